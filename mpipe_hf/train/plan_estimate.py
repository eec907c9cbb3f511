"""The profile a plan runs on when none is measured (``mpipe-hf plan`` without ``--profile``): estimated from the
config alone (:func:`estimate_profile`), before any GPU is booked.

- Compute times come from the matmul FLOPs at a peak rate and utilisation, the vision tower's from its weights
  (:mod:`.plan_vision`).
- Activation bytes are counted, not modelled: one decoder layer of each kind (:func:`representative_layers`) and
  the head run on the meta device (or on fake CPU tensors under bf16 autocast) under ``saved_tensors_hooks``
  (:func:`meta_activation_bytes`), attention through a stand-in that saves what a fused kernel keeps
  (:func:`register_fused_attention`), with what :mod:`.plan_layer_inputs` hands each layer.

:mod:`.plan` turns such a profile into every rank's memory and the predicted step.
"""

from __future__ import annotations

import contextlib
import copy
from collections import Counter

import torch

from ..models.costs import is_sparse, matmul_costs, num_experts
from ..models.decoder import layer_types
from ..models.load import meta_model
from ..runtime.memory import saved_bytes, storage_ids
from ..schedule.tune import Profile
from .plan_layer_inputs import (boundary_bytes, decoder_of, head_norm, head_of, kv_modes, layer_bytes, rope_of,
                                shares_kv, streams)
from .plan_vision import patches_per_image_token, tower_units, vision_parts, with_frozen_vit

FUSED_ATTENTION = "mpipe_meta_fused"  # the stand-in's name in transformers' AttentionInterface


class _FusedAttention(torch.autograd.Function):
    """A stand-in for a fused attention kernel (FlashAttention, SDPA's efficient kernels) when counting: its
    output has the query's shape with the value's head width (zeros, so a real run through it stays finite; the
    widths differ in multi-head latent attention), and it saves what such kernels
    keep for their backward, the query, key, value, output and the fp32 log-sum-exp per row, never the
    ``L x L`` probabilities. Its backward passes zero gradients (it is for counting memory, not training)."""

    @staticmethod
    def forward(ctx, query, key, value):
        out = torch.zeros_like(query)  # the query's memory layout: FlashAttention's (B, L, heads, d) output
        if value.shape[-1] != query.shape[-1]:
            b, heads, length, _ = query.shape
            out = query.new_zeros(b, length, heads, value.shape[-1]).transpose(1, 2)
        lse = query.new_zeros(query.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(query, key, value, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        query, key, value, *_ = ctx.saved_tensors
        return torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)


def _meta_attention(module, query, key, value, attention_mask, **kwargs):
    """``(B, heads, L, d)`` query -> ``(B, L, heads, d)`` output, as transformers' attention functions return.
    Under autocast the inputs go in as casts to its dtype, as autocast casts SDPA's (and FlashAttention takes)."""
    kind = query.device.type
    if kind != "meta" and torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    return _FusedAttention.apply(query, key, value).transpose(1, 2), None


def register_fused_attention() -> str:
    """Register the counting stand-in (:class:`_FusedAttention`) with transformers' ``AttentionInterface``;
    returns its name, for ``config._attn_implementation`` (a run that should save what the plan counts)."""
    from transformers import AttentionInterface
    AttentionInterface.register(FUSED_ATTENTION, _meta_attention)
    return FUSED_ATTENTION


def representative_layers(text) -> dict[int, int]:
    """``{layer id: layers of its kind}``: the first decoder layer of each kind, a kind being the layer's
    attention type (:func:`~mpipe_hf.models.decoder.layer_types`), whether its MLP is a mixture of experts
    (:func:`~mpipe_hf.models.costs.is_sparse`) and whether it stores, reuses or keeps to itself its keys and
    values (:func:`~.plan_layer_inputs.kv_modes`); layers of one kind save the same bytes per token."""
    firsts, counts = {}, Counter()
    for i, (layer_type, mode) in enumerate(zip(layer_types(text), kv_modes(text))):
        kind = (layer_type, is_sparse(text, i), mode)
        firsts.setdefault(kind, i)
        counts[kind] += 1
    return {firsts[kind]: counts[kind] for kind in firsts}


@contextlib.contextmanager
def _experts_fallback():
    """Within, transformers' grouped-mm experts (``grouped_mm_experts_forward``) take its own fallback op
    (``transformers::grouped_mm_fallback``: a fake kernel that shapes the output, an autograd that saves the
    input and weight as ``torch._grouped_mm``'s does) instead of ``torch._grouped_mm``, whose meta kernel takes
    bf16 only (the plan counts fp32 weights)."""
    from transformers.integrations import moe
    original = moe._can_use_grouped_mm
    moe._can_use_grouped_mm = lambda *args: False
    try:
        yield
    finally:
        moe._can_use_grouped_mm = original


def _static_rope(text) -> None:
    """Make a dynamic-NTK rotary embedding (InternVL3's Qwen2.5) the default one, in place: its frequencies do
    not change what a layer saves, and its update reads the longest position back to the host, which meta
    tensors cannot."""
    params = getattr(text, "rope_parameters", None) or {}
    for part in [params] + [v for v in params.values() if isinstance(v, dict)]:
        if part.get("rope_type") == "dynamic":
            part["rope_type"] = "default"
            part.pop("factor", None)


@contextlib.contextmanager
def quiet_transformers():
    """transformers' warnings muted (its ``[transformers] ... falling back to its reference PyTorch implementation
    ... much slower`` notices speak of running the model, which a count on the meta device does not)."""
    from transformers.utils import logging as hf_logging
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def meta_activation_bytes(config, tokens: int, bf16: bool = False) -> tuple[int, int]:
    """``(a decoder layer, the LM head with its loss)``: bytes saved for backward for one micro-batch of
    ``tokens`` tokens with a fused attention kernel; the layer's is the mean over the model's layers of the
    count of one layer of each kind (:func:`representative_layers`: linear and softmax attention, dense and
    expert MLPs; an MoE layer routes with transformers' grouped-mm experts). In fp32 counted on the meta
    device; with ``bf16`` under ``train.bf16``'s policy (fp32 weights, bf16 autocast, :mod:`.precision`),
    counted on fake CPU tensors (``FakeTensorMode``: shapes, dtypes and storages, no memory; meta tensors see no
    autocast) at full size under ``torch.autocast("cpu", torch.bfloat16)``, whose casts of these ops (matmuls to
    bf16; norms on the fp32 residual stream and the loss's upcast logits in fp32) are CUDA's. Parameters, and
    their casts (:func:`~mpipe_hf.runtime.memory.weight_copy`: one per step, not a micro's), are left out, as the
    executor's ``measure_memory`` leaves them out."""
    register_fused_attention()
    counted = copy.deepcopy(config)
    text = counted.get_text_config()
    kinds = representative_layers(text)
    _static_rope(text)
    if not shares_kv(text):  # the layers up to the last representative, no more (plan_layer_inputs: why not)
        text.num_hidden_layers = max(kinds) + 1
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:text.num_hidden_layers]
    model = meta_model(counted)
    decoder_of(model).config._attn_implementation = FUSED_ATTENTION
    if num_experts(text) and model.config._experts_implementation != "grouped_mm":
        # eager's routing reads counts back: no meta kernel; Kimi K2.5 sets it on its language model alone, Llama
        # 4's experts (one batched matmul) have no other implementation
        for part in [p for p in (model, decoder_of(model)) if p._can_set_experts_implementation()][:1]:
            part.set_experts_implementation("grouped_mm")
    if not bf16:
        with quiet_transformers():
            layers, head = _count(model, text, tokens, list(kinds), "meta", contextlib.nullcontext())
    else:
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode(allow_non_fake_inputs=True), quiet_transformers():  # meta parameters in, fake CPU out
            model.to_empty(device="cpu")
            layers, head = _count(model, text, tokens, list(kinds), "cpu",
                                  torch.autocast("cpu", dtype=torch.bfloat16))
    total = sum(kinds[i] * b for i, b in zip(kinds, layers))
    return round(total / sum(kinds.values())), head


def _count(model, text, tokens: int, layer_ids: list[int], device: str, region) -> tuple[list[int], int]:
    """:func:`meta_activation_bytes`'s count of layers ``layer_ids`` of ``model`` and its head, on ``device``
    inside ``region``."""
    inner = decoder_of(model)
    params = storage_ids(model.parameters())
    lead = (streams(text),) if streams(text) > 1 else ()  # Gemma 3n: the AltUp streams (S, B, L, H)
    hidden = torch.empty(*lead, 1, tokens, text.hidden_size, device=device, requires_grad=True)
    positions = torch.arange(tokens, device=device).unsqueeze(0)
    section = (getattr(text, "rope_parameters", None) or {}).get("mrope_section")
    if section:  # M-RoPE: one row per axis (HunYuan-VL's 4)
        positions = positions.expand(len(section), 1, tokens)
    labels = torch.zeros(1, tokens, dtype=torch.long, device=device)
    with region, _experts_fallback():
        layers = layer_bytes(inner, text, layer_ids, hidden, rope_of(inner, hidden, positions, layer_types(text)),
                             params, tokens, positions if positions.dim() == 2 else None)  # a stage's text positions
        lm_head, norm = head_of(model), head_norm(model, text)
        head = saved_bytes(lambda: model.loss_function(logits=lm_head(norm(hidden)), labels=labels,
                                                       vocab_size=text.vocab_size), params)
    return layers, head


def estimate_profile(config, tokens: int, image_tokens: int = 0, tflops: float = 989.0, mfu: float = 0.4,
                     bandwidth_gbps: float = 400.0, bf16: bool = False, frozen_vit: bool = False) -> Profile:
    """A :class:`~mpipe_hf.schedule.tune.Profile` from the config alone, for sizing before any hardware runs:
    compute times from the matmul FLOPs (``2 * weights * tokens`` forward, twice that backward; a layer's
    weights are the mean of :func:`~mpipe_hf.models.costs.layer_costs`, the active ones of an MoE layer) at
    ``tflops`` peak and ``mfu`` utilisation, the tower's from its weights over ``image_tokens *
    patches_per_image_token`` patches and its projector's (:func:`vision_parts`) over ``image_tokens``,
    activation bytes counted on the meta device (:func:`meta_activation_bytes`; the tower's scaled from a text
    layer's per token and hidden unit, a rough figure), and links at ``bandwidth_gbps`` GB/s. With ``bf16``
    (``train.bf16``) the activation bytes are those saved under bf16 autocast (``meta_activation_bytes(...,
    bf16=True)``); the hidden states between stages stay fp32 (the residual stream is fp32 under autocast). A
    layer's parameter bytes (what a trainable ``P`` sends per text layer) count every expert.

    Raises:
        ValueError: ``tokens`` below 1; as :func:`~mpipe_hf.models.costs.layer_costs` and :func:`vision_parts`.
    """
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    text = config.get_text_config()
    layer_w, head_w = matmul_costs(text)
    rate = tflops * 1e12 * mfu
    shadow = meta_model(config)
    layer_params = sum(p.numel() for p in decoder_of(shadow).layers.parameters()) / text.num_hidden_layers
    vision_w, vision_mm, patches, tower_act = 0.0, 0.0, 0.0, 0.0
    if hasattr(config, "vision_config"):
        sizes = [float(n) for n in vision_parts(shadow, config.model_type)]
        patches = image_tokens * patches_per_image_token(config)
        vision_w, vision_mm = sum(sizes), sizes[0] * patches + sum(sizes[1:]) * image_tokens  # projector: per token
    layer_act, head_act = meta_activation_bytes(config, tokens, bf16)
    if patches:  # as many bytes per element and block as a text layer saves per token and hidden unit (rough)
        per_unit = layer_act / (tokens * text.hidden_size)
        tower_act = per_unit * patches * tower_units(config.vision_config)
    profile = Profile(
        num_layers=text.num_hidden_layers, layer_forward_s=2 * layer_w * tokens / rate,
        layer_backward_s=4 * layer_w * tokens / rate, preprocess_forward_s=2 * vision_mm / rate,
        preprocess_backward_s=4 * vision_mm / rate, head_forward_s=2 * head_w * tokens / rate,
        head_backward_s=4 * head_w * tokens / rate, activation_bytes=boundary_bytes(text, tokens),
        feature_bytes=4.0 * image_tokens * text.hidden_size, layer_activation_bytes=float(layer_act),
        head_activation_bytes=float(head_act), preprocess_activation_bytes=float(tower_act),
        layer_param_bytes=4.0 * layer_params,
        preprocess_param_bytes=4.0 * vision_w, bandwidth_bytes_per_s=bandwidth_gbps * 1e9, latency_s=2e-5)
    return with_frozen_vit(profile, shadow, config, image_tokens, rate) if frozen_vit and patches else profile
