"""Predicted step times of Qwen2.5-VL-7B and -72B fine-tuning on 8 to 64 H100s, by simulation.

Interleaved 1F1B, zero-bubble and MPipe Transpose at dp x pp, from published hardware figures.

    python scripts/bench/sim_at_scale.py [--models 7b 72b] [--gpus 8 16 32 64] [--global-batch 128] [--vpp 2]
                                   [--efficiency 0.5] [--jobs 2] [--markdown OUT.md]
    python scripts/bench/sim_at_scale.py --profile PROFILE.yaml --config MODEL_DIR [--pp 4 8] [...]

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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mpipe_hf.schedule import ScheduleConfig, build_schedule  # noqa: E402
from mpipe_hf.schedule.actions import Kind  # noqa: E402
from mpipe_hf.schedule.hardware import (GIB, Cluster, Estimate, Workload, dp_group_within_node,  # noqa: E402
                                        figures_estimate, shapes_from_config,
                                        zero1_sync_seconds)
from mpipe_hf.schedule.layout import balanced_layers, cost_balanced_layers  # noqa: E402
from mpipe_hf.schedule.simulate import Costs, simulate  # noqa: E402
from mpipe_hf.schedule.tune import Profile, costs_for  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_at_scale_memory import rank_memory, state_floor  # noqa: E402
from sim_at_scale_report import BY_COUNT, HAS_ZB, RECOMPUTE, TOWER_RECOMPUTE, report  # noqa: E402

MODELS = {  # name: (hub id, preset config directory, pipeline sizes tried)
    "7b": ("Qwen/Qwen2.5-VL-7B-Instruct", "recipes/presets/qwen2_5_vl_7b", (4, 8)),
    "72b": ("Qwen/Qwen2.5-VL-72B-Instruct", "recipes/presets/qwen2_5_vl_72b", (8, 16)),
}
HAS_WEIGHT = "weight" in {f.name for f in dataclasses.fields(Costs)}
W_KIND = getattr(Kind, "W", None)


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


def _parser() -> argparse.ArgumentParser:
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
    return parser


def _plan_all(args, parser, runs, measured, workload, cluster):
    """``(estimates, rows, headers, vision)`` of every model run: each model's estimate per pipeline size and
    tower mode (with the recomputing fallbacks), its table rows and its heading."""
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
    return estimates, rows, headers, vision


def main(argv=None):
    parser = _parser()
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
    estimates, rows, headers, vision = _plan_all(args, parser, runs, measured, workload, cluster)
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
    text_out = report(runs, headers, rows, results, args, cluster, workload, vision, started, VARIANTS,
                      BASELINES)
    print(text_out)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text_out + "\n")


if __name__ == "__main__":
    main()
