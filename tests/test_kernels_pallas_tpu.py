"""The Pallas LM-head kernel over a mesh and for real TPUs.

On CPU: the shard_map wrapper (tokens over data, vocabulary over tensor, statistics combined across vocabulary
shards) in the Pallas interpreter on 8 host devices, against the float64 torch reference at float32 1e-4.
With libtpu: the step compiled by XLA:TPU for v5p and v6e slices from this host (no TPU needed) at the recipe
shape N = 8192, D = 4096, V = 151,936, float32 and bfloat16, forward and forward+backward.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_kernels_jax import TOL, assert_parity, make_case, torch_expected

from spatial_jax.kernels import resolve_impl
from spatial_jax.kernels.logprob_entropy import pallas
from spatial_jax.models.sharding import make_mesh


def sharded_outputs(mesh, h, w, targets, g_lp, g_h, place=True, **kwargs):
    if place:  # inputs laid out as the wrapper's shard_map wants them, as in a training step
        h = jax.device_put(h, NamedSharding(mesh, P(("data", "fsdp"), None)))
        w = jax.device_put(w, NamedSharding(mesh, P(None, "tensor")))

    def loss(h, w):
        lp, ent = pallas.linear_logprob_entropy(h, w, targets, mesh=mesh, **kwargs)
        return jnp.sum(lp * g_lp + ent * g_h), (lp, ent)

    (_, (lp, ent)), (dh, dw) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(h, w)
    return tuple(np.asarray(x, np.float64) for x in (lp, ent, dh, dw))


@pytest.mark.parametrize(
    "data, fsdp, tensor",
    [
        (2, 1, 2),  # V = 300: 150-column shards, each with a vocabulary tail inside its last block
        (1, 2, 4),  # 75-column shards; tokens over fsdp
    ],
)
def test_sharded_float32_parity(data, fsdp, tensor):
    mesh = make_mesh(data=data, fsdp=fsdp, tensor=tensor)
    h, w, targets, g_lp, g_h = make_case(16, 16, 300, h_std=80.0, w_std=0.02, seed=3)
    got = sharded_outputs(mesh, h, w, targets, g_lp, g_h, temperature=0.7, block_n=8, block_v=128, block_d=8,
                          interpret=True)
    assert_parity(got, torch_expected(h, w, targets, g_lp, g_h, 0.7), TOL[jnp.float32])


def test_sharded_axes_that_do_not_divide_are_dropped():
    # N = 13 divides no token axis and V = 301 not tensor = 2: both dimensions are replicated, values unchanged.
    mesh = make_mesh(data=2, tensor=2)
    h, w, targets, g_lp, g_h = make_case(13, 8, 301, seed=5)
    assert pallas._mesh_axes(mesh, 13, 301) == ((), None)
    got = sharded_outputs(mesh, h, w, targets, g_lp, g_h, place=False, block_n=8, block_v=128, block_d=8,
                          interpret=True)
    assert_parity(got, torch_expected(h, w, targets, g_lp, g_h, 1.0), TOL[jnp.float32])


def test_sharded_target_outside_vocabulary_is_nan():
    mesh = make_mesh(data=2, tensor=2)
    h, w, _, _, _ = make_case(4, 8, 256, seed=1)
    targets = jnp.asarray([0, 255, 256, -1], jnp.int32)
    lp, ent = pallas.linear_logprob_entropy(h, w, targets, mesh=mesh, block_n=8, block_v=128, block_d=8,
                                            interpret=True)
    assert np.all(np.isfinite(np.asarray(lp[:2]))) and np.all(np.isnan(np.asarray(lp[2:])))
    assert np.all(np.isfinite(np.asarray(ent)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("kind", sorted(pallas.VMEM_LIMITS))
def test_default_blocks_fit_the_generation(kind, dtype):
    block_n, block_v, block_d, limit = pallas.default_blocks(kind, 4096, dtype)
    assert limit == pallas.VMEM_LIMITS[kind] and 4096 % block_d == 0
    assert block_n % 8 == 0 and block_v % 128 == 0
    assert pallas._vmem_estimate(block_n, block_v, block_d, 4096, jnp.dtype(dtype).itemsize) <= 3 * limit // 4


def test_unknown_device_keeps_the_default_vmem_limit():
    assert pallas.default_blocks(None, 4096, jnp.float32)[3] is None
    assert pallas.default_blocks("TPU v99", 4096, jnp.float32)[3] is None


def _tpu_topology(name):
    """The devices of a TPU slice for the compiler on this host, or skip with the reason."""
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install 'jax[tpu]'): no XLA:TPU compiler")
    from jax.experimental import topologies

    # libtpu takes a machine-wide lock on first use; pytest-xdist workers (or a benchmark) would each want it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        return topologies.get_topology_desc(platform="tpu", topology_name=name).devices
    except Exception as err:  # a libtpu that cannot describe this slice
        pytest.skip(f"libtpu cannot describe topology {name}: {err}")


def test_auto_resolves_from_the_mesh_devices():
    # a TPU slice described from this CPU host: "auto" is the Pallas head under its mesh, XLA under a host mesh
    devices = _tpu_topology("v5e:2x2")
    with jax.set_mesh(jax.sharding.Mesh(np.asarray(devices).reshape(2, 2), ("data", "tensor"))):
        assert resolve_impl("auto") == "pallas"
    with jax.set_mesh(make_mesh(data=2, tensor=2)):
        assert resolve_impl("auto") == "xla"
    assert resolve_impl("auto") == "xla" and resolve_impl("auto", platform="tpu") == "pallas"


N, D, V = 8192, 4096, 151_936


# The forward+backward program holds the forward kernel too; the forward alone
# (benchmarks/kernels/pallas_tpu_compile.py) would compile it a second time at no gain in proof. Each generation with
# one dtype, each dtype on one generation (~20 s a compile): the blocks every generation x dtype gets are checked
# above without compiling, and benchmarks/kernels/pallas_tpu_compile.py compiles the whole grid.
@pytest.mark.parametrize("mode", ["fwd_bwd"])
@pytest.mark.parametrize(("topology", "dtype"), [("v5p:2x2x1", jnp.float32), ("v6e:2x2", jnp.bfloat16)])
@pytest.mark.slow
def test_compiles_for_tpu(topology, dtype, mode):
    devices = _tpu_topology(topology)
    mesh = jax.sharding.Mesh(np.asarray(devices).reshape(2, 2), ("data", "tensor"))
    rows = NamedSharding(mesh, P("data"))
    args = (
        jax.ShapeDtypeStruct((N, D), dtype, sharding=NamedSharding(mesh, P("data", None))),
        jax.ShapeDtypeStruct((D, V), dtype, sharding=NamedSharding(mesh, P(None, "tensor"))),
        jax.ShapeDtypeStruct((N,), jnp.int32, sharding=rows),
        jax.ShapeDtypeStruct((N,), jnp.float32, sharding=rows),
        jax.ShapeDtypeStruct((N,), jnp.float32, sharding=rows),
    )

    def loss(h, w, targets, g_lp, g_h):
        lp, ent = pallas.linear_logprob_entropy(h, w, targets, mesh=mesh)
        return jnp.sum(g_lp * lp + g_h * ent)

    step = jax.value_and_grad(loss, argnums=(0, 1)) if mode == "fwd_bwd" else loss
    compiled = jax.jit(step).lower(*args).compile()  # interpret defaults to False: the mesh's devices are TPUs
    text = compiled.as_text()
    assert text.count('custom_call_target="tpu_custom_call"') >= (3 if mode == "fwd_bwd" else 1)
    mem = compiled.memory_analysis()
    # Per chip: the local h and w shards are the arguments; nothing [N, V] is ever held (that would be 2.3 GiB).
    local_inputs = (N // 2) * D * jnp.dtype(dtype).itemsize + D * (V // 2) * jnp.dtype(dtype).itemsize
    assert local_inputs <= mem.argument_size_in_bytes < local_inputs + (1 << 20)
    assert mem.temp_size_in_bytes < 4 * D * (V // 2) * 4
