"""All-rank data loading: the owner of micro ``m`` reads, decodes and processes only micro ``m``'s rows
(SPEC.md, "DATA_LOAD"). Images are decoded lazily by ``datasets.Image``, so no other rank decodes them."""

from __future__ import annotations

from typing import Callable

import datasets
import torch


def load_text_dataset(jsonl_path: str) -> datasets.Dataset:
    """Read a JSONL of ``{"text": str}`` rows with ``datasets``.

    Raises:
        ValueError: the rows have no ``text`` column.
    """
    ds = datasets.load_dataset("json", data_files=jsonl_path, split="train")
    if "text" not in ds.column_names:
        raise ValueError(f"{jsonl_path}: a text dataset needs a 'text' field per row, got {ds.column_names}")
    return ds


def epoch_order(num_rows: int, seed: int, epoch: int) -> list[int]:
    """The shuffled order of rows ``0 .. num_rows - 1`` in epoch ``epoch``: ``torch.randperm`` drawn from
    ``seed + epoch`` (the same on every rank and after a resume)."""
    return torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


class MicroBatchPlan:
    """Which dataset rows form micro ``m`` of step ``k``: the rows are read as one stream, epoch after epoch, in
    consecutive blocks of ``micro_batch_size``, ``num_micro`` blocks per step. With ``shuffle``, each epoch reads
    the rows in its own order, a permutation drawn from ``seed + epoch`` (the same on every rank, so each owner
    knows its rows without asking).

    Args:
        dataset: anything with ``len`` and ``__getitem__(int) -> row``.
        collate: rows -> dict of tensors.
        validate: raises ``ValueError`` on a micro-batch the model cannot take.
        replica, num_replicas: data parallelism: step ``k`` reads ``num_replicas * num_micro`` blocks, and the
            pipeline replica ``replica`` (its ``dp`` rank) takes the ``replica``-th run of ``num_micro`` of them;
            within it, each micro's owner loads it (the global batch split by dp rank first, then by owner).

    Raises:
        ValueError: ``micro_batch_size`` below 1, or an empty dataset.
    """

    def __init__(self, dataset, collate: Callable, num_micro: int, micro_batch_size: int,
                 validate: Callable[[dict], None] | None = None, shuffle: bool = False, seed: int = 0,
                 replica: int = 0, num_replicas: int = 1):
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if len(dataset) == 0:
            raise ValueError("the dataset has no rows")
        self.dataset, self.collate, self.num_micro, self.mbs = dataset, collate, num_micro, micro_batch_size
        self.replica, self.num_replicas = replica, num_replicas
        self.validate, self.shuffle, self.seed = validate, shuffle, seed
        self._orders: dict[int, list[int]] = {}

    def steps_per_epoch(self) -> float:
        """Optimizer steps one pass over the rows takes (a fraction when the last step spans two epochs)."""
        return len(self.dataset) / (self.num_replicas * self.num_micro * self.mbs)

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            self._orders = {epoch: epoch_order(len(self.dataset), self.seed, epoch)}
        return self._orders[epoch]

    def rows(self, step: int, micro: int) -> list[int]:
        """The dataset indices of micro ``micro`` of step ``step``."""
        start = ((step * self.num_replicas + self.replica) * self.num_micro + micro) * self.mbs
        n = len(self.dataset)
        positions = [start + i for i in range(self.mbs)]
        if not self.shuffle:
            return [p % n for p in positions]
        return [self._order(p // n)[p % n] for p in positions]

    def micro_costs(self, step: int, row_costs) -> list[float]:
        """Each micro's cost in step ``step``: the sum of ``row_costs[i]`` over its rows ``i`` (e.g. a
        :class:`~.conversation.ConversationDataset`'s ``image_tokens``). Every rank computes the same, with no
        collective and nothing decoded: what load-aware owners are balanced by (:mod:`mpipe_hf.schedule.owners`).

        Raises:
            ValueError: ``row_costs`` does not give one cost per dataset row.
        """
        if len(row_costs) != len(self.dataset):
            raise ValueError(f"row_costs gives {len(row_costs)} costs for {len(self.dataset)} dataset rows")
        return [sum(row_costs[i] for i in self.rows(step, m)) for m in range(self.num_micro)]

    def load(self, step: int, micro: int) -> dict[str, torch.Tensor]:
        """Read, decode and process micro ``micro`` of step ``step``.

        Raises:
            ValueError: any failure to read, decode, process or validate the rows (an undecodable image is an
                ``OSError`` in PIL), naming the rows and the error's type.
        """
        return self.load_rows(self.rows(step, micro))

    def load_rows(self, rows: list[int]) -> dict[str, torch.Tensor]:
        """Read, decode and process the dataset rows ``rows`` as one micro-batch (raises as :meth:`load`)."""
        try:
            batch = self.collate([self.dataset[i] for i in rows])
            if self.validate is not None:
                self.validate(batch)
        except Exception as err:  # noqa: BLE001 - every failure of a sample is a bad sample
            kind = "" if isinstance(err, ValueError) else f"{type(err).__name__}: "
            raise ValueError(f"dataset rows {rows}: {kind}{err}") from err
        return batch
