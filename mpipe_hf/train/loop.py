"""One training step of the pipeline with the bad-sample policy: the piece of the loop that ``mpipe-hf train``
and the HF Trainer integration share (README, "Design notes").

A step whose data a rank cannot load (an undecodable image, a sample the model rejects: any ``ValueError``
of the step, which the executor raises on every rank with the same text) is skipped on every rank with
``on_bad_sample: skip``: no gradient is left, the caller takes no optimizer step, and the next step runs exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ..runtime import PipelineExecutor, StepStats
from .recipe import DataSection


@dataclass
class Skips:
    """The skipped steps so far: ``in_row`` (since the last step that ran), ``total``, and the last error."""

    in_row: int = 0
    total: int = 0
    last: str | None = None
    held: int = 0  # ``in_row`` before the last step that ran, in case it turns out not finite


    def warning(self, step: int) -> str:
        """The line that reports step ``step`` (0-based) as skipped."""
        return (f"mpipe_hf: warning: step {step + 1} skipped ({self.in_row} in a row, {self.total} in all): "
                f"{self.last}")

    def record(self, reason: str, data: DataSection) -> None:
        """Count a skipped step.

        Raises:
            ValueError: the ``data.max_bad_steps``-th skipped step in a row: ``reason`` and the count.
        """
        self.in_row, self.total, self.last = self.in_row + 1, self.total + 1, reason
        if self.in_row >= data.max_bad_steps:
            err = ValueError(f"{reason} ({self.in_row} steps in a row skipped, data.max_bad_steps = "
                             f"{data.max_bad_steps})")
            err.shared = True  # every rank counts the same skips: one line for the run, not one per rank
            raise err


def run_step(executor: PipelineExecutor, load: Callable[[int], dict], data: DataSection, skips: Skips, step: int,
             ahead: Callable[[int], dict] | None = None, num_micro: int | None = None,
             owners: Sequence[int] | None = None, next_owners: Sequence[int] | None = None) -> StepStats | None:
    """Run step ``step`` (0-based) over its micro-batches (``load(m)``); ``None`` when it was skipped.

    With placement ``fill`` and ``ahead`` (the next step's ``load``), the owners also load the next step's
    micro-batches in this step's idle time; when the step fails, it is run again without them, so that a bad row
    of the next step skips the next step, not this one. ``num_micro``: a step shorter than the schedule's ``M``.
    ``owners``, ``next_owners``: this step's and (with ``ahead``) the next step's owners of each micro-batch
    (load-aware owners; ``None``: ``m % NT``), the same on every rank (:meth:`PipelineExecutor.step`).

    Raises:
        ValueError: a bad sample with ``on_bad_sample: raise``, or the ``max_bad_steps``-th skipped step in a row
            (the last error's text, which names its rank and action, and the count).
        TimeoutError, RuntimeError: any other failure (the same text on every rank).
    """
    executor.step_index = step  # P's dropout seeds follow the data step, skipped steps included
    if executor.cfg.placement != "fill":
        ahead = None
    try:
        try:
            stats = executor.step(load, ahead, num_micro, owners, next_owners if ahead is not None else None)
        except ValueError:
            if ahead is None:
                raise
            executor.step_index = step
            stats = executor.step(load, None, num_micro, owners)
    except ValueError as err:
        if data.on_bad_sample == "raise":
            raise
        skips.record(str(err), data)
        return None
    skips.held, skips.in_row = skips.in_row, 0
    return stats


def finite_step(stats: StepStats, grad_norm: float, params, skips: Skips, data: DataSection) -> bool:
    """Whether the step's loss and global gradient norm (the same on every rank) are finite. When either is
    ``nan`` or ``inf``, the step is skipped on every rank: the gradients of ``params`` are dropped (the caller
    takes no optimizer step) and the skip is counted in ``skips``.

    Raises:
        ValueError: the ``data.max_bad_steps``-th skipped step in a row.
    """
    if math.isfinite(stats.loss) and math.isfinite(grad_norm):
        return True
    for p in params:
        p.grad = None
    skips.in_row = skips.held  # the step did not run after all: the skips before it are still in a row
    skips.record(f"the loss ({stats.loss}) or the gradient norm ({grad_norm}) is not finite", data)
    return False


def evaluate_rows(executor: PipelineExecutor, load_rows: Callable[[list[int]], dict], num_rows: int,
                  micro_batch_size: int) -> tuple[float, int]:
    """``(eval loss, label tokens)`` over rows ``0 .. num_rows - 1`` in order, ``micro_batch_size`` rows per
    micro-batch and ``M`` micro-batches per forward-only run (the last run shorter): the token losses summed over
    the whole set and divided once by its label tokens, as one process computes it. The same on every rank.

    Raises:
        ValueError, TimeoutError, RuntimeError: as :meth:`PipelineExecutor.evaluate`.
    """
    loss_sum, tokens, per_run = 0.0, 0, executor.cfg.num_micro * micro_batch_size
    for first in range(0, num_rows, per_run):
        micros = [list(range(s, min(s + micro_batch_size, num_rows)))
                  for s in range(first, min(first + per_run, num_rows), micro_batch_size)]
        run_loss, run_tokens = executor.evaluate(lambda m: load_rows(micros[m]), len(micros))
        loss_sum, tokens = loss_sum + run_loss, tokens + run_tokens
    return loss_sum / max(tokens, 1), tokens
