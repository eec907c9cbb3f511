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
from bench_schedules_varying import (VaryingStages, balanced_owners, inside_predicted, mimo_summary, time_split,
                                     tower_weights)
from sleeping import print_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VIDEO_PF_MS = 60.0  # the video-heavy profile's tower: 6 body chunks' forward per micro-batch
VARYING_PF_MS = 40.0  # the varying points' mean tower cost per micro-batch (as the fixed Pf = 40 ms points)
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
    own order's step with no overhead and no preprocess (``bound``), all in seconds; ``split``: where its measured
    step went (:func:`bench_schedules_varying.time_split`; MPipe and MIMO-style rows)."""

    point: tuple[int, str, float]
    name: str
    family: str  # "torch", "ours", "mpipe" or "mimo"
    measured: float | None = None
    predicted: float | None = None
    bound: float | None = None
    error: str | None = None
    split: str | None = None


def point_rows(args, rank, num_micro, mode, pf_ms, ours_rt, torch_rt):
    """Run every schedule of one point (``M``, ``P`` mode, ``Pf``) on every rank; returns its :class:`Row` list,
    its our-runtime limit, its ideal limit and notes (:class:`Point`)."""
    return Point(args, rank, num_micro, mode, pf_ms, ours_rt, torch_rt).run()


class Point:
    """One point: its costs, its stages and its rows, run on every rank. ``mode``: ``frozen``, ``trainable`` or
    ``freeze_vit``, ``" varying"`` appended where the tower's cost varies per micro-batch (its weights
    :func:`bench_schedules_varying.tower_weights`; every row runs the same ones). The measurements, predictions
    and limits are rank 0's (the rank that reports)."""

    def __init__(self, args, rank, num_micro, mode, pf_ms, ours_rt, torch_rt):
        from mpipe_hf.schedule import ScheduleConfig
        self.args, self.rank, self.num_micro, self.ours_rt, self.torch_rt = args, rank, num_micro, ours_rt, torch_rt
        self.point, self.rows, self.notes = (num_micro, mode, pf_ms), [], []
        kind = mode.split()[0]
        self.pf = pf_ms / 1e3
        self.pb = self.pf * {"frozen": 0.0, "trainable": 2.0, "freeze_vit": freeze_vit_backward_share()}[kind]
        self.p_mode = "frozen" if kind == "frozen" else "trainable"  # freeze_vit: a trainable P (docs/freeze.md)
        self.weights = tower_weights(num_micro) if mode.endswith(" varying") else None
        mean = 1.0 if self.weights is None else sum(self.weights) / num_micro
        # all the work over R: M (S (F + B) + Pf + Pb) / R, without rank 0's recompute of P
        self.work = num_micro * (R * V * (F_MS + B_MS) / 1e3 + (self.pf + self.pb) * mean) / R
        self.identity = ScheduleConfig(R, V, num_micro, "identity")

    def inside(self, sc, bare):
        """The stages with ``P`` inside stage 0: ``sc`` (``P``'s cost in stage 0's), or where it varies ``bare``
        (no ``P``) with ``P`` sleeping each micro's own cost."""
        if self.weights is None:
            return SleepingStages(sc)
        return VaryingStages(bare, self.pf, self.pb, self.weights, transposed=False)

    def transposed(self, bare):
        """The stages ``bare`` with ``P`` transposed (each micro's own cost where it varies)."""
        if self.weights is None:
            return SleepingStages(bare, (self.pf, self.pb))
        return VaryingStages(bare, self.pf, self.pb, self.weights, transposed=True)

    def ours(self, name, family, fields, stages, bare, model, executor_costs=None, inside=True):
        """A row of our executor: ``fields`` its ``ScheduleConfig`` beyond ``R, V, M``, ``stages`` what it runs,
        ``bare`` the body's costs without ``P``, ``model`` the prediction's costs (``inside``: ``P``'s mean in
        stage 0's; else ``P`` transposed, weighed per micro), ``executor_costs`` what the executor places by."""
        from mpipe_hf.schedule import ScheduleConfig, build_schedule
        from mpipe_hf.schedule.simulate import simulate
        row = Row(self.point, name, family)
        self.rows.append(row)
        try:  # validation only: the same on every rank, so all raise alike
            cfg = ScheduleConfig(R, V, self.num_micro, **fields)
        except ValueError as error:
            row.error = first_line(error)
            return
        row.measured, row.error = lockstep(lambda: run_ours(cfg, self.rank, stages, self.args.steps,
                                                            executor_costs)[0])
        progress(self.rank, row)
        if self.rank != 0 or row.measured is None:
            return
        # after the run: building a filled schedule takes seconds
        orders = build_schedule(cfg, model, **(dict(own=False, ahead=True) if cfg.placement == "fill" else {}))
        row.bound = simulate(orders, sim_costs(bare)).makespan
        if inside:
            row.predicted = inside_predicted(orders, model, self.pf, self.pb, self.weights)
            return
        row.predicted = simulate(orders, model).makespan

        def costs(latency, dispatch):
            return dataclasses.replace(model, latency=model.latency if latency else 0.0,
                                       dispatch=model.dispatch if dispatch else 0.0)
        row.split = time_split(lambda *flags: simulate(orders, costs(*flags)), row.measured, self.work)

    def torch_row(self, name, kind, sc, bare):
        """A row of torch's runtime: ``sc`` its stages with ``P`` inside stage 0, ``bare`` them without ``P``."""
        from mpipe_hf.schedule import build_schedule
        row = Row(self.point, name, "torch")
        self.rows.append(row)
        result, row.error = lockstep(lambda: run_torch(kind, self.rank, self.inside(sc, bare), self.num_micro,
                                                       self.args.steps))
        progress(self.rank, row, result)
        if self.rank == 0 and result is not None:
            row.measured, _, order = result
            row.bound = torch_makespan(order, bare)
            if kind == "1f1b":  # torch's order is ours (mpipe_hf.schedule.interleaved)
                row.predicted = inside_predicted(build_schedule(self.identity), sim_costs(sc, **self.torch_rt),
                                                 self.pf, self.pb, self.weights)

    def mpipe_rows(self, body, zero_bubble):
        """Rows (d) to (h): MPipe Transpose over the body ``body``; where ``P``'s cost varies, each overflow
        ``full`` row with load-aware owners over its weights (:func:`bench_schedules_varying.balanced_owners`)."""
        from mpipe_hf.schedule import ScheduleConfig
        variants = [("(d) MPipe full", dict(overflow="full")), ("(e) MPipe min", dict(overflow="min"))]
        variants.append(("(f) MPipe full, bubble filling", dict(placement="fill")) if self.p_mode == "frozen" else
                        ("(g) MPipe full, owner-backward", dict(owner_backward=True)))
        if zero_bubble:
            variants.append((f"(h) {variants[-1][0][4:]} + zero-bubble", dict(variants[-1][1], zero_bubble=True)))
        for name, fields in variants:
            fields = dict(fields, preprocess=self.p_mode)
            # without owner-backward, rank 0 recomputes P for its backward
            recompute = self.pf if self.p_mode == "trainable" and not fields.get("owner_backward") else 0.0
            model = placed = sim_costs(body, self.pf, self.pb + recompute, **self.ours_rt)
            if self.weights is not None:  # the executor places by the mean costs, as the trainer's does
                fill = fields.get("placement") == "fill"
                model = dataclasses.replace(model, micro_preprocess_weights=self.weights * (2 if fill else 1))
                try:
                    owners = balanced_owners(ScheduleConfig(R, V, self.num_micro, **fields), self.weights, model)
                except ValueError:  # a config this mpipe_hf refuses: the row reports it
                    owners = None
                if owners is not None:
                    fields, name = dict(fields, owners=owners), name + ", balanced owners"
            self.ours(name, "mpipe", fields, self.transposed(body), body, model, placed, inside=False)

    def run(self):
        """Run every row; returns ``(rows, our-runtime limit, ideal limit, notes)``."""
        from mpipe_hf.schedule import build_schedule
        from mpipe_hf.schedule.layout import stage0_layers
        from mpipe_hf.schedule.simulate import simulate
        pf, pb, ours_rt = self.pf, self.pb, self.ours_rt
        body = stage_costs(0.0, 0.0)
        our_limit = max(simulate(build_schedule(self.identity), sim_costs(body, **ours_rt)).makespan, self.work)
        inside = stage_costs(pf, pb)
        keep = LAYERS // (R * V)
        best = min(range(1, keep + 1), key=lambda k: simulate(build_schedule(self.identity), sim_costs(
            stage_costs(pf, pb, stage0_layers(LAYERS, R * V, k)), **ours_rt)).makespan)
        layout = stage0_layers(LAYERS, R * V, best)
        rebalanced, rebalanced_body = stage_costs(pf, pb, layout), stage_costs(0.0, 0.0, layout)
        self.torch_row("(a) torch interleaved 1F1B, P in stage 0", "1f1b", inside, body)
        plain = dict(preprocess="identity")
        self.ours("(b) ours interleaved 1F1B, P in stage 0", "ours", plain, self.inside(inside, body), body,
                  sim_costs(inside, **ours_rt))
        self.ours(f"(c) balanced layout, stage 0 keeps {best}/{keep} layers", "ours", plain,
                  self.inside(rebalanced, rebalanced_body), rebalanced_body, sim_costs(rebalanced, **ours_rt))
        zero_bubble = zero_bubble_supported()
        self.mpipe_rows(body, zero_bubble)
        if zero_bubble:
            model = sim_costs(inside, **ours_rt)
            self.ours("(i) ours interleaved 1F1B zero-bubble, P in stage 0", "ours", dict(plain, zero_bubble=True),
                      self.inside(inside, body), body, model, model)
        else:
            self.notes.append("(h) and (i) skipped: this mpipe_hf has no ScheduleConfig.zero_bubble (or no "
                              "Costs.weight).")
        self.torch_row(f"(j) torch interleaved 1F1B, stage 0 keeps {best}/{keep} layers", "1f1b", rebalanced,
                       rebalanced_body)
        self.torch_row("(k) torch interleaved zero-bubble, P in stage 0", "zb", inside, body)
        self.torch_row(f"(l) torch interleaved zero-bubble, stage 0 keeps {best}/{keep} layers", "zb", rebalanced,
                       rebalanced_body)
        self.torch_row("(m) torch ZBV zero-bubble, P in stage 0", "zbv", inside, body)
        self.mimo_rows()
        bounds = [row.bound for row in self.rows if row.measured is not None and row.bound is not None]
        return self.rows, our_limit, max(min(bounds), self.work) if bounds else self.work, self.notes

    def mimo_rows(self):
        """The MIMO-style rows (n) and (o): ``K`` = 1 and 2 tower ranks (``bench_schedules_mimo.py``), each measured
        and (rank 0) predicted, its ``bound`` torch's text order over the text stages with no overhead."""
        from bench_schedules_mimo import text_costs
        ahead = self.p_mode == "frozen"
        for towers in (1, 2):  # K tower ranks, torch's best text schedule (that builds) on the others
            best = mimo_text_kind(R - towers, self.num_micro)
            kinds = (best, "zb" if best == "1f1b" else "1f1b", "zbv")
            row = Row(self.point, f"({'n' if towers == 1 else 'o'}) MIMO-style, K = {towers} tower rank(s)", "mimo")
            self.rows.append(row)
            result, row.error = lockstep(lambda: run_mimo(kinds, self.rank, towers, self.pf, self.pb, self.weights,
                                                          self.num_micro, self.args.steps, ahead=ahead))
            if result is not None:
                row.measured, kind, order = result
                row.name += f", torch {TEXT_NAMES[kind]} on {R - towers} ranks{', towers a step ahead' * ahead}"
            progress(self.rank, row)
            if self.rank == 0 and row.measured is not None:
                row.bound = torch_makespan(order, text_costs(R - towers))
                rt = self.torch_rt

                def predict(latency, dispatch):
                    return mimo_simulation(kind, towers, self.num_micro, self.pf, self.pb, self.weights, dict(
                        latency=rt["latency"] if latency else 0.0, dispatch=rt["dispatch"] if dispatch else 0.0))
                row.predicted = predict(True, True).makespan
                row.split = time_split(predict, row.measured, self.work)


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


def mimo_simulation(kind, towers, num_micro, pf, pb, weights, runtime):
    """The simulator on a MIMO-style row (:func:`mpipe_hf.schedule.mimo.best_mimo` over our builder's order of
    ``kind``, its zero-bubble order for ``zbv`` too, with ``runtime``'s ``latency`` and ``dispatch``; ``weights``:
    the tower's per micro). A frozen ``P`` runs a step ahead: the text ranks' order without the features' wait
    beside each tower rank's forwards (its step: the larger of the text's and the busiest tower's)."""
    from bench_schedules_mimo import text_costs

    from mpipe_hf.schedule import Costs, ScheduleConfig, build_schedule
    from mpipe_hf.schedule.actions import Action, Kind
    from mpipe_hf.schedule.mimo import best_mimo, tower_owners
    from mpipe_hf.schedule.simulate import simulate
    sc = text_costs(R - towers)
    text = build_schedule(ScheduleConfig(R - towers, V, num_micro, "identity", zero_bubble=kind != "1f1b"))
    costs = Costs(sc.fwd, sc.bwd, pf, pb, weight=sc.bwd_w, micro_preprocess_weights=weights, **runtime)
    if pb:
        return best_mimo(text, towers, True, costs)[0]
    owners = tower_owners(num_micro, towers, weights)
    orders = {t: [Action(Kind.TRANSPOSE_FWD, m) for m in range(num_micro) if owners[m] == t] for t in range(towers)}
    orders.update({rank + towers: [a if a.peer is None else dataclasses.replace(a, peer=a.peer + towers)
                                   for a in order] for rank, order in text.items()})
    return simulate(orders, costs)


def cell(value, fmt):
    """``value`` formatted, or ``n/a`` when there is none."""
    return "n/a" if value is None else format(value, fmt)


def overhead_lines(ours_hdr, plain, torch_zero, ours_zero, split, took):
    """The report's runtime overheads (markdown lines): one transfer, the runtimes on stages that do nothing, the
    split check and the run's length."""
    (t_torch, c_torch), n_torch = torch_zero
    (t_ours, c_ours), n_ours = ours_zero
    split_in, split_w, split_first = split
    return ["", "Runtime overheads:", "",
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
    lines += summary + mimo_summary(points) + overhead_lines(ours_hdr, plain, torch_zero, ours_zero, split, took)
    lines += [f"- {note}" for note in notes]
    if failures:
        lines += ["", "Failed:", ""] + [f"- {failure}" for failure in failures]
    print_report("\n".join(lines), args.markdown)

