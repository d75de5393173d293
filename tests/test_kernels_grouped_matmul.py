"""The MoE experts' grouped matmul: megablox (jax's Pallas TPU kernel, here in the Pallas interpreter) against its
reference, XLA's ragged_dot, in float32 to 1e-5, forward and gradients, with empty groups, group sizes that do not
divide the tile, K and N in partial tiles and rows past the groups; clear errors; with libtpu, the kernel in shard_map
compiled by XLA:TPU for v5p runs as megablox's Mosaic kernels. The whole layer with megablox (adapters, router,
expert parallelism) equals ragged_dot in test_model_archs.py::test_expert_parallel_layer_equals_one_device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_kernels_pallas_tpu import _tpu_topology

from spatial_jax.config import FieldError
from spatial_jax.kernels.grouped_matmul import TILING, check_tiling, grouped_matmul, kernel_calls
from spatial_jax.models import ModelConfig
from spatial_jax.models.sharding import make_mesh

TOL = 1e-5
# tiny tiles so that a few rows make several M tiles and K, N end in partial tiles (the interpreter takes any)
TILES = (8, 16, 16)


def test_megablox_equals_ragged_dot():
    # 37 rows, 33 of them in groups (empty groups first, in the middle and last; sizes 7, 13, 1, 12 straddle the
    # 8-row tiles), the last 4 rows past every group; K = 40, N = 24 end in partial 16-wide tiles
    sizes = jnp.asarray([0, 7, 0, 13, 1, 12, 0], jnp.int32)
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (37, 40))
    w = jax.random.normal(keys[1], (7, 40, 24))
    g = jax.random.normal(keys[2], (37, 24))

    def run(impl):
        def loss(x, w):
            y = grouped_matmul(x, w, sizes, impl=impl, tiling=TILES, interpret=True)
            return jnp.sum(y * g), y

        (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(x, w)
        return y, *grads

    got, want = run("megablox"), run("ragged_dot")
    assert float(jnp.abs(got[0][33:]).max()) == 0.0 and float(jnp.abs(got[1][33:]).max()) == 0.0
    assert float(jnp.abs(got[2][jnp.asarray([0, 2, 6])]).max()) == 0.0  # empty groups' weights get no gradient
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=TOL, atol=TOL)


def test_rows_pad_to_tm_whatever_the_other_tiles():
    """tm larger than tk and tn (the rows pad to 16, not to 8), forward, in the interpreter by default off TPU."""
    sizes = jnp.asarray([5, 0, 9], jnp.int32)
    x = jax.random.normal(jax.random.key(1), (17, 8))
    w = jax.random.normal(jax.random.key(2), (3, 8, 8))
    got = jax.jit(lambda x, w: grouped_matmul(x, w, sizes, impl="megablox", tiling=(16, 8, 8)))(x, w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.lax.ragged_dot(x, w, sizes)), rtol=TOL, atol=TOL)


def test_bad_input_is_a_clear_error():
    x, w, sizes = jnp.zeros((8, 4)), jnp.zeros((2, 4, 3)), jnp.asarray([3, 5], jnp.int32)
    with pytest.raises(ValueError, match="impl must be one of"):
        grouped_matmul(x, w, sizes, impl="tokamax")
    with pytest.raises(ValueError, match=r"x \[M, K\] and w \[G, K, N\]"):
        grouped_matmul(x, jnp.zeros((2, 5, 3)), sizes)
    with pytest.raises(ValueError, match=r"x \[M, K\] and w \[G, K, N\]; got x\(8, 4, 4\)"):
        grouped_matmul(jnp.zeros((8, 4, 4)), w, sizes)  # K agrees: the rank alone is wrong
    with pytest.raises(ValueError, match=r"group_sizes must be \[G=2\] integers; got int32\(3,\)"):
        grouped_matmul(x, w, jnp.asarray([3, 5, 0], jnp.int32))
    with pytest.raises(ValueError, match="x and w must share a dtype; got float32 and bfloat16"):
        grouped_matmul(x, w.astype(jnp.bfloat16), sizes, impl="megablox")
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        grouped_matmul(x.astype(jnp.float16), w.astype(jnp.float16), sizes, impl="megablox")
    with pytest.raises(ValueError, match="three positive ints"):
        check_tiling((8, 0, 16), interpret=True)
    with pytest.raises(ValueError, match="multiple of 8"):
        check_tiling((12, 128, 128), interpret=False)
    with pytest.raises(ValueError, match="multiples of 128 for a TPU"):
        check_tiling(TILES, interpret=False)
    with pytest.raises(ValueError, match="multiples of 128 for a TPU; got 128, 16"):
        check_tiling((128, 128, 16), interpret=False)  # one of the two is enough to refuse
    with pytest.raises(ValueError, match="multiples of 128 for a TPU"):  # interpret=False is obeyed off TPU too
        grouped_matmul(x, w, sizes, impl="megablox", tiling=TILES, interpret=False)
    assert check_tiling(TILES, interpret=True) == TILES and check_tiling(TILING, interpret=False) == TILING
    assert check_tiling((8, 1, 1), interpret=True) == (8, 1, 1)
    with pytest.raises(FieldError, match="moe_matmul must be one of"):
        ModelConfig(moe_matmul="gmm")


def test_the_policy_key_reaches_the_model():
    from spatial_jax.config import ConfigError, load
    from spatial_jax.rl.config import TrainConfig
    from spatial_jax.rl.plan.shapes import model_config

    cfg = load(TrainConfig, None, ["policy.moe_matmul=megablox", "plan.model=qwen3-vl-30b-a3b"])
    assert model_config(cfg).moe_matmul == "megablox"
    assert load(TrainConfig, None, []).policy.moe_matmul == "ragged_dot"
    with pytest.raises(ConfigError, match="policy.moe_matmul: 'tokamax' is not one of"):
        load(TrainConfig, None, ["policy.moe_matmul=tokamax"])


def test_megablox_compiles_for_tpu():
    """The grouped matmul forward and backward in shard_map (experts over 4 chips), compiled by XLA:TPU for v5p:2x2x1
    from this host: megablox's Mosaic kernels are in the program (gmm forward; gmm and tgmm backward), not XLA:TPU's
    own (ragged_dot lowers to Mosaic kernels too, named ragged-dot-*). The layer at the Qwen3-VL-30B-A3B size:
    benchmarks/training/moe_tpu_compile.py."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = make_mesh(1, 4, 1, devices=_tpu_topology("v5p:2x2x1"))
    local = jax.shard_map(lambda x, w, sizes: grouped_matmul(x, w, sizes, impl="megablox"), mesh=mesh,
                          in_specs=(P("fsdp"), P("fsdp"), P()), out_specs=P("fsdp"), check_vma=False)

    def arg(shape, spec, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

    args = (arg((512, 256), P("fsdp")), arg((8, 256, 384), P("fsdp")), arg((512, 384), P("fsdp")),
            arg((2,), P(), jnp.int32))
    with jax.set_mesh(mesh):  # interpret defaults to False: the mesh's devices are TPUs
        step = jax.jit(jax.value_and_grad(lambda x, w, g, sizes: jnp.sum(local(x, w, sizes) * g), argnums=(0, 1)))
        hlo = step.lower(*args).compile().as_text()
    assert kernel_calls(hlo) == {"megablox": 3, "ragged_dot": 0}
    # the default impl, forward: XLA:TPU's own two kernels (ragged-dot-metadata, then the matmul), no megablox
    xla = jax.shard_map(lambda x, w, sizes: grouped_matmul(x, w, sizes), mesh=mesh,
                        in_specs=(P("fsdp"), P("fsdp"), P()), out_specs=P("fsdp"), check_vma=False)
    with jax.set_mesh(mesh):
        hlo = jax.jit(xla).lower(args[0], args[1], args[3]).compile().as_text()
    assert kernel_calls(hlo) == {"megablox": 0, "ragged_dot": 2}
