"""All-rank data loading: the owner of micro ``m`` reads, decodes and processes only micro ``m``'s rows
(SPEC.md, "DATA_LOAD"). Images stay unopened in the rows until the owner's collator opens them, so no other
rank decodes them."""

from __future__ import annotations

import bisect
from typing import Callable

import torch

from .apart import apart_blocks, apart_kinds
from .row_identity import row_digest


def epoch_order(num_rows: int, seed: int, epoch: int) -> list[int]:
    """The shuffled order of rows ``0 .. num_rows - 1`` in epoch ``epoch``: ``torch.randperm`` drawn from
    ``seed + epoch`` (the same on every rank and after a resume)."""
    return torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


class MicroBatchPlan:
    """Which dataset rows form micro ``m`` of step ``k``: the rows are read as one stream, epoch after epoch, in
    consecutive blocks of ``micro_batch_size``, ``num_micro`` blocks per step. With ``shuffle``, each epoch reads
    the rows in its own order, a permutation drawn from ``seed + epoch`` (the same on every rank, so each owner
    knows its rows without asking).

    For a model that cannot take images and videos in one forward (its family's ``media_apart``, GLM-4.xV: told by
    the collator's model type, :func:`~.apart.media_apart`) and a dataset holding both, each epoch's rows are cut
    instead into micro-batches of at most ``micro_batch_size`` rows, none holding both an image row and a video
    row (:func:`~.apart.apart_blocks`: text-only rows go with either; at most two short micro-batches an epoch),
    read one after the other, epoch after epoch: every row once an epoch, the same on every rank and after a
    resume.

    Args:
        dataset: anything with ``len`` and ``__getitem__(int) -> row``.
        collate: rows -> dict of tensors.
        validate: raises ``ValueError`` on a micro-batch the model cannot take.
        replica, num_replicas: data parallelism: step ``k`` reads ``num_replicas * num_micro`` blocks, and the
            pipeline replica ``replica`` (its ``dp`` rank) takes the ``replica``-th run of ``num_micro`` of them;
            within it, each micro's owner loads it (the global batch split by dp rank first, then by owner).
        drop_bad_rows: a row that fails to load is dropped from its micro-batch (:meth:`load_rows`); else the
            whole micro-batch fails (``on_bad_sample: raise``).
        evaluation: the rows are an evaluation's (a dropped row's warning says the evaluation runs on the rest,
            not the step, and a dropped row is not remembered: each evaluation counts the rows it lost).

    Attributes:
        dropped: the rows dropped and not yet taken (:meth:`take_dropped`), each ``"WHERE (WHY)"``.
        failed: the dataset rows known to fail (a training plan's: those it dropped, and those other ranks dropped,
            :meth:`remember`): every later load leaves them out without trying them again, a warning or a count.
        kinds: each row's visual kind (``"image"``, ``"video"`` or ``None``, :func:`~.apart.row_kinds`) where image
            rows and video rows must go apart (:func:`~.apart.apart_kinds`), else ``None``.

    Raises:
        ValueError: ``micro_batch_size`` below 1, or an empty dataset.
    """

    def __init__(self, dataset, collate: Callable, num_micro: int, micro_batch_size: int,
                 validate: Callable[[dict], None] | None = None, shuffle: bool = False, seed: int = 0,
                 replica: int = 0, num_replicas: int = 1, drop_bad_rows: bool = True, evaluation: bool = False):
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if len(dataset) == 0:
            raise ValueError("the dataset has no rows")
        self.dataset, self.collate, self.num_micro, self.mbs = dataset, collate, num_micro, micro_batch_size
        self.replica, self.num_replicas = replica, num_replicas
        self.validate, self.shuffle, self.seed = validate, shuffle, seed
        self._orders: dict[int, list[int]] = {}
        self.drop_bad_rows, self.dropped = drop_bad_rows, []
        self.failed: set[int] = set()
        self._fresh: list[int] = []  # the rows dropped since take_failed(), by index
        self._remembers, self._stale = not evaluation, set()  # _stale: a checkpoint's rows now elsewhere
        self.rest = "the evaluation runs on the rest" if evaluation else "the step trains on the rest"
        self.kinds = apart_kinds(dataset, collate)  # None: images and videos may share a micro-batch
        self._blocks: dict[int, list[list[int]]] = {}  # epoch -> its micro-batches (with kinds)
        self._starts = [0]  # the index of epoch e's first micro-batch in the stream (with kinds)

    def steps_per_epoch(self) -> float:
        """Optimizer steps one pass over the rows takes (a fraction when the last step spans two epochs)."""
        if self.kinds is not None:
            return len(self._epoch_blocks(0)) / (self.num_replicas * self.num_micro)
        return len(self.dataset) / (self.num_replicas * self.num_micro * self.mbs)

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            self._orders = {epoch: epoch_order(len(self.dataset), self.seed, epoch)}
        return self._orders[epoch]

    def rows(self, step: int, micro: int) -> list[int]:
        """The dataset indices of micro ``micro`` of step ``step``."""
        index = (step * self.num_replicas + self.replica) * self.num_micro + micro
        if self.kinds is not None:
            return self._block(index)
        start, n = index * self.mbs, len(self.dataset)
        positions = [start + i for i in range(self.mbs)]
        if not self.shuffle:
            return [p % n for p in positions]
        return [self._order(p // n)[p % n] for p in positions]

    def _epoch_blocks(self, epoch: int) -> list[list[int]]:
        """Epoch ``epoch``'s micro-batches with kinds (:func:`~.apart.apart_blocks` of its order); the last two
        epochs' are kept."""
        if epoch not in self._blocks:
            order = self._order(epoch) if self.shuffle else range(len(self.dataset))
            self._blocks = {e: b for e, b in self._blocks.items() if e == epoch - 1}
            self._blocks[epoch] = apart_blocks(order, self.kinds, self.mbs)
        return self._blocks[epoch]

    def _block(self, index: int) -> list[int]:
        """Micro-batch ``index`` of the stream of every epoch's micro-batches with kinds."""
        while self._starts[-1] <= index:
            self._starts.append(self._starts[-1] + len(self._epoch_blocks(len(self._starts) - 1)))
        epoch = bisect.bisect_right(self._starts, index) - 1
        return list(self._epoch_blocks(epoch)[index - self._starts[epoch]])

    def eval_micros(self) -> list[list[int]]:
        """Every row once, in dataset order, cut into micro-batches of at most ``micro_batch_size`` rows, as an
        evaluation reads them: consecutive blocks, or with :attr:`kinds` none holding both an image row and a
        video row (:func:`~.apart.apart_blocks` over ``0 .. len - 1``)."""
        if self.kinds is not None:
            return apart_blocks(range(len(self.dataset)), self.kinds, self.mbs)
        n = len(self.dataset)
        return [list(range(s, min(s + self.mbs, n))) for s in range(0, n, self.mbs)]

    def micro_costs(self, step: int, row_costs) -> list[float]:
        """Each micro's cost in step ``step``: the sum of ``row_costs[i]`` over its rows ``i`` (e.g. a
        :class:`~.conversation.ConversationDataset`'s ``visual_tokens``, its rows' image and video tokens: a video
        token is as many tower patches as an image token). Every rank computes the same, with no collective and
        nothing decoded: what load-aware owners are balanced by (:mod:`mpipe_hf.schedule.owners`).

        Raises:
            ValueError: ``row_costs`` does not give one cost per dataset row.
        """
        if len(row_costs) != len(self.dataset):
            raise ValueError(f"row_costs gives {len(row_costs)} costs for {len(self.dataset)} dataset rows")
        return [sum(row_costs[i] for i in self.rows(step, m)) for m in range(self.num_micro)]

    def load(self, step: int, micro: int) -> dict[str, torch.Tensor]:
        """Read, decode and process micro ``micro`` of step ``step`` (:meth:`load_rows`).

        Raises:
            ValueError: as :meth:`load_rows`.
        """
        return self.load_rows(self.rows(step, micro))

    def load_rows(self, rows: list[int]) -> dict[str, torch.Tensor]:
        """Read, decode and process the dataset rows ``rows`` as one micro-batch.

        With :attr:`drop_bad_rows` (default), a row that fails (to read, to decode an image, to be processed, or
        the model's ``validate``) costs that row: when the whole micro-batch fails, each row is collated alone to
        find the bad ones, which are dropped (one warning line each, ``mpipe_hf: warning: dropped WHERE (WHY);
        the step trains on the rest`` (an evaluation's: ``the evaluation runs on the rest``), and an entry in
        :attr:`dropped`) and the rest collated again. A row in :attr:`failed` is left out before anything is read.
        When every row fails, the collator's ``null_batch()`` stands in (one text-only row, every label ``-100``:
        no loss, no label token, zero gradients), if it has one.

        Raises:
            ValueError: the rows fail, naming them and the error's type (an undecodable image is an ``OSError``
                in PIL), and either :attr:`drop_bad_rows` is off, no single row is to blame (the rows fail together
                only), or every row fails (or failed before) and the collator has no ``null_batch`` (a user's
                ``data_collator``).
        """
        if self.drop_bad_rows and self.failed.intersection(rows):
            known, rows = rows, [i for i in rows if i not in self.failed]
            if not rows:
                return self._all_failed(known)
        try:
            return self._checked(rows)
        except Exception as err:  # noqa: BLE001 - every failure of a sample is a bad sample
            failure = _bad_rows_error(rows, err)
            if not self.drop_bad_rows:
                raise failure from err
        bad = {rows[0]: failure.__cause__} if len(rows) == 1 else {}
        for i in rows if len(rows) > 1 else []:
            try:
                self._checked([i])
            except Exception as err:  # noqa: BLE001 - as above, one row at a time
                bad[i] = err
        if not bad:
            raise failure
        kept = [i for i in rows if i not in bad]
        null = getattr(self.collate, "null_batch", None)
        if not kept and null is None:
            raise failure
        try:  # a null micro-batch the model rejects, or good rows that fail together: the rows' error stands
            batch = self._checked(kept) if kept else self._checked_null(null)
        except Exception:  # noqa: BLE001
            raise failure from failure.__cause__
        for i, err in bad.items():
            self._drop(i, err)
        return batch

    def _all_failed(self, rows: list[int]) -> dict[str, torch.Tensor]:
        """The micro-batch of ``rows``, each known to fail: the collator's null micro-batch.

        Raises:
            ValueError: the collator has no ``null_batch`` (a user's ``data_collator``).
        """
        null = getattr(self.collate, "null_batch", None)
        if null is None:
            raise ValueError(f"dataset rows {rows}: every row failed to load before, and the collator has no "
                             f"null_batch to stand in")
        return self._checked_null(null)

    def _checked(self, rows: list[int]) -> dict[str, torch.Tensor]:
        """The collated, validated micro-batch of ``rows`` (raises what the read, collator or check raises)."""
        batch = self.collate([self.dataset[i] for i in rows])
        if self.validate is not None:
            self.validate(batch)
        return batch

    def _checked_null(self, null: Callable[[], dict]) -> dict[str, torch.Tensor]:
        """The collator's null micro-batch, validated."""
        batch = null()
        if self.validate is not None:
            self.validate(batch)
        return batch

    def where(self, i: int) -> str:
        """Where dataset row ``i`` comes from: the dataset's ``where(i)`` (a file and 1-based line, or a row of a
        parquet file), else the row's ``where``, else its ``source:line``, else ``dataset row i``."""
        if callable(getattr(self.dataset, "where", None)):
            return str(self.dataset.where(i))
        try:
            row = self.dataset[i]
        except Exception:  # noqa: BLE001 - a row that cannot even be read is named by its index
            row = None
        if isinstance(row, dict) and row.get("where"):
            return str(row["where"])
        if isinstance(row, dict) and "source" in row and "line" in row:
            return f"{row['source']}:{row['line']}"
        return f"dataset row {i}"

    def _drop(self, i: int, err: BaseException) -> None:
        """Record and report the dropped row ``i``."""
        where = self.where(i)
        reason = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        reason = reason[len(where) + 2:] if reason.startswith(f"{where}: ") else reason
        self.dropped.append(f"{where} ({reason})")
        if self._remembers:
            self.failed.add(i)
            self._fresh.append(i)
        print(f"mpipe_hf: warning: dropped {where} ({reason}); {self.rest}", flush=True)

    def take_dropped(self) -> list[str]:
        """The rows dropped since the last call, each ``WHERE (WHY)``, oldest first; the list starts empty again
        (what the executor reads after a step's loads: ``PipelineExecutor.step(bad_rows=...)``)."""
        taken, self.dropped = self.dropped, []
        return taken

    def take_failed(self) -> list[int]:
        """The dataset rows this plan dropped since the last call, by index, oldest first (what the ranks
        exchange so that each remembers every rank's: :meth:`remember`); the list starts empty again."""
        taken, self._fresh = self._fresh, []
        return taken

    def identity(self, i: int) -> tuple[str, str]:
        """Row ``i`` as a checkpoint remembers it: ``(where, digest)``, its place (:meth:`where`) and a digest of
        its content and of the files it names (:func:`~.row_identity.row_digest`)."""
        return self.where(i), row_digest(self.dataset, i)

    def remember(self, rows) -> list[int]:
        """Add ``rows`` to :attr:`failed`: later loads leave them out. ``rows``: dataset indices (e.g. those other
        ranks dropped), or ``{index: (where, digest)}`` (a checkpoint's, :meth:`identity`), where an index whose
        row is another one now (the data changed since the checkpoint: another dataset, an edited file or image,
        another mixture) is not remembered but tried again, as is a checkpoint's entry that gives its place only
        (saved before rows had a digest). An evaluation's plan remembers nothing.

        Returns:
            the checkpoint's indices found stale by this call (each once per plan), in the order given.
        """
        stale = []
        if not self._remembers:
            return stale
        for i in rows:
            if i in self.failed or i in self._stale:
                continue
            saved = rows[i] if isinstance(rows, dict) else None
            if saved is None or (isinstance(saved, tuple) and 0 <= i < len(self.dataset)
                                 and self.identity(i) == saved):
                self.failed.add(i)
            else:
                self._stale.add(i)
                stale.append(i)
        return stale


def _bad_rows_error(rows: list[int], err: BaseException) -> ValueError:
    kind = "" if isinstance(err, ValueError) else f"{type(err).__name__}: "
    failure = ValueError(f"dataset rows {rows}: {kind}{err}")
    failure.__cause__ = err
    return failure
