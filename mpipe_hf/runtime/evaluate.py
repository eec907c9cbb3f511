"""A forward-only run of the pipeline (:meth:`~.executor.PipelineExecutor.evaluate`): the forward-only schedule of
:mod:`mpipe_hf.schedule.forward` through the handler table, in eval mode and without autograd, its loss and label
tokens summed over the pipeline group. A failure is handled as a training step's (:meth:`.PipelineExecutor.step`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.distributed as dist

from ..schedule.actions import RECV_KINDS
from ..schedule.connect import step_pairs
from ..schedule.forward import forward_config
from .casts import check_no_outer_region
from .handlers import run_action
from .step_context import StepContext, Tensors
from .watchdog import PeerFailed


def evaluate(executor, load: Callable[[int], Tensors], num_micro: int | None = None) -> tuple[float, int]:
    """A forward-only run of ``executor`` (:mod:`mpipe_hf.schedule.forward`) over ``num_micro`` micro-batches
    (default ``cfg.num_micro``), in eval mode and without autograd: no backward, no graph of ``P``, nothing kept
    for a backward. Gradients are left as they are.

    Args:
        executor: this rank's :class:`~.executor.PipelineExecutor`; its groups, watchdog and stages are used.
        load: ``load(m)`` returns micro ``m``'s raw inputs; called only on its owner.
        num_micro: this run's micro-batches (the last run of an eval set may have fewer).

    Returns:
        ``(summed token loss, label tokens)`` over the run, the same on every rank.

    Raises:
        As :meth:`~.executor.PipelineExecutor.step`; ``ValueError`` when called inside an autocast region
        (:func:`~.casts.check_no_outer_region`), as a step is.
    """
    check_no_outer_region(executor.device.type)
    full = executor.cfg
    n = num_micro or full.num_micro  # a static owners tuple fits the full run only
    cfg = dataclasses.replace(full, num_micro=n, owners=full.owners[:n] if full.owners and n == full.num_micro
                              else None)
    order = executor._order(cfg=cfg, forward=True)
    cfg = forward_config(cfg)  # what the handlers see: P without a graph
    loaded = executor._begin(order, load)  # every micro this rank loads, before the first transfer
    modules = list(executor.stages.values()) + ([executor.preprocess.module] if executor.preprocess.module else [])
    modes = [m.training for m in modules]
    for m in modules:
        m.eval()
    ctx = StepContext(cfg, executor.rank, executor.stages, executor.preprocess, executor.p2p, executor.group,
                      executor.watchdog, loaded.pop)
    action = None
    try:
        with torch.no_grad():
            executor.p2p.connect(step_pairs(executor.rank, order))  # in one global order (:mod:`.p2p`)
            executor.p2p.expect(a.peer for a in order if a.kind in RECV_KINDS)
            for action in order:
                run_action(ctx, action)
                ctx.saved.pop((action.stage, action.micro), None)
            executor.p2p.drain()
            action = None
            totals = ctx.sums(executor.device)[:2]
            executor.watchdog.wait(dist.all_reduce(totals, group=executor.group, async_op=True), "the eval loss sum")
    except BaseException as err:
        raise executor._abandon(err, action) from (None if isinstance(err, PeerFailed) else err)
    finally:
        ctx.clear()
        for m, mode in zip(modules, modes):
            m.train(mode)
    loss_sum, num_tokens = totals.tolist()
    return loss_sum, int(num_tokens)
