"""The continuous-batching engine (rollout/engine.py, paged KV in models/paged.py) against the static sampler, against
transformers' generate and against full forwards, on the tiny model and batch of test_sampler (two rows with images
of different sizes, one text-only), with fewer slots than requests and pages that run out.

Tolerances: engine and static sampler compute the same float32 logits by different attention layouts (gathered
pages vs one buffer): log-probs and entropies agree to 1e-6 + 1e-6 relative, and so do they against one full forward
(the training forward's logits); a float32 ulp at 4 nats is 4.8e-7. Observed: <= 9.6e-7 on an AMD EPYC host, <= 1.9e-6
at 2.4 nats on an Intel Xeon one (XLA:CPU's code differs between them, and so does its rounding).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_kernels_pallas_tpu import _tpu_topology
from test_sampler import GREEDY, N_NEW, _check_against_full_forward, _full_forward, _hf_greedy, _max_len, batch, tiny  # noqa: F401 (fixtures)

from spatial_jax.models import ModelConfig, Qwen3VL, paged
from spatial_jax.models.attention import AttentionMask, attention
from spatial_jax.models.paged import PagedKVCache
from spatial_jax.rollout import SamplingConfig, generate
from spatial_jax.rollout import engine as eng
from spatial_jax.rollout import logits as lg
from spatial_jax.rollout.engine import Engine

TIGHT = 1e-6
SMALL = dict(slots=2, page_size=8, chunk=4)
SAMPLED = SamplingConfig(temperature=1.3, top_p=0.95, top_k=40, max_new_tokens=N_NEW, seed=7)


def _one(mask) -> int:
    """Pages (of SMALL's size) the longest request can need."""
    return -(-(int(mask.sum(1).max()) + N_NEW) // SMALL["page_size"])


def _paged(model, batch_, cfg, **kw):
    """Through the engine with SMALL's slots and a pool too small for both slots' longest requests at once."""
    _, ids, mask, pv, grid = batch_
    kw = dict(SMALL, pages=_one(mask) + 2, **kw)
    return eng.generate(model, ids, mask, cfg=dataclasses.replace(cfg, engine="paged", **kw), pixel_values=pv,
                        image_grid_thw=grid, max_len=_max_len(ids))


def _static(model, batch_, cfg, row_ids=None):
    _, ids, mask, pv, grid = batch_
    out, _ = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, cfg=cfg, max_len=_max_len(ids),
                      row_ids=row_ids)
    return jax.tree.map(np.asarray, out)


def _same(a, b):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.mask, b.mask)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=TIGHT, rtol=TIGHT)
    np.testing.assert_allclose(a.entropies, b.entropies, atol=TIGHT, rtol=TIGHT)


@pytest.mark.slow
def test_greedy_equals_static_sampler_and_transformers_with_fewer_slots_than_requests(tiny, batch):  # noqa: F811 (fixtures)
    torch = pytest.importorskip("torch")
    hf, model = tiny
    rows, ids, mask, pv, grid = batch
    out = _paged(model, batch, GREEDY, **SMALL)  # row 2 waits for a slot
    _same(out, _static(model, batch, GREEDY))
    np.testing.assert_array_equal(out.tokens, _hf_greedy(torch, hf, model, ids, mask, pv, grid))


def test_sampled_rows_equal_the_static_sampler_whatever_slot_they_take(tiny, batch):  # noqa: F811 (fixtures)
    """Draws are keyed by row id: two slots for three requests (the last reuses a finished one's slot and pages), stop
    tokens ending rows early, and the log-probs/entropies of one full forward."""
    _, model = tiny
    rows, ids, mask, pv, grid = batch
    free = _static(model, batch, SAMPLED)
    cfg = dataclasses.replace(SAMPLED, stop_token_ids=(int(free.tokens[1, 2]),))
    ref = _static(model, batch, cfg)
    assert ref.mask.sum() < 3 * N_NEW
    out = _paged(model, batch, cfg)
    _same(out, ref)
    comps = _check_against_full_forward(model, rows, pv, grid, out, cfg.temperature)
    full, _ = _full_forward(model, [r + c for r, c in zip(rows, comps)], pv, grid)
    for i, c in enumerate(comps):  # and to float32 rounding: 1e-6 plus 1e-6 relative
        step_logits = jnp.asarray(full[i, np.arange(full.shape[1] - len(c) - 1, full.shape[1] - 1)])
        expected = lg.token_logprob(step_logits, jnp.asarray(c), cfg.temperature)
        np.testing.assert_allclose(out.logprobs[i, : len(c)], expected, atol=TIGHT, rtol=TIGHT)
        np.testing.assert_allclose(out.entropies[i, : len(c)], lg.entropy(step_logits), atol=TIGHT, rtol=TIGHT)


def test_page_exhaustion_waits_for_pages_or_fails_clearly(tiny, batch):  # noqa: F811 (fixtures)
    """A pool too small for all slots at once still decodes everything exactly (slots sit out chunks until pages
    free up; when none can run, the youngest first-round request restarts and redraws the same tokens); a pool that
    cannot hold one request raises instead of hanging; so does a request over max_len."""
    _, model = tiny
    rows, ids, mask, pv, grid = batch
    longest = int(mask.sum(1).max()) + N_NEW
    one = _one(mask)
    engine = Engine(model, GREEDY, max_len=_max_len(ids), pages=one + 2, **SMALL)
    reqs = eng.split_rows(ids, mask, pv, grid, eng.image_counts_of(model.cfg, ids, mask, grid))
    rounds = engine.run(reqs)
    ref = _static(model, batch, GREEDY)
    for r, (rnd,) in enumerate(rounds):
        np.testing.assert_array_equal(rnd.tokens, ref.tokens[r])
    assert engine.stats["paused"] > 0 and engine.stats["restarts"] > 0  # the pool ran short: waits and a restart
    assert engine.free_pages == list(range(paged.SCRATCH_PAGE + 1, engine.pages))  # every page back, once
    small = Engine(model, GREEDY, max_len=_max_len(ids), pages=2, **SMALL)  # one page: not even a prompt fits
    with pytest.raises(RuntimeError, match="KV page pool exhausted"):
        small.run(reqs)
    with pytest.raises(ValueError, match="KV cache overflow"):
        Engine(model, GREEDY, max_len=longest - 1, **SMALL).run(reqs)


def test_engine_config_is_typed():
    with pytest.raises(ValueError, match="engine"):
        SamplingConfig(engine="dynamic")
    with pytest.raises(ValueError, match="pages"):
        SamplingConfig(pages=1)
    with pytest.raises(ValueError, match="page_size"):
        SamplingConfig(page_size=0)


def test_decode_chunk_updates_the_page_pools_in_place():
    """The compiled decode chunk writes each step's keys/values into the pools without copying them (a copy per step
    would cost the whole pool's bytes every token)."""
    model = Qwen3VL(ModelConfig.tiny(vocab_size=64), rngs=nnx.Rngs(1))
    keys, values = PagedKVCache.zeros(model.cfg, 37, 16)
    S, t = 4, model.cfg.text
    ints = lambda x: jnp.full((S,), x, jnp.int32)
    args = (*nnx.split(model), keys, values, jnp.zeros((S, 64)), jnp.zeros((S, 4), jnp.int32), ints(0), ints(0),
            jnp.ones((S,), bool), jnp.arange(S), ints(0), ints(8), jax.random.PRNGKey(0), jnp.asarray([-1]),
            jnp.asarray([60, 61]), GREEDY, 4)
    hlo = eng._chunk_jit.lower(*args).compile().as_text()
    pool = (f"f32[{t.num_key_value_heads},37,16,{t.head_dim}]", f"f32[{t.num_key_value_heads},592,{t.head_dim}]")
    pooled = [line for line in hlo.splitlines() if any(p + "{" in line for p in pool)]
    assert pooled and "while" in hlo  # the pools' buffers are named as this test looks for them
    assert [line for line in pooled if " copy(" in line] == []


def _kernel_case(kv=2, heads=4, hd=16, pages=9, ps=4, lengths=(5, 11, 9), dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    table = np.asarray([[1, 2, 0, 0], [3, 4, 5, 0], [6, 7, 8, 0]], np.int32)
    pools = [jnp.asarray(rng.normal(size=(kv, pages, ps, hd)), dtype) for _ in range(2)]
    q = jnp.asarray(rng.normal(size=(len(table), 1, heads, hd)), dtype)
    read = (table[:, :, None] * ps + np.arange(ps)).reshape(len(table), -1)
    index = paged.PagedIndex(write=None, read=jnp.asarray(read), page_table=jnp.asarray(table),
                             lengths=jnp.asarray(lengths, jnp.int32))
    return q, pools, index, table


def test_tpu_paged_attention_kernel_matches_a_numpy_reference_interpreted():
    """jax's TPU paged-attention kernel (the decode step's attention on TPU), run in the Pallas TPU interpreter, and
    the XLA gather path against numpy: each row's first `lengths` positions over its pages, GQA heads. Tolerance:
    the XLA path 1e-6; the kernel 2e-2 (its matmuls take the TPU's default precision, bfloat16 passes)."""
    q, (pk, pv), index, table = _kernel_case()
    hd, heads, kv = q.shape[-1], q.shape[2], pk.shape[0]
    ref = np.zeros((len(table), heads, hd))
    for b, L in enumerate(np.asarray(index.lengths)):
        k, v = (np.concatenate([np.asarray(p)[:, page] for page in table[b]], axis=1)[:, :L] for p in (pk, pv))
        for h in range(heads):
            s = k[h // (heads // kv)] @ np.asarray(q)[b, 0, h] * hd**-0.5
            w = np.exp(s - s.max())
            ref[b, h] = (w / w.sum()) @ v[h // (heads // kv)]
    out = np.asarray(paged.decode_attention(q, pk, pv, index, hd**-0.5))[:, 0]
    np.testing.assert_allclose(out, ref, atol=2e-2)
    k, v = paged.read(pk, index), paged.read(pv, index)
    visible = jnp.arange(k.shape[1])[None, None, :] < index.lengths[:, None, None]
    xla = attention(q, k, v, AttentionMask(dense=visible), scale=hd**-0.5, impl="xla")
    np.testing.assert_allclose(np.asarray(xla)[:, 0], ref, atol=1e-6)


def test_tpu_paged_attention_kernel_per_shard_equals_one_device_interpreted():
    """Under a mesh of 4 CPU devices (rows over data, heads over tensor) the kernel runs per shard in shard_map and
    gives the one-device result (interpreted; same kernel, same precision per head: 1e-6)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    q, (pk, pv), index, _ = _kernel_case(lengths=(5, 11, 9, 3))
    index = index.replace(page_table=jnp.concatenate([index.page_table, index.page_table[:1]]),
                          read=jnp.concatenate([index.read, index.read[:1]]))
    q = jnp.concatenate([q, -q[:1]])
    one = paged.decode_attention(q, pk, pv, index, 0.25)
    mesh = Mesh(np.asarray(jax.devices()[:4]).reshape(2, 1, 2), ("data", "fsdp", "tensor"))
    put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))
    with jax.set_mesh(mesh):
        assert paged.uses_kernel("splash", q.dtype, 1)
        index = index.replace(page_table=put(index.page_table, "data"), lengths=put(index.lengths, "data"))
        out = jax.jit(paged.decode_attention, static_argnums=4)(
            put(q, "data", None, "tensor"), put(pk, "tensor"), put(pv, "tensor"), index, 0.25)
    np.testing.assert_allclose(np.asarray(out), np.asarray(one), atol=1e-6)


def test_tpu_paged_decode_compiles_for_a_tpu_chip():
    """The decode step's paged attention (write into the pools, then the kernel) compiled by XLA:TPU for one v5p
    chip (libtpu, no TPU needed) at a 4B-like shape in bfloat16: a Mosaic kernel, no gather of the rows' pages."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = _tpu_topology("v5p:2x2x1")
    mesh = Mesh(np.asarray(devices[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    B, H, kv, hd, pages, ps, W = 16, 32, 8, 128, 256, 16, 32
    arg = lambda shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, P()))

    def step(q, k_new, v_new, pk, pv, write, table, lengths):
        index = paged.PagedIndex(write=write, read=None, page_table=table, lengths=lengths)
        pk, pv = paged.write(pk, pv, k_new, v_new, index)
        assert paged.uses_kernel("auto", q.dtype, 1)
        return paged.decode_attention(q, pk, pv, index, hd**-0.5), pk, pv

    with jax.set_mesh(mesh):
        compiled = jax.jit(step, donate_argnums=(3, 4)).lower(
            arg((B, 1, H, hd)), arg((B, 1, kv, hd)), arg((B, 1, kv, hd)), arg((kv, pages, ps, hd)),
            arg((kv, pages, ps, hd)), arg((B, 1), jnp.int32), arg((B, W), jnp.int32), arg((B,), jnp.int32)).compile()
    text = compiled.as_text()
    assert 'custom_call_target="tpu_custom_call"' in text
    assert f"[{B},{W * ps},{kv},{hd}]" not in text  # the XLA path's gathered pages are never built


def test_tpu_paged_decode_compiles_sharded_for_four_tpu_chips():
    """The same decode step on a v5p:2x2x1 mesh (rows over data=2, kv heads over tensor=2, pools sharded on their
    kv heads): the kernel runs per shard (a Mosaic call in the program) and no pool crosses devices (no collective
    carries a pool's shape, global or per shard)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = _tpu_topology("v5p:2x2x1")
    mesh = Mesh(np.asarray(devices).reshape(2, 1, 2), ("data", "fsdp", "tensor"))
    B, H, kv, hd, pages, ps, W = 16, 32, 8, 128, 256, 16, 32
    arg = lambda shape, *spec, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, P(*spec)))
    rows = ("data", "fsdp")

    def step(q, k_new, v_new, pk, pv, write, table, lengths):
        index = paged.PagedIndex(write=write, read=None, page_table=table, lengths=lengths)
        pk, pv = paged.write(pk, pv, k_new, v_new, index)
        assert paged.uses_kernel("auto", q.dtype, 1)
        return paged.decode_attention(q, pk, pv, index, hd**-0.5), pk, pv

    with jax.set_mesh(mesh):
        pool = arg((kv, pages, ps, hd), "tensor")
        compiled = jax.jit(step, donate_argnums=(3, 4)).lower(
            arg((B, 1, H, hd), rows, None, "tensor"), arg((B, 1, kv, hd), rows, None, "tensor"),
            arg((B, 1, kv, hd), rows, None, "tensor"), pool, pool, arg((B, 1), rows, dt=jnp.int32),
            arg((B, W), rows, dt=jnp.int32), arg((B,), rows, dt=jnp.int32)).compile()
    text = compiled.as_text()
    assert 'custom_call_target="tpu_custom_call"' in text
    shapes = [f"[{n},{pages},{ps},{hd}]" for n in (kv, kv // 2)] + [f"[{n},{pages * ps},{hd}]" for n in (kv, kv // 2)]
    collectives = [line for line in text.splitlines()
                   if any(c in line for c in ("all-gather", "all-to-all", "collective-permute", "all-reduce"))]
    assert [line for line in collectives if any(s in line for s in shapes)] == []
    assert f"[{B},{W * ps},{kv},{hd}]" not in text and f"[{B // 2},{W * ps},{kv // 2},{hd}]" not in text


def test_tokens_unchanged_with_the_gpu_decode_kernel_and_command_buffers(tiny, batch, monkeypatch):  # noqa: F811
    """decode_kernel "pallas" (kernels/attention/paged.py, interpreted here) with command buffers (compiler options
    the CPU compiler checks and ignores) draws the tokens of the plain engine, log-probs to float32 rounding; a
    graph that fails to compile falls back to the plain chunk and says why."""
    _, model = tiny
    _, ids, mask, pv, grid = batch
    base = _paged(model, batch, GREEDY, **SMALL)
    _same(_paged(model, batch, GREEDY, **SMALL, decode_kernel="pallas", command_buffers=True), base)
    broken = jax.jit(eng._chunk_impl, static_argnums=(0, 15, 16), donate_argnums=(2, 3, 4),
                     compiler_options={"xla_gpu_enable_command_buffer": "NO_SUCH_COMMAND"})
    monkeypatch.setattr(eng, "_chunk_graph_jit", broken)
    engine = Engine(model, dataclasses.replace(GREEDY, command_buffers=True), max_len=_max_len(ids),
                    pages=_one(mask) + 2, **SMALL)  # _paged's pool: the plain chunk is compiled already
    rounds = engine.run(eng.split_rows(ids, mask, pv, grid, eng.image_counts_of(model.cfg, ids, mask, grid)))
    assert "NO_SUCH_COMMAND" in engine.command_buffer_error
    for r, (rnd,) in enumerate(rounds):
        np.testing.assert_array_equal(rnd.tokens, base.tokens[r, : base.mask[r].sum()])
