"""A process's share of a multi-process run: it reads, rolls out and scores its own block of every batch.

Process p of P takes rows [p*b, (p+1)*b) of each batch of B = P*b samples, the batches one process alone would
read, cut in P blocks: the job sees the same data however many processes share it, and the G rollouts of a prompt
(a group) never span processes. Images are read, decoded and tokenised only by the process that owns them.

What crosses hosts: the prompt block's arrays, because the decoding program runs over every process's devices as one
(`gather`; so its draws are those of one process holding all devices), and each process's scores for the loss and
the metrics. A process turns only its own rollouts into records and scores them (`own`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import numpy as np

from spatial_jax.data.pipeline import Batch, DataConfig, DataIterator, train_iterator
from spatial_jax.data.prompts import PromptFormat
from spatial_jax.data.tokenizer import SpatialTokenizer
from spatial_jax.distributed import allgather_json, allgather_rows
from spatial_jax.rollout.completions import Completions

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

    def iterator(self, data: DataConfig, tokenizer: SpatialTokenizer, fmt: PromptFormat, batch_size: int,
                 mode: Literal["rl", "sft"], image_cfg: Any) -> DataIterator:
        """This process's block of each of `train_iterator`'s batches of `batch_size`, read by this process alone."""
        return train_iterator(data, tokenizer, fmt, batch_size, mode=mode, image_cfg=image_cfg, process=self.index,
                              processes=self.count)

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
                pad = np.full((value.shape[0], width - value.shape[1]), fill, value.dtype)
                out[field.name] = allgather_rows(np.concatenate([pad, value], axis=1))
            else:  # per-row values, or per-item / per-patch arrays in row order
                out[field.name] = allgather_rows(value)
        return dataclasses.replace(batch, **out)

    def own(self, comps: Completions) -> Completions:
        """This process's rollouts (those of its prompts) among completions of the whole batch."""
        if self.count == 1:
            return comps
        total = len(comps.texts)
        rows = self.rows(total)
        items, patches = comps.item_starts()
        out: dict[str, Any] = {}
        for field in dataclasses.fields(comps):
            value = getattr(comps, field.name)
            if field.name == "pixel_values":
                out[field.name] = value[patches[items[rows.start]] : patches[items[rows.stop]]]
            elif field.name == "image_grid_thw":
                out[field.name] = value[items[rows.start] : items[rows.stop]]
            elif len(value) == total:
                out[field.name] = value[rows]
            else:
                raise ValueError(f"Completions.{field.name} has {len(value)} rows, not one per rollout ({total})")
        return dataclasses.replace(comps, **out)

    def blocks(self, obj: Any) -> list[Any]:
        """Every sharing process's JSON-ready `obj` (e.g. its scores), in process order; [obj] when one process reads
        everything."""
        return [obj] if self.count == 1 else allgather_json(obj)
