"""One training step of the pipeline with the bad-sample policy: the piece of the loop that ``mpipe-hf train``
and the HF Trainer integration share (README, "Design notes").

A step whose data a rank cannot load (an undecodable image, a sample the model rejects: any ``ValueError``
of the step, which the executor raises on every rank with the same text) is skipped on every rank with
``on_bad_sample: skip``: no gradient is left, the caller takes no optimizer step, and the next step runs exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..runtime import PipelineExecutor, StepStats
from .recipe import DataSection


@dataclass
class Skips:
    """The skipped steps so far: ``in_row`` (since the last step that ran), ``total``, and the last error."""

    in_row: int = 0
    total: int = 0
    last: str | None = None


def run_step(executor: PipelineExecutor, load: Callable[[int], dict], data: DataSection, skips: Skips, step: int,
             ahead: Callable[[int], dict] | None = None, num_micro: int | None = None) -> StepStats | None:
    """Run step ``step`` (0-based) over its micro-batches (``load(m)``); ``None`` when it was skipped.

    With placement ``fill`` and ``ahead`` (the next step's ``load``), the owners also load the next step's
    micro-batches in this step's idle time; when the step fails, it is run again without them, so that a bad row
    of the next step skips the next step, not this one. ``num_micro``: a step shorter than the schedule's ``M``.

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
            stats = executor.step(load, ahead, num_micro)
        except ValueError:
            if ahead is None:
                raise
            executor.step_index = step
            stats = executor.step(load, None, num_micro)
    except ValueError as err:
        if data.on_bad_sample == "raise":
            raise
        skips.in_row, skips.total, skips.last = skips.in_row + 1, skips.total + 1, str(err)
        if skips.in_row >= data.max_bad_steps:
            raise ValueError(f"{err} ({skips.in_row} steps in a row skipped for bad samples, data.max_bad_steps = "
                             f"{data.max_bad_steps})") from err
        return None
    skips.in_row = 0
    return stats
