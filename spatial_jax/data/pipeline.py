"""The grain input pipeline: samples -> image (or video) patches + the method's prompt ids -> left-padded, bucketed
batches.

A sample's visual items are packed in prompt order: one per image, one per temporal group of a video (a video of
grid [t, h, w] is t items [1, h, w], each behind its timestamp; see data/video_processing.py), or, for a model that
times videos by second_per_grid (Qwen2.5-VL), one item [t, h, w] per video. `image_grid_thw` lists every item of the
batch in row order, `image_counts` says how many belong to each row, and `second_per_grid` gives each item's seconds
per temporal patch (0 where none is read: images, and timestamped frames).

Order is a pure function of the seed (grain's index shuffle, reshuffled each epoch), and the iterator's position is
a small dict (`get_state` / `set_state`) that the trainer checkpoints; restoring it yields the same next batch.
Modes: "rl" batches prompts only (the sampler generates the completion); "sft" appends the method's reference
completion and `<|im_end|>`, with loss_mask marking those completion tokens (completion-only cross-entropy).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from spatial_jax.config import check_at_least, check_range, require
from spatial_jax.data import prompts
from spatial_jax.data.image_processing import ImageProcessingConfig, preprocess
from spatial_jax.data.prompts import PromptFormat
from spatial_jax.data.sample import DatasetError, Sample
from spatial_jax.data.screen import BAD_ROWS, screen, screened
from spatial_jax.data.synthetic import SyntheticConfig
from spatial_jax.data.tokenizer import VIDEO_PAD, SpatialTokenizer
from spatial_jax.data.tool_turns import encode_target, sft_target
from spatial_jax.data.video_processing import VideoProcessingConfig
from spatial_jax.data.visuals import PreprocessFn, Visuals, encode_visuals, load_visuals, video_config

SFT_TARGETS = ("method", "reference")  # DataConfig.sft_targets


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the data comes from and how it is batched; `train` / `eval` are source specs (data/sources: a JSONL path,
    `synthetic:<split>:<n>`, a published copy `FORMAT:PATH[:split]` or a `mix:` of them); columns renames a
    layout's fields (`field=column`, e.g. `answer=answer_option_text_only`).
    `sft_train` is the SFT cold start's own source (its reference completions); empty means `train`. sft_targets:
    "method" trains on the method's own SFT targets where it builds them (AlloSpatial's tool-calling trajectories,
    methods/harness_targets.py), "reference" on every sample's reference completion (AlloSpatial without tools: the
    question-answer-only cold start of its Table 4).
    bucket_lengths: the padded sequence lengths a batch may take (the smallest that fits its longest row); seed
    orders the training source (grain's index shuffle, reshuffled each epoch). max_image_pixels: larger image files
    are refused from their header, before decoding (a decompression bomb), and embedded ones once decoded; the default
    is PIL's own warning limit. bad_rows: "fail" (a real source's first unreadable row stops the run, naming file, row
    and field) or "skip" (such rows are dropped and counted by reason, data/screen.py), when at most max_bad_share of
    the source's rows are bad."""

    train: str = "synthetic:train:1000"
    eval: str = "synthetic:heldout:200"
    sft_train: str = ""
    sft_targets: str = "method"
    columns: tuple[str, ...] = ()
    synthetic: SyntheticConfig = dataclasses.field(default_factory=SyntheticConfig)
    bucket_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    seed: int = 0
    read_threads: int = 0
    max_image_pixels: int = 89_478_485
    bad_rows: str = "fail"
    max_bad_share: float = 0.01

    def __post_init__(self):
        lengths = self.bucket_lengths
        require("bucket_lengths", lengths, bool(lengths) and all(isinstance(b, int) and b >= 1 for b in lengths),
                "be positive lengths")
        require("bucket_lengths", lengths, list(lengths) == sorted(set(lengths)), "be strictly increasing")
        check_range(self, "seed", 0, 2**32 - 1)  # grain's shuffle takes a uint32
        check_at_least(self, read_threads=0, max_image_pixels=1)
        require("bad_rows", self.bad_rows, self.bad_rows in BAD_ROWS, f"be one of {BAD_ROWS}")
        check_range(self, "max_bad_share", 0.0, 1.0)
        require("sft_targets", self.sft_targets, self.sft_targets in SFT_TARGETS, f"be one of {SFT_TARGETS}")
        for name in ("train", "eval"):
            require(name, getattr(self, name), bool(getattr(self, name)),
                    "name a JSONL file, synthetic:<split>:<count> or FORMAT:PATH")
        require("columns", self.columns, all(isinstance(c, str) and "=" in c for c in self.columns),
                "be field=column entries")

    def training_source(self, mode: str) -> tuple[str, str]:
        """(field, source) a stage trains on: the SFT stage ("sft") reads sft_train when set, any other train."""
        return ("sft_train", self.sft_train) if mode == "sft" and self.sft_train else ("train", self.train)


def train_iterator(
    data: DataConfig,
    tokenizer: SpatialTokenizer,
    fmt: PromptFormat,
    batch_size: int,
    mode: Literal["rl", "sft"] = "rl",
    image_cfg: Any = ImageProcessingConfig(),
    process: int = 0,
    processes: int = 1,
) -> DataIterator:
    """Shuffled batches of the training source (mode "sft": data.sft_train when set), repeated forever; checkpoint it
    with get_state / set_state. With `processes` > 1, this process's block of each batch: batches of
    batch_size / processes in order are the blocks of the whole batches, and every processes-th from `process` is its
    own; its position counts batches as one process's does, so a run resumes on another process count."""
    if batch_size % processes:
        raise ValueError(f"{batch_size} rows do not split among {processes} processes")
    _, source = data.training_source(mode)
    samples = data_source(data, source)
    batches = make_dataset(samples, tokenizer, data, fmt, batch_size // processes, mode=mode, image_cfg=image_cfg)
    return DataIterator(batches if processes == 1 else batches[process::processes], data.read_threads)


def eval_iterator(
    data: DataConfig,
    tokenizer: SpatialTokenizer,
    fmt: PromptFormat,
    batch_size: int,
    image_cfg: Any = ImageProcessingConfig(),
) -> DataIterator:
    """The evaluation source once, in file order; the last batch may be smaller."""
    samples = data_source(data, data.eval)
    return make_iterator(samples, tokenizer, data, fmt, batch_size, shuffle=False,
                         num_epochs=1, drop_remainder=False, image_cfg=image_cfg)


def open_source(spec: str, synthetic_cfg: Any = None, check_images: bool = True, columns: Sequence[str] = (),
                seed: int = 0) -> Sequence[Sample]:
    """The samples a source spec names: a JSONL path, `synthetic:<split>:<num>` drawn from synthetic_cfg, or a
    published copy `FORMAT:PATH[:split]` / a mixture (data/sources: the one place specs are parsed). columns:
    data.columns; seed: a mixture's draw."""
    from spatial_jax.data.sources import open_spec

    return open_spec(spec, synthetic_cfg, check_images, columns, seed)


def source_key(data: DataConfig, spec: str) -> tuple:
    """What names one opened source for its screening (data/screen.py): the spec and what changes its rows."""
    return (spec, tuple(data.columns), data.seed)


def data_source(data: DataConfig, spec: str) -> Sequence[Sample]:
    """The samples of `spec` as data configures them: its columns and draw, without the rows screening dropped."""
    return screened(open_source(spec, data.synthetic, columns=data.columns, seed=data.seed), source_key(data, spec))


@dataclasses.dataclass(frozen=True)
class Example:
    """One encoded sample: token ids (prompt, then the completion in SFT mode) and its visual items' patches."""

    input_ids: np.ndarray  # int32 [n]
    prompt_length: int
    pixel_values: np.ndarray  # float32 [patches, C*tp*ps*ps], items in prompt order
    image_grid_thw: np.ndarray  # int64 [items, 3]
    sample: Sample
    target_mask: np.ndarray | None = None  # int32 [n - prompt_length] (SFT): 1 on the model's own tokens
    second_per_grid: np.ndarray | None = None  # float32 [items]: see the module docstring (None: zeros)


def check_visuals(source: Sequence[Sample], data: DataConfig, key: tuple = (), unique_ids: bool = True) -> Counter:
    """Decodes every picture and video of `source` once, as its batches will, within data.max_image_pixels, under
    data.bad_rows (data/screen.py): a row that cannot be read is found now, naming its file and line, not at the
    batch that first reads it. The counts of the rows skipped, by reason."""
    return screen(source, lambda s: load_visuals(s, max_image_pixels=data.max_image_pixels), data.bad_rows,
                  data.max_bad_share, key, unique_ids)


def row_tokens(tokenizer: SpatialTokenizer, data: DataConfig, fmt: PromptFormat, mode: Literal["rl", "sft"],
               image_cfg: Any = ImageProcessingConfig(), video_cfg: VideoProcessingConfig | None = None
               ) -> Callable[[Sample], int]:
    """A row's token count as its batches will encode it (pictures and video decoded within data.max_image_pixels
    and preprocessed, the prompt and, in SFT, the target tokenized); a row that cannot be encoded, or whose tokens do
    not fit the largest of data.bucket_lengths, raises its DatasetError naming file and line."""
    longest = max(data.bucket_lengths)

    def count(sample: Sample) -> int:
        example = encode_sample(sample, tokenizer, fmt, mode, image_cfg, max_image_pixels=data.max_image_pixels,
                                video_cfg=video_cfg, method_targets=data.sft_targets == "method")
        n = len(example.input_ids)
        if n > longest:
            what = "prompt, pictures and SFT target" if mode == "sft" else "prompt and pictures"
            raise sample.error(f"{n} tokens ({what}; {example.prompt_length} in the prompt) do not fit the largest "
                               f"of data.bucket_lengths, {longest}: add a longer bucket or drop the row")
        return n

    return count


def check_rows(source: Sequence[Sample], tokenizer: SpatialTokenizer, data: DataConfig, fmt: PromptFormat,
               mode: Literal["rl", "sft"], image_cfg: Any = ImageProcessingConfig(),
               video_cfg: VideoProcessingConfig | None = None, key: tuple = (), unique_ids: bool = True) -> Counter:
    """Every row of `source` encoded (row_tokens) under data.bad_rows, before the first compile rather than at the
    step that first draws it. The counts of the rows skipped, by reason."""
    return screen(source, row_tokens(tokenizer, data, fmt, mode, image_cfg, video_cfg), data.bad_rows,
                  data.max_bad_share, key, unique_ids)


@dataclasses.dataclass(frozen=True)
class Batch:
    """Rows are left-padded to `input_ids.shape[1]` (a bucket length); pixel_values concatenates the rows' patches.

    prompt_lengths counts each row's prompt tokens (RL: the whole row); loss_mask (SFT only) is 1 on the reference
    completion and its closing <|im_end|>. records are the samples, for scoring.
    """

    input_ids: np.ndarray  # int32 [B, L]
    attention_mask: np.ndarray  # int32 [B, L]
    pixel_values: np.ndarray  # float32 [sum of patches, D]
    image_grid_thw: np.ndarray  # int32 [sum of items, 3], rows' items in order
    prompt_lengths: np.ndarray  # int32 [B]
    loss_mask: np.ndarray | None  # int32 [B, L] in SFT mode
    records: tuple[Sample, ...]
    image_counts: np.ndarray  # int32 [B]: visual items of each row (images, or a video's temporal groups)
    second_per_grid: np.ndarray  # float32 [sum of items]: each video item's seconds per temporal patch (else 0)


def prompt_text(sample: Sample, fmt: PromptFormat, tokenizer: SpatialTokenizer, image_tokens: int | Sequence[int],
                video_placeholders: Sequence[str] = ()) -> str:
    """The full chat prompt, generation prompt included (`<think>\\n` opened for the thinking formats); image_tokens
    per image, and each video's expanded placeholder (video_processing.video_placeholder)."""
    return tokenizer.apply_chat_template(
        prompts.build_messages(sample, fmt),
        image_token_counts=[image_tokens] if isinstance(image_tokens, int) else list(image_tokens),
        add_generation_prompt=True,
        enable_thinking=fmt.thinking,
        video_placeholders=video_placeholders,
    )


def encode_sample(
    sample: Sample,
    tokenizer: SpatialTokenizer,
    fmt: PromptFormat,
    mode: str = "rl",
    image_cfg: Any = ImageProcessingConfig(),
    preprocess_fn: PreprocessFn = preprocess,
    max_image_pixels: int | None = None,
    video_cfg: VideoProcessingConfig | None = None,
    method_targets: bool = True,
) -> Example:
    """Images or video -> patches; prompt (and SFT target) -> ids, with exactly one <|image_pad|> (<|video_pad|>)
    per merged image (frame-group) token. A picture that cannot be loaded or preprocessed (aspect ratio over 200,
    say) is a DatasetError naming the row (sample.origin) and the file. method_targets: False trains on the
    sample's reference completion even where the method builds its own SFT target (DataConfig.sft_targets)."""
    video_cfg = video_config(image_cfg, video_cfg)
    vis = load_visuals(sample, video_cfg, max_image_pixels)
    if sample.image_size is None and vis.any:  # SpatialThinker states the size its boxes refer to; scorers read it
        first = vis.first
        sample = dataclasses.replace(sample, image_size=(int(first.shape[1]), int(first.shape[0])))
    pixel_values, grid_thw, image_tokens, placeholders, seconds = encode_visuals(sample, vis, image_cfg, video_cfg,
                                                                                 preprocess_fn)
    ids = tokenizer.encode(prompt_text(sample, fmt, tokenizer, image_tokens, placeholders))
    want = {tokenizer.image_pad_id: sum(image_tokens),
            tokenizer.video_pad_id: sum(p.count(VIDEO_PAD) for p in placeholders)}
    for token, n in want.items():
        if ids.count(token) != n:
            raise sample.error(
                f"the prompt holds {ids.count(token)} {tokenizer.hf.convert_ids_to_tokens(token)} tokens, expected "
                f"{n} (does the question text contain one?)"
            )
    prompt_length = len(ids)
    target_mask = None
    if mode == "sft":  # the reference completion, or the method's target with tool turns (data/tool_turns.py)
        target = sft_target(sample, fmt.reference_key, method_targets)
        if target is None:
            raise sample.error(f"SFT needs a reference completion under {fmt.reference_key!r}")
        completion = encode_target(target, tokenizer, image_cfg, preprocess_fn)
        ids = ids + completion.ids
        target_mask = np.asarray(completion.loss, np.int32)
        pixel_values = np.concatenate([np.asarray(pixel_values, np.float32), *completion.pixel_values], axis=0)
        grid_thw = np.concatenate([np.asarray(grid_thw, np.int64).reshape(-1, 3), *completion.image_grid_thw])
        seconds = np.concatenate([seconds, np.zeros(len(completion.image_grid_thw), np.float32)])
    return Example(
        input_ids=np.asarray(ids, dtype=np.int32),
        prompt_length=prompt_length,
        pixel_values=np.asarray(pixel_values, dtype=np.float32),
        image_grid_thw=np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3),
        sample=sample,
        target_mask=target_mask,
        second_per_grid=seconds,
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
            loss_mask[i, width - n + e.prompt_length :] = 1 if e.target_mask is None else e.target_mask
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        pixel_values=np.concatenate([e.pixel_values for e in examples], axis=0),
        image_grid_thw=np.concatenate([e.image_grid_thw for e in examples], axis=0).astype(np.int32),
        prompt_lengths=np.asarray([e.prompt_length for e in examples], dtype=np.int32),
        loss_mask=loss_mask,
        records=tuple(e.sample for e in examples),
        image_counts=np.asarray([len(e.image_grid_thw) for e in examples], dtype=np.int32),
        second_per_grid=np.concatenate([np.zeros(len(e.image_grid_thw), np.float32) if e.second_per_grid is None
                                        else e.second_per_grid for e in examples]).astype(np.float32),
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
    video_cfg: VideoProcessingConfig | None = None,
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
    ds = ds.map(lambda s: encode_sample(s, tokenizer, fmt, mode, image_cfg, preprocess_fn, data.max_image_pixels,
                                        video_cfg, data.sft_targets == "method"))
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
    video_cfg: VideoProcessingConfig | None = None,
) -> Batch:
    """The same prompts on blank pictures (ProSR's counterfactual rollout): every image of a prompt, and every
    sampled frame of a video, becomes its own size-matched blank. Only pixel_values change, since blanks of the same
    sizes have the same grids and so the same image tokens (and a video keeps its timestamps)."""
    video_cfg = video_config(image_cfg, video_cfg)
    pixels, grids = [], []
    for r in batch.records:
        vis = load_visuals(r, video_cfg)
        blank = Visuals([blank_image(im, fill) for im in vis.images], frames=None, fps=vis.fps,
                        frame_indices=vis.frame_indices, total_frames=vis.total_frames)
        if vis.frames is not None:
            blank = dataclasses.replace(blank, frames=np.stack([blank_image(f, fill) for f in vis.frames]))
        p, g, _, _, _ = encode_visuals(r, blank, image_cfg, video_cfg, preprocess_fn)
        pixels.append(np.asarray(p, np.float32))
        grids.append(np.asarray(g, np.int32).reshape(-1, 3))
    if not np.array_equal(np.concatenate(grids, axis=0), batch.image_grid_thw):
        raise ValueError("blank images changed the image grid; was the batch made with another image config?")
    return dataclasses.replace(batch, pixel_values=np.concatenate(pixels, axis=0))
