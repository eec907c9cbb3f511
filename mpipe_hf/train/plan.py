"""The memory plan of a recipe (``mpipe-hf plan RECIPE.yaml``): what every pipeline rank holds, and how fast a step
runs, before any GPU is booked.

- Parameter, gradient and optimizer-state bytes are exact: the model is built on the meta device and carved for
  each rank by the same :func:`~mpipe_hf.models.split` that training uses. Training keeps fp32 weights, an fp32
  gradient for every parameter the rank trains (none for a frozen one) and AdamW's two fp32 moments.
- The activation peak walks each rank's action list of the schedule: every stage forward whose backward has not
  run yet holds that stage's saved activations for one micro-batch (its layers' and, on the last stage, the
  head's), and the peak is the largest sum. The bytes per layer and micro come from a profile: a measured one
  (``mpipe-hf profile``), or one estimated from the config (:func:`estimate_profile`), whose activation bytes are
  counted on the meta device by running one decoder layer and the head under ``saved_tensors_hooks``. With
  gradient checkpointing a layer in flight keeps only its input hidden states.
- The step time and bubble are the simulator's (:func:`~mpipe_hf.schedule.tune.predict`) on that profile.
- With expert parallelism (``parallel.ep_size``) a rank holds ``E / ep_size`` experts of each MoE layer of
  its stages, the all-to-all's buffers, and its stages' ``F`` and ``B`` take the all-to-alls' time
  (:mod:`.plan_experts`).
- NCCL's buffers: the communicators a rank joins (its pipeline pairs, the pipeline's, the world's, the
  data-parallel and EP groups) at NCCL's default buffer sizes (:mod:`.plan_nccl`, which states the model).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections import Counter
from dataclasses import dataclass

import torch
from ..runtime.memory import saved_bytes, storage_ids

from ..models import split
from ..models.costs import is_sparse, matmul_costs, num_experts
from ..models.decoder import layer_types
from ..models.load import meta_model
from .plan_layer_inputs import (boundary_bytes, decoder_of, head_norm, head_of, kv_modes, layer_bytes, rope_of,
                                shares_kv, streams)
from ..schedule import ScheduleConfig, build_schedule
from ..schedule.actions import Kind
from ..schedule.simulate import simulate
from ..schedule.tune import Profile, costs_for
from .plan_experts import ExpertPlan, expert_plan, rank_bytes, sharded_names, with_all_to_all
from .plan_nccl import nccl_bytes
from .plan_vision import patches_per_image_token, tower_units, vision_parts, with_frozen_vit

ADAM_STATE_BYTES = 8  # exp_avg and exp_avg_sq, fp32, per trained element
GIB = 2**30


@dataclass(frozen=True)
class RankPlan:
    """One rank's device memory, in bytes (``activation_bytes``: the peak of saved activations;
    ``all_to_all_bytes``: expert parallelism's all-to-all buffers, :mod:`.plan_experts`)."""

    rank: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    peak_in_flight: int
    all_to_all_bytes: int = 0
    nccl_bytes: int = 0  # NCCL's buffers, :mod:`.plan_nccl`'s model

    @property
    def total_bytes(self) -> int:
        return (self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes
                + self.all_to_all_bytes + self.nccl_bytes)


@dataclass(frozen=True)
class Plan:
    """Every rank's :class:`RankPlan` (one pipeline, as every replica's is), the layout, the simulator's step time
    (seconds) and bubble, and with expert parallelism its :class:`~.plan_experts.ExpertPlan`."""

    ranks: list[RankPlan]
    layers_per_stage: list[int]
    step_s: float
    bubble: float
    profile: Profile
    experts: ExpertPlan | None = None

    def fits(self, device_bytes: float, headroom: float = 0.1) -> bool:
        """Whether every rank's total stays under ``device_bytes`` less a ``headroom`` share (allocator
        fragmentation, the CUDA context, communication buffers)."""
        return all(r.total_bytes <= device_bytes * (1 - headroom) for r in self.ranks)

    def table(self, device_bytes: float | None = None) -> str:
        """The per-rank table, the layout line (layers per stage, ``ep_size``, the predicted step) and, with
        ``device_bytes``, whether it fits. A units row under the headings gives each column's unit: the memory
        columns in GiB, then ``in-flight``, a count (the stage forwards a rank holds for their backward at its
        peak), apart from them."""
        ep = self.experts is not None
        gib = ["params", "grads", "optim", "activ"] + ["all2all"] * ep + ["nccl", "total"]
        lines = [f"{'rank':>4} " + " ".join(f"{h:>9}" for h in gib) + f" | {'in-flight':>9}",
                 f"{'':>4} " + " ".join(f"{'GiB':>9}" for _ in gib) + f" | {'forwards':>9}"]
        for r in self.ranks:
            lines.append(f"{r.rank:>4} {r.param_bytes / GIB:9.2f} {r.grad_bytes / GIB:9.2f} "
                         f"{r.optimizer_bytes / GIB:9.2f} {r.activation_bytes / GIB:9.2f} "
                         + (f"{r.all_to_all_bytes / GIB:9.2f} " if ep else "") + f"{r.nccl_bytes / GIB:9.2f} "
                         f"{r.total_bytes / GIB:9.2f} | "
                         f"{r.peak_in_flight:>9}")
        lines.append(f"layers per stage {self.layers_per_stage}; "
                     + (f"{self.experts.describe()}; " if ep else "ep_size 1; ")
                     + f"predicted step {self.step_s:.3f} s, bubble {self.bubble:.3f}")
        if device_bytes:
            worst = max(r.total_bytes for r in self.ranks)
            lines.append(f"{'fits' if self.fits(device_bytes) else 'does NOT fit'} on {device_bytes / GIB:.0f} GiB "
                         f"devices: the fullest rank needs {worst / GIB:.1f} GiB (limit with 10% headroom "
                         f"{0.9 * device_bytes / GIB:.1f} GiB)")
        return "\n".join(lines)


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


def _peak_activation_bytes(order, stage_bytes: list[float], graph_bytes: float = 0.0,
                           keeps: bool = False) -> tuple[int, int]:
    """``(peak bytes, peak count)`` of what one rank's ``order`` holds for a backward: each stage forward until
    its ``B`` (counted), and with ``graph_bytes`` (a trainable ``P``'s graph for one micro) either each graph
    an owner ``keeps`` from ``TRANSPOSE_FWD`` to its ``TRANSPOSE_BWD`` (owner-backward), or the one graph
    ``TRANSPOSE_BWD`` rebuilds (without it; SPEC.md, "Actions")."""
    live = peak = count = peak_count = 0
    for a in order:
        if a.kind is Kind.F:
            live, count = live + stage_bytes[a.stage], count + 1
        elif a.kind is Kind.B:
            live, count = live - stage_bytes[a.stage], count - 1
        elif a.kind is Kind.TRANSPOSE_FWD and keeps:
            live += graph_bytes
        elif a.kind is Kind.TRANSPOSE_BWD and keeps:
            live -= graph_bytes
        elif a.kind is Kind.TRANSPOSE_BWD:
            peak = max(peak, live + graph_bytes)
        peak, peak_count = max(peak, live), max(peak_count, count)
    return int(peak), peak_count


def plan(config, cfg: ScheduleConfig, profile: Profile, layers_per_stage: list[int], text_layers: int = 0,
         gradient_checkpointing: bool = False, ep_size: int = 1, ep_within_node: bool = True,
         dp_size: int = 1) -> Plan:
    """Every rank's memory and the predicted step of ``cfg`` with ``layers_per_stage`` on ``profile`` (see the
    module docstring). With ``gradient_checkpointing`` a layer keeps only its input (``profile.activation_bytes``)
    per micro in flight, and each rank adds one layer's full activations, rebuilt during a backward. A trainable
    ``P``'s graphs count as the tower's activations plus ``text_layers`` layers' per micro-batch. ``ep_size``:
    expert parallelism (``parallel.ep_size``; :mod:`.plan_experts`), its all-to-all over NVLink when
    ``ep_within_node``, else InfiniBand. ``dp_size``: the pipeline replicas, for NCCL's buffers
    (:mod:`.plan_nccl`; none in a world of one process).

    Raises:
        ValueError: as :func:`~mpipe_hf.models.split` (the layout, ``text_layers``, the model type); as
            :func:`~.plan_experts.expert_plan` (``ep_size`` against the model).
    """
    orders = build_schedule(cfg)
    experts = expert_plan(config, profile, layers_per_stage, text_layers, ep_size, ep_within_node)
    counts = list(layers_per_stage)
    counts[0] -= text_layers
    per_layer = profile.activation_bytes if gradient_checkpointing else profile.layer_activation_bytes
    stage_bytes = [n * per_layer for n in counts]
    if experts is not None and not gradient_checkpointing:  # AllToAllEP's own saved tensors, per MoE layer
        stage_bytes = [b + n * experts.saved_bytes for b, n in zip(stage_bytes, experts.moe_layers)]
    stage_bytes[-1] += profile.head_activation_bytes
    recompute = profile.layer_activation_bytes + (experts.saved_bytes if experts else 0.0) \
        if gradient_checkpointing else 0
    graph = profile.preprocess_activation_bytes + text_layers * per_layer if cfg.trains_preprocess else 0.0
    shadow = meta_model(config)
    # by name: a tied weight is two copies (embedding on rank 0, head on the last rank) once split over ranks
    params = dict(shadow.named_parameters(remove_duplicate=cfg.pp_size == 1))
    carved = split(copy.deepcopy(shadow), cfg, 0, layers_per_stage, text_layers)  # the layout is every rank's

    def under(name, prefixes):
        return any(name == p or name.startswith(p + ".") for p in prefixes)
    ranks = []
    for rank in range(cfg.pp_size):
        shards = sharded_names(shadow, config, carved, rank, cfg.pp_size, ep_size)  # E / ep_size rows held
        numel = {n: p.numel() // (ep_size if n in shards else 1) for n, p in params.items()}
        sizes = {n: numel[n] * p.element_size() for n, p in params.items()}
        owned = carved.owned_prefixes(cfg, rank)
        held = [n for n in sizes if under(n, owned + carved.preprocess_fqns)]
        trained = [n for n in held if under(n, owned) and not under(n, carved.frozen)]
        replicas = [n for n in held if not under(n, owned) and not under(n, carved.frozen)]
        grads = trained + (replicas if cfg.trains_preprocess and cfg.owner_backward else [])  # owners backprop P
        act, in_flight = _peak_activation_bytes(orders[rank], stage_bytes, graph, cfg.owner_backward)
        ranks.append(RankPlan(rank, sum(sizes[n] for n in held), sum(sizes[n] for n in grads),
                              ADAM_STATE_BYTES * sum(numel[n] for n in trained), round(act + recompute), in_flight,
                              rank_bytes(experts, rank, cfg.pp_size),
                              nccl_bytes(rank, cfg.pp_size, dp_size, ep_size)))
    if gradient_checkpointing:  # each backward first recomputes its layers' forward
        profile = dataclasses.replace(profile, layer_backward_s=profile.layer_backward_s + profile.layer_forward_s)
    costs = with_all_to_all(costs_for(profile, cfg, layers_per_stage, text_layers), experts)
    sim = simulate(build_schedule(cfg, costs), costs)
    return Plan(ranks, list(layers_per_stage), sim.makespan, sim.mean_bubble, profile, experts)
