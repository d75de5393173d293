"""The GPU kernels in the Pallas interpreter against the project's XLA paths and the float64 torch references
(kernels/attention/reference_torch.py), and their Triton lowering for CUDA (built on CPU: a kernel lowers, only PTX
needs a GPU).

The paged decode kernel (kernels/attention/paged.py) against the XLA paged path (pages gathered by models/paged.read,
models.attention.xla), its jnp reference and torch's, over page sizes, GQA ratios, rows of one token, rows ending
mid-page and on a page's last slot, several pages per block and split rows. The engine with it and with command
buffers: tests/test_engine.py.

The flash kernel (kernels/attention/flash.py) on the shared-prefix update's completions (causal mask offset by the
prompt, a left-padded prompt, right-padded completions, GQA): outputs and gradients in q, k, v against attention
"xla" and torch's autograd, on real queries; as attention "pallas", per shard under a mesh.

Tolerances: float32 inputs, 2e-6 absolute (the kernel sums in another order: online softmax over blocks and splits);
bfloat16 inputs, one bfloat16 ulp of the output's scale (2 ** -7 relative): the XLA path rounds its probabilities to
bfloat16 before the value product, the kernel its unnormalised ones, so the two differ by bfloat16 rounding.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from spatial_jax.kernels.attention import flash as fa
from spatial_jax.kernels.attention import paged as pa
from spatial_jax.kernels.attention import reference_torch as torch_reference
from spatial_jax.models import paged
from spatial_jax.models.attention import AttentionMask, attention, xla
from spatial_jax.models.sharding import make_mesh


def _case(B, H, Hkv, D, page_size, W, lengths, dtype, seed=0):
    rng = np.random.default_rng(seed)
    pages = B * W + 3
    q = jnp.asarray(rng.normal(size=(B, H, D)), dtype)
    pool_k, pool_v = (jnp.asarray(rng.normal(size=(Hkv, pages, page_size, D)), dtype) for _ in range(2))
    table = jnp.asarray(rng.permutation(np.arange(1, pages))[: B * W].reshape(B, W), jnp.int32)
    return q, pool_k, pool_v, table, jnp.asarray(lengths, jnp.int32)


@jax.jit
def _xla_paged(q, pool_k, pool_v, table, lengths, scale=0.3):
    """What models/text.py does for a decode step without a kernel: paged_inputs, gather, XLA attention."""
    cache = paged.PagedKVCache(keys=(pool_k,), values=(pool_v,), page_table=table, lengths=lengths - 1)
    mask, index, _ = paged.paged_inputs(cache, jnp.ones((q.shape[0], 1), jnp.int32))
    k, v = paged.read(pool_k, index), paged.read(pool_v, index)
    return xla(q[:, None], k, v, mask, scale=scale)[:, 0]


# (page_size, H, Hkv, pages_per_block, splits, dtype): GQA 8 and 1 (MHA; the tiny policy's 2 in test_engine); one
# page per block and several; a row split 3 ways and whole
CASES = [(4, 8, 1, 2, 3, jnp.float32), (8, 2, 2, 1, 1, jnp.bfloat16)]


@pytest.mark.parametrize("page_size,H,Hkv,ppb,splits,dtype", CASES)
def test_paged_kernel_interpreted_equals_the_xla_paged_path(page_size, H, Hkv, ppb, splits, dtype):
    W = 5  # not a multiple of pages_per_block * splits: the kernel pads the table
    # one token; mid-page; a page's last slot; the whole window
    lengths = [1, page_size + page_size // 2 + 1, 2 * page_size, W * page_size]
    q, pool_k, pool_v, table, lens = _case(4, H, Hkv, 16, page_size, W, lengths, dtype)
    got = pa.paged_decode_attention(q, pool_k, pool_v, table, lens, scale=0.3, pages_per_block=ppb, splits=splits,
                                    interpret=True)
    assert got.shape == q.shape and got.dtype == dtype
    ref = _xla_paged(q, pool_k, pool_v, table, lens)
    own = jax.jit(pa.reference, static_argnames="scale")(q, pool_k, pool_v, table, lens, scale=0.3)
    if dtype == jnp.float32:
        truth = torch_reference.paged_decode_attention(*(torch.tensor(np.asarray(x)) for x in (q, pool_k, pool_v,
                                                                                             table, lens)), 0.3)
        np.testing.assert_allclose(got, ref, atol=2e-6, rtol=0)
        np.testing.assert_allclose(got, own, atol=2e-6, rtol=0)
        np.testing.assert_allclose(got, truth.numpy(), atol=2e-6, rtol=0)
    else:
        scale = float(jnp.abs(ref.astype(jnp.float32)).max())
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref, np.float32), atol=2**-7 * scale)
    # a row of one token attends to that token only: its value, exactly up to rounding
    v0 = pool_v[:, table[0, 0], 0].astype(jnp.float32)  # [Hkv, D]
    np.testing.assert_allclose(np.asarray(got[0], np.float32), np.repeat(v0, H // Hkv, axis=0),
                               atol=2e-6 if dtype == jnp.float32 else 2**-8 * float(jnp.abs(v0).max()))


def test_paged_kernel_lowers_to_triton_for_cuda_and_checks_its_inputs():
    q, pool_k, pool_v, table, lens = _case(2, 8, 2, 32, 16, 6, [3, 40], jnp.bfloat16)
    # splits chosen for the GPU (None): 3 here, one per block of 2 of the 6 pages
    fn = jax.jit(lambda *a: pa.paged_decode_attention(*a, scale=0.1, pages_per_block=2, interpret=False))
    text = fn.trace(q, pool_k, pool_v, table, lens).lower(lowering_platforms=("cuda",)).as_text()
    assert "triton" in text.lower() and "paged_decode_attention" in text
    with pytest.raises(ValueError, match="powers of two"):  # a head of 24 cannot be a Triton block
        pa.paged_decode_attention(q[..., :24], pool_k[..., :24], pool_v[..., :24], table, lens, scale=0.1,
                                  interpret=False)
    with pytest.raises(ValueError, match="do not fit"):
        pa.paged_decode_attention(q[:, :3], pool_k, pool_v, table, lens, scale=0.1)
    with pytest.raises(ValueError, match="lengths"):
        pa.paged_decode_attention(q, pool_k, pool_v, table, lens[:1], scale=0.1)
    with pytest.raises(ValueError, match="scale"):
        pa.paged_decode_attention(q, pool_k, pool_v, table, lens, scale=float("nan"))


def test_flash_kernel_interpreted_equals_xla_on_the_shared_prefix_mask():
    rng = np.random.default_rng(1)
    B, P, N, H, Hkv, D = 2, 7, 11, 4, 2, 16
    q = jnp.asarray(rng.normal(size=(B, N, H, D)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(B, P + N, Hkv, D)), jnp.float32) for _ in range(2))
    prompt, completion = np.ones((B, P), np.int32), np.ones((B, N), np.int32)
    prompt[1, :2] = 0  # left padding
    completion[0, -3:] = 0  # right padding
    q_seg, kv_seg = jnp.asarray(completion), jnp.asarray(np.hstack([prompt, completion]))
    mask = AttentionMask(segment_ids=q_seg, kv_segment_ids=kv_seg, causal=True, causal_offset=P)
    real = q_seg[:, :, None, None] > 0
    cotangent = jnp.where(real, jnp.cos(jnp.arange(H * D)).reshape(H, D), 0.0)  # padding queries: never read

    @jax.jit
    def both(q, k, v):  # outputs and gradients; blocks of 8 (several causal frontiers and skipped blocks)
        flash = lambda q, k, v: fa.flash_attention(q, k, v, q_seg, kv_seg, scale=0.3, causal=True, causal_offset=P,
                                                   block_q=8, block_k=8, interpret=True)
        out = []
        for f in (flash, lambda q, k, v: xla(q, k, v, mask, scale=0.3)):
            o, vjp = jax.vjp(f, q, k, v)
            out.append((o, *vjp(cotangent)))
        return out

    (got, *g_got), (want, *g_want) = both(q, k, v)
    tq, tk, tv = (torch.tensor(np.asarray(x), dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    truth = torch_reference.segment_attention(tq, tk, tv, torch.tensor(completion), torch.tensor(np.asarray(kv_seg)),
                                              0.3, causal=True, causal_offset=P)
    (truth * torch.tensor(np.asarray(cotangent), dtype=torch.float64)).sum().backward()
    for out in (want, truth.detach().numpy()):
        np.testing.assert_allclose(jnp.where(real, got, 0), np.where(real, out, 0), atol=2e-6, rtol=0)
    assert np.isfinite(np.asarray(got)).all()  # padding queries too
    for a, b, c in zip(g_got, g_want, (tq.grad, tk.grad, tv.grad)):
        np.testing.assert_allclose(a, b, atol=2e-6, rtol=0)
        np.testing.assert_allclose(a, c.numpy(), atol=2e-6, rtol=0)
    # the attention entry point's "pallas" (default blocks) on the same mask, per shard under a mesh (rows over
    # data, heads over tensor), as a sharded update runs it
    with jax.set_mesh(make_mesh(data=2, fsdp=1, tensor=2)):
        wired = jax.jit(lambda q, k, v: attention(q, k, v, mask, scale=0.3, impl="pallas"))(q, k, v)
    np.testing.assert_allclose(jnp.where(real, wired, 0), jnp.where(real, want, 0), atol=2e-6, rtol=0)
    with pytest.raises(ValueError, match="causal_offset"):
        fa.flash_attention(q, k, v, q_seg, kv_seg, scale=0.3, causal_offset=P)
    fn = jax.jit(jax.grad(lambda q: fa.flash_attention(q, k.astype(q.dtype), v.astype(q.dtype), q_seg, kv_seg,
                                                       scale=0.3, causal=True, causal_offset=P, block_q=16,
                                                       block_k=16, interpret=False).astype(jnp.float32).sum()))
    text = fn.trace(q.astype(jnp.bfloat16)).lower(lowering_platforms=("cuda",)).as_text()
    assert all(f"flash_attention_{part}" in text for part in ("forward", "dq", "dkv"))
