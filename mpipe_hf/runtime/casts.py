"""One bf16 copy of each weight per step.

Under bf16 autocast a matmul casts its fp32 weight to bf16, and the backward needs that copy, so each micro-batch
in flight saved a copy of its stage's weights. Autocast's own cache shares one copy per step for the weights it
caches, the trained ones (leaves that take a gradient), as long as one autocast region spans the step (the
executor holds it). A frozen weight (a LoRA base layer, a frozen embedding's tied head) is not cached, so
:func:`frozen_weight_casts` casts each frozen ``nn.Linear`` weight and bias once when the step starts and puts the
copy in its place until the step ends. ``F.linear`` under autocast casts weight, bias and input to bf16 anyway:
the same values reach the kernel, and the step is unchanged bit for bit. Only where ``F.linear`` is the weight's
one reader: the base layer of a DoRA adapter (peft's ``use_dora``), which also takes the norm of its weight, is
left to autocast.

Under FSDP2 (``dp_shard``) the executor keeps a region per stage call instead: FSDP2's ``MixedPrecisionPolicy``
gathers the Linear weights in bf16 once per step already, and with a step-long region the bf16 copy of any other
weight would be cached at the first micro-batch, whose old autograd node runs after FSDP2's post-backward hook
has reduce-scattered the chunk's gradient in its last backward: that micro's gradient would be lost.

There, the step has no region around it at all (:func:`step_region`): autocast counts a *disabled* region as
nesting too, and clears its cache only when the outermost region exits, so a disabled region over the step kept
every per-call cast for the whole step, with the loss above (LoRA adapters, fused MoE experts; a
gradient off by 0.29 at ``dp = 2``).

Fused MoE experts (transformers' ``grouped_mm`` experts, :mod:`mpipe_hf.models.expert_precision`) are no
``nn.Linear``: autocast neither casts nor caches their ``(E, ...)`` weights. Their forward casts them itself
(:func:`cached_cast`), once per step while :func:`step_casts` is active (the executor holds it over every step),
else once per call.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

_STEP_CASTS: dict | None = None  # {id(weight): (weight, its cast)} while step_casts is active
_STEP_KEEPS = None  # which weights step_casts may cache (None: every leaf)


@contextlib.contextmanager
def frozen_weight_casts(modules: Iterable[nn.Module], dtype: torch.dtype | None) -> Iterator[None]:
    """While active, every frozen fp32 ``weight``/``bias`` of an ``nn.Linear`` in ``modules`` is a bf16 (``dtype``)
    parameter holding its cast; the originals are back on exit, also when the step fails. ``dtype`` ``None``:
    nothing changes."""
    swapped = []
    if dtype is not None:
        for module in modules:
            # a DoRA layer reads its base weight outside F.linear (the weight norm): that one stays fp32
            dora = {id(m.get_base_layer()) for m in module.modules() if any(getattr(m, "use_dora", {}).values())}
            for layer in module.modules():
                if not isinstance(layer, nn.Linear) or id(layer) in dora:
                    continue
                for name in ("weight", "bias"):
                    p = layer._parameters.get(name)
                    if p is not None and not p.requires_grad and p.dtype == torch.float32 and \
                            not isinstance(p, DTensor):
                        layer._parameters[name] = nn.Parameter(p.detach().to(dtype), requires_grad=False)
                        swapped.append((layer, name, p))
    try:
        yield
    finally:
        for layer, name, p in reversed(swapped):
            layer._parameters[name] = p


def step_region(device_type: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """The autocast region the executor holds over a step: one enabled region of ``dtype`` (its cache shares one
    cast of each trained weight between the micro-batches), or, with ``dtype`` ``None`` (fp32, or FSDP2 whose
    stages open a region per call), none at all: never a disabled one (module docstring)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype)


def check_no_outer_region(device_type: str) -> None:
    """Refuse a step whose caller holds an autocast region open, enabled or not: the step's own regions would
    nest in it, and autocast clears its cache of casts only when the outermost region exits, so the casts would
    outlive the step (stale after the optimizer's update; under FSDP2, the loss of gradient the module docstring
    describes), and an enabled one would cast an fp32 run to lower precision.

    Raises:
        ValueError: an autocast region is open at the step's start.
    """
    outer = torch.autocast_increment_nesting() > 1  # the count with this probe: 1 when no region is open
    torch.autocast_decrement_nesting()
    if outer:
        raise ValueError(f"the pipeline step was called inside a torch.autocast region ({device_type}); mpipe_hf "
                         f"applies its own precision policy (train.bf16 / TrainingArguments.bf16): call the step "
                         f"outside any autocast region")


@contextlib.contextmanager
def step_casts(keeps=None) -> Iterator[None]:
    """While active, :func:`cached_cast` casts each leaf weight once and hands every later call that copy, as
    autocast's cache does for an ``nn.Linear`` weight in a step-long region: one cast per step, whose autograd
    node takes every micro-batch's gradient back to the fp32 weight. The copies are dropped on exit.

    ``keeps``: ``keeps(weight) -> bool``, the weights that may be cached (``None``: every leaf). Under FSDP2 only
    the expert shards FSDP2 leaves alone: a step-long cast of a weight FSDP2 gathers would run its gradient
    after the chunk's reduce-scatter (the module docstring). Nested: the outermost one holds the cache."""
    global _STEP_CASTS, _STEP_KEEPS
    if _STEP_CASTS is not None:
        yield
        return
    _STEP_CASTS, _STEP_KEEPS = {}, keeps
    try:
        yield
    finally:
        _STEP_CASTS, _STEP_KEEPS = None, None


def cached_cast(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``weight`` in ``dtype`` when it is an fp32 tensor, else ``weight`` itself. A leaf (a trained weight, or a
    frozen one: then a frozen parameter, which the memory count and the swap take for a weight) is cast once per
    :func:`step_casts` and that copy reused; a trained leaf only while gradients are on (a copy made under
    ``no_grad`` would carry none). A computed weight (peft's ``ParamWrapper`` adds its adapter to the fused tensor
    on every read) is cast on every call."""
    if weight.dtype != torch.float32 or dtype == torch.float32:
        return weight
    cacheable = _STEP_CASTS is not None and weight.is_leaf and (torch.is_grad_enabled() or not weight.requires_grad)
    if not cacheable or (_STEP_KEEPS is not None and not _STEP_KEEPS(weight)):
        return weight.to(dtype)
    held = _STEP_CASTS.get(id(weight))
    if held is None or held[0] is not weight:
        held = (weight, weight.to(dtype) if weight.requires_grad else  # a frozen one's copy: a parameter, as
                nn.Parameter(weight.detach().to(dtype), requires_grad=False))  # frozen_weight_casts makes it
        _STEP_CASTS[id(weight)] = held
    return held[1]
