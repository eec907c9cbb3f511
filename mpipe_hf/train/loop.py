"""One training step of the pipeline with the bad-sample policy: the piece of the loop that ``mpipe-hf train``
and the HF Trainer integration share (README, "Design notes").

With ``on_bad_sample: skip``, a row that fails at load (an undecodable image, a sample the model rejects) costs
that row: its owner drops it from the micro-batch and the step trains on the rest
(:meth:`~mpipe_hf.data.owner.MicroBatchPlan.load_rows`); the vote before the step's first transfer tells every rank
how many rows were dropped (:attr:`~mpipe_hf.runtime.StepStats.bad_rows`). A step that cannot run (a micro-batch a
user's collator cannot load, a step with no row left, a loss or gradient norm that is not finite: any
``ValueError`` of the step, which the executor raises on every rank with the same text) is skipped on every rank:
no gradient is left, the caller takes no optimizer step, and the next step runs exact. The run stops once more
than ``data.max_bad_rows`` distinct rows failed in all, or that many steps in a row were skipped.

A row that failed is remembered: after a step whose vote counted dropped rows, every rank learns which rows were
dropped on any rank (one gather over the vote's group, only then) and the plan leaves them out of every later load
(:meth:`~mpipe_hf.data.owner.MicroBatchPlan.remember`), so a bad row is tried, warned about and counted once per
run, not once per epoch; the set is saved with the rank's state. The error that stops the run for bad data says
whether the state is whole enough to save a checkpoint first (:func:`saves_before_stop`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch.distributed as dist

from ..runtime import PipelineExecutor, StepStats
from .recipe import DataSection


@dataclass
class Skips:
    """The bad data so far: the skipped steps, ``in_row`` (since the last step that ran) and ``total``, the last
    error, ``bad_rows``, the distinct rows dropped at load over the run, and ``rows``, ``{dataset index: (where,
    digest)}`` of those the plan named (both saved with the rank's state; a resume onto changed data forgets
    the entries whose row is another one now, :func:`forget_stale`)."""

    in_row: int = 0
    total: int = 0
    last: str | None = None
    held: int = 0  # ``in_row`` before the last step that ran, in case it turns out not finite
    bad_rows: int = 0
    rows: dict = field(default_factory=dict)

    def warning(self, step: int) -> str:
        """The line that reports step ``step`` (0-based) as skipped."""
        return (f"mpipe_hf: warning: step {step + 1} skipped ({self.in_row} in a row, {self.total} in all): "
                f"{self.last}")

    def record(self, reason: str, data: DataSection) -> None:
        """Count a skipped step.

        Raises:
            ValueError: the ``data.max_bad_rows``-th skipped step in a row: ``reason`` and the count.
        """
        self.in_row, self.total, self.last = self.in_row + 1, self.total + 1, reason
        if self.in_row >= data.max_bad_rows:
            raise _shared(f"{reason} ({self.in_row} steps in a row skipped, data.max_bad_rows = "
                          f"{data.max_bad_rows})", rows=False)

    @staticmethod
    def dropped_warning(step: int, stats) -> str:
        """The line the lead rank prints for step ``step`` (0-based) whose loads dropped ``stats.bad_rows`` rows
        (each owner also prints its own, on its own output): the count and one row's place and reason."""
        others = f" and {stats.bad_rows - 1} more" if stats.bad_rows > 1 else ""
        return (f"mpipe_hf: warning: step {step + 1}: {stats.bad_rows} bad row(s) dropped, {stats.bad_row}{others}; "
                f"the step trained on the rest")

    def drop_rows(self, count: int, reason: str | None, data: DataSection) -> None:
        """Count ``count`` rows a step dropped at load, each a row not counted before (``reason``: one of them,
        ``"WHERE (WHY)"``).

        Raises:
            ValueError: more than ``data.max_bad_rows`` distinct rows dropped in all: ``reason`` and the count.
        """
        self.bad_rows += count
        if count and self.bad_rows > data.max_bad_rows:
            raise _shared(f"a row failed to load: {reason} ({self.bad_rows} rows failed in all, more than "
                          f"data.max_bad_rows = {data.max_bad_rows})", rows=True)

    def distinct(self, count: int, executor, plan) -> int:
        """Of the ``count`` rows the step's vote counted as dropped, those not counted before: with ``plan``
        (the step's :class:`~mpipe_hf.data.owner.MicroBatchPlan`), every rank's newly dropped row indices are
        gathered over the vote's group (all ranks of every replica; a collective, so every rank calls it with
        the same ``count``: the vote's), every rank's plan remembers them and :attr:`rows` adds them (with
        their place, :meth:`~mpipe_hf.data.owner.MicroBatchPlan.where`); without
        ``plan`` (rows that have no index), ``count`` as it is."""
        if plan is None or not count:
            return count
        mine, group = plan.take_failed(), getattr(executor, "control", None)
        every = [mine]
        if group is not None and dist.is_initialized():
            every = [None] * dist.get_world_size(group)
            dist.all_gather_object(every, mine, group=group)
        new = sorted({i for rows in every for i in rows} - self.rows.keys())
        self.rows.update((i, plan.identity(i)) for i in new)
        plan.remember(new)
        return len(new)


def forget_stale(skips: Skips, stale: list[int]) -> None:
    """Drop from ``skips.rows`` the checkpoint's failed rows that ``plan``'s data no longer holds as they were
    (``stale``: :meth:`~mpipe_hf.data.owner.MicroBatchPlan.remember`'s answer), which are tried again and, should
    they fail, counted as new; the world's rank 0 says so in one line. Their count stays in ``skips.bad_rows``: those
    rows did fail in the run before. An entry saved without a digest (its place only) is tried again too, but
    kept, so that it is not counted twice. Every rank decides alike (the same data, the same checkpoint)."""
    if not stale:
        return
    places = [skips.rows.pop(i)[0] if isinstance(skips.rows[i], tuple) else skips.rows[i] for i in stale]
    if not dist.is_initialized() or dist.get_rank() == 0:  # the lead rank of the world: one line for the run
        shown = ", ".join(places[:3]) + (f" and {len(places) - 3} more" if len(places) > 3 else "")
        print(f"mpipe_hf: resumed onto other data: {len(stale)} row(s) the checkpoint remembers as failed are not "
              f"known to be the rows at those places now ({shown}); they are tried again", flush=True)


def _shared(text: str, rows: bool) -> ValueError:
    err = ValueError(text)
    err.shared = True  # every rank counts the same skips: one line for the run, not one per rank
    err.bad_data = "rows" if rows else "steps"  # the stop for bad data (saves_before_stop)
    return err


def saves_before_stop(err: BaseException, data_parallel: bool) -> bool:
    """Whether a run stopped by ``err`` saves a resumable checkpoint first: the stop for too many bad rows (the
    step ran, or failed only after its whole schedule, on every rank alike), and the stop for too many skipped
    steps in a row without data parallelism (a failed step can leave an FSDP2 or replica collective pending on one
    replica, which a save's own collectives would wait on for ever)."""
    kind = getattr(err, "bad_data", None)
    return kind == "rows" or (kind == "steps" and not data_parallel)


def run_step(executor: PipelineExecutor, load: Callable[[int], dict], data: DataSection, skips: Skips, step: int,
             ahead: Callable[[int], dict] | None = None, num_micro: int | None = None,
             owners: Sequence[int] | None = None, next_owners: Sequence[int] | None = None,
             bad_rows: Callable[[], Sequence[str]] | None = None, plan=None) -> StepStats | None:
    """Run step ``step`` (0-based) over its micro-batches (``load(m)``); ``None`` when it was skipped.

    With placement ``fill`` and ``ahead`` (the next step's ``load``), the owners also load the next step's
    micro-batches in this step's idle time; when the step fails, it is run again without them, so that a bad row
    of the next step skips the next step, not this one. ``num_micro``: a step shorter than the schedule's ``M``.
    ``owners``, ``next_owners``: this step's and (with ``ahead``) the next step's owners of each micro-batch
    (load-aware owners; ``None``: ``m % NT``), the same on every rank (:meth:`PipelineExecutor.step`).
    ``bad_rows``: the rows the loads dropped since it was last called
    (:meth:`~mpipe_hf.data.owner.MicroBatchPlan.take_dropped`); the step's count over every rank adds to
    ``skips.bad_rows``. ``plan``: the plan ``load`` reads (``bad_rows`` defaults to its ``take_dropped``): it
    leaves out the rows any rank dropped before (``skips.rows``), and a row is counted once
    (:meth:`Skips.distinct`).

    Raises:
        ValueError: a bad sample with ``on_bad_sample: raise``, more than ``data.max_bad_rows`` rows dropped in all,
            or the ``max_bad_rows``-th skipped step in a row (the last error's text, which names its rank and
            action or its row, and the count).
        TimeoutError, RuntimeError: any other failure (the same text on every rank).
    """
    executor.step_index = step  # P's dropout seeds follow the data step, skipped steps included
    if plan is not None:
        forget_stale(skips, plan.remember(skips.rows))  # resumed: the checkpoint's failed rows
        bad_rows = bad_rows or plan.take_dropped
    if executor.cfg.placement != "fill":
        ahead = None
    try:
        try:
            stats = executor.step(load, ahead, num_micro, owners, next_owners if ahead is not None else None,
                                  bad_rows)
        except ValueError:
            if ahead is None:
                raise
            executor.step_index = step
            stats = executor.step(load, None, num_micro, owners, None, bad_rows)
    except ValueError as err:
        if data.on_bad_sample == "raise":
            raise
        dropped = skips.distinct(getattr(err, "bad_rows", 0), executor, plan)
        skips.drop_rows(dropped, str(err), data)  # a step with no row left
        skips.record(str(err), data)
        return None
    if stats.bad_rows and data.on_bad_sample == "raise":  # a loader that dropped rows all the same
        raise ValueError(f"a row failed to load: {stats.bad_row}")
    skips.drop_rows(skips.distinct(stats.bad_rows, executor, plan), stats.bad_row, data)
    skips.held, skips.in_row = skips.in_row, 0
    return stats


def finite_step(stats: StepStats, grad_norm: float, params, skips: Skips, data: DataSection) -> bool:
    """Whether the step's loss and global gradient norm (the same on every rank) are finite. When either is
    ``nan`` or ``inf``, the step is skipped on every rank: the gradients of ``params`` are dropped (the caller
    takes no optimizer step) and the skip is counted in ``skips``.

    Raises:
        ValueError: the ``data.max_bad_rows``-th skipped step in a row.
    """
    if math.isfinite(stats.loss) and math.isfinite(grad_norm):
        return True
    for p in params:
        p.grad = None
    skips.in_row = skips.held  # the step did not run after all: the skips before it are still in a row
    skips.record(f"the loss ({stats.loss}) or the gradient norm ({grad_norm}) is not finite", data)
    return False


def evaluate_rows(executor: PipelineExecutor, load_rows: Callable[[list[int]], dict], micros: list[list[int]],
                  data_parallel=None, replica: int = 0) -> tuple[float, int]:
    """``(eval loss, label tokens)`` over the micro-batches ``micros`` (each a list of row indices; e.g.
    :meth:`~mpipe_hf.data.owner.MicroBatchPlan.eval_micros`), ``M`` micro-batches per forward-only run (the last
    run shorter): the token losses summed over the whole set and divided once by its label tokens, as one process
    computes it. The same on every rank.

    With ``data_parallel`` (a :class:`~mpipe_hf.runtime.data_parallel.DataParallel` of ``size`` replicas; this
    rank's replica ``replica``), the set is divided among the replicas (:func:`eval_share`) and the sums are added
    over them: each replica runs the same number of forwards, of the same lengths (FSDP2 gathers its weights in
    every forward, a collective of the replicas).

    Raises:
        ValueError, TimeoutError, RuntimeError: as :meth:`PipelineExecutor.evaluate`.
    """
    size = data_parallel.batches if data_parallel is not None else 1  # the CP ranks of a replica share its rows
    loss_sum, tokens, per_run = 0.0, 0, executor.cfg.num_micro
    for part, counted in eval_share(micros, size, replica):
        for first in range(0, len(part), per_run):
            run = part[first:first + per_run]
            run_loss, run_tokens = executor.evaluate(lambda m: load_rows(run[m]), len(run))
            loss_sum, tokens = loss_sum + counted * run_loss, tokens + counted * run_tokens
    if data_parallel is not None and data_parallel.size > 1:  # the replicas', and the CP ranks' slices'
        import torch
        sums = data_parallel.sum(torch.tensor([loss_sum, tokens], dtype=torch.float64, device=executor.device))
        loss_sum, tokens = sums[0].item(), int(sums[1].item())
    return loss_sum / max(tokens, 1), tokens


def eval_share(micros: list, size: int, replica: int) -> list[tuple[list, bool]]:
    """Replica ``replica``'s share of an evaluation's micro-batches ``micros`` among ``size`` replicas, as
    ``[(micro-batches, counted)]``: the ``replica``-th of ``size`` equal consecutive runs of ``len // size``,
    counted; then the ``len % size`` left over, which every replica runs (the same forwards on each) and replica 0
    alone counts. Each micro-batch is counted once over the replicas."""
    even = len(micros) // size
    share = [(micros[replica * even:(replica + 1) * even], True)] if even else []
    rest = micros[even * size:]
    return share + ([(rest, replica == 0)] if rest else [])
