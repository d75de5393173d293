"""A process's share of a multi-process run: it reads, rolls out and scores its own block of every batch.

Process p of P takes rows [p*b, (p+1)*b) of each batch of B = P*b samples, the batches one process alone would
read, cut in P blocks: the job sees the same data however many processes share it, and the G rollouts of a prompt
(a group) never span processes. Images are read, decoded and tokenised only by the process that owns them.

A process decodes only its own prompts, with its own decoding copy (rollout/decode_copy.py), keyed by the rollouts'
global ids (`row_ids`), so it draws the tokens one process decoding the whole batch would. What crosses hosts is
what the update and the metrics need: the rollouts' arrays (`assemble`) and each process's scores (`blocks`).
The SFT update's batch is the whole batch's arrays (`gather`).
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterable
from typing import Any, Literal

import jax
import numpy as np

from spatial_jax.data.pipeline import Batch, DataConfig, DataIterator, data_source, make_iterator, train_iterator
from spatial_jax.data.prompts import PromptFormat
from spatial_jax.data.tokenizer import SpatialTokenizer
from spatial_jax.distributed import allgather_bytes, allgather_json, allgather_rows
from spatial_jax.rollout.completions import COMPLETION_ROWS, PROMPT_ROWS, Completions, pad_to

# Batch fields of token rows: left-padded to the widest process's bucket (pad id for ids, 0 for masks)
_TOKEN_ROWS = ("input_ids", "attention_mask", "loss_mask")


@dataclasses.dataclass(frozen=True)
class HostShare:
    """Process `index` of `count`; the default (one process) reads, rolls out and scores everything."""

    index: int = 0
    count: int = 1
    pad_id: int = 0

    @classmethod
    def of_cluster(cls, pad_id: int) -> HostShare:
        return cls(jax.process_index(), jax.process_count(), pad_id)

    def rows(self, total: int) -> slice:
        """This process's block of `total` rows."""
        if total % self.count:
            raise ValueError(f"{total} rows do not split among {self.count} processes")
        size = total // self.count
        return slice(self.index * size, (self.index + 1) * size)

    def row_ids(self, prompts: int, group_size: int) -> np.ndarray:
        """Global ids of the rollouts of this process's `prompts` prompts (G each) among every process's equal
        blocks: rollout r of process p is p * prompts * G + r."""
        return self.index * prompts * group_size + np.arange(prompts * group_size)

    def iterator(self, data: DataConfig, tokenizer: SpatialTokenizer, fmt: PromptFormat, batch_size: int,
                 mode: Literal["rl", "sft"], image_cfg: Any) -> DataIterator:
        """This process's block of each of `train_iterator`'s batches of `batch_size`, read by this process alone."""
        return train_iterator(data, tokenizer, fmt, batch_size, mode=mode, image_cfg=image_cfg, process=self.index,
                              processes=self.count)

    def share(self, total: int) -> list[int]:
        """This process's contiguous run of indices 0..total-1 (process p's follow process p - 1's; the first
        total % count processes take one more): evaluation's questions, shared out."""
        return [int(i) for i in np.array_split(np.arange(total), self.count)[self.index]]

    def eval_iterator(self, data: DataConfig, tokenizer: SpatialTokenizer, fmt: PromptFormat, batch_size: int,
                      max_samples: int, image_cfg: Any) -> Iterable[Batch]:
        """This process's share of the held-out samples (data.eval; the first max_samples of them, or all), in file
        order, in batches of its share of batch_size."""
        source = data_source(data, data.eval)
        own = self.share(min(len(source), max_samples) if max_samples else len(source))
        if not own:
            return []
        return make_iterator([source[i] for i in own], tokenizer, data, fmt, max(1, batch_size // self.count),
                             shuffle=False, num_epochs=1, drop_remainder=False, image_cfg=image_cfg)

    def gather(self, batch: Batch) -> Batch:
        """The whole batch's arrays from every process's block, as one process would have read it (token rows
        left-padded to the widest block's bucket); records stay this process's own, so they are dropped here."""
        if self.count == 1:
            return batch
        width = int(allgather_rows(np.asarray([batch.input_ids.shape[1]])).max())
        out: dict[str, Any] = {"records": ()}
        for field in dataclasses.fields(batch):
            value = getattr(batch, field.name)
            if field.name == "records" or value is None:
                out.setdefault(field.name, value)
            elif field.name in _TOKEN_ROWS:
                fill = self.pad_id if field.name == "input_ids" else 0
                out[field.name] = allgather_rows(pad_to(value, width, fill, left=True))
            else:  # per-row values, or per-item / per-patch arrays in row order
                out[field.name] = allgather_rows(value)
        return dataclasses.replace(batch, **out)

    def assemble(self, comps: Completions) -> Completions:
        """Every process's rollouts' arrays in process order: those of the whole batch, as one process decoding it
        holds them (prompt rows left-padded to the widest process's, completion rows right-padded with the pad id
        and zeros). Texts and offsets stay with the process that scored them: the result has none."""
        if self.count == 1:
            return comps
        out: dict[str, Any] = {"texts": (), "offsets": ()}
        for field in dataclasses.fields(comps):
            name, value = field.name, getattr(comps, field.name)
            if name in out:
                continue
            if value is None:  # an optional per-item array not carried (second_per_grid)
                out[name] = None
                continue
            if name in PROMPT_ROWS or name in COMPLETION_ROWS:
                width = int(allgather_rows(np.asarray([value.shape[1]])).max())
                fill = self.pad_id if name in ("prompt_ids", "tokens") else 0
                value = pad_to(value, width, fill, left=name in PROMPT_ROWS)
            out[name] = allgather_rows(value)  # per-row values, or per-item / per-patch arrays in row order
        return dataclasses.replace(comps, **out)

    def blocks(self, obj: Any) -> list[Any]:
        """Every sharing process's JSON-ready `obj` (e.g. its scores), in process order; [obj] when one process reads
        everything."""
        return [obj] if self.count == 1 else allgather_json(obj)

    def everyone(self, obj: Any) -> list[Any]:
        """Every sharing process's `obj` (any picklable value: records, per-sample rows), in process order."""
        if self.count == 1:
            return [obj]
        return [pickle.loads(raw) for raw in allgather_bytes(pickle.dumps(obj))]
