"""Planning the rollouts as the job samples them: host 0's block of a batch on its decoding copy (its chips, the
decode dtype; or a rollout mesh of its own with decode.devices), through the paged engine or the static sampler,
with the trainer's state resident meanwhile."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spatial_jax.config import ConfigError
from spatial_jax.models import ModelConfig, prepare_vision_inputs, rope_index
from spatial_jax.models.sharding import logical_to_spec, make_mesh
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.plan.measure import Program, _measure
from spatial_jax.rl.plan.shapes import Abstract, Shapes, _ints, _local_bytes, _placed, _replicated, _rows, _spec_on
from spatial_jax.rl.plan.targets import GPUS_PER_HOST, Target, chips_slice
from spatial_jax.rollout import engine, sampler
from spatial_jax.rollout.decode_copy import decode_mesh
from spatial_jax.rollout.engine import Engine, Request


@dataclasses.dataclass
class Decoding:
    """What rollouts run on (rollout/decode_copy.py): the decoding copy of process 0 of the training mesh, on that
    process's own devices, and the rollouts it decodes (its block of every batch, rollout/hosts.py)."""

    mesh: Mesh
    graphdef: Any
    params: Any  # the copy: every weight in the decode dtype, laid out on `mesh`
    processes: int  # processes holding devices of the training mesh (each decodes its own block)
    rows: int


def rollout_mesh_devices(cfg: TrainConfig, target: Target) -> tuple[tuple, tuple]:
    """(training mesh's devices, rollout mesh's) for decode.devices > 0: the chips after the training mesh's, on the
    one host a rollout mesh of its own runs on (rollout/decode_copy.rollout_devices); each a slice of its own."""
    n, d = cfg.mesh.size, cfg.decode.devices
    if target.platform == "gpu":
        if n + d > GPUS_PER_HOST:
            raise ConfigError(f"decode.devices={d}: a rollout mesh of its own runs on the training mesh's one host, "
                              f"but {n} + {d} GPUs exceed a host's {GPUS_PER_HOST}")
        return (), ()
    chips = target.devices[: n + d]
    if len({getattr(c, "process_index", 0) for c in chips}) > 1:
        raise ConfigError(f"decode.devices={d}: a rollout mesh of its own runs on one host, but the {n} + {d} chips "
                          f"of {target.name} span several: use decode.devices=0 there (one_step_off then overlaps on "
                          "the same chips)")
    return chips_slice(target, chips[:n]), chips_slice(target, chips[n:])


def decoding(cfg: TrainConfig, policy: Abstract, mesh, shapes: Shapes, host: tuple | None = None) -> Decoding:
    """The decoding copy as process 0 holds it while it samples its share of `shapes.rollouts` (on `host`, its
    chips as their own slice, when given: `host_slice`)."""
    processes = len({d.process_index for d in mesh.devices.flat})
    if cfg.rl.prompts_per_step % processes:
        raise ConfigError(f"rl.prompts_per_step={cfg.rl.prompts_per_step} does not split among the {processes} "
                          "hosts of the mesh (each host decodes its own block of prompts)")
    own = mesh if host is None else make_mesh(1, len(host), 1, devices=list(host))
    dmesh = decode_mesh(own, cfg.decode.tensor)
    graphdef, state = nnx.split(policy.model)
    dtype = cfg.decode.weights_dtype(policy.model.cfg.dtype)
    return Decoding(dmesh, graphdef, _placed(state, dmesh, float_dtype=dtype), processes,
                    shapes.rollouts // processes)


def _static_programs(cfg, mc, policy, dec: Decoding, shapes, grid, resident, run) -> list[Program]:
    """The static sampler's prefill and decode loop (sampling.engine = "static") over process 0's rollouts."""
    B, sc, out = dec.rows, cfg.rl.sampling, []
    where = f"on {dec.mesh.devices.size} chips of host 0 of {dec.processes}"
    if "rollout_prefill" in run:
        ids, mask, pixels, grids = _rows(mc, B, shapes.prompt, grid)
        positions, deltas = rope_index(mc, ids, grids, mask)
        tokens = [jax.ShapeDtypeStruct(x.shape, jnp.int32, sharding=_spec_on(dec.mesh, B, x.ndim, axis))
                  for x, axis in ((ids, 0), (mask, 0), (positions, 1), (deltas, 0))]
        vision = _replicated(prepare_vision_inputs(pixels, grids, mc.vision), dec.mesh)
        args = (dec.graphdef, dec.params, _sampler_state(policy, dec.mesh, B, shapes.cache), *tokens, vision)
        out.append(_measure(dec.mesh, "rollout_prefill", f"static, {B} prompts x {shapes.prompt} tokens, cache "
                            f"{shapes.cache}, {where}", sampler._extend_jit, args, resident))
    if "rollout_decode" in run:
        sampling = dataclasses.replace(sc, seed=0, stop_token_ids=(), suppress_token_ids=())
        args = (dec.graphdef, dec.params, _sampler_state(policy, dec.mesh, B, shapes.cache),
                _ints(dec.mesh, 1), _ints(dec.mesh, 2), sampling)
        out.append(_measure(dec.mesh, "rollout_decode", f"static, {B} rows, up to {sc.max_new_tokens} tokens, cache "
                            f"{shapes.cache}, {where}", sampler._decode_jit, args, resident))
    return out


def _paged_programs(cfg, mc, policy, dec: Decoding, shapes, grid, resident, run) -> list[Program]:
    """The paged engine's programs (sampling.engine = "paged", rollout/engine.py) at their largest shapes: the
    prefill admitting every slot's prompt at once, and a decode chunk with every slot holding its longest context.
    The KV pool is `sampling.pages` pages (default: every slot's longest request), the rows `sampling.slots`
    (default: all of the host's rollouts)."""
    sc, out = cfg.rl.sampling, []
    eng = Engine(policy.model, sc, slots=sc.slots or dec.rows, max_len=shapes.cache, page_size=sc.page_size,
                 pages=sc.pages, chunk=sc.chunk)
    S = eng.slots
    kv_spec = NamedSharding(dec.mesh, P(*logical_to_spec(("act_kv_heads", None, None, None),
                                                       (mc.text.num_key_value_heads, 1, 1, 1), dec.mesh)))
    pool = tuple(jax.ShapeDtypeStruct((mc.text.num_key_value_heads, eng.pages, eng.page_size, mc.text.head_dim),
                                      jnp.dtype(mc.dtype), sharding=kv_spec) for _ in range(mc.text.num_hidden_layers))
    logits = jax.ShapeDtypeStruct((S, mc.text.vocab_size), jnp.float32, sharding=NamedSharding(dec.mesh, P()))
    where = (f"{S} slots, {eng.pages} pages of {eng.page_size}, up to {shapes.cache} tokens a request, on "
             f"{dec.mesh.devices.size} chips of host 0 of {dec.processes}")
    if "rollout_prefill" in run:
        ids, _, pixels, grids = _rows(mc, 1, shapes.prompt, grid)
        inputs = eng.widest_prefill_inputs(Request(ids[0], 0, pixels, grids), cfg.rl.group_size)
        args = (dec.graphdef, dec.params, pool, pool, logits, *_replicated(inputs, dec.mesh))
        out.append(_measure(dec.mesh, "rollout_prefill", f"paged, {S} prompts x {shapes.prompt} tokens, {where}",
                            engine._prefill_jit, args, resident))
    if "rollout_decode" in run:
        inputs = eng.widest_chunk_inputs()
        static = dataclasses.replace(sc, seed=0, stop_token_ids=(), suppress_token_ids=())
        args = (dec.graphdef, dec.params, pool, pool, logits, *_replicated(inputs, dec.mesh),
                _ints(dec.mesh, 2, jnp.uint32), _ints(dec.mesh, 1), _ints(dec.mesh, 2), static, eng.chunk)
        out.append(_measure(dec.mesh, "rollout_decode", f"paged, a chunk of {eng.chunk} steps, {where}",
                            engine._chunk_jit, args, resident))
    return out


def _sampler_state(policy: Abstract, mesh, batch: int, max_len: int):
    """The static sampler's state for `batch` rows and a `max_len` cache on `mesh` (rows over the batch axes, KV
    heads over `tensor`); its cache index is traced, so one compile serves every position."""
    state = jax.eval_shape(lambda: sampler.init_state(policy.model, batch, max_len))
    kv = logical_to_spec(("batch", "cache_seq", "act_kv_heads", None), state.cache.keys[0].shape, mesh)

    def one(path, x):
        names = [getattr(p, "name", "") for p in path]
        if "keys" in names or "values" in names:
            spec = kv
        elif x.ndim and x.shape[0] == batch:
            spec = P(*logical_to_spec(("batch",), (batch,), mesh), *([None] * (x.ndim - 1)))
        else:
            spec = P()
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))

    return jax.tree_util.tree_map_with_path(one, state)


def rollout_programs(cfg: TrainConfig, mc: ModelConfig, policy: Abstract, mesh, shapes: Shapes, grid, run: set[str],
                     rl_opt, reference: int, host: tuple | None) -> list[Program]:
    """Those of the rollouts' prefill and decode in `run`, through the configured engine, on the decoding copy."""
    # while the copy samples, every chip still holds its shard of the trainer's state: the master weights,
    # Adam's state and the KL reference; a rollout mesh of its own (decode.devices) holds none of it
    resident = 0 if cfg.decode.devices else (
        _local_bytes(policy.trainable, mesh) + _local_bytes(policy.frozen, mesh) + _local_bytes(rl_opt, mesh)
        + reference)
    dec = decoding(cfg, policy, mesh, shapes, host)
    rollout = _paged_programs if cfg.rl.sampling.engine == "paged" else _static_programs
    return rollout(cfg, mc, policy, dec, shapes, grid, resident, run)
