"""The grain input pipeline: samples -> image patches + the method's prompt ids -> left-padded, bucketed batches.

Order is a pure function of the seed (grain's index shuffle, reshuffled each epoch), and the iterator's position is
a small dict (`get_state` / `set_state`) that the trainer checkpoints; restoring it yields the same next batch.
Modes: "rl" batches prompts only (the sampler generates the completion); "sft" appends the method's reference
completion and `<|im_end|>`, with loss_mask marking those completion tokens (completion-only cross-entropy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from spatial_jax.config import check_at_least, check_range, require
from spatial_jax.data import prompts
from spatial_jax.data.image_processing import ImageProcessingConfig, num_image_tokens, preprocess
from spatial_jax.data.prompts import PromptFormat
from spatial_jax.data.sample import DatasetError, Sample
from spatial_jax.data.synthetic import SyntheticConfig, SyntheticSource
from spatial_jax.data.tokenizer import SpatialTokenizer

PreprocessFn = Callable[[Sequence[np.ndarray], Any], tuple[np.ndarray, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the data comes from and how it is batched; `train` / `eval` are JSONL paths or `synthetic:<split>:<n>`.
    `sft_train` is the SFT cold start's own source (its reference completions); empty means `train`.
    bucket_lengths: the padded sequence lengths a batch may take (the smallest that fits its longest row); seed
    orders the training source (grain's index shuffle, reshuffled each epoch). max_image_pixels: larger image files
    are refused from their header, before decoding (a decompression bomb); the default is PIL's own warning limit."""

    train: str = "synthetic:train:1000"
    eval: str = "synthetic:heldout:200"
    sft_train: str = ""
    synthetic: SyntheticConfig = dataclasses.field(default_factory=SyntheticConfig)
    bucket_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    seed: int = 0
    read_threads: int = 0
    max_image_pixels: int = 89_478_485

    def __post_init__(self):
        lengths = self.bucket_lengths
        require("bucket_lengths", lengths, bool(lengths) and all(isinstance(b, int) and b >= 1 for b in lengths),
                "be positive lengths")
        require("bucket_lengths", lengths, list(lengths) == sorted(set(lengths)), "be strictly increasing")
        check_range(self, "seed", 0, 2**32 - 1)  # grain's shuffle takes a uint32
        check_at_least(self, read_threads=0, max_image_pixels=1)
        for name in ("train", "eval"):
            require(name, getattr(self, name), bool(getattr(self, name)),
                    "name a JSONL file or synthetic:<split>:<count>")


def train_iterator(
    data: DataConfig,
    tokenizer: SpatialTokenizer,
    fmt: PromptFormat,
    batch_size: int,
    mode: Literal["rl", "sft"] = "rl",
    image_cfg: Any = ImageProcessingConfig(),
) -> DataIterator:
    """Shuffled batches of the training source (mode "sft": data.sft_train when set), repeated forever; checkpoint it
    with get_state / set_state."""
    source = data.sft_train if mode == "sft" and data.sft_train else data.train
    return make_iterator(open_source(source, data.synthetic), tokenizer, data, fmt, batch_size, mode=mode,
                         image_cfg=image_cfg)


def eval_iterator(
    data: DataConfig,
    tokenizer: SpatialTokenizer,
    fmt: PromptFormat,
    batch_size: int,
    image_cfg: Any = ImageProcessingConfig(),
) -> DataIterator:
    """The evaluation source once, in file order; the last batch may be smaller."""
    return make_iterator(open_source(data.eval, data.synthetic), tokenizer, data, fmt, batch_size, shuffle=False,
                         num_epochs=1, drop_remainder=False, image_cfg=image_cfg)


def open_source(spec: str, synthetic_cfg: Any = None, check_images: bool = True) -> Sequence[Sample]:
    """`path/to/data.jsonl`, or `synthetic:<split>:<num>` (split train or heldout) drawn from synthetic_cfg."""
    if spec.startswith("synthetic:"):
        parts = spec.split(":")
        if len(parts) != 3 or not parts[2].isdigit():
            raise DatasetError(f"synthetic source {spec!r} must read synthetic:<train|heldout>:<count>")
        try:
            return SyntheticSource(synthetic_cfg or SyntheticConfig(), parts[1], int(parts[2]))
        except ValueError as e:
            raise DatasetError(f"synthetic source {spec!r}: {e}") from None
    from spatial_jax.data.jsonl import read_jsonl

    return read_jsonl(spec, check_images=check_images)


@dataclasses.dataclass(frozen=True)
class Example:
    """One encoded sample: token ids (prompt, then the completion in SFT mode) and its image patches."""

    input_ids: np.ndarray  # int32 [n]
    prompt_length: int
    pixel_values: np.ndarray  # float32 [patches, C*tp*ps*ps]
    image_grid_thw: np.ndarray  # int64 [1, 3]
    sample: Sample


@dataclasses.dataclass(frozen=True)
class Batch:
    """Rows are left-padded to `input_ids.shape[1]` (a bucket length); pixel_values concatenates the rows' patches.

    prompt_lengths counts each row's prompt tokens (RL: the whole row); loss_mask (SFT only) is 1 on the reference
    completion and its closing <|im_end|>. records are the samples, for scoring.
    """

    input_ids: np.ndarray  # int32 [B, L]
    attention_mask: np.ndarray  # int32 [B, L]
    pixel_values: np.ndarray  # float32 [sum of patches, D]
    image_grid_thw: np.ndarray  # int32 [B, 3]
    prompt_lengths: np.ndarray  # int32 [B]
    loss_mask: np.ndarray | None  # int32 [B, L] in SFT mode
    records: tuple[Sample, ...]


def prompt_text(sample: Sample, fmt: PromptFormat, tokenizer: SpatialTokenizer, image_tokens: int) -> str:
    """The full chat prompt, generation prompt included (`<think>\\n` opened for the thinking formats)."""
    return tokenizer.apply_chat_template(
        prompts.build_messages(sample, fmt),
        image_token_counts=[image_tokens],
        add_generation_prompt=True,
        enable_thinking=fmt.thinking,
    )


def encode_sample(
    sample: Sample,
    tokenizer: SpatialTokenizer,
    fmt: PromptFormat,
    mode: str = "rl",
    image_cfg: Any = ImageProcessingConfig(),
    preprocess_fn: PreprocessFn = preprocess,
    max_image_pixels: int | None = None,
) -> Example:
    """Image -> patches; prompt (and SFT target) -> ids, with exactly one <|image_pad|> per merged image token.
    An image that cannot be loaded or preprocessed (aspect ratio over 200, say) is a DatasetError naming the row
    (sample.origin) and the image."""
    image = sample.load_image(max_image_pixels)
    if sample.image_size is None:  # SpatialThinker states the size its pixel boxes refer to; scorers read it too
        sample = dataclasses.replace(sample, image_size=(int(image.shape[1]), int(image.shape[0])))
    try:
        pixel_values, grid_thw = preprocess_fn([image], image_cfg)
    except ValueError as e:
        where = sample.image if isinstance(sample.image, str) else f"of {image.shape[1]}x{image.shape[0]} pixels"
        raise sample.error(f"image {where}: {e}") from None
    n_image = int(num_image_tokens(grid_thw, image_cfg.merge_size)[0])
    ids = tokenizer.encode(prompt_text(sample, fmt, tokenizer, n_image))
    if ids.count(tokenizer.image_pad_id) != n_image:
        raise sample.error(
            f"the prompt holds {ids.count(tokenizer.image_pad_id)} image tokens, expected {n_image} "
            "(does the question text contain <|image_pad|>?)"
        )
    prompt_length = len(ids)
    if mode == "sft":
        target = sample.reference.get(fmt.reference_key)
        if target is None:
            raise sample.error(f"SFT needs a reference completion under {fmt.reference_key!r}")
        ids = ids + tokenizer.encode(target) + [tokenizer.im_end_id]
    return Example(
        input_ids=np.asarray(ids, dtype=np.int32),
        prompt_length=prompt_length,
        pixel_values=np.asarray(pixel_values, dtype=np.float32),
        image_grid_thw=np.asarray(grid_thw, dtype=np.int64).reshape(1, 3),
        sample=sample,
    )


def bucket_length(length: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if length <= b:
            return b
    raise DatasetError(f"a row of {length} tokens is longer than the largest bucket ({max(buckets)}); add a bucket")


def collate(examples: Sequence[Example], pad_id: int, buckets: Sequence[int], sft: bool) -> Batch:
    """Left-pads the rows to the smallest bucket that holds the longest one."""
    lengths = [len(e.input_ids) for e in examples]
    try:
        width = bucket_length(max(lengths), buckets)
    except DatasetError as err:
        longest = examples[int(np.argmax(lengths))].sample.id
        raise DatasetError(f"sample {longest}: {err}") from None
    b = len(examples)
    input_ids = np.full((b, width), pad_id, dtype=np.int32)
    attention_mask = np.zeros((b, width), dtype=np.int32)
    loss_mask = np.zeros((b, width), dtype=np.int32) if sft else None
    for i, (e, n) in enumerate(zip(examples, lengths)):
        input_ids[i, width - n :] = e.input_ids
        attention_mask[i, width - n :] = 1
        if loss_mask is not None:
            loss_mask[i, width - n + e.prompt_length :] = 1
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        pixel_values=np.concatenate([e.pixel_values for e in examples], axis=0),
        image_grid_thw=np.concatenate([e.image_grid_thw for e in examples], axis=0).astype(np.int32),
        prompt_lengths=np.asarray([e.prompt_length for e in examples], dtype=np.int32),
        loss_mask=loss_mask,
        records=tuple(e.sample for e in examples),
    )


def make_dataset(
    source: Sequence[Sample],
    tokenizer: SpatialTokenizer,
    data: DataConfig,
    fmt: PromptFormat,
    batch_size: int,
    *,
    mode: Literal["rl", "sft"] = "rl",
    shuffle: bool = True,
    num_epochs: int | None = None,
    drop_remainder: bool = True,
    image_cfg: Any = ImageProcessingConfig(),
    preprocess_fn: PreprocessFn = preprocess,
):
    """A grain.MapDataset of Batch: ds[k] is the k-th batch (random access, so any position can be recomputed).
    Batches follow `data` (buckets, seed); `num_epochs` None repeats forever."""
    import grain

    if mode not in ("rl", "sft"):
        raise ValueError(f"mode must be 'rl' or 'sft', got {mode!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_epochs is not None and num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1 or None (forever), got {num_epochs}")
    if len(source) == 0:
        raise DatasetError("the dataset is empty")
    ds = grain.MapDataset.source(source)
    if shuffle:
        ds = ds.shuffle(seed=data.seed)
    ds = ds.repeat(num_epochs)
    ds = ds.map(lambda s: encode_sample(s, tokenizer, fmt, mode, image_cfg, preprocess_fn, data.max_image_pixels))
    return ds.batch(
        batch_size,
        drop_remainder=drop_remainder,
        batch_fn=lambda xs: collate(xs, tokenizer.pad_id, data.bucket_lengths, mode == "sft"),
    )


class DataIterator:
    """Iterates batches; get_state() / set_state() save and restore the position (a JSON-ready dict)."""

    def __init__(self, dataset, read_threads: int = 0):
        import grain

        self._it = iter(
            dataset.to_iter_dataset(
                grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=max(1, 2 * read_threads))
            )
        )

    def __iter__(self) -> DataIterator:
        return self

    def __next__(self) -> Batch:
        return next(self._it)

    def get_state(self) -> dict:
        return dict(self._it.get_state())

    def set_state(self, state: dict) -> None:
        self._it.set_state(dict(state))


def make_iterator(
    source: Sequence[Sample],
    tokenizer: SpatialTokenizer,
    data: DataConfig,
    fmt: PromptFormat,
    batch_size: int,
    **kwargs: Any,
) -> DataIterator:
    """`make_dataset`'s batches as a checkpointable iterator (same keyword arguments)."""
    return DataIterator(make_dataset(source, tokenizer, data, fmt, batch_size, **kwargs), data.read_threads)


BLANK_FILLS = ("mean", "black", "white")


def blank_image(image: np.ndarray, fill: str = "mean") -> np.ndarray:
    """ProSR's size-matched blank image: every pixel the image's mean colour (default), black or white."""
    if fill not in BLANK_FILLS:
        raise ValueError(f"blank fill must be one of {BLANK_FILLS}, got {fill!r}")
    if fill == "mean":
        colour = np.round(image.reshape(-1, image.shape[-1]).mean(axis=0)).astype(np.uint8)
    else:
        colour = np.full(image.shape[-1], 0 if fill == "black" else 255, np.uint8)
    return np.broadcast_to(colour, image.shape).copy()


def blank_batch(
    batch: Batch,
    fill: str = "mean",
    image_cfg: Any = ImageProcessingConfig(),
    preprocess_fn: PreprocessFn = preprocess,
) -> Batch:
    """The same prompts on blank images (ProSR's counterfactual rollout): only pixel_values change, since a blank of
    the same size has the same grid and so the same number of image tokens."""
    out = [preprocess_fn([blank_image(r.load_image(), fill)], image_cfg) for r in batch.records]
    grid = np.concatenate([np.asarray(g, dtype=np.int32).reshape(1, 3) for _, g in out], axis=0)
    if not np.array_equal(grid, batch.image_grid_thw):
        raise ValueError("blank images changed the image grid; was the batch made with another image config?")
    return dataclasses.replace(batch, pixel_values=np.concatenate([np.asarray(p, np.float32) for p, _ in out], axis=0))
