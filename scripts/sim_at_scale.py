"""Predicted step times of Qwen2.5-VL-7B and -72B fine-tuning on 8 to 64 H100s, by simulation (issue 18).

Item 6 of the issue: interleaved 1F1B, zero-bubble and MPipe Transpose at dp x pp, from published hardware figures.

    python scripts/sim_at_scale.py [--models 7b 72b] [--gpus 8 16 32 64] [--global-batch 128] [--vpp 2]
                                   [--efficiency 0.5] [--jobs 2] [--markdown OUT.md]
    python scripts/sim_at_scale.py --profile PROFILE.yaml --config MODEL_DIR [--pp 4 8] [...]

Each model's cost profile comes from its config's shapes (``mpipe_hf.schedule.hardware``: FLOPs at an assumed
share of the H100's bf16 peak, NVLink 4 within a node, NDR InfiniBand across nodes), or with ``--profile`` from a
measured profile (``mpipe-hf profile RECIPE.yaml`` on the GPU; ``--config`` gives the parameter counts the memory
check and the data-parallel exchange need). For every GPU count ``N`` and pipeline size ``pp`` (``dp = N / pp``,
the global batch fixed, ``M = global batch / dp`` micro-batches of one sample per replica), every schedule is
built and simulated (``mpipe_hf.schedule.simulate``), the ZeRO-1 gradient exchange over the data-parallel group
is added after each rank's last action, and each rank's memory is checked against the GPU's (parameters,
gradients and sharded AdamW states, plus the activations its schedule holds at its peak). A cell that does not
fit is retried with the layout by count (marked ‡), with the trainable tower's activations recomputed (*), then
the decoder layers' too (†), and reported as not fitting if it still does not.
The script prints its assumptions and one markdown table per model and tower mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mpipe_hf.schedule import ScheduleConfig, build_schedule  # noqa: E402
from mpipe_hf.schedule.actions import Kind  # noqa: E402
from mpipe_hf.schedule.hardware import (GIB, Cluster, Estimate, Workload, dp_group_within_node,  # noqa: E402
                                        figures_estimate, shapes_from_config, zero1_state_bytes,
                                        zero1_sync_seconds)
from mpipe_hf.schedule.layout import balanced_layers, cost_balanced_layers  # noqa: E402
from mpipe_hf.schedule.simulate import Costs, simulate  # noqa: E402
from mpipe_hf.schedule.tune import Profile, costs_for  # noqa: E402

MODELS = {  # name: (hub id, preset config directory, pipeline sizes tried)
    "7b": ("Qwen/Qwen2.5-VL-7B-Instruct", "recipes/presets/qwen2_5_vl_7b", (4, 8)),
    "72b": ("Qwen/Qwen2.5-VL-72B-Instruct", "recipes/presets/qwen2_5_vl_72b", (8, 16)),
}
HAS_ZB = "zero_bubble" in {f.name for f in dataclasses.fields(ScheduleConfig)}
HAS_WEIGHT = "weight" in {f.name for f in dataclasses.fields(Costs)}
W_KIND = getattr(Kind, "W", None)
RECOMPUTE = "†"  # the cell needed activation recomputation (decoder layers, and a trainable tower) to fit
TOWER_RECOMPUTE = "*"  # the cell needed the trainable tower's activation recomputation to fit
BY_COUNT = "‡"  # the cell needed the layout by count (not by cost) to fit


@dataclasses.dataclass(frozen=True)
class Variant:
    """One schedule column: ``preprocess`` ``identity`` puts the tower inside stage 0 (the baselines);
    ``rebalanced``: the layout balanced by cost with the tower counted on stage 0 (else by count)."""

    title: str
    preprocess: str  # "identity" or "mpipe" (the tower mode)
    rebalanced: bool = False
    zero_bubble: bool = False
    placement: str = "prefix"
    owner_backward: bool = False

    def applies(self, tower: str) -> bool:
        if self.zero_bubble and not HAS_ZB:
            return False
        if self.placement == "fill" and tower != "frozen":
            return False
        return not (self.owner_backward and tower != "trainable")


VARIANTS = [
    Variant("1F1B, P in stage 0", "identity"),
    Variant("1F1B, stage 0 rebalanced", "identity", rebalanced=True),
    Variant("ZB, P in stage 0", "identity", rebalanced=True, zero_bubble=True),
    Variant("MPipe", "mpipe"),
    Variant("MPipe fill", "mpipe", placement="fill"),
    Variant("MPipe ZB", "mpipe", zero_bubble=True),
    Variant("MPipe owner-bwd", "mpipe", owner_backward=True),
]
BASELINES = {"1F1B, P in stage 0", "1F1B, stage 0 rebalanced", "ZB, P in stage 0"}


def recomputed(est: Estimate, layers: bool, tower: bool) -> Estimate:
    """``est`` under activation recomputation of the decoder ``layers`` and/or the (trainable) ``tower``: each
    keeps only its input for its backward, which first runs its forward again (backward += forward; the weight
    gradient is unchanged)."""
    p = est.profile
    changes = {}
    if layers:
        changes.update(layer_backward_s=p.layer_backward_s + p.layer_forward_s,
                       layer_activation_bytes=est.layer_input_bytes)
    if tower:
        changes.update(preprocess_backward_s=p.preprocess_backward_s + p.preprocess_forward_s,
                       preprocess_activation_bytes=est.preprocess_input_bytes)
    return dataclasses.replace(est, profile=dataclasses.replace(p, **changes))


def layout_for(est: Estimate, variant: Variant, cfg: ScheduleConfig, tower: str) -> list[int]:
    """Layers per stage: by count for the plain baseline; else balanced by cost, counting on stage 0 what rank 0
    runs per micro-batch besides its layers: the embedding, and for the baselines the tower (its forward, and
    its backward when it trains), for MPipe with a trainable tower and no owner-backward its recompute and
    backward (``TRANSPOSE_BWD``). MPipe's transposed forwards (and owner-backwards) spread evenly over the ranks
    and shift no layer."""
    p = est.profile
    if variant.preprocess == "identity" and not variant.rebalanced:
        return balanced_layers(p.num_layers, cfg.num_stages)
    first = p.embed_s + p.embed_backward_s
    if variant.preprocess == "identity":
        first += p.preprocess_forward_s + (p.preprocess_backward_s if tower == "trainable" else 0.0)
    elif cfg.trains_preprocess and not cfg.owner_backward:
        first += p.preprocess_forward_s + p.preprocess_backward_s
    return cost_balanced_layers(p.num_layers, cfg.pp_size, cfg.vpp, p.layer_forward_s + p.layer_backward_s,
                                first, p.head_forward_s + p.head_backward_s)


def variant_costs(est: Estimate, variant: Variant, cfg: ScheduleConfig, layout: list[int], tower: str) -> Costs:
    """:func:`~mpipe_hf.schedule.tune.costs_for`, plus: with the tower in stage 0 and trainable, its backward in
    stage 0's (``costs_for`` adds only its forward); with the tower in stage 0, the pixels in the raw data rank 0
    receives; the weight-gradient seconds per stage for a zero-bubble schedule."""
    p = est.profile
    costs = costs_for(p, cfg, layout)
    backward = list(costs.backward)
    bytes_ = dict(costs.message_bytes)
    if variant.preprocess == "identity":
        bytes_["DATA"] = p.data_bytes + p.graph_bytes
        if tower == "trainable":
            backward[0] += p.preprocess_backward_s
    extra = {}
    if HAS_WEIGHT and est.layer_weight_s is not None:
        weight = [n * est.layer_weight_s for n in layout]
        weight[-1] += est.head_weight_s or 0.0
        if variant.preprocess == "identity" and tower == "trainable":
            weight[0] += est.preprocess_weight_s or 0.0
        extra["weight"] = tuple(weight)
    return dataclasses.replace(costs, backward=tuple(backward), message_bytes=bytes_, **extra)


_SCHEDULES: dict = {}


def schedule(cfg: ScheduleConfig, costs: Costs) -> dict:
    """The built schedule; placement ``fill`` in its steady state (this step's micros preprocessed by the
    previous step, the next step's in this one). Plain schedules do not depend on the costs and are cached."""
    if cfg.placement == "fill":
        return build_schedule(cfg, costs, own=False, ahead=True)
    if cfg.zero_bubble:
        return build_schedule(cfg, costs)
    if cfg not in _SCHEDULES:
        _SCHEDULES[cfg] = build_schedule(cfg)
    return _SCHEDULES[cfg]


def activation_peak(order, stage_bytes: list[float], p: Profile, cfg: ScheduleConfig, rank: int,
                    tower_in_stage0: float, transient: float) -> float:
    """The most bytes ``order`` holds for backwards and for later use at once, on ``rank``:

    - each stage forward's saved activations until its ``W`` (zero-bubble) or else its ``B`` (with the tower's,
      ``tower_in_stage0``, on stage 0 when a trainable tower runs inside it);
    - on rank 0, each micro's raw inputs (the pixels too when the tower runs in stage 0) and features from their
      arrival (or rank 0's own load and ``P`` forward) until its stage-0 ``F``; with placement ``fill`` in its
      steady state this step's micros are held from the start (the previous step preprocessed them) and the
      next step's to the end; a trainable ``P``'s raw inputs (``GRAPH``) until its ``TRANSPOSE_BWD``;
    - a trainable ``P``'s graph: with owner-backward each owner keeps it from its ``TRANSPOSE_FWD`` to its
      backward; without, ``TRANSPOSE_BWD`` rebuilds one at a time;
    - ``transient``: one layer's full activations while a recomputing backward rebuilds them.

    The walk of ``mpipe_hf.train.plan``'s memory plan, with the ``W`` and the held inputs added."""
    weighted = {(a.stage, a.micro) for a in order if a.kind is W_KIND}
    data = p.data_bytes + (0.0 if cfg.transposed else p.graph_bytes)
    graph = p.preprocess_activation_bytes if cfg.trains_preprocess else 0.0
    held: dict[tuple, float] = {}
    if rank == 0 and cfg.placement == "fill":
        held = {key: nbytes for m in range(cfg.num_micro)
                for key, nbytes in ((("data", m), data), (("feat", m), p.feature_bytes))}
    live = sum(held.values())
    peak = live

    def hold(key, nbytes):
        nonlocal live
        held[key] = nbytes
        live += nbytes

    def drop(key):
        nonlocal live
        live -= held.pop(key, 0.0)
    for a in order:
        k, extra = a.kind, 0.0
        if k is Kind.F:
            live += stage_bytes[a.stage] + (tower_in_stage0 if a.stage == 0 else 0.0)
            if a.stage == 0:
                drop(("data", a.micro))
                drop(("feat", a.micro))
        elif (k is Kind.B and (a.stage, a.micro) not in weighted) or k is W_KIND:
            live -= stage_bytes[a.stage] + (tower_in_stage0 if a.stage == 0 else 0.0)
        elif rank == 0 and k in (Kind.DATA_RECV, Kind.DATA_LOAD):
            hold(("data", a.micro), data)
        elif rank == 0 and (k is Kind.FWD_RECV or k is Kind.TRANSPOSE_FWD):
            hold(("feat", a.micro), p.feature_bytes)
        elif k is Kind.GRAPH_RECV:
            hold(("pixels", a.micro), p.graph_bytes)
        if k is Kind.TRANSPOSE_FWD and cfg.owner_backward:
            hold(("graph", a.micro), graph)
        elif k is Kind.TRANSPOSE_BWD and cfg.owner_backward:
            drop(("graph", a.micro))
        elif k is Kind.TRANSPOSE_BWD:
            extra = graph
            drop(("pixels", a.micro))
        peak = max(peak, live + extra)
    return peak + transient


def rank_memory(est: Estimate, variant: Variant, cfg: ScheduleConfig, layout: list[int], tower: str, dp: int,
                orders: dict, transient: float) -> tuple[list[float], list[float]]:
    """``(bytes per rank, trained parameters per rank)``: ZeRO-1 parameter state (the stage layers, the embedding on
    rank 0, the LM head on the last stage's rank, the tower: inside stage 0 on rank 0 for the baselines, a
    replica on every rank for MPipe, trained by rank 0 when trainable, with a gradient buffer on the owners
    under owner-backward), plus the activation peak (:func:`activation_peak`)."""
    p, R = est.profile, cfg.pp_size
    last = (cfg.num_stages - 1) % R
    stage_bytes = [n * p.layer_activation_bytes for n in layout]
    stage_bytes[-1] += p.head_activation_bytes
    in_stage0 = p.preprocess_activation_bytes if variant.preprocess == "identity" and tower == "trainable" else 0.0
    totals, trained_counts = [], []
    for r in range(R):
        layers = sum(layout[s] for s in range(r, cfg.num_stages, R))
        trained = layers * est.layer_params + (est.embed_params if r == 0 else 0) + (
            est.head_params if r == last else 0)
        frozen = grads = 0.0
        holds_tower = variant.preprocess != "identity" or r == 0
        if holds_tower and tower == "trainable" and r == 0:
            trained += est.preprocess_params
        elif holds_tower:
            frozen += est.preprocess_params
            if variant.owner_backward:
                grads += est.preprocess_params
        state = zero1_state_bytes(trained, dp, frozen, grads)
        totals.append(state + activation_peak(orders[r], stage_bytes, p, cfg, r, in_stage0, transient))
        trained_counts.append(trained)
    return totals, trained_counts


def run_cell(levels: list[tuple[str, Estimate]], variant: Variant, tower: str, pp: int, vpp: int, dp: int,
             micro: int, cluster: Cluster) -> dict:
    """Build, check and simulate one schedule: ``{"text": the cell, "step": seconds or None, "sync": the slowest
    rank's ZeRO-1 exchange, "bubble", "layout"}``.

    ``levels``: ``(mark, estimate)`` from no recomputation to the most (:func:`recomputed`). The first that
    fits of: at each level, the variant's layout, then the layout by count (when different; marked ‡). The plain schedule (cached, fast) decides; a zero-bubble or
    filled one, slow to build, is built for the first choice that fits plain and is checked again."""
    mode = "identity" if variant.preprocess == "identity" else tower
    extra = {"zero_bubble": True} if variant.zero_bubble else {}
    try:
        cfg = ScheduleConfig(pp, vpp, micro, mode, owner_backward=variant.owner_backward,
                             placement=variant.placement, **extra)
    except ValueError as e:
        return {"text": "n/a", "step": None, "why": str(e)}
    within = dp_group_within_node(pp, dp, cluster.gpus_per_node)
    plain = dataclasses.replace(cfg, placement="prefix", **({"zero_bubble": False} if HAS_ZB else {}))
    est = levels[0][1]
    by_count = balanced_layers(est.profile.num_layers, cfg.num_stages)
    worst = 0.0
    for mark, e in levels:
        primary = layout_for(e, variant, cfg, tower)
        for layout in [primary] + ([by_count] if by_count != primary else []):
            costs = variant_costs(e, variant, cfg, layout, tower)
            transient = est.profile.layer_activation_bytes if e.profile.layer_activation_bytes < \
                est.profile.layer_activation_bytes else 0.0
            orders = schedule(plain, costs)
            worst = max(rank_memory(e, variant, plain, layout, tower, dp, orders, transient)[0])
            if worst > cluster.memory_budget_bytes:
                continue
            orders = schedule(cfg, costs) if cfg != plain else orders
            totals, trained = rank_memory(e, variant, cfg, layout, tower, dp, orders, transient)
            worst = max(totals)
            if worst <= cluster.memory_budget_bytes:
                break
        else:
            continue
        break
    else:
        return {"text": f"OOM ({worst / GIB:.0f})", "step": None}
    sim = simulate(orders, costs)
    sync = [zero1_sync_seconds(n, dp, cluster, within) for n in trained]
    ends = [max((ev.end for ev in sim.timeline[r]), default=0.0) for r in range(pp)]
    step = max(end + s for end, s in zip(ends, sync))
    marks = mark + (BY_COUNT if layout is not primary else "")
    return {"text": f"{step:.2f}{marks} ({worst / GIB:.0f})", "step": step, "sync": max(sync),
            "bubble": sim.mean_bubble, "layout": layout}


def load_config(path: str):
    """The HF config at ``path`` (a directory or a ``config.json``): read as plain attributes when the file
    names every size :func:`~mpipe_hf.schedule.hardware.shapes_from_config` reads (no torch import), else by
    ``transformers.AutoConfig``. Returns ``(text shape, vision shape or None)``."""
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    with open(file) as f:
        raw = json.load(f)

    def namespace(d):
        ns = types.SimpleNamespace(**{k: namespace(v) if isinstance(v, dict) else v for k, v in d.items()})
        return ns
    ns = namespace(raw)
    if hasattr(ns, "text_config"):
        ns.get_text_config = lambda: ns.text_config
    try:
        text, vision = shapes_from_config(ns)
        if getattr(ns.get_text_config() if hasattr(ns, "get_text_config") else ns, "attention_bias", None) is None:
            text = dataclasses.replace(text, qkv_bias=True)  # Qwen2's q, k, v projections carry a bias
        return text, vision
    except AttributeError:
        from transformers import AutoConfig
        return shapes_from_config(AutoConfig.from_pretrained(path))


def state_floor(est: Estimate, pp: int, dp: int) -> float:
    """A lower bound of the fullest rank's parameter state: the trained parameters spread evenly over ``pp``."""
    total = est.profile.num_layers * est.layer_params + est.embed_params + est.head_params
    return zero1_state_bytes(total / pp, dp)


@dataclasses.dataclass
class Row:
    """One table row: ``N`` GPUs as ``dp x pp``, ``M`` micro-batches per replica; ``skip``: why it is not
    simulated (then ``cells`` says what to print)."""

    model: str
    tower: str
    gpus: int
    pp: int
    dp: int
    micro: int
    skip: str = ""
    floor: float = 0.0


_CONTEXT: dict = {}  # what the worker processes read (set before they fork)


def _cell(task):
    """Pool worker: one ``(row index, variant index)``."""
    i, j = task
    row, variant = _CONTEXT["rows"][i], VARIANTS[j]
    levels = _CONTEXT["estimates"][(row.model, row.pp, row.tower)]
    work = row.micro * row.pp
    if ((variant.zero_bubble or variant.owner_backward) and work > _CONTEXT["zb_max_work"]) or (
            variant.placement == "fill" and work > _CONTEXT["fill_max_work"]):
        return task, {"text": "capped", "step": None, "cpu_s": 0.0}
    started = time.process_time()
    cell = run_cell(levels, variant, row.tower, row.pp, _CONTEXT["vpp"], row.dp, row.micro, _CONTEXT["cluster"])
    return task, {**cell, "cpu_s": time.process_time() - started}


def plan_rows(model: str, est_for, tower: str, gpus: list[int], pps: tuple[int, ...], vpp: int,
              workload: Workload, cluster: Cluster) -> list[Row]:
    """The rows of one table, with the ones not worth simulating marked (``skip``)."""
    rows = []
    for n in gpus:
        for pp in pps:
            if n % pp or pp > n:
                continue
            dp = n // pp
            try:
                micro = workload.num_micro(dp)
            except ValueError as e:
                rows.append(Row(model, tower, n, pp, dp, 0, skip=str(e)))
                continue
            est = est_for(pp, tower)[0][1]
            if pp * vpp > est.profile.num_layers:
                rows.append(Row(model, tower, n, pp, dp, micro,
                                skip=f"{pp * vpp} stages exceed the {est.profile.num_layers} layers"))
                continue
            floor = state_floor(est, pp, dp)
            if floor > cluster.memory_budget_bytes:
                rows.append(Row(model, tower, n, pp, dp, micro, floor=floor, skip=(
                    f"the parameter state alone (ZeRO-1, the trained parameters spread evenly over pp) is "
                    f"{floor / GIB:.0f} GiB per rank, over the {cluster.memory_budget_bytes / GIB:.0f} GiB budget; "
                    f"not simulated")))
                continue
            rows.append(Row(model, tower, n, pp, dp, micro))
    return rows


def render(rows: list[Row], results: dict, indices: list[int], tower: str) -> tuple[str, list[str]]:
    """One markdown table (rows: N, dp x pp; columns: the schedules that apply) and its notes."""
    columns = [j for j, v in enumerate(VARIANTS) if v.applies(tower)]
    head = ["GPUs", "dp x pp", "M", "ZeRO-1 sync s"] + [VARIANTS[j].title for j in columns] + [
        "MPipe vs best baseline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for i in indices:
        row = rows[i]
        if row.skip:
            notes.append(f"N = {row.gpus}, {row.dp} x {row.pp}: {row.skip}")
            if row.floor:
                lines.append(f"| {row.gpus} | {row.dp} x {row.pp} | {row.micro} | – | "
                             + " | ".join([f"OOM (≥{row.floor / GIB:.0f})"] * len(columns)) + " | – |")
            continue
        cells = {j: results[(i, j)] for j in columns}
        for j, cell in cells.items():
            if cell.get("why"):
                notes.append(f"N = {row.gpus}, {row.dp} x {row.pp}, {VARIANTS[j].title}: not built ({cell['why']})")
        base = [c["step"] for j, c in cells.items() if VARIANTS[j].title in BASELINES and c["step"]]
        ours = [c["step"] for j, c in cells.items() if VARIANTS[j].title not in BASELINES and c["step"]]
        ratio = f"{min(base) / min(ours):.3f}x" if base and ours else "–"
        sync = next((c["sync"] for c in cells.values() if c.get("sync") is not None), None)
        lines.append(f"| {row.gpus} | {row.dp} x {row.pp} | {row.micro} | {'–' if sync is None else f'{sync:.3f}'} | "
                     + " | ".join(cells[j]["text"] for j in columns) + f" | {ratio} |")
    return "\n".join(lines), notes


def assumptions(cluster: Cluster, workload: Workload, vpp: int, measured: str | None, vision, caps) -> list[str]:
    """The assumptions the tables rest on, one line each."""
    latency_nv, bw_nv = cluster.link(True)
    latency_ib, bw_ib = cluster.link(False)
    fill_cap, zb_cap = caps
    out = [
        f"GPU: {cluster.name}; {cluster.gpus_per_node} GPUs per node, each pipeline on consecutive GPUs "
        f"(a pipeline of pp <= {cluster.gpus_per_node} inside one node).",
        (f"compute: the measured profile {measured} (its link figures replaced by the ones below; the weight "
         f"gradient taken as half of each backward)" if measured else
         f"compute: {cluster.peak_flops / 1e12:.1f} TFLOPS dense bf16 peak (datasheet) at "
         f"{cluster.compute_efficiency:.0%} achieved = {cluster.flops_per_s / 1e12:.0f} TFLOPS per GPU, applied to "
         f"the matmul FLOPs of each layer (2 x weights x tokens + causal attention 2 x heads x dim x L^2 forward; "
         f"backward 2x; the weight-gradient part 2 x weights x tokens); norms, rotary, embedding and loss cost 0 "
         f"(absorbed in the efficiency); data loading is free (a dataloader's work, overlapped)."),
        f"pipeline P2P: NVLink 4, {cluster.nvlink_bytes_per_s / 1e9:.0f} GB/s per direction (900 GB/s bidirectional"
        f" per GPU) at {cluster.nvlink_efficiency:.0%} = {bw_nv / 1e9:.0f} GB/s, {latency_nv * 1e6:.0f} us per "
        f"transfer; a pipeline longer than a node takes InfiniBand for every transfer (conservative). Body "
        f"messages are the bf16 hidden states of a micro-batch, P's output the bf16 image features.",
        f"data parallel: ZeRO-1 (AdamW states sharded over dp): ring reduce-scatter of bf16 gradients + ring "
        f"all-gather of bf16 weights after each rank's last action, not overlapped; over NVLink when the dp group "
        f"is inside a node, else NDR InfiniBand {cluster.ib_bytes_per_s * 8 / 1e9:.0f} Gb/s per GPU at "
        f"{cluster.ib_efficiency:.0%} = {bw_ib / 1e9:.0f} GB/s, {latency_ib * 1e6:.0f} us per ring step. The "
        f"optimizer update itself is left out. \"ZeRO-1 sync s\": the slowest rank's exchange.",
        f"memory: {cluster.memory_budget_bytes / GIB:.0f} GiB per rank ({cluster.memory_bytes / GIB:.0f} GiB less "
        f"{cluster.memory_headroom:.0%}): trained parameters 2 (bf16 weight) + 2 (bf16 gradient) + 12 / dp (fp32 "
        f"master weight, Adam moments) bytes, frozen ones 2, plus the schedule's activation peak (bf16 activations, "
        f"fused attention; the walk of every rank's actions). A cell that does not fit is retried with the trainable "
        f"tower's activations recomputed (marked {TOWER_RECOMPUTE}: each tower block keeps its input, its backward "
        f"reruns its forward), then with the decoder layers' too (marked {RECOMPUTE}); cells marked {BY_COUNT} the layout by count instead of by cost (the cost-balanced layout can load "
        f"one rank with more layers); OOM (GiB): not even then. In parentheses: the fullest rank's GiB.",
        f"workload: {workload.tokens} tokens per sample, {workload.images} images of {workload.image_height}x"
        f"{workload.image_width} per sample"
        + (f" = {workload.image_tokens(vision)} image tokens ({workload.patches(vision)} patches)" if vision else "")
        + f"; micro-batch {workload.micro_batch} sample; global batch {workload.global_batch} samples; "
        f"M = global batch / dp per replica; V = {vpp} model chunks per rank.",
        "schedules: 1F1B = our interleaved 1F1B with the tower inside stage 0 (layers by count; \"rebalanced\": by "
        "cost, the tower counted on stage 0). ZB = the same with zero_bubble=True (our ZB-H1 body: "
        "mpipe_hf.schedule.zero_bubble), the stand-in for torch's ScheduleInterleavedZeroBubble, which the "
        "simulator cannot run; rebalanced layout. MPipe = MPipe Transpose, overflow full, layout balanced by "
        "cost (stage 0 counts the embedding, and a trainable tower's recompute and backward, which rank 0 runs "
        "for every micro-batch without owner-backward); fill = bubble filling in its steady state (the next step's tower forwards in this step); ZB = "
        "zero_bubble=True; owner-bwd = owner-backward (trainable tower).",
        "MPipe vs best baseline = the fastest baseline's step / the fastest MPipe variant's step (> 1: MPipe faster).",
        f"capped: placement fill is simulated up to M x pp = {fill_cap}, zero-bubble and owner-backward up to "
        f"M x pp = {zb_cap} (--fill-max-work, --zb-max-work), to keep the script under two minutes: fill's greedy "
        f"pass simulates the step once per candidate position of every micro-batch (about 12 s of CPU at M = 32, "
        f"pp = 8 and 50 s at M = 32, pp = 16), and the weight placement (zero-bubble's W, owner-backward's tower "
        f"backward) relists and resimulates the whole schedule until it settles (about 8 s at M = 128, pp = 8).",
    ]
    if not HAS_ZB:
        out.append("ZB columns absent: this checkout's ScheduleConfig has no zero_bubble field.")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--gpus", nargs="+", type=int, default=[8, 16, 32, 64])
    parser.add_argument("--pp", nargs="+", type=int, default=None, help="pipeline sizes (default: per model)")
    parser.add_argument("--global-batch", type=int, default=Workload.global_batch)
    parser.add_argument("--tokens", type=int, default=Workload.tokens)
    parser.add_argument("--images", type=int, default=Workload.images)
    parser.add_argument("--image-size", type=int, default=Workload.image_height)
    parser.add_argument("--vpp", type=int, default=2)
    parser.add_argument("--efficiency", type=float, default=Cluster.compute_efficiency)
    parser.add_argument("--fill-max-work", type=int, default=256, help="simulate placement fill up to this M x pp")
    parser.add_argument("--zb-max-work", type=int, default=1024,
                        help="simulate zero-bubble and owner-backward up to this M x pp")
    parser.add_argument("--towers", nargs="+", default=["frozen", "trainable"], choices=["frozen", "trainable"])
    parser.add_argument("--profile", help="a measured Profile YAML (mpipe-hf profile) instead of the figures")
    parser.add_argument("--config", help="with --profile: the model's HF config (a directory or config.json)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--markdown", help="also write the output to this file")
    args = parser.parse_args(argv)
    if args.profile and not args.config:
        parser.error("--profile needs --config (the parameter counts of the memory check and the exchange)")
    started = time.time()
    cluster = dataclasses.replace(Cluster(), compute_efficiency=args.efficiency)
    workload = Workload(tokens=args.tokens, images=args.images, image_height=args.image_size,
                        image_width=args.image_size, global_batch=args.global_batch)
    measured = Profile.load(args.profile) if args.profile else None
    if args.profile:
        runs = [(os.path.basename(args.profile), args.config, tuple(args.pp or (4, 8)))]
    else:
        runs = [(MODELS[m][0], os.path.join(ROOT, MODELS[m][1]), tuple(args.pp or MODELS[m][2]))
                for m in args.models]
    estimates, rows, headers, vision = {}, [], {}, None
    for title, config_path, pps in runs:
        text, vision = load_config(config_path)
        if measured is not None and measured.num_layers != text.layers:
            parser.error(f"--profile {args.profile} has num_layers = {measured.num_layers}, but --config "
                         f"{config_path} has {text.layers} decoder layers; profile the same model")

        def est_for(pp, tower, text=text, vision=vision, title=title):
            key = (title, pp, tower)
            if key not in estimates:
                est = figures_estimate(text, vision, workload, cluster, pp)
                if measured is not None:
                    latency, bandwidth = cluster.pipeline_link(pp)
                    profile = dataclasses.replace(measured, latency_s=latency, bandwidth_bytes_per_s=bandwidth)
                    est = dataclasses.replace(
                        est, profile=profile, layer_weight_s=None, head_weight_s=None, preprocess_weight_s=None,
                        layer_input_bytes=measured.activation_bytes,
                        preprocess_input_bytes=measured.preprocess_activation_bytes / (vision.depth if vision else 1))
                trains = tower == "trainable"
                estimates[key] = [("", est)] + ([(TOWER_RECOMPUTE, recomputed(est, False, True))] if trains else []) \
                    + [(RECOMPUTE, recomputed(est, True, trains))]
            return estimates[key]
        p = est_for(pps[0], "frozen")[0][1].profile
        headers[title] = (f"### {title}: {text.layers} layers, hidden {text.hidden}; per micro-batch a layer "
                          f"{p.layer_forward_s * 1e3:.1f} ms forward / {p.layer_backward_s * 1e3:.1f} ms backward, "
                          f"the tower {p.preprocess_forward_s * 1e3:.1f} / {p.preprocess_backward_s * 1e3:.1f} ms, "
                          f"the LM head {p.head_forward_s * 1e3:.1f} / {p.head_backward_s * 1e3:.1f} ms; a body "
                          f"message {p.activation_bytes / 2**20:.1f} MiB")
        for tower in args.towers:
            rows += plan_rows(title, est_for, tower, args.gpus, pps, args.vpp, workload, cluster)
    _CONTEXT.update(rows=rows, estimates=estimates, vpp=args.vpp, cluster=cluster,
                    fill_max_work=args.fill_max_work, zb_max_work=args.zb_max_work)
    tasks = [(i, j) for i, row in enumerate(rows) if not row.skip
             for j, v in enumerate(VARIANTS) if v.applies(row.tower)]
    tasks.sort(key=lambda t: -rows[t[0]].micro * rows[t[0]].pp * (4 if VARIANTS[t[1]].zero_bubble else 1))
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = dict(pool.imap_unordered(_cell, tasks))
    else:
        results = dict(map(_cell, tasks))
    if os.environ.get("SIM_AT_SCALE_TIMES"):
        for (i, j), cell in sorted(results.items(), key=lambda kv: -kv[1]["cpu_s"])[:25]:
            r = rows[i]
            print(f"{cell['cpu_s']:6.1f} s  {r.model[:22]} {r.tower} N={r.gpus} pp={r.pp} M={r.micro} "
                  f"{VARIANTS[j].title}: {cell['text']}", file=sys.stderr)
    out = []
    for title, _, _ in runs:
        out += [headers[title]]
        for tower in args.towers:
            indices = [i for i, r in enumerate(rows) if r.model == title and r.tower == tower]
            body, notes = render(rows, results, indices, tower)
            out += ["", f"{tower} tower (step seconds, and the fullest rank's GiB):", "", body]
            out += [f"- {n}" for n in notes]
        out.append("")
    text_out = "\n".join(["Assumptions:", ""] + [f"- {a}" for a in assumptions(
        cluster, workload, args.vpp, args.profile, vision, (args.fill_max_work, args.zb_max_work))] + [""]
        + out + [f"({time.time() - started:.0f} s in all, {args.jobs} worker processes)"])
    print(text_out)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text_out + "\n")


if __name__ == "__main__":
    main()
