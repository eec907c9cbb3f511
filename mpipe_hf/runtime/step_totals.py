"""A step's totals, as :meth:`~.executor.PipelineExecutor.step` keeps them: one float64 vector every pipeline rank
fills with its figures (:func:`rank_totals`, its times from :class:`StepClock`) and the pipeline group sums in one
all-reduce, read back into :class:`~.step_stats.StepStats` (:class:`StepTotals`).

The vector holds :data:`FIXED` step-wide slots (loss sum, label tokens, busy, wall, micro means, MoE aux sum, micros
with an aux loss; the last stage accumulates the :data:`SUMS` among them on the device), then four per-rank rows of
``world`` slots (busy, wall, saved-activation peak, device-memory peak), where each rank writes its own slot and
leaves the others zero, so the sum gathers every rank's figures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .step_context import StepContext
from .step_stats import StepStats

FIXED = 7  # totals' step-wide slots: loss sum, label tokens, busy, wall, micro means, MoE aux sum, micros with aux
SUMS = [0, 1, 4, 5, 6]  # the slots the last stage accumulates (StepContext.sums)


class StepClock:
    """A step's busy and wall time from ``start`` (``time.perf_counter()``): on the host; on CUDA on the device's
    timeline (the launches are asynchronous), with CUDA events around the step and each compute action
    (``ctx.gpu_events``, which it opens), and the device-memory peak counted from here."""

    def __init__(self, device: torch.device, start: float, ctx: StepContext):
        self.device, self.start, self.cuda = device, start, device.type == "cuda"
        if self.cuda:  # compute is timed on the device (the launches are asynchronous): CUDA events
            torch.cuda.reset_peak_memory_stats(device)
            ctx.gpu_events, self.begin = [], torch.cuda.Event(enable_timing=True)
            self.begin.record()

    def read(self, ctx: StepContext) -> tuple[float, float]:
        """``(busy, wall)`` seconds so far; on CUDA the device's timeline, read once per step (a synchronisation)."""
        wall, busy = time.perf_counter() - self.start, ctx.busy_s
        if self.cuda:  # the device's timeline, read once per step
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            wall = self.begin.elapsed_time(end) / 1e3
            busy = sum(a.elapsed_time(b) for a, b in ctx.gpu_events) / 1e3
        return busy, wall

    def device_peak(self) -> int:
        """``torch.cuda.max_memory_allocated`` since the step began, bytes (0 off CUDA)."""
        return torch.cuda.max_memory_allocated(self.device) if self.cuda else 0


def rank_totals(rank: int, world: int, busy: float, wall: float, saved_peak: int, device_peak: int) -> torch.Tensor:
    """This rank's totals vector (``FIXED + 4 * world`` float64 on the host, the :data:`SUMS` slots still zero):
    its ``busy`` and ``wall`` seconds in the step-wide slots and in its own, and its saved-activation and
    device-memory peaks (bytes) in its own."""
    # sums, then per rank: busy, wall, saved-activation peak, device-memory peak
    totals = torch.zeros(FIXED + 4 * world, dtype=torch.float64)
    totals[2], totals[3] = busy, wall
    totals[FIXED + rank], totals[FIXED + world + rank] = busy, wall
    totals[FIXED + 2 * world + rank] = saved_peak
    totals[FIXED + 3 * world + rank] = device_peak
    return totals


@dataclass
class StepTotals:
    """The summed totals, read on the host: the step-wide figures and each rank's (``busy_r``, ``wall_r`` in
    seconds, ``saved_r``, ``device_r`` in bytes)."""

    loss_sum: float
    num_tokens: float
    busy: float
    wall_sum: float
    micro_means: float
    aux_sum: float
    aux_micros: float
    busy_r: list[float]
    wall_r: list[float]
    saved_r: list[float]
    device_r: list[float]

    @classmethod
    def read(cls, totals: torch.Tensor, world: int) -> "StepTotals":
        """Read the all-reduced ``totals`` of a pipeline of ``world`` ranks (one host synchronisation)."""
        values = totals.tolist()
        return cls(*values[:FIXED], *(values[FIXED + k * world:FIXED + (k + 1) * world] for k in range(4)))

    def stats(self, per_micro: bool, divisor: float, wall_s: float, peak: int, activation_bytes: bool,
              device_bytes: bool, dropped: tuple[int, str | None]) -> StepStats:
        """The step's :class:`StepStats`: its loss and MoE aux loss divided by ``divisor`` (with ``per_micro`` the
        sum of the micro-batches' means, else the summed token loss), ``wall_s`` this rank's seconds, ``peak`` its
        most stage forwards held, the per-rank byte peaks where measured, and the rows ``dropped`` at load."""
        rank_bubble = [round(1.0 - b / w, 4) if w else 0.0 for b, w in zip(self.busy_r, self.wall_r)]
        loss = (self.micro_means if per_micro else self.loss_sum) / divisor
        return StepStats(loss, int(self.num_tokens), 1.0 - self.busy / self.wall_sum, wall_s, peak, rank_bubble,
                         [int(v) for v in self.saved_r] if activation_bytes else [],
                         [int(v) for v in self.device_r] if device_bytes else [], self.wall_r, *dropped,
                         aux_loss=self.aux_sum / divisor if self.aux_micros else None)  # no router: no micro had one
