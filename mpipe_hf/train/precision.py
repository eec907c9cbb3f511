"""The precision policy of ``train: {bf16: true}``: fp32 master weights with bf16 autocast.

Every parameter, gradient and AdamW state stays fp32 (16 bytes per trained parameter, as without ``bf16``); each
stage's forward and ``P``'s run under ``torch.autocast(dtype=torch.bfloat16)``, so the matmuls compute in bf16
and their activations are bf16, about half the saved activation memory of fp32 where matmul outputs dominate. The
residual stream stays fp32 (an fp32 embedding plus bf16 branch outputs promotes to fp32), so the hidden states
between stages are fp32, exactly as inside the unsplit model; HF's loss upcasts the logits, so the cross-entropy
and the loss are fp32. The backward replays the forward's casts. This is the policy of the HF Trainer's
``bf16=True`` (AMP), chosen over bf16 weights with fp32 optimizer states because the gradients then accumulate in
fp32 over the micro-batches and the pipelined run equals the one-process AMP run op for op.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..models import expert_precision  # noqa: F401 - the experts' bf16 grouped GEMM under autocast
from ..runtime import Preprocess


class Autocast(nn.Module):
    """``module``'s forward under ``torch.autocast(device_type, dtype)``; the same parameters (``module`` is a
    submodule, so a wrapped ``P`` still lists its trainable parameters).

    ``autocast_dtype`` tells the executor to hold one autocast region open over the whole step, so autocast's
    cache casts each trained weight once per step and every micro-batch in flight shares that copy (a
    region per stage call cast, and saved, a copy per micro-batch). An input that is a leaf taking a gradient
    (an activation received from the previous stage) goes in as a view, which autocast does not cache: its cast
    then lives only as long as the micro-batch's graph, not the whole step."""

    def __init__(self, module: nn.Module, device_type: str, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.module, self.device_type, self.autocast_dtype = module, device_type, dtype

    def forward(self, inputs):
        inputs = {k: v.view_as(v) if isinstance(v, torch.Tensor) and v.is_leaf and v.requires_grad else v
                  for k, v in inputs.items()}
        with torch.autocast(self.device_type, dtype=self.autocast_dtype):
            return self.module(inputs)


def autocast_modules(stages: dict[int, nn.Module], preprocess: Preprocess, device: torch.device
                     ) -> tuple[dict[int, nn.Module], Preprocess]:
    """``(stages, preprocess)`` with every stage and ``P``'s module running under bf16 autocast."""
    wrapped = {s: Autocast(m, device.type) for s, m in stages.items()}
    module = None if preprocess.module is None else Autocast(preprocess.module, device.type)
    return wrapped, dataclasses.replace(preprocess, module=module)
