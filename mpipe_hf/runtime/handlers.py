"""One small function per action kind, and the table that maps kinds to them (SPEC.md, "Actions").

Each handler takes the step's :class:`~.step_context.StepContext` and the action. Tensors move between handlers
only through the context's stores, keyed by micro (and stage), so a failed step is cleaned by clearing the context.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..schedule import Action, Kind
from ..schedule.actions import COMPUTE_KINDS
from .aux_loss import micro_tokens, with_aux
from .placement import host_side, to_device
from .step_context import StepContext, Tensors
from .zero_bubble import backward_input

BACKWARD_KINDS = frozenset({Kind.B, Kind.W, Kind.TRANSPOSE_BWD})


def _handoff(outputs: Tensors) -> Tensors:
    """Outputs cut from the graph as new leaves, keeping which of them carry a gradient."""
    return {k: v.detach().requires_grad_(v.requires_grad) for k, v in outputs.items()}


def _backward(outputs: Tensors, grads: Tensors) -> None:
    keys = [k for k in grads if outputs[k].requires_grad]
    if keys:
        torch.autograd.backward([outputs[k] for k in keys], [grads[k] for k in keys])


def _input_grads(inputs: Tensors) -> Tensors:
    return {k: (v.grad if v.grad is not None else torch.zeros_like(v)) for k, v in inputs.items()
            if v.requires_grad}


def forward(ctx: StepContext, a: Action) -> None:
    """``F``: run stage ``a.stage`` on micro ``a.micro``; keep inputs/outputs for ``B``."""
    s, m = a.stage, a.micro
    if s == 0:
        feats = ctx.feats.pop(m) if ctx.cfg.transposed else {}
        feats = {k: v.detach().requires_grad_(ctx.cfg.trains_preprocess and v.is_floating_point()) for k, v in feats.items()}
        inputs = {**ctx.data.pop(m), **feats}
    else:
        inputs = ctx.act.pop((s - 1, m))
    if ctx.swap is not None and ctx.swap.current == (s, m):  # SWAP_SET_GROUP ran: its saved tensors are filed
        with ctx.swap.hooks():
            outputs = ctx.stages[s](inputs)
        ctx.swap.keep((s, m), [*inputs.values(), *outputs.values()])  # the pipeline's own: never offloaded
    else:
        outputs = ctx.stages[s](inputs)
    if ctx.last_stage(s):
        outputs, aux = with_aux(ctx, outputs)
        # on the device, as float64 (the sum a Python float would give): no host synchronisation per micro-batch
        ctx.loss_sum = ctx.loss_sum + outputs["loss"].detach().double()
        ctx.num_tokens = ctx.num_tokens + torch.as_tensor(outputs["num_tokens"]).detach()
        if ctx.per_micro:  # backprop the micro's mean, as a Trainer that does not count num_items_in_batch
            # (a CP rank's slice sum over the whole micro's tokens: the CP group's parts sum to the mean)
            outputs = {**outputs, "loss": outputs["loss"] / micro_tokens(outputs) + aux}
            ctx.micro_mean_sum = ctx.micro_mean_sum + outputs["loss"].detach().double()
    else:
        ctx.act[(s, m)] = _handoff(outputs)
    ctx.saved[(s, m)] = (inputs, outputs)


def backward(ctx: StepContext, a: Action) -> None:
    """``B``: backprop stage ``a.stage`` for micro ``a.micro``; keep the gradient of its inputs. Where the
    backward is split (zero bubble), only that gradient: what the weights' needs is kept for the ``W``."""
    s, m = a.stage, a.micro
    inputs, outputs = ctx.saved.pop((s, m))
    if ctx.last_stage(s):
        roots, grads = [outputs["loss"]], [None]
    else:
        given = ctx.grad.pop((s + 1, m))
        keys = [k for k in given if outputs[k].requires_grad]
        roots, grads = [outputs[k] for k in keys], [given[k] for k in keys]
    if (s, m) in ctx.split:
        weights = [p for p in ctx.stages[s].parameters() if p.requires_grad]
        ctx.weight_work[(s, m)] = backward_input(roots, grads, list(inputs.values()), weights)
    else:
        if roots:
            torch.autograd.backward(roots, grads)
        if ctx.swap is not None:
            ctx.swap.release((s, m))
    grads = _input_grads(inputs)
    if s > 0:
        ctx.grad[(s, m)] = grads
    elif ctx.cfg.trains_preprocess:
        ctx.feat_grad[m] = grads


def weight(ctx: StepContext, a: Action) -> None:
    """``W`` (zero bubble): the weight gradients of stage ``a.stage`` for micro ``a.micro``, from what its ``B``
    kept; a ``W`` without a ``B`` (a stage whose inputs take no gradient) is the whole backward."""
    s, m = a.stage, a.micro
    if (s, m) in ctx.split:
        ctx.weight_work.pop((s, m)).run()
        if ctx.swap is not None:
            ctx.swap.release((s, m))
        return
    backward(ctx, a)


def send_f(ctx: StepContext, a: Action) -> None:
    ctx.p2p.send(ctx.check(ctx.act.pop((a.stage, a.micro)), a), a.peer, a, a.kind.value)


def recv_f(ctx: StepContext, a: Action) -> None:
    ctx.act[(a.stage - 1, a.micro)] = ctx.p2p.recv(a.peer, a)


def send_b(ctx: StepContext, a: Action) -> None:
    ctx.p2p.send(ctx.check(ctx.grad.pop((a.stage, a.micro)), a), a.peer, a, a.kind.value)


def recv_b(ctx: StepContext, a: Action) -> None:
    ctx.grad[(a.stage + 1, a.micro)] = ctx.p2p.recv(a.peer, a)


def param_broadcast(ctx: StepContext, a: Action) -> None:
    """Broadcast ``P``'s trainable parameters from pipeline rank 0, flattened into one message."""
    params = ctx.preprocess.trainable_parameters()
    if not params:
        return
    flat = ctx.check({"flat": _flatten_dense_tensors([p.data for p in params])}, a)["flat"]
    ctx.watchdog.wait(dist.broadcast(flat, group=ctx.group, group_src=0, async_op=True), str(a))
    for p, value in zip(params, _unflatten_dense_tensors(flat, [p.data for p in params])):
        p.data.copy_(value)


def preprocess_seed(seed: int, step: int, micro: int) -> int:
    """The RNG seed ``P`` runs micro ``micro`` of step ``step`` under, on whichever rank runs it: the owner's
    forward and rank 0's recompute in ``TRANSPOSE_BWD`` draw the same dropout masks (as
    ``torch.utils.checkpoint`` replays the RNG state of the forward it recomputes), and a one-process reference
    that seeds its tower the same way draws them too. Distinct for every ``(step, micro)`` with
    ``micro < 65537``."""
    return ((seed * 1_000_003 + step) * 65_537 + micro) % 2 ** 63


def _run_preprocess(ctx: StepContext, m: int, inputs: Tensors) -> Tensors:
    """``P`` on micro ``m``'s inputs, under micro ``m``'s own seed (:func:`preprocess_seed`); the caller's RNG
    state is restored afterwards, so nothing else on the rank sees a different sequence."""
    device = ctx.p2p.device
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device.index or 0] if cuda else [], device_type="cuda"):
        seed = ctx.micro_seed(m)
        torch.default_generator.manual_seed(seed)
        if cuda:
            torch.cuda.default_generators[device.index or 0].manual_seed(seed)
        return ctx.preprocess.module(inputs)


def data_load(ctx: StepContext, a: Action) -> None:
    """``DATA_LOAD``: this rank's raw inputs of the micro (the loader validated them before the step and did the
    host's part, :func:`~.placement.host_prepare`), on this rank's device."""
    raw = ctx.load(a.micro)
    keep = ctx.preprocess.host_keys
    raw = {k: v if k in keep else to_device(v, ctx.p2p.device) for k, v in raw.items()}
    ctx.data[a.micro] = ctx.preprocess.stage0_inputs(raw)
    if ctx.cfg.transposed:
        ctx.pin[a.micro] = ctx.preprocess.inputs(raw)


def transpose_fwd(ctx: StepContext, a: Action) -> None:
    """``TRANSPOSE_FWD``: run ``P`` on the micro. Without a graph, except with owner-backward, where the owner
    keeps it for its ``TRANSPOSE_BWD``; rank 0 otherwise recomputes ``P`` in ``TRANSPOSE_BWD`` (trainable ``P``). ``P``
    runs under the micro's own seed (:func:`preprocess_seed`)."""
    m = a.micro
    if ctx.cfg.owner_backward:
        with torch.enable_grad():
            ctx.kept[m] = _run_preprocess(ctx, m, ctx.pin.pop(m))
        ctx.feats[m] = {k: v.detach() for k, v in ctx.kept[m].items()}
        return
    pin = ctx.pin[m] if ctx.cfg.trains_preprocess else ctx.pin.pop(m)
    with torch.no_grad():
        ctx.feats[m] = _run_preprocess(ctx, m, pin)


def transpose_bwd(ctx: StepContext, a: Action) -> None:
    """``TRANSPOSE_BWD``: backprop the body's feature gradient through ``P``: on the graph this rank kept
    (owner-backward: every owner, rank 0 included, after the gradient reached it, by ``GRAD_RECV`` on the others)
    or, on rank 0 without owner-backward, on a recompute of ``P`` from the micro's inputs."""
    m, grads = a.micro, ctx.feat_grad.pop(a.micro)
    if m in ctx.kept:
        _backward(ctx.kept.pop(m), grads)
        return
    with torch.enable_grad():  # the forward's dropout masks again: the same seed
        _backward(_run_preprocess(ctx, m, ctx.pin.pop(m)), grads)


def grad_reduce(ctx: StepContext, a: Action) -> None:
    """``GRAD_REDUCE`` (owner-backward): SUM ``P``'s gradient over the pipeline group. The executor hands each
    step a fresh gradient, so only this step's contributions are summed, once. A parameter no rank computed a
    gradient for (a tower that saw no image) keeps ``grad = None``, as in the unsplit model."""
    params = ctx.preprocess.trainable_parameters()
    if not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)  # on the host: voted there
    ctx.watchdog.wait(dist.all_reduce(present, group=ctx.votes or ctx.group, async_op=True), f"{a} (votes)")
    flat = ctx.check({"flat": _flatten_dense_tensors(grads)}, a)["flat"]
    ctx.watchdog.wait(dist.all_reduce(flat, group=ctx.group, async_op=True), str(a))
    for p, value, seen in zip(params, _unflatten_dense_tensors(flat, grads), present.tolist()):
        p.grad = value if seen else None


def _sender(store: str) -> Callable[[StepContext, Action], None]:
    def send(ctx: StepContext, a: Action) -> None:
        payload = host_side(getattr(ctx, store).pop(a.micro), ctx.p2p.device)
        ctx.p2p.send(ctx.check(payload, a), a.peer, a, a.kind.value)
    send.__doc__ = (f"Ship the micro's entry of ``ctx.{store}`` to the peer; its host integers stay on the host "
                    f"(:func:`~.placement.host_side`).")
    return send


def _receiver(store: str) -> Callable[[StepContext, Action], None]:
    def recv(ctx: StepContext, a: Action) -> None:
        getattr(ctx, store)[a.micro] = ctx.p2p.recv(a.peer, a)
    recv.__doc__ = f"Receive the micro's entry of ``ctx.{store}`` from the peer."
    return recv


def _swap(method: str) -> Callable[[StepContext, Action], None]:
    def run(ctx: StepContext, a: Action) -> None:
        getattr(ctx.swap, method)((a.stage, a.micro))
    run.__doc__ = f"``{method}`` of the rank's swap manager on the action's ``(stage, micro)`` group."
    return run


HANDLERS: dict[Kind, Callable[[StepContext, Action], None]] = {
    Kind.F: forward,
    Kind.B: backward,
    Kind.W: weight,
    Kind.SEND_F: send_f,
    Kind.RECV_F: recv_f,
    Kind.SEND_B: send_b,
    Kind.RECV_B: recv_b,
    Kind.PARAM_BROADCAST: param_broadcast,
    Kind.DATA_LOAD: data_load,
    Kind.TRANSPOSE_FWD: transpose_fwd,
    Kind.TRANSPOSE_BWD: transpose_bwd,
    Kind.DATA_SEND: _sender("data"),
    Kind.DATA_RECV: _receiver("data"),
    Kind.FWD_SEND: _sender("feats"),
    Kind.FWD_RECV: _receiver("feats"),
    Kind.GRAPH_SEND: _sender("pin"),
    Kind.GRAPH_RECV: _receiver("pin"),
    Kind.GRAD_SEND: _sender("feat_grad"),
    Kind.GRAD_RECV: _receiver("feat_grad"),
    Kind.GRAD_REDUCE: grad_reduce,
    Kind.SWAP_SET_GROUP: _swap("set_group"),
    Kind.SWAP_LAUNCH_OFFLOAD: _swap("launch_offload"),
    Kind.SWAP_WAIT_OFFLOAD: _swap("wait_offload"),
    Kind.SWAP_LAUNCH_LOAD: _swap("launch_load"),
    Kind.SWAP_WAIT_LOAD: _swap("wait_load"),
}


def run_action(ctx: StepContext, a: Action) -> None:
    """Dispatch one action; time it if it computes (on a GPU with CUDA events: the launches are asynchronous, so
    the host's clock would time the launches, not the work)."""
    handler = HANDLERS[a.kind]
    device = ctx.p2p.device.type
    if a.kind in BACKWARD_KINDS and torch.is_autocast_enabled(device):  # a backward replays the forward's casts
        with torch.autocast(device, enabled=False):  # inside the step's region: its weight casts stay cached
            _timed(ctx, handler, a)
    else:
        _timed(ctx, handler, a)


def _timed(ctx: StepContext, handler, a: Action) -> None:
    if a.kind not in COMPUTE_KINDS:
        handler(ctx, a)
    elif ctx.gpu_events is not None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        handler(ctx, a)
        end.record()
        ctx.gpu_events.append((start, end))
    else:
        start = time.perf_counter()
        handler(ctx, a)
        ctx.busy_s += time.perf_counter() - start
