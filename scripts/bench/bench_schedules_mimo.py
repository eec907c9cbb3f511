"""The MIMO-style rows of ``scripts/bench/bench_schedules.py``: ``K`` ranks run only the tower (Megatron's MIMO puts the
vision encoder on ranks of its own), the other ``R - K`` ranks the text model under a torch schedule on torch's
runtime, the same sleeping body split over their ``(R - K) V`` stages by layers, at the same ``M``.

Each tower rank sleeps ``Pf w[m]`` per micro-batch ``m`` it is given (:func:`mpipe_hf.schedule.mimo.tower_owners`:
list scheduling over the per-micro weights ``w``) and sends the feature (a tagged gloo send) to the rank of text
stage 0, every forward first; trained, it then receives each feature's gradient and sleeps ``Pb w[m]``. Text
stage 0 receives micro ``m``'s feature inside its forward (the micro's index rides in its input) and, trained,
sends the gradient back from an autograd node that torch's backward (whole, or the zero-bubble weight pass: the
node leads to a parameter) runs. A frozen tower may run one step ahead: its ranks then compute the next step's
features during this step (the first step's before it), so the text never waits for them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from bench_schedules_stages import (B_MS, F_MS, LAYERS, R, TORCH_KINDS, TORCH_TIMEOUT, V, SleepModule, StageCosts,
                                    timed)
from sleeping import Sleep

GRAD_TAG = 100_000  # a feature gradient's tag: this plus the micro index (a feature's is the index)


def text_costs(text_ranks: int) -> StageCosts:
    """The body's 32 layers over ``text_ranks x V`` stages (the first stages get the remainder's extra layers, one
    each), backward split in halves."""
    stages = text_ranks * V
    base, extra = divmod(LAYERS, stages)
    layers = [base + (1 if s < extra else 0) for s in range(stages)]
    per_f, per_b = F_MS * R * V / LAYERS / 1e3, B_MS * R * V / LAYERS / 1e3
    return StageCosts(tuple(n * per_f for n in layers), tuple(n * per_b / 2 for n in layers),
                      tuple(n * per_b / 2 for n in layers))


class Arrive(torch.autograd.Function):
    """Identity on a received feature whose backward sends its gradient to the tower rank ``src`` (tag
    :data:`GRAD_TAG` + ``micro``); ``anchor`` (a parameter) puts the node on the weight path, so torch's
    zero-bubble weight pass runs it too."""

    @staticmethod
    def forward(ctx, feature, anchor, src, micro, sends):
        ctx.src, ctx.micro, ctx.sends = src, micro, sends
        return feature.clone()

    @staticmethod
    def backward(ctx, grad):
        if grad.device.type != "meta":
            ctx.sends.append(dist.isend(grad.contiguous(), ctx.src, tag=GRAD_TAG + ctx.micro))
        return grad, torch.zeros(1), None, None, None


class FirstTextStage(nn.Module):
    """Text stage 0: receives micro ``int(x[0, 0])``'s feature from its tower rank, then sleeps as a body stage. Its
    first forward is torch's metadata inference (on the first micro's real input): no feature is taken for it."""

    def __init__(self, fwd_s, bwd_in_s, bwd_w_s, owners, trainable):
        super().__init__()
        self.body, self.anchor = SleepModule(fwd_s, bwd_in_s, bwd_w_s), nn.Parameter(torch.zeros(1))
        self.owners, self.trainable, self.sends, self.inferred = owners, trainable, [], False

    def forward(self, x):
        if not self.inferred:  # torch's metadata inference: one forward (and backward) before the first step's
            self.inferred = True
            return self.body(x * self.anchor if self.trainable else x)
        micro = int(x[0, 0])
        feature = torch.empty(1, 16)
        dist.recv(feature, self.owners[micro], tag=micro)
        if self.trainable:
            feature = Arrive.apply(feature.requires_grad_(), self.anchor, self.owners[micro], micro, self.sends)
        return self.body(feature)


def tower_step(rank, towers, owners, pf, pb, weights, ahead):
    """One step of tower rank ``rank``: its forwards, each feature sent as it is ready (``ahead``: the features the
    last step computed sent at once, then the next step's computed), then its backwards as their gradients come."""
    mine, text0 = [m for m, t in enumerate(owners) if t == rank], towers
    sends = [dist.isend(torch.ones(1, 16), text0, tag=m) for m in mine] if ahead else []
    for m in mine:
        Sleep.apply(torch.ones(1), pf * weights[m], 0.0)
        if not ahead:
            sends.append(dist.isend(torch.ones(1, 16), text0, tag=m))
    if pb:
        for m in mine:
            grad = torch.empty(1, 16)
            dist.recv(grad, text0, tag=GRAD_TAG + m)
            Sleep.apply(torch.ones(1), pb * weights[m], 0.0)
    for work in sends:
        work.wait()


def text_schedule(kinds, rank, towers, owners, trainable, num_micro, group):
    """Text rank ``rank``'s torch schedule: the first of ``kinds`` torch builds (its interleaved schedules take
    only ``M`` that are multiples of ``M // pp``: not 16 on 3 ranks; ``zbv`` places the stages V-shape). Returns
    ``(kind, schedule, stage 0 or None, modules)``, or
    ``(None, error text, None, None)`` when none builds."""
    from torch.distributed import pipelining
    pp = R - towers
    sc, local, num_stages = text_costs(pp), rank - towers, pp * V
    errors = []
    for kind in kinds:
        first = FirstTextStage(sc.fwd[0], sc.bwd_in[0], sc.bwd_w[0], owners, trainable)
        placed = [local, 2 * pp - 1 - local] if kind == "zbv" else range(local, num_stages, pp)
        modules = {s: first if s == 0 else SleepModule(sc.fwd[s], sc.bwd_in[s], sc.bwd_w[s]) for s in placed}
        try:
            built = [pipelining.PipelineStage(module, s, num_stages, torch.device("cpu"), group=group)
                     for s, module in modules.items()]
            schedule = getattr(pipelining, TORCH_KINDS[kind])(built, num_micro, loss_fn=lambda out, target: out.sum())
        except ValueError as error:
            errors.append(f"{kind}: {error}")
            continue
        return kind, schedule, first if 0 in modules else None, modules
    return None, "; ".join(errors), None, None


def run_mimo(kinds, rank, towers, pf, pb, weights, num_micro, steps, ahead=False):
    """The MIMO-style layout: ``towers`` tower ranks, on the other ranks the first torch schedule of ``kinds``
    (``1f1b``, ``zb``, ``zbv``) that builds; ``weights`` the per-micro tower weights; ``ahead``: a frozen tower a step
    ahead. Returns ``(median step seconds, the kind run, torch's compute order of the text ranks: their
    ``pipeline_order``, ranks from 0)``. Raises ``ValueError`` on every rank when no kind builds
    (the ranks agree first, so none waits for a failed one); a step's error as torch raises it (the caller's
    ``lockstep`` reports it)."""
    from mpipe_hf.schedule.mimo import tower_owners
    weights = weights or (1.0,) * num_micro
    owners = tower_owners(num_micro, towers, weights)
    group = dist.new_group(list(range(towers, R)), backend="gloo", timeout=TORCH_TIMEOUT)
    try:
        kind = schedule = first = modules = None
        if rank >= towers:
            kind, schedule, first, modules = text_schedule(kinds, rank, towers, owners, pb > 0, num_micro, group)
        agreed = [None] * dist.get_world_size()
        dist.all_gather_object(agreed, (kind, schedule if kind is None else schedule.pipeline_order))
        if agreed[towers][0] is None:
            raise ValueError(f"no torch schedule of {kinds} builds on {R - towers} ranks: {agreed[towers][1]}")
        kind, order = agreed[towers]
        if rank < towers:
            if ahead:  # the first step's features, before the timing
                for m in (m for m, t in enumerate(owners) if t == rank):
                    Sleep.apply(torch.ones(1), pf * weights[m], 0.0)
            step = lambda: tower_step(rank, towers, owners, pf, pb, weights, ahead)  # noqa: E731
            return timed(step, dist.group.WORLD, steps), kind, order
        inputs = torch.arange(num_micro, dtype=torch.float32).unsqueeze(1).expand(num_micro, 16).contiguous()
        last = (R - towers) * V - 1

        def step():
            schedule.step(*([inputs] if first is not None else []),
                          target=torch.ones(num_micro, 16) if last in modules else None)
            for work in first.sends if first is not None else []:
                work.wait()
            if first is not None:
                first.sends.clear()
        return timed(step, dist.group.WORLD, steps), kind, order
    finally:
        dist.destroy_process_group(group)
