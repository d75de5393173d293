"""The dataset record: one image, several images or a video, one question, its gold answer and whatever the rewards
need to score it."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from spatial_jax.records import (
    GTBox,
    RecordError,
    Rollout,
    TokenTrace,
    brief,
    parse_gt_boxes,
    parse_image_size,
    parse_scene,
)

ImageRef = str | np.ndarray

ANSWER_TYPES = ("choice", "number", "text")
MAX_TEXT_ANSWER = 200  # characters: a short answer (a word, a direction, an object name), SPEC section 10
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class DatasetError(ValueError):
    """A dataset row that cannot be used; the reader prefixes the message with `path:line`."""


def regular_file(path: str | Path, what: str = "dataset file") -> Path:
    """`path` as a Path, or a DatasetError unless it is a regular file (or a link to one): a named pipe, a device
    or a socket would block a reader that opens it until killed."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: {what} {not_a_file(path)}")
    return path


@dataclasses.dataclass(frozen=True)
class Video:
    """A video, as a file (`path`, decoded with PyAV) or as its frames (`frames`: files or RGB uint8 arrays).

    fps: the frame rate of the frames as listed (for a file, read from it when None); timestamps are index / fps.
    frame_indices: the source index of each listed frame when the frames are already sampled (they are then used
    as they are); None means the frames are the whole clip, sampled by the video processor (Qwen3-VL: 2 frames a
    second, 4 to 768 frames).
    """

    path: str | None = None
    frames: tuple[ImageRef, ...] = ()
    fps: float | None = None
    frame_indices: tuple[int, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.frames, tuple):
            object.__setattr__(self, "frames", tuple(self.frames))
        if (self.path is None) == (not self.frames):
            raise DatasetError("a video needs either a 'path' or a non-empty 'frames' list, not both")
        if self.fps is not None and (isinstance(self.fps, bool) or not isinstance(self.fps, (int, float))
                                     or not math.isfinite(self.fps) or self.fps <= 0):
            raise DatasetError(f"video 'fps' must be a positive number, got {brief(self.fps)}")
        if self.frames and self.fps is None:
            raise DatasetError("video 'frames' need the 'fps' they were taken at (the prompt states frame times)")
        if self.frame_indices is not None:
            idx = self.frame_indices
            if self.path is not None:
                raise DatasetError("video 'frame_indices' go with 'frames', not with a 'path'")
            if len(idx) != len(self.frames):
                raise DatasetError(f"video 'frame_indices' has {len(idx)} entries for {len(self.frames)} frames")
            if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in idx):
                raise DatasetError(f"video 'frame_indices' must be non-negative integers, got {brief(idx)}")
            if any(b <= a for a, b in zip(idx, idx[1:])):
                raise DatasetError(f"video 'frame_indices' must increase, got {brief(idx)}")

    def to_json(self) -> dict[str, Any]:
        if self.path is not None:
            out: dict[str, Any] = {"path": self.path}
        else:
            if not all(isinstance(f, str) for f in self.frames):
                raise DatasetError("a video of in-memory frames cannot be written as JSON")
            out = {"frames": list(self.frames)}
        if self.fps is not None:
            out["fps"] = self.fps
        if self.frame_indices is not None:
            out["frame_indices"] = list(self.frame_indices)
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class Sample:
    """One question about one image, several images, or a video (at most one of `image`, `images`, `video` is set;
    none: a text-only row, trained with no vision tokens).

    image: a path (absolute, or resolved against the JSONL file's folder by the reader) or an RGB uint8 array.
    images: several such images, in the order the prompt shows them (multi-view questions); `image` is then None.
    video: a `Video`; `image` is then None.
    answer: the gold option letter ("choice"), a number ("number", scored by MRA) or a short text ("text", scored by a
    normalised exact match: SPEC section 10).
    image_size: (width, height) of the image, or of the first image or video frame; the SpatialThinker prompt
    states it and pixel boxes refer to it.
    gt_boxes: pseudo-ground-truth boxes in the [0, 1000] normalised frame with validity v in [0, 1] (SpatialCORE);
    with several images or a video they refer to the first image (or the first sampled frame), as does `scene`.
    scene: the SpatialThinker reference scene graph, boxes in pixels of `image_size`.
    reference: output format (a PromptFormat's reference_key) -> reference completion, the SFT target.
    meta: free-form extras (the synthetic world stores its objects and the corruption applied to each box).
    origin: where the row came from (`file:line` for a JSONL row), so errors met later (in the pipeline's workers)
    still name it.
    prompt_text: the question as a benchmark's protocol lays it out (its option labels and answer instruction,
    spatial_jax/suites/layout.py); when set, the user turn shows it in place of the question and lettered options.
    """

    id: str
    image: ImageRef | None
    question: str
    options: tuple[str, ...]
    answer: str | float
    answer_type: str = "choice"
    category: str = ""
    image_size: tuple[int, int] | None = None
    gt_boxes: tuple[GTBox, ...] = ()
    scene: dict | None = None
    reference: dict[str, str] = dataclasses.field(default_factory=dict)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    origin: str = ""
    images: tuple[ImageRef, ...] = dataclasses.field(default=(), kw_only=True)
    video: Video | None = dataclasses.field(default=None, kw_only=True)
    prompt_text: str = dataclasses.field(default="", kw_only=True)

    def __post_init__(self):
        given = [name for name, v in (("image", self.image is not None), ("images", bool(self.images)),
                                      ("video", self.video is not None)) if v]
        if len(given) > 1:  # none is a text-only row, as verl's, EasyR1's and TRL's vision sets mix them in
            raise DatasetError(f"a sample has at most one of 'image', 'images' or 'video', got {given}")
        if not isinstance(self.images, tuple):
            object.__setattr__(self, "images", tuple(self.images))
        if self.answer_type not in ANSWER_TYPES:
            raise DatasetError(f"answer_type must be one of {ANSWER_TYPES}, got {brief(self.answer_type)}")
        if self.answer_type == "choice":
            if not self.options:
                raise DatasetError("a multiple-choice sample needs a non-empty 'options' list")
            if len(self.options) > len(LETTERS):
                raise DatasetError(f"at most {len(LETTERS)} options are supported, got {len(self.options)}")
            valid = LETTERS[: len(self.options)]
            if not isinstance(self.answer, str) or self.answer not in valid:
                raise DatasetError(f"answer must be one of the option letters {list(valid)}, got {brief(self.answer)}")
        elif self.answer_type == "text":
            if not isinstance(self.answer, str) or not self.answer.strip():
                raise DatasetError(f"a text answer must be a non-empty string, got {brief(self.answer)}")
            if len(self.answer) > MAX_TEXT_ANSWER:
                raise DatasetError(f"a text answer is a short answer of at most {MAX_TEXT_ANSWER} characters, got "
                                   f"{len(self.answer)} ({brief(self.answer)}); a free-form text is scored by no "
                                   "reward of this project")
        else:
            if isinstance(self.answer, bool) or not isinstance(self.answer, (int, float)):
                raise DatasetError(f"a numeric sample needs a number as answer, got {brief(self.answer)}")
            if not math.isfinite(self.answer) or self.answer == 0:
                raise DatasetError(
                    f"a numeric answer must be finite and non-zero (MRA divides by it), got {self.answer}")

    @property
    def image_refs(self) -> tuple[ImageRef, ...]:
        """The sample's images in prompt order: (image,) or images; () for a video."""
        return (self.image,) if self.image is not None else self.images

    @property
    def text_only(self) -> bool:
        """No image, images or video: the prompt has no vision tokens."""
        return not self.image_refs and self.video is None

    @property
    def answer_letter(self) -> str | None:
        return self.answer if self.answer_type == "choice" else None

    @property
    def answer_text(self) -> str:
        """`(B) left` for a choice (SpatialThinker's gold form), a text gold as given, the number as written."""
        if self.answer_type == "choice":
            return f"({self.answer}) {self.options[LETTERS.index(self.answer)]}"
        if self.answer_type == "text":
            return self.answer
        return format_number(float(self.answer))

    def to_rollout(
        self,
        completion: str,
        rollout_id: str | None = None,
        trace: TokenTrace = TokenTrace(),
        group: str | None = None,
        num_generated_tokens: int | None = None,
    ) -> Rollout:
        """The rewards' record for one completion of this sample (gold, pseudo-GT, scene graph, image size)."""
        return Rollout(
            id=self.id if rollout_id is None else rollout_id,
            completion=completion,
            question=self.question,
            options=self.options,
            answer=self.answer,
            answer_type=self.answer_type,
            gt_boxes=self.gt_boxes,
            trace=trace,
            scene=self.scene,
            image_size=self.image_size,
            num_generated_tokens=num_generated_tokens,
            group=self.id if group is None else group,
        )

    def error(self, what: str) -> DatasetError:
        """A DatasetError about this sample, led by its origin (`file:line`) or, in memory, its id."""
        return DatasetError(f"{self.origin or f'sample {self.id}'}: {what}")

    def load_image(self, max_pixels: int | None = None) -> np.ndarray:
        """The image as an RGB uint8 array (H, W, 3). A file over `max_pixels` pixels is refused from its header,
        before decoding; PIL itself refuses twice its Image.MAX_IMAGE_PIXELS. Whatever cannot be read or decoded is a
        DatasetError naming the row and the image. Only for a single-image sample (see load_images)."""
        if self.image is None:
            raise self.error("this step takes one image per sample; the sample holds "
                             + (f"{len(self.images)} images" if self.images else "a video" if self.video is not None
                                else "none (a text-only row)"))
        return self.load_ref(self.image, max_pixels)

    def load_images(self, max_pixels: int | None = None) -> list[np.ndarray]:
        """Every image of the sample in prompt order (load_image's checks on each); [] for a video."""
        return [self.load_ref(ref, max_pixels) for ref in self.image_refs]

    def load_ref(self, ref: ImageRef, max_pixels: int | None = None, what: str = "image") -> np.ndarray:
        """One image (or video frame) file or array of this sample, errors naming the row and the file; either over
        max_pixels is refused (an embedded picture as a file is: data.max_image_pixels bounds every picture)."""
        if isinstance(ref, np.ndarray):
            if max_pixels is not None and ref.ndim >= 2 and ref.shape[0] * ref.shape[1] > max_pixels:
                raise self.error(f"embedded {what} of {ref.shape[1]}x{ref.shape[0]} = {ref.shape[0] * ref.shape[1]} "
                                 f"pixels, over data.max_image_pixels = {max_pixels}")
            return ref
        from PIL import Image

        if os.path.exists(ref) and not os.path.isfile(ref):  # a pipe would block PIL until killed
            raise self.error(f"{what} {ref} {not_a_file(Path(ref))}")
        try:
            with Image.open(ref) as im:
                pixels = im.width * im.height
                if max_pixels is None or pixels <= max_pixels:
                    return _rgb(im)
        except Image.DecompressionBombError as e:
            raise self.error(f"{what} {ref}: refused as a likely decompression bomb: {e}") from None
        except Image.UnidentifiedImageError:
            raise self.error(f"{what} {ref}: cannot identify the image format") from None
        # PIL reports damaged files as any of these (truncated data, broken chunks, bad headers).
        except (OSError, SyntaxError, ValueError, EOFError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
            raise self.error(f"{what} {ref}: {why}") from None
        raise self.error(f"{what} {ref}: {im.width}x{im.height} = {pixels} pixels, over "
                         f"data.max_image_pixels = {max_pixels}")

    def to_json(self, image_path: str | None = None) -> dict[str, Any]:
        """A JSON-ready dict; an in-memory single image needs `image_path` (where the caller saved it). Several
        images or video frames are written as their paths (in-memory ones are refused)."""
        out: dict[str, Any] = {"id": self.id}
        if self.images:
            if not all(isinstance(r, str) for r in self.images):
                raise DatasetError(f"sample {self.id}: in-memory images cannot be written as JSON")
            out["images"] = list(self.images)
        elif self.video is not None:
            out["video"] = self.video.to_json()
        elif self.image is not None:  # a text-only row writes no picture field
            if image_path is None:
                if not isinstance(self.image, str):
                    raise DatasetError(f"sample {self.id}: an in-memory image needs an image_path to be written")
                image_path = self.image
            out["image"] = image_path
        out.update({
            "question": self.question,
            "options": list(self.options),
            "answer": self.answer,
            "answer_type": self.answer_type,
            "category": self.category,
        })
        if self.image_size is not None:
            out["image_size"] = list(self.image_size)
        out["gt_boxes"] = [
            {"bbox_2d": [_plain(c) for c in b.bbox], "label": b.label, "validity": b.validity} for b in self.gt_boxes
        ]
        if self.scene is not None:
            out["scene"] = self.scene
        if self.reference:
            out["reference"] = dict(self.reference)
        if self.meta:
            out["meta"] = self.meta
        return out

    @staticmethod
    def from_json(obj: Any, base_dir: str | Path | None = None, check_image: bool = True, origin: str = "") -> Sample:
        """Validates one parsed JSON row; raises DatasetError naming the bad field. `origin` is kept (see Sample)."""
        if not isinstance(obj, dict):
            raise DatasetError(f"expected a JSON object, got {type(obj).__name__}")
        for key in ("id", "question"):
            if key not in obj:
                raise DatasetError(f"missing field '{key}'")
        visual = [k for k in ("image", "images", "video") if k in obj]
        if len(visual) > 1:  # none: a text-only row
            raise DatasetError(f"a row has at most one of the fields 'image', 'images' or 'video', got {visual}")
        sid = obj["id"]
        if isinstance(sid, bool) or not isinstance(sid, (str, int)):
            raise DatasetError(f"field 'id' must be a string or an integer, got {brief(sid)}")
        image, images, video = None, (), None
        if visual == ["image"]:
            image = _file(_str_field(obj, "image"), "image", base_dir, check_image)
        elif visual == ["images"]:
            images = _files(obj["images"], "images", base_dir, check_image)
        elif visual == ["video"]:
            video = _video(obj["video"], base_dir, check_image)
        question = _str_field(obj, "question")
        options = obj.get("options", [])
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise DatasetError("field 'options' must be a list of strings")
        answer_type = obj.get("answer_type", "choice" if options else "number")
        if answer_type not in ANSWER_TYPES:
            raise DatasetError(f"field 'answer_type' must be one of {list(ANSWER_TYPES)}, got {brief(answer_type)}")
        if "answer" not in obj:
            raise DatasetError("missing field 'answer'")
        answer = _answer(obj["answer"], answer_type, options)
        category = obj.get("category", "")
        if not isinstance(category, str):
            raise DatasetError(f"field 'category' must be a string, got {brief(category)}")
        scene = _from_record(parse_scene, obj.get("scene"))
        reference = obj.get("reference", {})
        if not isinstance(reference, dict) or not all(isinstance(v, str) for v in reference.values()):
            raise DatasetError("field 'reference' must map format names to completion strings")
        meta = obj.get("meta", {})
        if not isinstance(meta, dict):
            raise DatasetError("field 'meta' must be an object")
        return Sample(
            id=str(sid),
            image=image,
            question=question,
            options=tuple(options),
            answer=answer,
            answer_type=answer_type,
            category=category,
            image_size=_from_record(parse_image_size, obj.get("image_size")),
            gt_boxes=_from_record(parse_gt_boxes, obj.get("gt_boxes", []), require_label=True),
            scene=scene,
            reference=reference,
            meta=meta,
            origin=origin,
            images=images,
            video=video,
        )


def _file(name: str, field: str, base_dir: str | Path | None, check: bool) -> str:
    """A file named by a row, resolved against the JSONL file's folder; must exist when `check`."""
    path = Path(name)
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    try:
        missing = check and not path.is_file()
    except OSError as e:  # a name too long for the file system, say; is_file only hides "no such file"
        raise DatasetError(f"field '{field}': cannot use {brief(str(path))}: {e.strerror or e}") from None
    if missing:
        raise DatasetError(f"field '{field}': {brief(str(path))} {not_a_file(path)}")
    return str(path)


def not_a_file(path: Path) -> str:
    """Why a path that is no regular file cannot be read as one: a folder, or a device or pipe (/dev/zero would be
    read without end), is named as such, not as missing."""
    if path.is_dir():
        return "is a folder, not a file"
    if path.exists():
        return "is not a regular file (a device or a pipe)"
    return "does not exist"


def _files(raw: Any, field: str, base_dir: str | Path | None, check: bool) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(x, str) for x in raw):
        raise DatasetError(f"field '{field}' must be a non-empty list of file names, got {brief(raw)}")
    return tuple(_file(x, f"{field}[{k}]", base_dir, check) for k, x in enumerate(raw))


def _video(raw: Any, base_dir: str | Path | None, check: bool) -> Video:
    """`{"path": file[, "fps": n]}` or `{"frames": [files], "fps": n[, "frame_indices": [ints]]}`."""
    if not isinstance(raw, dict):
        raise DatasetError(f"field 'video' must be an object, got {brief(raw)}")
    unknown = sorted(set(raw) - {"path", "frames", "fps", "frame_indices"})
    if unknown:
        raise DatasetError(f"field 'video' has unknown keys {unknown} (path, frames, fps, frame_indices)")
    path = None
    if "path" in raw:
        if not isinstance(raw["path"], str):
            raise DatasetError(f"field 'video.path' must be a string, got {brief(raw['path'])}")
        path = _file(raw["path"], "video.path", base_dir, check)
    frames = _files(raw["frames"], "video.frames", base_dir, check) if "frames" in raw else ()
    indices = raw.get("frame_indices")
    if indices is not None and not isinstance(indices, list):
        raise DatasetError(f"field 'video.frame_indices' must be a list of integers, got {brief(indices)}")
    return Video(path=path, frames=frames, fps=raw.get("fps"),
                 frame_indices=None if indices is None else tuple(indices))


def _rgb(im) -> np.ndarray:
    """A PIL image -> RGB uint8. PIL reads 16-bit grey as mode I;16* (or I), which convert("RGB") clips at 255, so
    those are scaled from [0, 65535] (values outside clipped) to [0, 255]."""
    if im.mode.startswith("I"):
        grey = np.clip(np.asarray(im).astype(np.int64), 0, 65535)
        grey8 = ((grey * 255 + 65535 // 2) // 65535).astype(np.uint8)  # round(x / 257); no ties occur
        return np.repeat(grey8[:, :, None], 3, axis=-1)
    return np.asarray(im.convert("RGB"))


def format_number(x: float) -> str:
    """A number as the completions write it: integers without a decimal point."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _plain(c: float) -> int | float:
    return int(c) if float(c).is_integer() else float(c)


def _str_field(obj: dict, key: str) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise DatasetError(f"field '{key}' must be a string, got {brief(value)}")
    return value


def _answer(raw: Any, answer_type: str, options: list[str]) -> str | float:
    if answer_type == "text":
        if not isinstance(raw, str):
            raise DatasetError(f"field 'answer' of a text answer must be a string, got {brief(raw)}")
        return raw.strip()
    if answer_type == "number":
        if isinstance(raw, str):
            try:
                return float(raw)
            except ValueError:
                raise DatasetError(f"field 'answer' must be a number, got {brief(raw)}") from None
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise DatasetError(f"field 'answer' must be a number, got {brief(raw)}")
        try:
            return float(raw)
        except OverflowError:  # a JSON integer past the float range
            raise DatasetError(f"field 'answer' = {brief(raw)} is beyond the range of a float") from None
    # A gold given as "B", "B. text" or "(B) text" is its leading letter; an integer is an index into the options.
    if isinstance(raw, int) and not isinstance(raw, bool):
        if not 0 <= raw < len(options):
            raise DatasetError(f"field 'answer': index {brief(raw)} is outside the {len(options)} options")
        return LETTERS[raw]
    if not isinstance(raw, str):
        raise DatasetError(f"field 'answer' must be an option letter, got {brief(raw)}")
    text = raw.strip()
    if text.startswith("(") and len(text) >= 3 and text[2] == ")":
        text = text[1]
    letter = text[:1]
    if not letter or letter not in LETTERS[: len(options)] or (len(text) > 1 and text[1].isalnum()):
        raise DatasetError(f"field 'answer' {brief(raw)} does not name one of the {len(options)} options by its letter")
    return letter


def _from_record(parse, raw: Any, **kwargs):
    """The rewards' field parsers, with their errors re-raised as DatasetError (the reader adds path:line)."""
    try:
        return parse(raw, **kwargs)
    except RecordError as e:
        raise DatasetError(str(e)) from None
