"""Run one rank's MPipe Transpose schedule for one optimizer step (SPEC.md, "Runtime rules").

The executor loads this rank's own micro-batches first and agrees with the other ranks that every load
succeeded, so a bad sample raises the same error on every rank before any point-to-point transfer. It then runs
the action list through the handler table, drains its sends, sums loss and label-token counts over the pipeline
group, and divides this rank's gradients by the step's label-token count: the loss is normalised over the whole
step (the sum-then-divide of Megatron-LM's per-token loss), not per micro-batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from ..schedule import Kind, ScheduleConfig, build_schedule
from .handlers import Preprocess, StepContext, Tensors, run_action
from .p2p import P2P


@dataclass
class StepStats:
    """What one step measured. ``loss`` is the mean over the step's label tokens; ``bubble`` is the fraction of
    the ranks' wall time spent not computing (``1 - sum busy / sum wall``)."""

    loss: float
    num_tokens: int
    bubble: float
    wall_s: float


class PipelineExecutor:
    """One rank's side of the pipeline.

    Args:
        cfg: the schedule configuration (same on every rank).
        rank: this process's rank in the pipeline group.
        stages: ``{stage index: module}`` for this rank's stages; a module maps a dict of tensors to a dict of
            tensors, and the last stage returns ``{"loss": summed token loss, "num_tokens": label tokens}``.
        preprocess: the transposed block ``P`` (every rank holds a replica).
        group: the pipeline process group (``mesh.get_group("pp")``).
        device: where received tensors go.
        params: the parameters this rank optimises; their gradients are divided by the step's token count.
        timeout: the longest any wait may take.
    """

    def __init__(self, cfg: ScheduleConfig, rank: int, stages: dict[int, nn.Module], preprocess: Preprocess,
                 group: dist.ProcessGroup, device: torch.device, params: Iterable[nn.Parameter],
                 timeout: timedelta = timedelta(seconds=120)):
        self.cfg, self.rank, self.stages, self.preprocess, self.group = cfg, rank, stages, preprocess, group
        self.device = device
        self.params = list(params)
        self.order = build_schedule(cfg)[rank]
        self.own_micros = [a.micro for a in self.order if a.kind is Kind.DATA_LOAD]
        self.p2p = P2P(group, device, timeout)

    def _load_all(self, load: Callable[[int], Tensors]) -> dict[int, Tensors]:
        """Load this rank's micros, then agree on failure: every rank raises the first rank's error."""
        loaded, error = {}, None
        try:
            for m in self.own_micros:
                loaded[m] = {k: v.to(self.device) for k, v in load(m).items()}
        except Exception as err:  # noqa: BLE001 - re-raised on every rank below
            error = (type(err).__name__, f"pipeline rank {self.rank}, micro-batch {m}: {err}")
        flag = torch.tensor([0 if error is None else 1], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        if flag.item():
            errors = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(errors, error, group=self.group)
            name, message = next(e for e in errors if e is not None)
            raise (ValueError if name == "ValueError" else RuntimeError)(message)
        return loaded

    def step(self, load: Callable[[int], Tensors]) -> StepStats:
        """Run the schedule once over the step's ``M`` micro-batches.

        Args:
            load: ``load(m)`` returns micro ``m``'s raw inputs as a dict of tensors; called only on its owner.
                Gradients of ``params`` must be zero (or ``None``) on entry.

        Raises:
            ValueError: a load failed on some rank (same message on every rank), or the step has no label token.
            TimeoutError: a transfer did not arrive in time.
        """
        start = time.perf_counter()
        loaded = self._load_all(load)
        ctx = StepContext(self.cfg, self.rank, self.stages, self.preprocess, self.p2p, self.group, loaded.pop)
        try:
            for action in self.order:
                run_action(ctx, action)
            self.p2p.drain()
        except BaseException:
            self.p2p.discard()
            raise
        finally:
            ctx.clear()
        wall = time.perf_counter() - start
        totals = torch.tensor([ctx.loss_sum, ctx.num_tokens, ctx.busy_s, wall], dtype=torch.float64,
                              device=self.device)
        dist.all_reduce(totals, group=self.group)
        loss_sum, num_tokens, busy, wall_sum = totals.tolist()
        if num_tokens == 0:
            raise ValueError("the step has no label tokens (every label is -100); check the collator's labels")
        for p in self.params:
            if p.grad is not None:
                p.grad.div_(num_tokens)
        return StepStats(loss_sum / num_tokens, int(num_tokens), 1.0 - busy / wall_sum, wall)
