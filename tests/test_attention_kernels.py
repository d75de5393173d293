"""The attention entry point (spatial_jax.models.attention): splash attention in the Pallas interpreter equals the
XLA path (float32, 1e-4, values and gradients) with causal + padding + several segments per row and with GQA;
the cuDNN wrapper's plumbing (rows rotated so the real run starts at 0, per-row lengths) equals it through jax's
reference implementation (no GPU here); implementation choice per backend and input checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spatial_jax.models.attention import AttentionMask, attention, cudnn, resolve_impl, splash, xla
from spatial_jax.models.sharding import make_mesh

TOL = 1e-4


def case(B=2, T=150, H=4, Hkv=2, D=16, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((B, T, h, D)), jnp.float32) for h in (H, Hkv, Hkv))
    seg = np.zeros((B, T), np.int32)
    seg[0, 7:120] = 1  # left and right padding around one sequence
    seg[1, :40], seg[1, 40:97], seg[1, 97:] = 1, 2, 3  # three packed segments, no padding
    return q, k, v, seg


def real_rows(seg):
    return jnp.asarray(seg > 0)[..., None, None]


@pytest.mark.parametrize("causal", [True, False])
def test_splash_interpret_equals_xla(causal):
    q, k, v, seg = case()
    mask = AttentionMask(segment_ids=jnp.asarray(seg), causal=causal)

    def loss(fn):
        return lambda q, k, v: jnp.sum(jnp.where(real_rows(seg), fn(q, k, v), 0.0) ** 2)

    ref = xla(q, k, v, mask, scale=0.3)
    got = splash(q, k, v, mask, scale=0.3, interpret=True)  # T = 150 padded to 256 inside
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(np.asarray(got)[seg > 0], np.asarray(ref)[seg > 0], atol=TOL)
    if not causal:  # the backward kernels are the same for both masks; once keeps the interpreter's time down
        return
    g_ref = jax.grad(loss(lambda *a: xla(*a, mask, scale=0.3)), argnums=(0, 1, 2))(q, k, v)
    g_got = jax.grad(loss(lambda *a: splash(*a, mask, scale=0.3, interpret=True)), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_got, g_ref, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=TOL)


def test_splash_under_a_mesh_runs_per_shard():
    q, k, v, _ = case(B=4, T=64, H=4, Hkv=2)
    seg = np.ones((4, 64), np.int32)
    seg[1, :9] = 0
    seg[2, 30:] = 2
    mask = AttentionMask(segment_ids=jnp.asarray(seg), causal=True)
    ref = xla(q, k, v, mask, scale=0.25)
    with jax.set_mesh(make_mesh(data=2, fsdp=1, tensor=2)):
        got = jax.jit(lambda q, k, v: attention(q, k, v, mask, scale=0.25, impl="splash"))(q, k, v)
    np.testing.assert_allclose(np.asarray(got)[seg > 0], np.asarray(ref)[seg > 0], atol=TOL)


@pytest.mark.parametrize("causal", [True, False])
def test_cudnn_plumbing_equals_xla(causal):  # (the chunked XLA path is held to transformers in test_model_parity)
    q, k, v, seg = case(T=33)
    seg = np.zeros_like(seg)
    seg[0, 5:30], seg[1, :21] = 1, 1  # one contiguous real run per row: left + right padding, right padding
    mask = AttentionMask(segment_ids=jnp.asarray(seg), causal=causal)
    got = cudnn(q, k, v, mask, scale=0.3, implementation="xla")
    ref = xla(q, k, v, mask, scale=0.3)
    np.testing.assert_allclose(np.asarray(got)[seg > 0], np.asarray(ref)[seg > 0], atol=1e-5)


def test_implementation_choice_and_input_checks():
    assert resolve_impl("auto", jnp.float32, "cpu") == "xla"
    assert resolve_impl("auto", jnp.float32, "tpu") == "splash"
    assert resolve_impl("auto", jnp.bfloat16, "gpu") == "cudnn"
    assert resolve_impl("auto", jnp.float32, "gpu") == "xla"
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        resolve_impl("cudnn", jnp.bfloat16, "cpu")
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        resolve_impl("cudnn", jnp.float32, "gpu")
    with pytest.raises(ValueError, match="one of"):
        resolve_impl("flash", jnp.float32, "cpu")
    q, k, v, seg = case(T=8)
    good = AttentionMask(segment_ids=jnp.asarray(seg))
    with pytest.raises(ValueError, match="segment_ids must be"):
        attention(q, k, v, AttentionMask(segment_ids=jnp.asarray(seg[:, :4])), scale=0.3)
    with pytest.raises(ValueError, match="do not fit"):
        attention(q, k[..., :8], v[..., :8], good, scale=0.3)
    with pytest.raises(ValueError, match="scale"):
        attention(q, k, v, good, scale=float("nan"))
    with pytest.raises(ValueError, match="dense mask"):
        attention(q, k, v, AttentionMask(dense=jnp.ones((2, 8, 8), jnp.int32)), scale=0.3)
    # an explicit mask (KV-cache calls) takes the XLA path whatever impl says
    dense = AttentionMask(dense=jnp.asarray(seg[:, :, None] == seg[:, None, :]) & jnp.asarray(seg > 0)[:, None])
    np.testing.assert_allclose(np.asarray(attention(q, k, v, dense, scale=0.3, impl="splash")),
                               np.asarray(xla(q, k, v, dense, scale=0.3)), atol=0)
