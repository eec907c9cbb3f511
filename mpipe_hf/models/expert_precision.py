"""Fused MoE experts on the bf16 grouped GEMM under ``train.bf16`` (docs/precision.md, "MoE experts").

transformers' ``grouped_mm`` experts (``transformers.integrations.moe.grouped_mm_experts_forward``, the default
experts implementation of Qwen3-VL-MoE, Qwen3.5-MoE, GLM-4.5V, ...) call ``torch._grouped_mm`` on the input cast
to the *weights'* dtype, and autocast leaves that op alone (it is on neither of its op lists). With fp32 master
weights every expert then ran in fp32, and on CUDA fp32 is not the grouped GEMM's fast path (bf16 operands and
output only): ATen's fallback copies the group offsets to the host (``offs.cpu()``) and loops over the experts,
one device-to-host sync per grouped matmul, two per MoE layer forward.

:func:`bf16_grouped_experts` is registered in transformers' ``ExpertsInterface`` as ``grouped_mm`` (in this
process, when this module is imported) and applies autocast's rule for a matmul to the experts: inside an
enabled autocast region, each fused fp32 weight (``gate_up_proj``/``up_proj``, ``down_proj`` and their biases) is
cast to the region's dtype, so the input follows (transformers casts it to the weights' dtype) and both grouped
matmuls run in bf16 with a bf16 output, transformers' own code otherwise unchanged. The fp32 weights stay the
master copies (gradients and AdamW state fp32): the cast's backward takes each micro-batch's bf16 gradient back to
fp32 and autograd adds it into the fp32 ``.grad``, as for an ``nn.Linear`` under autocast. The cast is made once
per step and shared by the micro-batches (:func:`~mpipe_hf.runtime.casts.cached_cast`, autocast's weight cache).
Outside autocast, or with weights already bf16, nothing changes.

The same rule holds in one process: the unsplit HF model under ``torch.autocast`` (with this module imported)
casts the same weights to the same values once per call, so its losses and gradients are the pipeline's bit for
bit (a cached cast and a fresh one are the same numbers, and so are their gradients).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.integrations import moe

from ..runtime.casts import cached_cast

# the fused tensors transformers' experts forward reads (``has_gate``: gate_up_proj, else up_proj; ``has_bias``)
FUSED = ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "up_proj_bias", "down_proj_bias")
_PLAIN = moe.grouped_mm_experts_forward  # transformers' own, called with the cast weights


class _CastExperts:
    """An experts module seen with its fused weights replaced by their casts: what transformers' experts
    forward reads as ``self`` (every other attribute is the module's)."""

    def __init__(self, module: nn.Module, casts: dict[str, torch.Tensor]):
        self.__dict__.update(casts)
        self._module = module

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def bf16_grouped_experts(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                         top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' grouped-mm experts forward, under autocast on the region's dtype (the module docstring).

    Args:
        self: the experts module (fused ``(E, ...)`` weights).
        hidden_states: ``(tokens, hidden)``; top_k_index, top_k_weights: ``(tokens, k)`` routes and weights.

    Returns:
        ``(tokens, hidden)`` in ``hidden_states``' dtype, as transformers' forward returns it.
    """
    device = hidden_states.device.type  # no autocast on some (the meta device)
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        weights = {}
        for name in FUSED:
            weight = getattr(self, name, None)  # a peft ParamWrapper's parametrization adds its adapter here
            if isinstance(weight, torch.Tensor) and weight.dtype == torch.float32:
                weights[name] = weight
        width = torch.finfo(dtype).bits // 8
        # the grouped GEMM takes 16-byte aligned rows only: other experts stay fp32, as before
        if weights and not any(w.dim() == 3 and w.shape[-1] * width % 16 for w in weights.values()):
            casts = {name: cached_cast(weight, dtype) for name, weight in weights.items()}
            if getattr(self, "_is_expert_parallel", False):
                # rows received by an all-to-all (top-1, unit weights): the output stays bf16 so that the combine
                # weights and sums it in bf16, as the unsplit experts do (their weighted sum is of bf16 products)
                hidden_states = hidden_states.to(dtype)
            return _PLAIN(_CastExperts(self, casts), hidden_states, top_k_index, top_k_weights)
    return _PLAIN(self, hidden_states, top_k_index, top_k_weights)


def register() -> None:
    """Make :func:`bf16_grouped_experts` transformers' ``grouped_mm`` experts implementation in this process
    (idempotent; a model reads the implementation at every call)."""
    moe.ExpertsInterface.register("grouped_mm", bf16_grouped_experts)


register()
