"""One small function per action kind, and the table that maps kinds to them (SPEC.md, "Actions").

Each handler takes the step's :class:`StepContext` and the action. Tensors move between handlers only through the
context's stores, keyed by micro (and stage), so a failed step is cleaned by clearing the context.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..schedule import Action, Kind, ScheduleConfig
from ..schedule.actions import COMPUTE_KINDS
from .p2p import P2P

Tensors = dict[str, torch.Tensor]


@dataclass
class Preprocess:
    """The transposed block ``P`` and the raw keys it and stage 0 read.

    Attributes:
        module: ``forward(inputs: dict) -> dict`` of tensors, e.g. pixels -> ``{"image_features": (n, H)}``.
        input_keys: raw keys ``P`` reads; ``GRAPH_SEND`` ships these (trainable ``P`` only).
        stage0_keys: raw keys stage 0 reads; ``DATA_SEND`` ships only these, so keys read by ``P`` alone (pixels)
            never reach rank 0 when ``P`` is frozen.
    """

    module: nn.Module
    input_keys: tuple[str, ...]
    stage0_keys: tuple[str, ...]

    def inputs(self, raw: Tensors) -> Tensors:
        return {k: raw[k] for k in self.input_keys if k in raw}

    def stage0_inputs(self, raw: Tensors) -> Tensors:
        return {k: raw[k] for k in self.stage0_keys if k in raw}


@dataclass
class StepContext:
    """Everything one rank's schedule run reads and writes. Stores are emptied when the step ends or fails."""

    cfg: ScheduleConfig
    rank: int
    stages: dict[int, nn.Module]
    preprocess: Preprocess
    p2p: P2P
    group: dist.ProcessGroup
    load: Callable[[int], Tensors]
    data: dict[int, Tensors] = field(default_factory=dict)        # stage-0 inputs per micro
    pin: dict[int, Tensors] = field(default_factory=dict)         # P's inputs per micro
    feats: dict[int, Tensors] = field(default_factory=dict)       # P's outputs per micro
    feat_grad: dict[int, Tensors] = field(default_factory=dict)   # gradient on P's outputs (rank 0)
    act: dict[tuple[int, int], Tensors] = field(default_factory=dict)   # (stage, m) -> output for stage + 1
    grad: dict[tuple[int, int], Tensors] = field(default_factory=dict)  # (stage, m) -> grad of stage's inputs
    saved: dict[tuple[int, int], tuple[Tensors, Tensors]] = field(default_factory=dict)  # for the backward
    loss_sum: float = 0.0
    num_tokens: int = 0
    busy_s: float = 0.0

    def clear(self) -> None:
        for store in (self.data, self.pin, self.feats, self.feat_grad, self.act, self.grad, self.saved):
            store.clear()

    def last_stage(self, stage: int) -> bool:
        return stage == self.cfg.num_stages - 1


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
        feats = {k: v.detach().requires_grad_(ctx.cfg.trainable and v.is_floating_point())
                 for k, v in ctx.feats.pop(m).items()}
        inputs = {**ctx.data.pop(m), **feats}
    else:
        inputs = ctx.act.pop((s - 1, m))
    outputs = ctx.stages[s](inputs)
    if ctx.last_stage(s):
        ctx.loss_sum += float(outputs["loss"].detach())
        ctx.num_tokens += int(outputs["num_tokens"])
    else:
        ctx.act[(s, m)] = _handoff(outputs)
    ctx.saved[(s, m)] = (inputs, outputs)


def backward(ctx: StepContext, a: Action) -> None:
    """``B``: backprop stage ``a.stage`` for micro ``a.micro``; keep the gradient of its inputs."""
    s, m = a.stage, a.micro
    inputs, outputs = ctx.saved.pop((s, m))
    if ctx.last_stage(s):
        outputs["loss"].backward()
    else:
        _backward(outputs, ctx.grad.pop((s + 1, m)))
    grads = _input_grads(inputs)
    if s > 0:
        ctx.grad[(s, m)] = grads
    elif ctx.cfg.trainable:
        ctx.feat_grad[m] = grads


def send_f(ctx: StepContext, a: Action) -> None:
    ctx.p2p.send(ctx.act.pop((a.stage, a.micro)), a.peer, what=str(a))


def recv_f(ctx: StepContext, a: Action) -> None:
    ctx.act[(a.stage - 1, a.micro)] = ctx.p2p.recv(a.peer, what=str(a))


def send_b(ctx: StepContext, a: Action) -> None:
    ctx.p2p.send(ctx.grad.pop((a.stage, a.micro)), a.peer, what=str(a))


def recv_b(ctx: StepContext, a: Action) -> None:
    ctx.grad[(a.stage + 1, a.micro)] = ctx.p2p.recv(a.peer, what=str(a))


def param_broadcast(ctx: StepContext, a: Action) -> None:
    """Broadcast ``P``'s trainable parameters from pipeline rank 0, flattened into one message."""
    params = [p for p in ctx.preprocess.module.parameters() if p.requires_grad]
    if not params:
        return
    flat = _flatten_dense_tensors([p.data for p in params])
    dist.broadcast(flat, group=ctx.group, group_src=0)
    for p, value in zip(params, _unflatten_dense_tensors(flat, [p.data for p in params])):
        p.data.copy_(value)


def data_load(ctx: StepContext, a: Action) -> None:
    """``DATA_LOAD``: this rank's raw inputs of the micro (the loader validates and may cache)."""
    raw = ctx.load(a.micro)
    ctx.data[a.micro] = ctx.preprocess.stage0_inputs(raw)
    ctx.pin[a.micro] = ctx.preprocess.inputs(raw)


def transpose_fwd(ctx: StepContext, a: Action) -> None:
    """``TRANSPOSE_FWD``: run ``P`` without a graph (rank 0 recomputes it for a trainable ``P``)."""
    keep = ctx.cfg.trainable
    pin = ctx.pin[a.micro] if keep else ctx.pin.pop(a.micro)
    with torch.no_grad():
        ctx.feats[a.micro] = ctx.preprocess.module(pin)


def transpose_bwd(ctx: StepContext, a: Action) -> None:
    """``TRANSPOSE_BWD``: recompute ``P`` on the micro's inputs and backprop the body's feature gradient."""
    pin, grads = ctx.pin.pop(a.micro), ctx.feat_grad.pop(a.micro)
    with torch.enable_grad():
        _backward(ctx.preprocess.module(pin), grads)


def _sender(store: str) -> Callable[[StepContext, Action], None]:
    def send(ctx: StepContext, a: Action) -> None:
        ctx.p2p.send(getattr(ctx, store).pop(a.micro), a.peer, what=str(a))
    send.__doc__ = f"Ship the micro's entry of ``ctx.{store}`` to rank 0."
    return send


def _receiver(store: str) -> Callable[[StepContext, Action], None]:
    def recv(ctx: StepContext, a: Action) -> None:
        getattr(ctx, store)[a.micro] = ctx.p2p.recv(a.peer, what=str(a))
    recv.__doc__ = f"Receive the micro's entry of ``ctx.{store}`` from its owner."
    return recv


HANDLERS: dict[Kind, Callable[[StepContext, Action], None]] = {
    Kind.F: forward,
    Kind.B: backward,
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
}

def run_action(ctx: StepContext, a: Action) -> None:
    """Dispatch one action; time it if it computes."""
    handler = HANDLERS.get(a.kind)
    if handler is None:
        raise NotImplementedError(f"no handler for {a.kind.value} yet")
    if a.kind in COMPUTE_KINDS:
        start = time.perf_counter()
        handler(ctx, a)
        ctx.busy_s += time.perf_counter() - start
    else:
        handler(ctx, a)
