"""Pseudo-ground-truth boxes for a dataset (SpatialCORE A.3, SPEC 2): object phrases from the question and options,
a zero-shot detector, the top box per phrase, scores below the threshold dropped, boxes scaled to the [0, 1000]
frame, validity = detector score.

Three separable parts: phrase extraction (data/phrases.py: `extract_phrases`, offline; `ChatExtractor`, an
OpenAI-compatible endpoint, or any callable (question, options) -> phrases), box selection on plain arrays
(`select_boxes`), and the detector runner (`ZeroShotDetector`, transformers' Grounding DINO / OWLv2 / OWL-ViT from a
local folder). `annotate` writes the samples with `gt_boxes` filled, appending and flushing per batch;
`completed_ids` makes a rerun after a kill skip what is written (a last line cut short is dropped), so no record is
written twice. A rerun trusts the rows only when `<output>.settings.json`, written before the first row, records the
settings it has itself (`resume_settings`): the same input, detector weights, threshold, pixel cap and phrase
extractor.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import numpy as np

from spatial_jax.config import ConfigError, check_at_least, check_range
from spatial_jax.data.jsonl import MalformedJSON, parse_line
from spatial_jax.data.phrases import PhraseExtractor, clean_phrases, extract_phrases
from spatial_jax.data.pipeline import DataConfig
from spatial_jax.data.sample import DatasetError, Sample
from spatial_jax.data.sources import spec_digest
from spatial_jax.digests import sha256
from spatial_jax.records import GTBox, brief

NORM = 1000


@dataclasses.dataclass(frozen=True)
class PseudoGTConfig:
    """threshold: detections scored below it are dropped (A.3: 0.3). batch_size: samples per detector call, and per
    flush of the output (what a kill can lose). max_image_pixels: larger images are refused from their header, as
    the training job refuses them (data.max_image_pixels), instead of the detector taking minutes over one."""

    threshold: float = 0.3
    batch_size: int = 8
    max_image_pixels: int = DataConfig.max_image_pixels

    def __post_init__(self):
        check_range(self, "threshold", 0, 1)
        check_at_least(self, batch_size=1, max_image_pixels=1)


# ---------------------------------------------------------------- what decides the boxes, recorded for a resume

# a detector folder's files transformers reads (weights, configs, vocabulary); anything else in it decides nothing
DETECTOR_FILES = (".json", ".safetensors", ".bin", ".txt", ".model")


def settings_path(out: str | Path) -> Path:
    return Path(f"{out}.settings.json")


def box_settings(input_spec: str, detector: str | Path, cfg: PseudoGTConfig, extractor: str) -> dict:
    """What decides an output row's boxes: the input's rows (by digest), the detector's weights and configs (by
    digest: a copy elsewhere is the same detector), the threshold, the pixel cap and the phrase extractor (its
    words)."""
    folder = Path(detector)
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in DETECTOR_FILES) if folder.is_dir() \
        else []
    return {"input_sha256": spec_digest(input_spec),
            "detector_sha256": {p.name: sha256(p) for p in files},
            "threshold": cfg.threshold, "max_image_pixels": cfg.max_image_pixels, "extractor": extractor}


def resume_settings(out: str | Path, settings: dict) -> None:
    """Before any row is read or written: an output holding rows is resumed only when the settings recorded beside it
    are `settings` (a ConfigError names the difference, or says no settings were recorded: rows this command did not
    write); an output without rows gets `settings` recorded (atomically) before its first row."""
    out, path = Path(out), settings_path(out)
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        recorded = None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} does not read ({e}): it records how --output {out} was written") from None
    if out.exists() and out.stat().st_size > 0:
        if not isinstance(recorded, dict):
            raise ConfigError(f"--output {out} holds rows this command did not write (no {path.name} beside it "
                              "records their settings): name a new file")
        differ = [f"{k}={brief(recorded.get(k))} (here {brief(v)})" for k, v in settings.items()
                  if recorded.get(k) != v]
        if differ:
            raise ConfigError(f"--output {out} was written with other settings: {'; '.join(differ)}; rerun with "
                              "its settings to resume it, or name a new file")
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, path)


# ---------------------------------------------------------------- box selection


@dataclasses.dataclass(frozen=True)
class Detections:
    """One image's candidate boxes: `boxes` [N, 4] as (x1, y1, x2, y2) in pixels of the image; `scores` [N, P], each
    candidate's score for each of the image's P phrases (-inf or NaN where the detector gave none)."""

    boxes: np.ndarray
    scores: np.ndarray


def select_boxes(detections: Detections, phrases: Sequence[str], image_size: tuple[int, int],
                 threshold: float) -> tuple[GTBox, ...]:
    """A.3 on plain arrays: each candidate belongs to the phrase it scores highest on (the detector's returned label,
    so one box never names two objects); per phrase its top-scoring candidate is kept when scored >= threshold, as
    integer [0, 1000] coordinates of the image (`image_size` = (width, height)), clipped to the frame, with
    validity = the score. Candidates that are not finite or have no area once in the integer frame never win.
    Phrases are distinct; the boxes come in phrase order."""
    boxes = np.asarray(detections.boxes, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(detections.scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape != (len(boxes), len(phrases)):
        raise ValueError(f"scores must have shape [{len(boxes)} candidates, {len(phrases)} phrases], "
                         f"got {list(scores.shape)}")
    width, height = image_size
    if width < 1 or height < 1:
        raise ValueError(f"image size must be >= 1 pixel each way, got {image_size}")
    if not len(boxes) or not len(phrases):
        return ()
    scaled = boxes * np.array([NORM / width, NORM / height, NORM / width, NORM / height])
    with np.errstate(invalid="ignore"):
        frame = np.clip(np.rint(scaled), 0, NORM)
    x1, x2 = np.minimum(frame[:, 0], frame[:, 2]), np.maximum(frame[:, 0], frame[:, 2])
    y1, y2 = np.minimum(frame[:, 1], frame[:, 3]), np.maximum(frame[:, 1], frame[:, 3])
    usable = np.isfinite(scaled).all(axis=1) & (x2 > x1) & (y2 > y1)
    clean = np.where(np.isnan(scores), -np.inf, scores)
    owner = np.argmax(clean, axis=1)
    best = clean[np.arange(len(boxes)), owner]
    out = []
    for p, phrase in enumerate(phrases):
        mine = np.flatnonzero(usable & (owner == p) & (best >= threshold))
        if not len(mine):
            continue
        k = mine[np.argmax(best[mine])]
        v = round(float(np.clip(best[k], 0.0, 1.0)), 4)
        out.append(GTBox(bbox=(float(x1[k]), float(y1[k]), float(x2[k]), float(y2[k])), label=phrase, validity=v))
    return tuple(out)


# ---------------------------------------------------------------- detector runner

Detector = Callable[[list[np.ndarray], list[list[str]]], list[Detections]]
FAMILIES = ("grounding-dino", "mm-grounding-dino", "owlv2", "owlvit")


class ZeroShotDetector:
    """A transformers zero-shot detector (AutoProcessor + AutoModelForZeroShotObjectDetection) loaded from a local
    folder only, never downloaded. Called with images (RGB uint8 arrays) and each image's phrases, it returns one
    Detections per image. Grounding DINO reads the phrases as one prompt ("a. b."), and a candidate's score for a
    phrase is its highest token probability over the phrase's tokens; OWL models score each phrase as a query."""

    def __init__(self, path: str | Path, device: str | None = None):
        import torch
        from transformers import AutoConfig, AutoModelForZeroShotObjectDetection, AutoProcessor

        path = Path(path)
        if not path.is_dir():
            raise ConfigError(f"--detector {path}: no such folder (a saved transformers detector is needed)")
        try:
            model_type = AutoConfig.from_pretrained(path, local_files_only=True).model_type
        except (OSError, ValueError) as e:
            raise ConfigError(f"--detector {path}: cannot read its config.json: {e}") from None
        if model_type not in FAMILIES:
            raise ConfigError(f"--detector {path}: model type {model_type!r} is not a supported zero-shot "
                              f"detector; supported: {list(FAMILIES)}")
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda: torch sees no CUDA device")
        self.family = model_type
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.processor = AutoProcessor.from_pretrained(path, local_files_only=True)
        self.model = AutoModelForZeroShotObjectDetection.from_pretrained(path, local_files_only=True)
        self.model.to(self.device).eval()

    def __call__(self, images: list[np.ndarray], phrases: list[list[str]]) -> list[Detections]:
        import torch

        with torch.inference_mode():
            if "grounding-dino" in self.family:
                return self._grounding_dino(images, phrases)
            return self._owl(images, phrases)

    def _grounding_dino(self, images, phrases) -> list[Detections]:
        max_len = self.model.config.max_text_len
        # The model splits its prompt at "." tokens, so a phrase carries none of its own.
        parts = [[p.replace(".", " ").strip() for p in ps] for ps in phrases]
        prompts = [". ".join(ps) + "." for ps in parts]
        inputs = self.processor(images=images, text=prompts, return_tensors="pt", padding="longest",
                                truncation=True, max_length=max_len).to(self.device)
        out = self.model(**inputs)
        probs = out.logits.sigmoid().float().cpu().numpy()  # [B, queries, max_text_len]
        rel = out.pred_boxes.float().cpu().numpy()  # (cx, cy, w, h) relative to the image
        result = []
        for b, (image, ps, prompt) in enumerate(zip(images, parts, prompts)):
            offsets = self.processor.tokenizer(prompt, return_offsets_mapping=True, truncation=True,
                                               max_length=max_len)["offset_mapping"]
            scores = np.full((probs.shape[1], len(ps)), -np.inf)
            start = 0
            for p, phrase in enumerate(ps):
                end = start + len(phrase)
                tokens = [t for t, (s, e) in enumerate(offsets) if e > s and s >= start and e <= end]
                if tokens:  # a phrase cut off by max_text_len has none and gets no box
                    scores[:, p] = probs[b][:, tokens].max(axis=1)
                start = end + 2  # ". "
            h, w = image.shape[:2]
            result.append(Detections(_corners(rel[b]) * np.array([w, h, w, h]), scores))
        return result

    def _owl(self, images, phrases) -> list[Detections]:
        max_len = self.model.config.text_config.max_position_embeddings
        inputs = self.processor(images=images, text=[list(ps) for ps in phrases], return_tensors="pt",
                                truncation=True, max_length=max_len).to(self.device)
        out = self.model(**inputs)
        probs = out.logits.sigmoid().float().cpu().numpy()  # [B, patches, max queries]
        rel = out.pred_boxes.float().cpu().numpy()
        result = []
        for b, (image, ps) in enumerate(zip(images, phrases)):
            h, w = image.shape[:2]
            # OWLv2 pads each image to a square (bottom and right) before resizing; OWL-ViT resizes it as it is.
            scale = np.array([max(w, h)] * 4) if self.family == "owlv2" else np.array([w, h, w, h])
            result.append(Detections(_corners(rel[b]) * scale, probs[b][:, : len(ps)]))
        return result


def _corners(cxcywh: np.ndarray) -> np.ndarray:
    cx, cy, w, h = np.moveaxis(np.asarray(cxcywh, dtype=np.float64), -1, 0)
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)


# ---------------------------------------------------------------- resumable JSONL writing


def relocate(sample: Sample, out_dir: str | Path) -> Sample:
    """The sample with its image, images or video files relative to `out_dir`, where its row is written (the reader
    resolves them against the JSONL file's folder); in-memory images stay as they are."""
    base = os.path.abspath(out_dir)

    def moved(ref):
        return os.path.relpath(os.path.abspath(ref), base) if isinstance(ref, str) else ref

    video = sample.video
    if video is not None:
        video = dataclasses.replace(video, path=moved(video.path), frames=tuple(moved(f) for f in video.frames))
    return dataclasses.replace(sample, image=moved(sample.image), images=tuple(moved(r) for r in sample.images),
                               video=video)


def completed_ids(out: str | Path, ids: Collection[str]) -> set[str]:
    """The ids already written to `out` by an earlier run (none when it does not exist). A line that is no record, or
    a record whose id is not among `ids`, is a DatasetError naming `out:line`, the file left as it is: it is not an
    earlier run's output on this input. Only once every line passed is a last line without its newline (the start
    of a record, cut short by a kill) cut from the file."""
    out = Path(out)
    if not out.exists():
        return set()
    data = out.read_bytes()
    end = data.rfind(b"\n") + 1
    lines = data[:end].decode("utf-8", errors="replace").split("\n")[:-1]
    done = {_earlier_id(out, lineno, line, ids) for lineno, line in enumerate(lines, start=1) if line.strip()}
    tail = data[end:].decode("utf-8", errors="replace")
    if tail.strip() and not _cut_record(tail):  # a whole record that lost only its newline is checked as any other
        _earlier_id(out, len(lines) + 1, tail, ids)
    if end < len(data):
        with open(out, "r+b") as f:
            f.truncate(end)
    return done


def _cut_record(text: str) -> bool:
    """Whether `text` is the start of a row `annotate` writes (`{"id": ...`), cut short before its end."""
    start = '{"id": '
    if not (text.startswith(start) or start.startswith(text)):
        return False
    try:
        parse_line(text)
    except MalformedJSON:
        return True
    return False


def _earlier_id(out: Path, lineno: int, line: str, ids: Collection[str]) -> str:
    """The id of one line of an earlier run's output; DatasetError when it is no record of an id in `ids`."""
    try:
        obj = parse_line(line)
    except MalformedJSON as e:
        raise DatasetError(f"{out}:{lineno}: {e}; not a record of an earlier run (remove the file to start "
                           f"over)") from None
    sid = str(obj.get("id")) if isinstance(obj, dict) else None
    if sid not in ids:
        raise DatasetError(f"{out}:{lineno}: id {sid!r} is not in the input; the file is not an earlier run's "
                           f"output on this input (remove it or choose another --output)")
    return sid


def annotate(samples: Sequence[Sample], out: str | Path, detector: Detector,
             extractor: PhraseExtractor = extract_phrases, cfg: PseudoGTConfig = PseudoGTConfig(),
             done: Collection[str] = frozenset(), progress: bool = True) -> dict[str, int]:
    """Appends each sample not in `done` to `out`, in input order, with its pseudo-GT boxes (label = phrase) and, in
    meta["pseudo_gt"], its phrases (the extractor's, through `clean_phrases`) and the threshold; flushes after every
    batch. A sample without phrases, or without a picture, gets no boxes and costs no detector call. Returns counts."""
    from tqdm import tqdm

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    todo = [s for s in samples if s.id not in done]
    stats = {"samples": len(samples), "already_done": len(samples) - len(todo), "written": 0,
             "with_phrases": 0, "with_boxes": 0, "boxes": 0}
    with open(out, "a", encoding="utf-8") as f, tqdm(total=len(samples), initial=stats["already_done"],
                                                    unit="sample", desc="pseudo-gt", disable=not progress) as bar:
        for start in range(0, len(todo), cfg.batch_size):
            batch = todo[start: start + cfg.batch_size]
            phrases = [clean_phrases(extractor(s.question, s.options)) for s in batch]
            asked = [i for i, ps in enumerate(phrases) if ps and not batch[i].text_only]  # no picture: no boxes
            images = {i: batch[i].load_image(cfg.max_image_pixels) for i in asked}
            found = detector(list(images.values()), [phrases[i] for i in asked]) if asked else []
            for i, s in enumerate(batch):
                boxes: tuple[GTBox, ...] = ()
                if i in images:
                    height, width = images[i].shape[:2]
                    boxes = select_boxes(found[asked.index(i)], phrases[i], (width, height), cfg.threshold)
                meta = {**s.meta, "pseudo_gt": {"phrases": list(phrases[i]), "threshold": cfg.threshold}}
                row = relocate(dataclasses.replace(s, gt_boxes=boxes, meta=meta), out.parent)
                f.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
                stats["written"] += 1
                stats["with_phrases"] += bool(phrases[i])
                stats["with_boxes"] += bool(boxes)
                stats["boxes"] += len(boxes)
            f.flush()
            bar.update(len(batch))
    return stats
