"""The points and the report of ``scripts/bench/bench_schedules.py``: every schedule of one point (``M``, ``P`` mode,
``Pf``) on the sleeping stages of :mod:`bench_schedules_stages`, and the tables.

``P`` modes: ``frozen`` (no backward), ``trainable`` (``Pb = 2 Pf``) and ``freeze_vit``: a frozen ViT under a
trainable merger, the most common VLM fine-tune (docs/freeze.md). It runs as a trainable ``P`` whose backward is
the merger's alone: ``Pb`` = :func:`freeze_vit_backward_share` ``x Pf``, from the real Qwen2.5-VL-7B tower's
matmul counts. Without owner-backward, rank 0 still recomputes ``P``'s whole forward (ViT included) before that
backward, as the runtime does (``mpipe_hf.runtime.handlers.transpose_bwd``).
"""

from __future__ import annotations

import dataclasses
import functools
import os

from bench_schedules_stages import (B_MS, F_MS, LAYERS, R, V, SleepingStages, first_line, lockstep, run_ours,
                                    run_torch, sim_costs, stage_costs, torch_makespan, zero_bubble_supported)
from bench_schedules_mimo import run_mimo
from sleeping import print_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VIDEO_PF_MS = 60.0  # the video-heavy profile's tower: 6 body chunks' forward per micro-batch
VIDEO_GRIDS = ((2, 36, 64),) * 8  # a clip as Qwen2.5-VL samples it: 16 frames of 504 x 896 px, 2 frames a grid


@functools.lru_cache(maxsize=None)
def freeze_vit_backward_share() -> float:
    """``Pb / Pf`` of a frozen ViT under a trainable merger: the merger's backward over the whole tower's forward,
    Qwen2.5-VL-7B's tower (``recipes/presets/qwen2_5_vl_7b``) on :data:`VIDEO_GRIDS`, by the matmul counts of
    ``mpipe_hf.schedule.counts`` (an upper bound: the merger's input and weight gradients, twice its forward,
    though its input needs none)."""
    from mpipe_hf.schedule.counts import vision_flops, vision_matmul_params
    from sim_at_scale import load_config
    _, vision = load_config(os.path.join(ROOT, "recipes", "presets", "qwen2_5_vl_7b"))
    merged = sum(t * h * w for t, h, w in VIDEO_GRIDS) // vision.merge**2
    merger_forward = 2.0 * merged * vision_matmul_params(vision)[2]
    return 2 * merger_forward / vision_flops(vision, list(VIDEO_GRIDS)).forward


def progress(rank, row, result=None):
    """Rank 0 prints the row just run (its step seconds, or its error), so a long run shows where it is."""
    if rank == 0:
        step = row.measured if result is None else result[0]
        print(f"  {row.point} {row.name}: {row.error or format(step, '.3f') + ' s'}", flush=True)


@dataclasses.dataclass
class Row:
    """One schedule at one point: its measured step (``None`` when it failed: ``error``), its prediction, and its
    own order's step with no overhead and no preprocess (``bound``), all in seconds."""

    point: tuple[int, str, float]
    name: str
    family: str  # "torch", "ours", "mpipe" or "mimo"
    measured: float | None = None
    predicted: float | None = None
    bound: float | None = None
    error: str | None = None


def point_rows(args, rank, num_micro, mode, pf_ms, ours_rt, torch_rt):
    """Run every schedule of one point (``M``, ``P`` mode, ``Pf``) on every rank; returns its :class:`Row` list,
    its our-runtime limit, its ideal limit and notes. The measurements, predictions and limits are rank 0's (the
    rank that reports)."""
    from mpipe_hf.schedule import ScheduleConfig, build_schedule
    from mpipe_hf.schedule.layout import stage0_layers
    from mpipe_hf.schedule.simulate import simulate
    point, steps, notes = (num_micro, mode, pf_ms), args.steps, []
    pf = pf_ms / 1e3
    pb = pf * {"frozen": 0.0, "trainable": 2.0, "freeze_vit": freeze_vit_backward_share()}[mode]
    p_mode = "frozen" if mode == "frozen" else "trainable"  # freeze_vit: a trainable P (docs/freeze.md)
    body = stage_costs(0.0, 0.0)
    identity = ScheduleConfig(R, V, num_micro, "identity")
    work = num_micro * (R * V * (F_MS + B_MS) / 1e3 + pf + pb) / R
    our_limit = max(simulate(build_schedule(identity), sim_costs(body, 0.0, 0.0, **ours_rt)).makespan, work)
    inside = stage_costs(pf, pb)
    keep = LAYERS // (R * V)
    best = min(range(1, keep + 1), key=lambda k: simulate(build_schedule(identity), sim_costs(
        stage_costs(pf, pb, stage0_layers(LAYERS, R * V, k)), **ours_rt)).makespan)
    layout = stage0_layers(LAYERS, R * V, best)
    rebalanced, rebalanced_body = stage_costs(pf, pb, layout), stage_costs(0.0, 0.0, layout)
    rows = []

    def ours(name, family, fields, sc, bare, pre=None, model=None, executor_costs=None):
        """A row of our executor: ``fields`` its ``ScheduleConfig`` beyond ``R, V, M``, ``sc`` its stages, ``bare``
        them without ``P``, ``model`` the prediction's costs (with ``P``'s), ``executor_costs`` what the executor
        places by."""
        row = Row(point, name, family)
        rows.append(row)
        try:  # validation only: the same on every rank, so all raise alike
            cfg = ScheduleConfig(R, V, num_micro, **fields)
        except ValueError as error:
            row.error = first_line(error)
            return
        row.measured, row.error = lockstep(lambda: run_ours(cfg, rank, SleepingStages(sc, pre), steps,
                                                            executor_costs)[0])
        progress(rank, row)
        if rank == 0 and row.measured is not None:  # after the run: building a filled schedule takes seconds
            orders = build_schedule(cfg, model, **(dict(own=False, ahead=True) if cfg.placement == "fill" else {}))
            row.predicted = simulate(orders, model).makespan
            row.bound = simulate(orders, sim_costs(bare)).makespan

    def torch_row(name, kind, sc, bare):
        """A row of torch's runtime: ``sc`` its stages, ``bare`` them without ``P``."""
        row = Row(point, name, "torch")
        rows.append(row)
        result, row.error = lockstep(lambda: run_torch(kind, rank, SleepingStages(sc), num_micro, steps))
        progress(rank, row, result)
        if rank == 0 and result is not None:
            row.measured, _, order = result
            row.bound = torch_makespan(order, bare)
            if kind == "1f1b":  # torch's order is ours (mpipe_hf.schedule.interleaved)
                row.predicted = simulate(build_schedule(identity), sim_costs(sc, **torch_rt)).makespan

    torch_row("(a) torch interleaved 1F1B, P in stage 0", "1f1b", inside, body)
    plain = dict(preprocess="identity")
    ours("(b) ours interleaved 1F1B, P in stage 0", "ours", plain, inside, body, model=sim_costs(inside, **ours_rt))
    ours(f"(c) balanced layout, stage 0 keeps {best}/{keep} layers", "ours", plain, rebalanced, rebalanced_body,
         model=sim_costs(rebalanced, **ours_rt))
    variants = [("(d) MPipe full", dict(overflow="full")), ("(e) MPipe min", dict(overflow="min"))]
    variants.append(("(f) MPipe full, bubble filling", dict(placement="fill")) if p_mode == "frozen" else
                    ("(g) MPipe full, owner-backward", dict(owner_backward=True)))
    zero_bubble = zero_bubble_supported()
    if zero_bubble:
        variants.append((f"(h) {variants[-1][0][4:]} + zero-bubble", dict(variants[-1][1], zero_bubble=True)))
    for name, fields in variants:
        # without owner-backward, rank 0 recomputes P for its backward
        recompute = pf if p_mode == "trainable" and not fields.get("owner_backward") else 0.0
        model = sim_costs(body, pf, pb + recompute, **ours_rt)
        ours(name, "mpipe", dict(fields, preprocess=p_mode), body, body, (pf, pb), model, model)
    if zero_bubble:
        model = sim_costs(inside, **ours_rt)
        ours("(i) ours interleaved 1F1B zero-bubble, P in stage 0", "ours", dict(plain, zero_bubble=True), inside,
             body, model=model, executor_costs=model)
    else:
        notes.append("(h) and (i) skipped: this mpipe_hf has no ScheduleConfig.zero_bubble (or no Costs.weight).")
    torch_row(f"(j) torch interleaved 1F1B, stage 0 keeps {best}/{keep} layers", "1f1b", rebalanced,
              rebalanced_body)
    torch_row("(k) torch interleaved zero-bubble, P in stage 0", "zb", inside, body)
    torch_row(f"(l) torch interleaved zero-bubble, stage 0 keeps {best}/{keep} layers", "zb", rebalanced,
              rebalanced_body)
    torch_row("(m) torch ZBV zero-bubble, P in stage 0", "zbv", inside, body)
    rows += mimo_rows(rank, point, p_mode, pf, pb, steps, torch_rt)
    bounds = [row.bound for row in rows if row.measured is not None and row.bound is not None]
    ideal = max(min(bounds), work) if bounds else work
    return rows, our_limit, ideal, notes


def mimo_rows(rank, point, p_mode, pf, pb, steps, torch_rt):
    """The MIMO-style rows (n) and (o) of one point: ``K`` = 1 and 2 tower ranks (``bench_schedules_mimo.py``),
    each measured and (rank 0) predicted."""
    num_micro, rows = point[0], []
    for towers in (1, 2):  # MIMO-style: K tower ranks, torch's best text schedule (that builds) on the others
        best = mimo_text_kind(R - towers, num_micro)
        row = Row(point, f"({'n' if towers == 1 else 'o'}) MIMO-style, K = {towers} tower rank(s)", "mimo")
        rows.append(row)
        result, row.error = lockstep(lambda: run_mimo((best, "zb" if best == "1f1b" else "1f1b", "zbv"), rank, towers, pf,
                                                      pb, None, num_micro, steps, ahead=p_mode == "frozen"))
        if result is not None:
            row.measured, kind = result
            row.name += (f", torch {TEXT_NAMES[kind]} on "
                         f"{R - towers} ranks{', towers a step ahead' if p_mode == 'frozen' else ''}")
        progress(rank, row)
        if rank == 0 and row.measured is not None:
            row.predicted = mimo_predicted(kind, towers, num_micro, pf, pb, torch_rt)
    return rows


TEXT_NAMES = {"1f1b": "interleaved 1F1B", "zb": "interleaved zero-bubble", "zbv": "ZBV zero-bubble"}


def mimo_text_kind(text_ranks, num_micro):
    """``1f1b`` or ``zb``: the torch schedule the simulator finds faster for the body alone on ``text_ranks`` ranks
    (our builder's orders for both; torch's ZB-1P is of the zero-bubble family)."""
    from mpipe_hf.schedule import Costs, ScheduleConfig, build_schedule
    from mpipe_hf.schedule.simulate import simulate
    stages = text_ranks * V
    costs = Costs(R * V * F_MS / 1e3 / stages, R * V * B_MS / 1e3 / stages)
    steps = {kind: simulate(build_schedule(ScheduleConfig(text_ranks, V, num_micro, "identity",
                                                          zero_bubble=kind == "zb")), costs).makespan
             for kind in ("1f1b", "zb")}
    return min(steps, key=steps.get)


def mimo_predicted(kind, towers, num_micro, pf, pb, runtime):
    """The simulator's step of a MIMO-style row (:func:`mpipe_hf.schedule.mimo.best_mimo` over our builder's order
    of ``kind``, its zero-bubble order for ``zbv`` too, with torch's measured ``runtime`` overheads); a frozen
    ``P`` a step ahead: the larger of the text's step and the busiest tower's work."""
    from bench_schedules_mimo import text_costs

    from mpipe_hf.schedule import Costs, ScheduleConfig, build_schedule
    from mpipe_hf.schedule.mimo import best_mimo
    from mpipe_hf.schedule.simulate import simulate
    sc = text_costs(R - towers)
    text = build_schedule(ScheduleConfig(R - towers, V, num_micro, "identity", zero_bubble=kind != "1f1b"))
    costs = Costs(sc.fwd, sc.bwd, pf, pb, weight=sc.bwd_w, **runtime)
    if pb:
        return best_mimo(text, towers, True, costs)[0].makespan
    return max(simulate(text, costs).makespan, pf * -(-num_micro // towers))


def cell(value, fmt):
    """``value`` formatted, or ``n/a`` when there is none."""
    return "n/a" if value is None else format(value, fmt)


def mimo_summary(points):
    """Per point, the best MIMO-style row against the best MPipe row (markdown lines)."""
    lines = ["", "Per point: the best MIMO-style row ((n), (o)) against the best MPipe row: MPipe / MIMO = MIMO step / "
             "MPipe step (above 1: MPipe faster; the goal: at least 0.97 at these fixed-cost points).", "",
             "| M | P | Pf ms | best MIMO-style | step s | best MPipe step s | MPipe / MIMO |", "|---|---|---|---|---|---|---|"]
    for rows, _, _ in points:
        m, mode, pf = rows[0].point
        best = {family: min((row for row in rows if row.family == family and row.measured is not None),
                            key=lambda row: row.measured, default=None) for family in ("mimo", "mpipe")}
        if best["mimo"] is not None and best["mpipe"] is not None:
            lines.append(f"| {m} | {mode} | {pf:g} | {best['mimo'].name} | {best['mimo'].measured:.3f} | "
                         f"{best['mpipe'].measured:.3f} | {best['mimo'].measured / best['mpipe'].measured:.3f} |")
    return lines


def report(args, points, notes, ours_hdr, plain, torch_zero, ours_zero, dispatch, split, took):
    """Print (and with ``--markdown``, write) the table, the per-point summary and the runtime overheads."""
    lines = [f"R = {R}, V = {V}, body F = {F_MS:g} ms and B = {B_MS:g} ms per chunk (B_in = B_w = B / 2), P backward "
             f"Pb = 2 Pf trainable, {freeze_vit_backward_share():.4f} Pf freeze_vit (the merger's), gloo on "
             f"CPU, median of {args.steps} steps after 2 warm-up steps. The simulator's costs for each runtime, "
             f"measured in this run: link latency {ours_hdr * 1e3:.3f} ms for ours (shape header and payload) "
             f"and {plain * 1e3:.3f} ms for torch's fixed-shape sends; dispatch (CPU time per action) "
             f"{dispatch[1] * 1e3:.3f} ms for ours and {dispatch[0] * 1e3:.3f} ms for torch. Ratios are this "
             f"row's step / the reference's (below 1: faster).", "",
             "| M | P | Pf ms | schedule | step s | step / (a) | step / best torch | step / ideal | predicted s | "
             "error | our-runtime limit s | ideal limit s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = ["", "Per point: best torch row, best MPipe row ((d) to (h)), speed-up = best torch step / best "
               "MPipe step (above 1: MPipe faster), best MPipe step / ideal limit.", "",
               "| M | P | Pf ms | best torch | step s | best MPipe | step s | speed-up | MPipe / ideal |",
               "|---|---|---|---|---|---|---|---|---|"]
    failures = []
    for rows, our_limit, ideal in points:
        m, mode, pf = rows[0].point
        lead = f"| {m} | {mode} | {pf:g} | "
        ran = [row for row in rows if row.measured is not None]
        base = next((row.measured for row in ran if row.name.startswith("(a)")), None)
        torch_best = min((row for row in ran if row.family == "torch"), key=lambda row: row.measured, default=None)
        mpipe_best = min((row for row in ran if row.family == "mpipe"), key=lambda row: row.measured, default=None)
        for row in rows:
            if row.measured is None:
                error = row.error.replace("|", "\\|")
                failures.append(f"{m} {mode} Pf={pf:g}: {row.name}: {row.error}")
                lines.append(lead + f"{row.name} | failed: {error[:160]} | | | | | | {our_limit:.3f} | "
                             f"{ideal:.3f} |")
                continue
            predicted = row.predicted
            error = None if predicted is None else (predicted - row.measured) / row.measured
            lines.append(lead + f"{row.name} | {row.measured:.3f} | "
                         f"{cell(None if base is None else row.measured / base, '.3f')} | "
                         f"{cell(None if torch_best is None else row.measured / torch_best.measured, '.3f')} | "
                         f"{row.measured / ideal:.3f} | {cell(predicted, '.3f')} | {cell(error, '+.1%')} | "
                         f"{our_limit:.3f} | {ideal:.3f} |")
        if torch_best is not None and mpipe_best is not None:
            summary.append(lead + f"{torch_best.name} | {torch_best.measured:.3f} | {mpipe_best.name} | "
                           f"{mpipe_best.measured:.3f} | {torch_best.measured / mpipe_best.measured:.3f} | "
                           f"{mpipe_best.measured / ideal:.3f} |")
        else:
            summary.append(lead + "n/a | | n/a | | | |")
    (t_torch, c_torch), n_torch = torch_zero
    (t_ours, c_ours), n_ours = ours_zero
    split_in, split_w, split_first = split
    lines += summary + mimo_summary(points) + ["", "Runtime overheads:", "",
                        f"- one transfer of a 4 x 64 fp32 tensor, rank 0 -> 1 and back, halved: ours (shape header and "
                        f"payload) {ours_hdr * 1e6:.0f} us, a plain fixed-shape send {plain * 1e6:.0f} us "
                        f"({(ours_hdr - plain) * 1e6:+.0f} us per transfer).",
                        f"- stages that do nothing, M = 16, rank 0: torch {t_torch * 1e3:.1f} ms per step "
                        f"({c_torch * 1e3:.1f} ms CPU) over {n_torch} compute actions; ours {t_ours * 1e3:.1f} ms "
                        f"({c_ours * 1e3:.1f} ms CPU) over {n_ours} actions (compute, send and receive). Per compute "
                        f"action (64): torch {t_torch / 64 * 1e6:.0f} us, ours {t_ours / 64 * 1e6:.0f} us (ratio "
                        f"{t_ours / t_torch:.2f}). Four processes share two cores here, so these steps are bound by "
                        f"CPU, unlike the sleeping ones.",
                        f"- split check, one process, torch's stage_backward_input / stage_backward_weight on the "
                        f"sleeping module (B_in = 20 ms, B_w = 30 ms): the input part took {split_in * 1e3:.1f} ms, "
                        f"the weight part {split_w * 1e3:.1f} ms; a whole first-stage backward (input without "
                        f"gradient) {split_first * 1e3:.1f} ms (50 expected).",
                        f"- the whole run took {took:.0f} s."]
    lines += [f"- {note}" for note in notes]
    if failures:
        lines += ["", "Failed:", ""] + [f"- {failure}" for failure in failures]
    print_report("\n".join(lines), args.markdown)

