"""One training step of the pipeline with the bad-sample policy: the piece of the loop that ``mpipe-hf train``
and the HF Trainer integration share (README, "Design notes").

A step whose data a rank cannot load (an undecodable image, a sample the model rejects: any ``ValueError``
of the step, which the executor raises on every rank with the same text) is skipped on every rank with
``on_bad_sample: skip``: no gradient is left, the caller takes no optimizer step, and the next step runs exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ..data import MicroBatchPlan
from ..runtime import PipelineExecutor, StepStats
from .recipe import DataSection


@dataclass
class Skips:
    """The skipped steps so far: ``in_row`` (since the last step that ran), ``total``, and the last error."""

    in_row: int = 0
    total: int = 0
    last: str | None = None


def run_step(executor: PipelineExecutor, plan: MicroBatchPlan, step: int, steps: int, data: DataSection,
             skips: Skips) -> StepStats | None:
    """Run step ``step`` (0-based, of ``steps``) over its micro-batches; ``None`` when it was skipped.

    With placement ``fill`` the owners also load the next step's micro-batches in this step's idle time; when
    the step fails, it is run again without them, so that a bad row of the next step skips the next step, not
    this one.

    Raises:
        ValueError: a bad sample with ``on_bad_sample: raise``, or the ``max_bad_steps``-th skipped step in a row
            (with the last error's text).
        TimeoutError, RuntimeError: any other failure (the same text on every rank).
    """
    executor.step_index = step  # P's dropout seeds follow the data step, skipped steps included
    load = partial(plan.load, step)
    ahead = partial(plan.load, step + 1) if step + 1 < steps and executor.cfg.placement == "fill" else None
    try:
        try:
            stats = executor.step(load, ahead)
        except ValueError:
            if ahead is None:
                raise
            executor.step_index = step
            stats = executor.step(load)
    except ValueError as err:
        if data.on_bad_sample == "raise":
            raise
        skips.in_row, skips.total, skips.last = skips.in_row + 1, skips.total + 1, str(err)
        if skips.in_row >= data.max_bad_steps:
            raise ValueError(f"{skips.in_row} steps in a row skipped for bad samples (data.max_bad_steps = "
                             f"{data.max_bad_steps}); the last: {err}") from err
        return None
    skips.in_row = 0
    return stats
