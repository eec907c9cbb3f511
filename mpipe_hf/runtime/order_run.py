"""One pass over a rank's action list for a step (:class:`OrderRun`), as :meth:`.executor.PipelineExecutor.step`
runs it: each action through the handler table, with the step's figures."""

from __future__ import annotations

import time

from ..schedule.actions import RECV_KINDS, Kind
from ..schedule.connect import step_pairs
from ..schedule.simulate import Event
from .handlers import run_action
from .memory import SavedStorages
from .step_context import StepContext


class OrderRun:
    """One pass over the executor's action list for a step: each action through the handler table, with the
    step's figures (``peak``: the most stage forwards held at once; ``peak_bytes``: with ``measure_memory``, the
    most bytes their saved tensors held, :mod:`.memory`) and ``action``, the one running (it names a failure)."""

    def __init__(self, ex, ctx: StepContext):
        self.ex, self.ctx, self.action, self.peak, self.peak_bytes = ex, ctx, None, 0, 0

    def __call__(self) -> None:
        ex, ctx = self.ex, self.ctx
        order, held, live = ex.order, {}, 0
        last_backward = {} if ex.dp is None else {a.stage: i for i, a in enumerate(order)
                                                  if a.kind in (Kind.B, Kind.W)}
        # every pair this step talks over, connected first in one global order (NCCL sets them up lazily)
        ex.p2p.connect(step_pairs(ex.rank, order, [peer for _, peer in ex.tied]))
        ex.p2p.expect(a.peer for a in order if a.kind in RECV_KINDS)
        for i, action in enumerate(order):
            self.action = action
            begin = time.time() if ex.events is not None else 0.0
            if last_backward.get(action.stage) == i:
                ex.dp.before_last_backward(action.stage)
            swapped = ex.swap is not None and ex.swap.current == (action.stage, action.micro)
            if ex.measure_memory and action.kind is Kind.F and not swapped:
                with SavedStorages(ex._weights) as saved:
                    run_action(ctx, action)
                held[(action.stage, action.micro)] = saved.bytes()
                live += held[(action.stage, action.micro)]
            else:  # a swapped forward's bytes are the swap manager's, on the device only
                run_action(ctx, action)
                if action.kind is Kind.W or (action.kind is Kind.B and (action.stage, action.micro)
                                             not in ctx.split):  # the backward's last action
                    live -= held.pop((action.stage, action.micro), 0)
            if ex.measure_memory:
                resident = ex.swap.resident_bytes if ex.swap is not None else 0
                self.peak_bytes = max(self.peak_bytes, live + resident)
            if ex.events is not None:
                ex.events.append(Event(begin, time.time(), action))
            self.peak = max(self.peak, len(ctx.saved) + len(ctx.weight_work))
