"""A benchmark record -> the project's Sample (what the pipeline prompts the policy with)."""

from __future__ import annotations

import dataclasses
import io

import numpy as np

from spatial_jax.data.sample import LETTERS, Sample, Video
from spatial_jax.suites.layout import Layout
from spatial_jax.suites.record import BenchmarkError, BenchRecord, Media


def decode(media: Media, record: BenchRecord) -> str | np.ndarray:
    """A path stays a path (read by the pipeline); embedded bytes become an RGB uint8 array."""
    if isinstance(media, str):
        return media
    from PIL import Image

    try:
        with Image.open(io.BytesIO(media)) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise BenchmarkError(f"{record.origin}: its embedded image cannot be decoded ({e})") from None


def sampled_video(path: str, num_frames: int, record: BenchRecord) -> Video:
    """`num_frames` frames at np.linspace(0, total - 1, num_frames) truncated to integers (lmms-eval's uniform
    sampling, as VSI-Bench's evaluations sample their 7, 8, 32 frames), with their source indices and the file's
    frame rate."""
    import av

    try:
        with av.open(path) as container:
            stream = container.streams.video[0]
            fps = float(stream.average_rate or stream.guessed_rate or 0) or None
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    except (av.FFmpegError, IndexError, ValueError) as e:
        raise BenchmarkError(f"{record.origin}: video {path} cannot be decoded ({e})") from None
    if not frames or fps is None:
        raise BenchmarkError(f"{record.origin}: video {path} holds no frames or no frame rate")
    picks = np.linspace(0, len(frames) - 1, num_frames, dtype=int)
    return Video(frames=tuple(frames[i] for i in picks), fps=fps, frame_indices=tuple(int(i) for i in picks))


def to_sample(record: BenchRecord, video_frames: int = 0, layout: Layout | None = None) -> Sample:
    """Choice and numeric questions convert; SPAR's view-change commands ("text" answers) have no Sample form.
    video_frames > 0 samples that many frames uniformly (a protocol's setting); 0 leaves the whole clip to the
    video processor. layout: the benchmark's own layout of the question (its prompt_text); None: the method's."""
    if record.answer_type == "text":
        raise BenchmarkError(f"{record.origin}: a {record.category} answer (free text scored by its own metric) has "
                             "no Sample form; score such responses with --predictions")
    options, answer = record.options, record.answer
    if record.answer_type == "choice" and (not options or answer not in LETTERS[: len(options)]):
        raise BenchmarkError(f"{record.origin}: gold {answer!r} names none of the {len(options)} options parsed "
                             "from the record")
    kwargs: dict = {}
    if record.video is not None:
        kwargs["video"] = (sampled_video(record.video, video_frames, record) if video_frames > 0
                           else Video(path=record.video))
        image = None
    elif len(record.images) == 1:
        image = decode(record.images[0], record)
    else:
        kwargs["images"] = tuple(decode(m, record) for m in record.images)
        image = None
    return Sample(
        id=record.id, image=image, question=record.question, options=options if record.answer_type == "choice"
        else (), answer=answer, answer_type="choice" if record.answer_type == "choice" else "number",
        category=record.category, meta={"benchmark": record.benchmark}, origin=record.origin,
        prompt_text=layout.text(record) if layout is not None else "", **kwargs)


def with_answer(record: BenchRecord, answer) -> BenchRecord:
    return dataclasses.replace(record, answer=answer)
