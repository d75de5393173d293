"""models/lora.py one layer at a time (test_model_lora.py runs whole models through transformers): the forward
y = x W + b + (alpha / r) * dropout(x) A B against the formula in float64 (the second opinion; the whole-model test
holds a merged export to transformers), in float32 and bfloat16 compute; the merged kernel, also for stacked layers;
the adapters off and on again, an error inside the block included; a merge that leaves the original alone; fresh
adapters drawn in their bounds; the count of adapter weights. Tolerances: float32 1e-5, bfloat16 compute 3e-2
(three bfloat16 roundings of values near 1)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spatial_jax.models.lora import (
    LoRALinear,
    LoRAParam,
    disable_adapters,
    lora_layers,
    lora_param_count,
    merge_lora,
    reset_adapters,
)

IN, OUT, R, ALPHA = 6, 5, 3, 12.0


def _layer(rank=R, bias=True, dtype="float32", dropout=0.0, seed=0) -> LoRALinear:
    layer = LoRALinear(IN, OUT, axes=("embed", "mlp"), use_bias=bias, rank=rank, alpha=ALPHA, dropout=dropout,
                       dtype=dtype, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    if bias:
        layer.bias[...] = jnp.asarray(rng.standard_normal(OUT), jnp.float32)
    if rank:
        layer.lora_b[...] = jnp.asarray(rng.standard_normal((rank, OUT)), jnp.float32)
    return layer


def _formula(layer: LoRALinear, x: np.ndarray, adapters: bool = True) -> np.ndarray:
    w = np.asarray(layer.kernel[...], np.float64)
    y = x.astype(np.float64) @ w
    if layer.bias is not None:
        y = y + np.asarray(layer.bias[...], np.float64)
    if layer.rank and adapters:
        a, b = np.asarray(layer.lora_a[...], np.float64), np.asarray(layer.lora_b[...], np.float64)
        y = y + (ALPHA / layer.rank) * (x @ a @ b)
    return y


X = np.random.default_rng(9).standard_normal((2, 4, IN)).astype(np.float32)


@pytest.mark.parametrize("rank", [0, 1, R])
@pytest.mark.parametrize("bias", [False, True])
def test_forward_is_the_formula(rank, bias):
    layer = _layer(rank, bias)
    got = layer(jnp.asarray(X))
    assert got.dtype == jnp.float32 and got.shape == (2, 4, OUT)
    np.testing.assert_allclose(np.asarray(got), _formula(layer, X), atol=1e-5, rtol=0)
    assert layer.scaling == (ALPHA / rank if rank else 0.0)
    assert (layer.lora_a is None, layer.lora_b is None, layer.lora_dropout is None) == ((rank == 0,) * 3)


def test_bfloat16_compute_from_float32_parameters():
    layer = _layer(dtype="bfloat16")
    got = layer(jnp.asarray(X))
    assert got.dtype == jnp.bfloat16 and layer.kernel[...].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got, np.float32), _formula(layer, X), atol=3e-2 * 8, rtol=3e-2)


def test_a_fresh_adapter_changes_nothing_and_is_drawn_in_its_bounds():
    layer = LoRALinear(64, OUT, axes=(None, None), rank=R, alpha=ALPHA, rngs=nnx.Rngs(1))
    a = np.asarray(layer.lora_a[...])
    assert a.shape == (64, R) and np.abs(a).max() <= 64**-0.5 and np.abs(a).max() > 0.6 * 64**-0.5
    assert not np.asarray(layer.lora_b[...]).any()
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(layer(jnp.asarray(x))), np.asarray(jnp.asarray(x) @ layer.kernel[...]))
    w = np.asarray(layer.kernel[...])
    assert abs(w.std() - 64**-0.5) < 0.2 * 64**-0.5  # N(0, 1/in)
    assert isinstance(layer.lora_a, LoRAParam) and isinstance(layer.lora_b, LoRAParam)
    assert not isinstance(layer.kernel, LoRAParam)


def test_dropout_applies_to_the_adapter_path_only_in_training():
    layer = _layer(dropout=0.5, seed=2)
    x = jnp.asarray(X)
    np.testing.assert_allclose(np.asarray(layer(x)), _formula(layer, X), atol=1e-5, rtol=0)
    train = nnx.view(layer, deterministic=False, raise_if_not_found=False)
    y = np.asarray(train(x))
    assert np.abs(y - _formula(layer, X)).max() > 1e-3
    with disable_adapters(train):  # the base path has no dropout
        np.testing.assert_allclose(np.asarray(train(x)), _formula(layer, X, adapters=False), atol=1e-5, rtol=0)


def test_merged_kernel_and_merge_lora():
    layer = _layer()
    w = np.asarray(layer.kernel[...], np.float64)
    a, b = np.asarray(layer.lora_a[...], np.float64), np.asarray(layer.lora_b[...], np.float64)
    np.testing.assert_allclose(np.asarray(layer.merged_kernel()), w + ALPHA / R * a @ b, atol=1e-5, rtol=0)
    plain = _layer(rank=0)
    assert plain.merged_kernel() is not None and np.array_equal(plain.merged_kernel(), plain.kernel[...])
    merged = merge_lora(layer)
    np.testing.assert_allclose(np.asarray(merged(jnp.asarray(X))), _formula(layer, X), atol=1e-5, rtol=0)
    assert not np.asarray(merged.lora_b[...]).any()
    np.testing.assert_allclose(np.asarray(merged.kernel[...]), w + ALPHA / R * a @ b, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(layer.lora_b[...]), b.astype(np.float32))  # the original untouched
    # stacked layers (ModelConfig.scan_layers): [L, in, r] @ [L, r, out] per layer
    rng = np.random.default_rng(3)
    layer.kernel.set_value(jnp.asarray(rng.standard_normal((2, IN, OUT)), jnp.float32))
    layer.lora_a.set_value(jnp.asarray(rng.standard_normal((2, IN, R)), jnp.float32))
    layer.lora_b.set_value(jnp.asarray(rng.standard_normal((2, R, OUT)), jnp.float32))
    want = np.stack([np.asarray(layer.kernel[...])[k] + ALPHA / R * np.asarray(layer.lora_a[...])[k]
                     @ np.asarray(layer.lora_b[...])[k] for k in range(2)])
    np.testing.assert_allclose(np.asarray(layer.merged_kernel()), want, atol=1e-4, rtol=0)


def test_merged_kernel_keeps_the_parameter_dtype():
    layer = LoRALinear(IN, OUT, axes=(None, None), rank=R, alpha=ALPHA, param_dtype="bfloat16", rngs=nnx.Rngs(0))
    layer.lora_b[...] = jnp.ones((R, OUT), jnp.bfloat16)
    merged = layer.merged_kernel()
    assert merged.dtype == jnp.bfloat16
    want = np.asarray(layer.kernel[...], np.float32) + ALPHA / R * np.asarray(
        jnp.matmul(layer.lora_a[...].astype(jnp.float32), layer.lora_b[...].astype(jnp.float32)))
    np.testing.assert_allclose(np.asarray(merged, np.float32), want, atol=0.05, rtol=0.01)


class _Two(nnx.Module):
    def __init__(self):
        self.first = _layer(seed=0)
        self.plain = _layer(rank=0, seed=1)
        self.second = _layer(rank=1, seed=2)


def test_defaults_are_a_plain_dense_layer_and_alpha_one():
    plain = LoRALinear(IN, OUT, axes=(None, None), rngs=nnx.Rngs(0))
    assert (plain.bias, plain.rank, plain.scaling, plain.lora_a) == (None, 0, 0.0, None)
    adapted = LoRALinear(IN, OUT, axes=(None, None), rank=2, rngs=nnx.Rngs(0))
    assert adapted.scaling == 0.5 and adapted.lora_dropout.rate == 0.0


def test_variables_carry_their_logical_axes_and_the_parameter_dtype():
    layer = LoRALinear(IN, OUT, axes=("embed", "mlp"), use_bias=True, rank=R, param_dtype="bfloat16",
                       rngs=nnx.Rngs(0))
    axes = {n: getattr(layer, n).get_metadata().get("out_sharding") for n in ("kernel", "bias", "lora_a", "lora_b")}
    assert axes == {"kernel": ("embed", "mlp"), "bias": ("mlp",), "lora_a": ("embed", "lora_rank"),
                    "lora_b": ("lora_rank", "mlp")}
    assert {getattr(layer, n)[...].dtype for n in axes} == {jnp.dtype(jnp.bfloat16)}
    reset_adapters(layer)
    assert layer.lora_a[...].dtype == layer.lora_b[...].dtype == jnp.bfloat16


def test_every_matmul_runs_in_the_compute_dtype():
    """bfloat16 compute from float32 parameters: the base and both adapter matmuls take bfloat16 operands (a float32
    one would promote the product, and the MXU's rate with it)."""
    import jax

    layer = _layer(dtype="bfloat16")
    jaxpr = jax.make_jaxpr(lambda x: layer(x))(jnp.asarray(X))
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 3
    assert all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)


def test_disable_adapters_switches_every_layer_and_restores_each():
    model = _Two()
    model.second.adapters_enabled = False  # switched off by the caller before: stays off after
    with disable_adapters(model) as m:
        assert m is model
        assert [layer.adapters_enabled for layer in lora_layers(model)] == [False, False, False]
        np.testing.assert_allclose(np.asarray(model.first(jnp.asarray(X))), _formula(model.first, X, False),
                                   atol=1e-5, rtol=0)
    assert [layer.adapters_enabled for layer in lora_layers(model)] == [True, True, False]
    merged = merge_lora(model)  # a rank-0 layer and a rank-1 one among them
    np.testing.assert_allclose(np.asarray(merged.second.kernel[...]), np.asarray(model.second.merged_kernel()),
                               atol=1e-6, rtol=0)
    assert not np.asarray(merged.second.lora_b[...]).any()
    np.testing.assert_array_equal(np.asarray(merged.plain.kernel[...]), np.asarray(model.plain.kernel[...]))
    with pytest.raises(KeyError), disable_adapters(model):
        raise KeyError("inside")
    assert [layer.adapters_enabled for layer in lora_layers(model)] == [True, True, False]


def test_reset_adapters_draws_fresh_a_zero_b_and_new_dropout_streams():
    model = _Two()
    before_a = np.asarray(model.first.lora_a[...])
    assert reset_adapters(model, seed=5) is model
    for layer in (model.first, model.second):
        a = np.asarray(layer.lora_a[...])
        assert a.shape == (IN, layer.rank) and 0.5 * IN**-0.5 < np.abs(a).max() <= IN**-0.5  # U(+-1/sqrt(in))
        assert not np.asarray(layer.lora_b[...]).any()
    assert not np.array_equal(np.asarray(model.first.lora_a[...]), before_a)
    np.testing.assert_array_equal(np.asarray(reset_adapters(_Two()).first.lora_a[...]),
                                  np.asarray(reset_adapters(_Two(), seed=0).first.lora_a[...]))  # seed 0 by default
    again = reset_adapters(_Two(), seed=5)
    np.testing.assert_array_equal(np.asarray(again.first.lora_a[...]), np.asarray(model.first.lora_a[...]))
    other = reset_adapters(_Two(), seed=6)
    assert not np.array_equal(np.asarray(other.first.lora_a[...]), np.asarray(model.first.lora_a[...]))
    assert model.plain.lora_a is None  # rank 0 untouched
    # the dropout streams are the reset's: two resets with one seed drop the same entries
    model.first.lora_b[...] = again.first.lora_b[...] = jnp.ones((R, OUT), jnp.float32)
    model.first.lora_dropout.rate = again.first.lora_dropout.rate = 0.5
    y1 = nnx.view(model.first, deterministic=False, raise_if_not_found=False)(jnp.asarray(X))
    y2 = nnx.view(again.first, deterministic=False, raise_if_not_found=False)(jnp.asarray(X))
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(y2))


def test_adapter_weights_are_counted():
    assert lora_param_count(_Two()) == IN * R + R * OUT + IN * 1 + 1 * OUT
    assert lora_param_count(_layer(rank=0)) == 0
