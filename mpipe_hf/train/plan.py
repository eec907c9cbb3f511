"""The memory plan of a recipe (``mpipe-hf plan RECIPE.yaml``): what every pipeline rank holds, and how fast a step
runs, before any GPU is booked.

- Parameter, gradient and optimizer-state bytes are exact: the model is built on the meta device and carved for
  each rank by the same :func:`~mpipe_hf.models.split` that training uses. Training keeps fp32 weights, an fp32
  gradient for every parameter the rank trains (none for a frozen one) and AdamW's two fp32 moments.
- The activation peak walks each rank's action list of the schedule: every stage forward whose backward has not
  run yet holds that stage's saved activations for one micro-batch (its layers' and, on the last stage, the
  head's), and the peak is the largest sum. The bytes per layer and micro come from a profile: a measured one
  (``mpipe-hf profile``), or one estimated from the config (:func:`~.plan_estimate.estimate_profile`), whose
  activation bytes are
  counted on the meta device by running one decoder layer and the head under ``saved_tensors_hooks``. With
  gradient checkpointing a layer in flight keeps only its input hidden states.
- The step time and bubble are the simulator's (:func:`~mpipe_hf.schedule.tune.predict`) on that profile.
- With expert parallelism (``parallel.ep_size``) a rank holds ``E / ep_size`` experts of each MoE layer of
  its stages, the all-to-all's buffers, and its stages' ``F`` and ``B`` take the all-to-alls' time
  (:mod:`.plan_experts`).
- With context parallelism (``parallel.cp_size``) a CP rank holds ``1 / cp_size`` of each micro-batch's saved
  decoder and head activations (the tower's and the front's stay whole), and its stages' ``F`` and ``B`` take
  Ulysses' all-to-alls (:mod:`.plan_context_parallel`).
- NCCL's buffers: the communicators a rank joins (its pipeline pairs, the pipeline's, the world's, the
  data-parallel and EP groups) at NCCL's default buffer sizes (:mod:`.plan_nccl`, which states the model).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from ..models import split
from ..models.load import meta_model
from ..schedule import ScheduleConfig, build_schedule
from ..schedule.actions import Kind
from ..schedule.simulate import simulate
from ..schedule.tune import Profile
from .plan_context_parallel import ContextPlan, context_plan, divided_profile, rank_costs, with_ulysses
from .plan_experts import ExpertPlan, expert_plan, rank_bytes, sharded_names, with_all_to_all
from .plan_nccl import nccl_bytes

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
    (seconds) and bubble, with expert parallelism its :class:`~.plan_experts.ExpertPlan` and with context
    parallelism its :class:`~.plan_context_parallel.ContextPlan`."""

    ranks: list[RankPlan]
    layers_per_stage: list[int]
    step_s: float
    bubble: float
    profile: Profile
    experts: ExpertPlan | None = None
    context: ContextPlan | None = None

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
                     + (f"{self.context.describe()}; " if self.context is not None else "")
                     + f"predicted step {self.step_s:.3f} s, bubble {self.bubble:.3f}")
        if device_bytes:
            worst = max(r.total_bytes for r in self.ranks)
            lines.append(f"{'fits' if self.fits(device_bytes) else 'does NOT fit'} on {device_bytes / GIB:.0f} GiB "
                         f"devices: the fullest rank needs {worst / GIB:.1f} GiB (limit with 10% headroom "
                         f"{0.9 * device_bytes / GIB:.1f} GiB)")
        return "\n".join(lines)


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


def _stage_bytes(profile: Profile, counts: list[int], experts: ExpertPlan | None, context: ContextPlan | None,
                 gradient_checkpointing: bool) -> tuple[list[float], float]:
    """``(each stage's saved bytes per micro in flight, the one layer a backward rebuilds under checkpointing)``
    on ``profile`` (one rank's, :func:`~.plan_context_parallel.divided_profile`'s under context parallelism) for
    ``counts`` layers a stage: with ``gradient_checkpointing`` a layer keeps only its input; EP's and Ulysses'
    own saved tensors a layer (:mod:`.plan_experts`, :mod:`.plan_context_parallel`); the head on the last stage."""
    per_layer = profile.activation_bytes if gradient_checkpointing else profile.layer_activation_bytes
    extra = 0.0 if gradient_checkpointing else (context.extra_bytes if context else 0.0)
    stage_bytes = [n * (per_layer + extra) for n in counts]
    if experts is not None and not gradient_checkpointing:  # AllToAllEP's own saved tensors, per MoE layer
        stage_bytes = [b + n * experts.saved_bytes for b, n in zip(stage_bytes, experts.moe_layers)]
    stage_bytes[-1] += profile.head_activation_bytes
    if context is not None:
        stage_bytes[0] += context.front_bytes
    recompute = 0.0
    if gradient_checkpointing:
        recompute = (profile.layer_activation_bytes + (experts.saved_bytes if experts else 0.0)
                     + (context.extra_bytes if context else 0.0))
    return stage_bytes, recompute


def plan(config, cfg: ScheduleConfig, profile: Profile, layers_per_stage: list[int], text_layers: int = 0,
         gradient_checkpointing: bool = False, ep_size: int = 1, ep_within_node: bool = True,
         dp_size: int = 1, cp_size: int = 1, cp_within_node: bool = True, dtype_bytes: int = 4) -> Plan:
    """Every rank's memory and the predicted step of ``cfg`` with ``layers_per_stage`` on ``profile`` (see the
    module docstring). With ``gradient_checkpointing`` a layer keeps only its input (``profile.activation_bytes``)
    per micro in flight, and each rank adds one layer's full activations, rebuilt during a backward. A trainable
    ``P``'s graphs count as the tower's activations plus ``text_layers`` layers' per micro-batch. ``ep_size``:
    expert parallelism (``parallel.ep_size``; :mod:`.plan_experts`), its all-to-all over NVLink when
    ``ep_within_node``, else InfiniBand. ``dp_size``: the pipeline replicas, for NCCL's buffers
    (:mod:`.plan_nccl`; none in a world of one process). ``cp_size``: context parallelism
    (:mod:`.plan_context_parallel`), ``profile`` being one process's micro-batch; its all-to-alls over NVLink when
    ``cp_within_node``; ``dtype_bytes``: the attention's element size (fp32 4, ``train.bf16`` 2).

    Raises:
        ValueError: as :func:`~mpipe_hf.models.split` (the layout, ``text_layers``, the model type); as
            :func:`~.plan_experts.expert_plan` (``ep_size`` against the model); as
            :func:`~.plan_context_parallel.context_plan` (``cp_size`` against the heads).
    """
    orders = build_schedule(cfg)
    context = context_plan(config, profile, layers_per_stage, text_layers, cp_size, dtype_bytes, cp_within_node)
    whole = profile  # P and its text layers run on the whole micro-batch, on every CP rank
    profile = divided_profile(profile, cp_size)
    experts = expert_plan(config, profile, layers_per_stage, text_layers, ep_size, ep_within_node)
    counts = list(layers_per_stage)
    counts[0] -= text_layers
    stage_bytes, recompute = _stage_bytes(profile, counts, experts, context, gradient_checkpointing)
    per_layer = whole.activation_bytes if gradient_checkpointing else whole.layer_activation_bytes
    graph = whole.preprocess_activation_bytes + text_layers * per_layer if cfg.trains_preprocess else 0.0
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
                              nccl_bytes(rank, cfg.pp_size, dp_size, ep_size, cp_size)))
    if gradient_checkpointing:  # each backward first recomputes its layers' forward
        whole = dataclasses.replace(whole, layer_backward_s=whole.layer_backward_s + whole.layer_forward_s)
        profile = divided_profile(whole, cp_size)
    costs = with_ulysses(with_all_to_all(rank_costs(whole, cfg, layers_per_stage, text_layers, cp_size), experts),
                         context)
    sim = simulate(build_schedule(cfg, costs), costs)
    return Plan(ranks, list(layers_per_stage), sim.makespan, sim.mean_bubble, profile, experts, context)
