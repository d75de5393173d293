"""The vision-language model (vision tower + decoder) in Flax NNX, numerically equal to transformers 5.25's
`Qwen3VLForConditionalGeneration`, `Qwen2_5_VLForConditionalGeneration` and `Qwen3VLMoeForConditionalGeneration`
(the registry's architectures; spatial_jax/models/registry.py builds each from its config.json).

Public API (stable; sampling/ and rl/ build on it)
---------------------------------------------------
Config (spatial_jax.models.config)
    ModelConfig(text=TextConfig, vision=VisionConfig, lora=LoRAConfig, image_token_id, video_token_id,
                vision_start_token_id, vision_end_token_id, tie_word_embeddings, dtype, param_dtype)
    registry.config_from_hf(config_json_dict, lora=LoRAConfig(), dtype="float32", param_dtype=None) / config_to_hf(cfg)
    ModelConfig.tiny(vocab_size=256, image_token_id=None, ..., tie_word_embeddings=True, lora=LoRAConfig())
        (< 1M parameters; special ids default to the last four ids: image, video, vision start, vision end)
    LoRAConfig(rank, alpha, dropout, targets, vision_rank, vision_alpha, vision_targets); LoRAConfig.spatialcore()

Model
    model = Qwen3VL(cfg, rngs=nnx.Rngs(0))   or create_model(cfg, seed=0, mesh=None) (placed on a mesh)
    logits, new_cache = model(input_ids [B,T] int32, *, positions [3,B,T] int32 | None, attention_mask [B,T] | None,
                              pixel_values [P, C*tp*ps*ps] | None, image_grid_thw [n_img,3] | None,
                              vision: VisionInputs | None, cache: KVCache | None, cache_index: int32 scalar | None,
                              return_hidden=False)
        logits [B,T,V] float32 (or the final normed hidden states [B,T,D] in cfg.dtype when return_hidden).
        attention_mask: 1 = real token (left padding). Without a cache it is the whole sequence's mask; with a cache
        it is the mask of the T tokens of this call (stored into the cache's key mask at slots cache_index..+T).
        positions: from `get_rope_index` (prompt) and `rope.decode_positions` (continuation). When None (no cache),
        the model computes them as transformers does: text only, cumsum(attention_mask)-1 (traceable); with images,
        get_rope_index on the host, so input_ids, attention_mask and image_grid_thw must be concrete (not under
        jit). Inside jit with images, or with a cache, positions must be given (a ValueError otherwise).
        pixel_values + image_grid_thw (host arrays) are turned into `VisionInputs` here, so the transformers-style
        call `model(input_ids, pixel_values=..., image_grid_thw=..., attention_mask=...)` works eagerly; inside
        jit pass `vision=prepare_vision_inputs(pixel_values, image_grid_thw, cfg.vision, buckets=cfg.vision_buckets,
        num_frames=..., row_group=...)` and positions. The image tokens of input_ids (all rows, row-major) receive
        the merged patch features in order; with `row_group` (rows sharing images, e.g. G rollouts of a prompt)
        each row's image tokens receive the features of its group's images, encoded once.
    positions, rope_deltas = model.get_rope_index(input_ids, image_grid_thw, attention_mask)   # numpy, host side
        positions [3,B,T] int32, rope_deltas [B] int32 (HF's [B,1] squeezed); rope_index(cfg, ...) without a model.
        Qwen2.5-VL videos: second_per_grid= [items] beside image_grid_thw (the data layer's Batch.second_per_grid).
    cache = model.init_cache(batch, max_len, dtype=None)   # KVCache: keys/values tuples of [B,max_len,n_kv,hd],
        mask [B,max_len] int32. Prefill: model(prompt [B,T0], positions=..., attention_mask=prompt mask, vision=...,
        cache=cache, cache_index=0). Decode step s = 0, 1, ... feeds the s-th sampled token:
        model(tok [B,1], positions=decode_positions(prompt_mask.sum(1) + s, rope_deltas), attention_mask=ones [B,1],
        cache=cache, cache_index=T0 + s). Shapes are static, so one jit compile serves every step.
    Paged (spatial_jax.models.paged, continuous batching): cache=PagedKVCache(keys/values: per-layer page pools
        [pages, page_size, n_kv, hd], page_table [B, W], lengths [B]) and no cache_index; the T tokens come
        right-padded (real ones first) and go to logical positions lengths .. lengths+n-1 of their row's pages.
    model.lm_head_weight() -> W [D,V] (the embedding transposed when tied), for the fused log-prob kernel on
        `model(..., return_hidden=True)`.
    last, rest = model.shared_prefix_hidden(input_ids [B,P+N], positions=, attention_mask=, vision=, prompt_len=P,
        group=G): rows in runs of G sharing their first P tokens (G rollouts of a prompt) with each prompt run once;
        last [B/G, D] = hidden[::G, P-1], rest [B, N, D] = hidden[:, P:] of the whole forward, to float rounding.

Memory knobs (ModelConfig; results unchanged): `remat=True` (= `remat_policy="full"`) recomputes each decoder layer
    in the backward pass, `remat_policy="dots"` / `"dots_no_batch"` keeps the matmul outputs (spatial_jax.models.scan);
    `attention_chunk` (default 1024, 0 = off) runs queries in blocks so no [B, H, T, S] score tensor is live.
    `scan_layers=True` stacks the decoder layers' (and vision blocks') parameters on a leading "layers" axis
    (`model.layers` is then one DecoderLayer holding [L, ...] arrays) and runs them under lax.scan: compile time
    nearly independent of depth, same results. With a KV cache the stacked layers run in a Python loop instead
    (the cache stays per-layer tuples, written in place as before); Hugging Face checkpoints map to and from the
    stacks.

LoRA (spatial_jax.models.lora): every decoder q/k/v/o/gate/up/down projection (and the vision blocks' qkv, proj,
    linear_fc1/2 when vision_rank > 0) is a `LoRALinear`; adapter factors are `LoRAParam` variables (B starts at 0).
    `with disable_adapters(model): ...` runs the frozen base (the KL reference) from the same weights;
    `merge_lora(model)` returns a merged copy; dropout runs only under
    `nnx.view(model, deterministic=False, raise_if_not_found=False)`.

Sharding (spatial_jax.models.sharding): parameters carry logical axis names; `RULES` maps them to the mesh axes of
    `make_mesh(data, fsdp, tensor)`; `shard_model(model, mesh)` places parameters; run the forward under
    `jax.set_mesh(mesh)` to constrain activations.

Checkpoints (spatial_jax.models.hf_io, exported by spatial_jax.models): `from_pretrained(path, dtype=...,
    param_dtype=..., mesh=None, lora=...)`, `save_pretrained(model, path)` (adapters merged), `load_config(path)`,
    in HF safetensors layout, without torch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spatial_jax.models import rope
from spatial_jax.models.attention import AttentionMask
from spatial_jax.models.config import ModelConfig
from spatial_jax.models.layers import Embed, RMSNorm, param, random_normal
from spatial_jax.models.paged import PagedKVCache, paged_inputs
from spatial_jax.models.registry import architecture
from spatial_jax.models.scan import REMAT_POLICIES, run_stack, stack_modules
from spatial_jax.models.sharding import constrain, shard_model
from spatial_jax.models.text import DecoderLayer, KVCache, attention_mask_for
from spatial_jax.models.vision import VisionInputs, count_features, feature_slots, prepare_vision_inputs


def rope_index(cfg: ModelConfig, input_ids, image_grid_thw=None, attention_mask=None,
               second_per_grid=None) -> tuple[np.ndarray, np.ndarray]:
    """rope.get_rope_index with cfg's rules (its special ids, merge size and tokens_per_second): every host-side
    position of a prompt goes through here, so an architecture's video timing cannot be left out. second_per_grid
    [items] beside image_grid_thw: seconds per temporal patch of each video item (Qwen2.5-VL; None: 1 second)."""
    return rope.get_rope_index(
        np.asarray(input_ids),
        None if image_grid_thw is None else np.asarray(image_grid_thw),
        None if attention_mask is None else np.asarray(attention_mask),
        image_token_id=cfg.image_token_id,
        spatial_merge_size=cfg.vision.spatial_merge_size,
        video_token_id=cfg.video_token_id,
        tokens_per_second=cfg.vision.tokens_per_second,
        second_per_grid=second_per_grid,
    )


def _is_concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def _run_layer(layer, *args):
    return layer(*args)


def _run_shared_layer(layer, *args):
    return layer.shared(*args)


class Qwen3VL(nnx.Module):
    """The whole vision-language model of every registered architecture (spatial_jax.models.registry: Qwen3-VL,
    Qwen2.5-VL, Qwen3-VL-MoE, told apart by the config's switches); attribute names follow HF's module tree."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        t = cfg.text
        self.cfg = cfg
        self.visual = architecture(cfg.model_type).vision_tower(cfg, rngs=rngs)
        self.embed_tokens = Embed(t.vocab_size, t.hidden_size, axes=("vocab", "embed"), dtype=cfg.dtype,
                                  param_dtype=cfg.param_dtype, rngs=rngs)
        layers = [DecoderLayer(cfg, i, rngs=rngs) for i in range(t.num_hidden_layers)]
        # stacked from the same per-layer draws, so a scanned model equals the unrolled one of the same seed
        self.layers = stack_modules(layers) if cfg.scan_layers else nnx.List(layers)
        self.norm = RMSNorm(t.hidden_size, eps=t.rms_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype)
        if cfg.tie_word_embeddings:
            self.lm_head = None
        else:
            w = random_normal(rngs.params(), (t.hidden_size, t.vocab_size), t.hidden_size**-0.5,
                              jnp.dtype(cfg.param_dtype))
            self.lm_head = param(w, ("embed", "vocab"))

    def lm_head_weight(self) -> jax.Array:
        """Output projection W [D, V] in the parameter dtype (tied: the token embedding transposed)."""
        if self.lm_head is None:
            return self.embed_tokens.embedding[...].T
        return self.lm_head[...]

    def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
        return KVCache.zeros(self.cfg, batch, max_len, dtype)

    def get_rope_index(self, input_ids, image_grid_thw=None, attention_mask=None,
                       second_per_grid=None) -> tuple[np.ndarray, np.ndarray]:
        """`rope_index` of this model's config."""
        return rope_index(self.cfg, input_ids, image_grid_thw, attention_mask, second_per_grid)

    def __call__(
        self,
        input_ids: jax.Array,
        *,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        pixel_values=None,
        image_grid_thw=None,
        vision: VisionInputs | None = None,
        cache: KVCache | None = None,
        cache_index: jax.Array | int | None = None,
        return_hidden: bool = False,
    ) -> tuple[jax.Array, KVCache | None]:
        cfg = self.cfg
        input_ids = jnp.asarray(input_ids, jnp.int32)
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {input_ids.shape}")
        B, T = input_ids.shape
        # Checks on host values only; inside a trace (even of constants) they are skipped.
        host_ids = np.asarray(input_ids) if _is_concrete(input_ids) else None
        if host_ids is not None and host_ids.size and (host_ids.min() < 0 or host_ids.max() >= cfg.text.vocab_size):
            raise ValueError(f"input_ids outside the vocabulary [0, {cfg.text.vocab_size})")
        host_mask = attention_mask  # as given: get_rope_index below needs it on the host
        attention_mask = jnp.ones((B, T), jnp.int32) if attention_mask is None else jnp.asarray(attention_mask)
        if attention_mask.shape != (B, T):
            raise ValueError(f"attention_mask shape {attention_mask.shape} != input_ids shape {(B, T)}")
        paged = isinstance(cache, PagedKVCache)
        if paged and cache_index is not None:
            raise ValueError("a PagedKVCache carries its rows' lengths: give no cache_index")
        if not paged and (cache is None) != (cache_index is None):
            raise ValueError("cache and cache_index go together")
        if pixel_values is not None:
            if vision is not None or image_grid_thw is None:
                raise ValueError("give pixel_values together with image_grid_thw, or vision=VisionInputs, not both")
            vision = prepare_vision_inputs(pixel_values, image_grid_thw, cfg.vision, buckets=cfg.vision_buckets)
        if positions is None:
            if cache is not None:
                raise ValueError("positions are required with a cache: get_rope_index(prompt ids, image_grid_thw, "
                                 "prompt mask) for the prefill, decode_positions(...) for each decode step")
            if vision is not None:
                if host_ids is None or image_grid_thw is None or not _is_concrete(image_grid_thw, host_mask):
                    raise ValueError(
                        "positions are required with images unless input_ids, attention_mask and image_grid_thw are "
                        "concrete host arrays (not traced under jit): pass "
                        "positions=model.get_rope_index(input_ids, image_grid_thw, attention_mask)[0]")
                positions = jnp.asarray(self.get_rope_index(host_ids, image_grid_thw, host_mask)[0])
            else:
                # Text only: equals get_rope_index on a left-padded batch (otherwise it differs only at padding,
                # which is masked out) and, unlike it, traces under jit.
                positions = jnp.broadcast_to(jnp.maximum(jnp.cumsum(attention_mask, axis=1) - 1, 0)[None], (3, B, T))
        positions = jnp.asarray(positions)
        if positions.shape != (3, B, T):
            raise ValueError(f"positions must be [3, B, T] = {(3, B, T)}, got {positions.shape}")

        x = constrain(self.embed_tokens(input_ids), ("batch", "seq", "act_embed"))
        # DeepStack: the first len(injections) layers get the multi-level visual features added to their output
        injections: list[jax.Array] = []
        if vision is not None:
            img_mask = (input_ids == cfg.image_token_id) | (input_ids == cfg.video_token_id)  # video frames too
            if host_ids is not None and _is_concrete(vision.segment_ids, vision.row_feature_count):
                n_feat = count_features(vision, cfg.vision.spatial_merge_size)
                is_img = (host_ids == cfg.image_token_id) | (host_ids == cfg.video_token_id)
                n_tok = is_img.sum(1) if np.ndim(n_feat) else int(is_img.sum())
                if np.shape(n_tok) != np.shape(n_feat) or np.any(n_tok != n_feat):
                    raise ValueError(f"image tokens ({np.asarray(n_tok).tolist()}) and image features "
                                     f"({np.asarray(n_feat).tolist()}) do not match")
            feats, injections = self._image_features(vision, img_mask, feature_slots(vision, img_mask), x.dtype)
            x = jnp.where(img_mask[..., None], feats, x)

        cos, sin = self._rotary(positions, x.dtype)
        if paged:  # cache_index becomes the flat page indices every layer writes and reads
            mask, cache_index, new_lengths = paged_inputs(cache, attention_mask)
        else:
            mask, key_mask = attention_mask_for(attention_mask, cache, cache_index)

        # Recomputation only pays in a backward pass; with a KV cache (sampling) the plain layer also runs inside
        # the sampler's while_loop, where the lifted remat cannot reach the loop's state.
        remat = "none" if cache is not None else cfg.decoder_remat
        if cfg.scan_layers:
            x, new_keys, new_values = self._run_stacked(x, cos, sin, mask, injections, cache, cache_index, remat)
        else:
            run_layer = _run_layer if remat == "none" else nnx.remat(_run_layer, policy=REMAT_POLICIES[remat])
            new_keys, new_values = [], []
            for i, layer in enumerate(self.layers):
                kv = None if cache is None else (cache.keys[i], cache.values[i])
                x, new_kv = run_layer(layer, x, cos, sin, mask, kv, cache_index)
                if new_kv is not None:
                    new_keys.append(new_kv[0])
                    new_values.append(new_kv[1])
                if i < len(injections):
                    x = x + injections[i]
        x = self.norm(x)
        if paged:
            new_cache = cache.replace(keys=tuple(new_keys), values=tuple(new_values), lengths=new_lengths)
        else:
            new_cache = None if cache is None else KVCache(keys=tuple(new_keys), values=tuple(new_values),
                                                           mask=key_mask)
        if return_hidden:
            return x, new_cache
        logits = jnp.dot(x, self.lm_head_weight().astype(x.dtype), preferred_element_type=jnp.float32)
        return constrain(logits, ("batch", "seq", "act_vocab")), new_cache

    def shared_prefix_hidden(self, input_ids: jax.Array, *, positions: jax.Array, attention_mask: jax.Array,
                             vision: VisionInputs | None, prompt_len: int, group: int) -> tuple[jax.Array, jax.Array]:
        """The final normed hidden states of rows whose first `prompt_len` tokens are the same in each run of
        `group` consecutive rows (the G rollouts of a prompt), with each prompt run through the decoder once:
        returns (the prompt's last position [B/G, D], the completion positions [B, N, D]), equal to the whole
        forward's hidden[::G, P - 1] and hidden[:, P:] to float rounding. Image tokens must lie in the prompts
        (they are written into the prompt rows alone); the caller checks the rows on the host
        (rl.step.make_seq_batch)."""
        cfg, G, P = self.cfg, group, prompt_len
        B, L = input_ids.shape
        if group < 1 or B % group or not 0 < P < L:
            raise ValueError(f"a shared-prefix forward wants rows in whole groups of {group} and 0 < prompt_len < "
                             f"{L}; got {B} rows, prompt_len {P}")
        if positions.shape != (3, B, L) or attention_mask.shape != (B, L):
            raise ValueError(f"positions {positions.shape} / attention_mask {attention_mask.shape} do not fit "
                             f"input_ids {(B, L)}")
        ids = (input_ids[::G, :P], input_ids[:, P:])
        am = (attention_mask[::G, :P].astype(jnp.int32), attention_mask[:, P:].astype(jnp.int32))
        x = tuple(constrain(self.embed_tokens(i), ("batch", "seq", "act_embed")) for i in ids)
        dtype = x[0].dtype
        injections: list[jax.Array] = []
        if vision is not None:
            img_mask = (input_ids == cfg.image_token_id) | (input_ids == cfg.video_token_id)
            idx = feature_slots(vision, img_mask)[::G, :P]  # a group's first row's slots serve the whole group
            img_mask = img_mask[::G, :P]
            feats, injections = self._image_features(vision, img_mask, idx, dtype)
            x = (jnp.where(img_mask[..., None], feats, x[0]), x[1])
        cos_p, sin_p = self._rotary(positions[:, ::G, :P], dtype)
        cos_s, sin_s = self._rotary(positions[:, :, P:], dtype)
        seg = tuple((a > 0).astype(jnp.int32) for a in am)
        mask = (AttentionMask(segment_ids=seg[0], causal=True),
                AttentionMask(segment_ids=seg[1], kv_segment_ids=jnp.concatenate([jnp.repeat(seg[0], G, 0), seg[1]],
                                                                                  axis=1),
                              causal=True, causal_offset=P))
        args = ((cos_p, cos_s), (sin_p, sin_s), mask, G)
        remat = cfg.decoder_remat
        if cfg.scan_layers:
            def step(layer, x, extra):
                xp, xs = layer.shared(x, *args)
                return (xp if extra is None else xp + extra), xs

            x = self._scan_uncached(x, step, injections, remat)
        else:
            run = _run_shared_layer if remat == "none" else nnx.remat(_run_shared_layer, policy=REMAT_POLICIES[remat],
                                                                      static_argnums=(5,))
            for i, layer in enumerate(self.layers):
                x = run(layer, x, *args)
                if i < len(injections):
                    x = (x[0] + injections[i], x[1])
        return self.norm(x[0])[:, -1], self.norm(x[1])

    def _rotary(self, positions: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
        """The M-RoPE (cos, sin) tables of positions [3, B, T] in the compute dtype."""
        t = self.cfg.text
        cos, sin = rope.mrope_cos_sin(positions, t.head_dim, t.rope_theta, t.mrope_section, t.mrope_interleaved)
        return cos.astype(dtype), sin.astype(dtype)

    def _image_features(self, vision: VisionInputs, img_mask: jax.Array, idx: jax.Array,
                        dtype) -> tuple[jax.Array, list[jax.Array]]:
        """The tower's merged features at the image tokens of img_mask [B, T] (feature slots idx [B, T]) and its
        DeepStack features likewise, each [B, T, D] with 0 at the other tokens."""
        feats, deepstack = self.visual(vision)

        def at_tokens(f):
            return jnp.where(img_mask[..., None], jnp.take(f, idx, axis=0).astype(dtype), 0)

        return at_tokens(feats), [at_tokens(d) for d in deepstack]

    def _scan_uncached(self, x, step, injected, remat):
        """x through the stacked decoder layers without a KV cache, x = step(layer, x, extra) with `extra` the
        layer's DeepStack features (None past them): one scan over the DeepStack layers (their features as
        per-layer inputs) and one over the rest, so no [L, B, T, D] array of zeros is built for the layers without
        features."""
        def layer_fn(layer, x, extra):
            return step(layer, x, extra), None

        n = len(injected)
        if n:
            x, _ = run_stack(self.layers, layer_fn, x, jnp.stack(injected), stop=n, remat=remat)
        if n < self.cfg.text.num_hidden_layers:
            x, _ = run_stack(self.layers, layer_fn, x, start=n, remat=remat)
        return x

    def _run_stacked(self, x, cos, sin, mask, injected, cache, cache_index, remat):
        """The stacked decoder layers (_scan_uncached without a KV cache). With a KV cache the layers run in a
        Python loop over parameter slices: each layer's cache array is then updated in place by its own
        dynamic_update_slice, where a scan's outputs would be fresh buffers, a copy of the whole [L, B, S, ...]
        cache per decode step (and the sampler compiles once per shape, not once per update)."""
        if cache is not None:
            def decode_layer(layer, x, inputs):
                kv, extra = inputs
                x, new_kv = layer(x, cos, sin, mask, kv, cache_index)
                return (x if extra is None else x + extra), new_kv

            extras = list(injected) + [None] * (len(cache.keys) - len(injected))
            x, kvs = run_stack(self.layers, decode_layer, x, list(zip(zip(cache.keys, cache.values), extras)),
                               scan=False)
            return x, [k for k, _ in kvs], [v for _, v in kvs]

        def step(layer, x, extra):
            x, _ = layer(x, cos, sin, mask)
            return x if extra is None else x + extra

        return self._scan_uncached(x, step, injected, remat), [], []


def create_model(cfg: ModelConfig, *, seed: int = 0, mesh: jax.sharding.Mesh | None = None) -> Qwen3VL:
    """A randomly initialised model (built on the host), placed on `mesh` by the sharding rules when given.
    For real checkpoints use hf_io.from_pretrained, which never materialises a random initialisation."""
    model = Qwen3VL(cfg, rngs=nnx.Rngs(seed))
    return model if mesh is None else shard_model(model, mesh)
