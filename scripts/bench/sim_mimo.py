"""MPipe against a MIMO-style layout (the tower on ranks of its own, Megatron's MIMO) and torch's best schedule with
the tower on stage 0, at equal ranks and global batch, in the simulator (``mpipe_hf.schedule.mimo``): the crossover
map over the tower's share of a step's compute, fixed and varying per micro-batch.

Usage: python scripts/bench/sim_mimo.py [--micro 16] [--out outputs/sim_mimo] [--smoke]

Costs are ``scripts/bench/bench_schedules.py``'s sleeping stages: R = 4 ranks, V = 2, body F = 10 ms and B = 20 ms per
chunk (8 chunks, backward split in halves), M = 16, no runtime overhead (latency and dispatch 0: the schedules
alone). The tower's share ``s`` of a step's compute sets its cost per micro-batch: ``Pf + Pb = s / (1 - s)`` times
the body's ``8 (F + B)``, with ``Pb = 2 Pf`` trainable, ``Pb = 0`` frozen. Varying: micro ``m``'s tower costs
``w[m]`` times that, ``w`` from the packed demo data's visual tokens (:func:`demo_weights`), mean 1, coefficient of
variation 0.5. Layouts, each the fastest of its configurations:

- torch's best: interleaved 1F1B and zero-bubble (our builder's orders; torch's ZB-1P is of that family, its
  ZBV is not simulated), the tower inside stage 0, stage 0 keeping 1 to 4 of its 4 layers (the rest spread);
- MIMO-style: ``K`` in 1 .. R - 1 tower ranks, the text model split evenly over the other ``R - K`` ranks (V = 2,
  a fractional split: as balanced as can be, which favours MIMO), interleaved 1F1B or zero-bubble, each tower
  forward sent to text stage 0 and its gradient back, the towers' micros by list scheduling, their order the best
  lead (``best_mimo``); a frozen tower may also run one step ahead (the step is then the larger of the text's
  step and the busiest tower's work; the text ranks' bubble and imbalance are then reported for it);
- MPipe Transpose: overflow ``full`` and ``min``, bubble filling (frozen) or owner-backward (trainable), each with
  and without zero-bubble; varying, each also with load-aware owners (``parallel.owners: balanced``).

For each point the script prints the three steps, the winner, MPipe / MIMO (above 1: MPipe faster) against the
goal (1.10 varying, 0.97 fixed), and where a goal is missed, where MPipe's time went: per rank the share idle
(bubble), the busiest rank's compute over the mean (imbalance), transfer and overhead (0 here: none is modelled).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "make"))  # make_demo_data

R, V, F_S, B_S, LAYERS_PER_CHUNK = 4, 2, 0.010, 0.020, 4
SHARES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
GOALS = {"fixed": 0.97, "varying": 1.10}
TARGET_CV = 0.5


def photo_tokens(max_side: int = 112) -> list[int]:
    """Visual tokens of each demo photo (``scripts/make/make_demo_data.py``'s, thumbnailed to ``max_side``) as
    Qwen2.5-VL's processor counts them: each side rounded to 28 px (at least 56 x 56 px in all), one token per
    28 x 28 px."""
    import skimage.data
    from make_demo_data import PHOTOS
    tokens = []
    for name, _, _ in PHOTOS:
        try:
            array = getattr(skimage.data, name)()
        except Exception:  # a loader that would need to download: make_demo_data.py skips it too
            continue
        array = array[0] if isinstance(array, tuple) else array
        h, w = array.shape[:2]
        scale = min(1.0, max_side / max(h, w))
        h, w = max(28, round(h * scale / 28) * 28), max(28, round(w * scale / 28) * 28)
        if h * w < 56 * 56:
            h, w = max(h, 56), max(w, 56)
        tokens.append(h * w // (28 * 28))
    return tokens


def demo_weights(num_micro: int, rows_per_micro: int = 4, seed: int = 0) -> tuple[tuple[float, ...], float]:
    """Per-micro tower weights (mean 1, coefficient of variation :data:`TARGET_CV`) from the demo data's visual
    tokens: rows drawn as ``scripts/bench/bench_packing.py`` draws them (0 to 3 photos each), ``rows_per_micro`` a micro;
    the data's own deviations from the mean, scaled to the target spread. Returns the weights and the data's own
    coefficient of variation."""
    import numpy as np
    from bench_packing import draw_row
    rng, photos = np.random.default_rng(seed), photo_tokens()
    names = [str(i) for i in range(len(photos))]
    tokens = []
    for _ in range(num_micro):
        rows = [draw_row(rng, names, ["word"]) for _ in range(rows_per_micro)]
        tokens.append(sum(photos[int(i)] for row in rows for i in row.get("images", [])))
    mean, std = statistics.fmean(tokens), statistics.pstdev(tokens)
    weights = tuple(max(0.0, 1 + TARGET_CV * (t - mean) / std) for t in tokens) if std else (1.0,) * num_micro
    return weights, std / mean


def tower_costs(share: float, mode: str) -> tuple[float, float]:
    """``(Pf, Pb)`` seconds per micro-batch for a tower that is ``share`` of a step's compute."""
    total = share / (1 - share) * R * V * (F_S + B_S)
    return (total, 0.0) if mode == "frozen" else (total / 3, 2 * total / 3)


def torch_best(num_micro, pf, pb, weights):
    """The fastest torch-family schedule with the tower inside stage 0: ``(step, name, simulation)``."""
    from mpipe_hf.schedule import Costs, ScheduleConfig, build_schedule, simulate
    best = None
    per_f, per_b = F_S / LAYERS_PER_CHUNK, B_S / LAYERS_PER_CHUNK
    stages = R * V
    for keep in range(1, LAYERS_PER_CHUNK + 1):
        rest = (LAYERS_PER_CHUNK * stages - keep) / (stages - 1)
        layers = [keep] + [rest] * (stages - 1)
        fwd = [n * per_f for n in layers]
        bwd = [n * per_b for n in layers]
        # a varying tower inside stage 0: its extra cost per micro is the tower's, so weigh stage 0's mean costs
        fwd[0] += pf
        bwd0 = bwd[0] + pb
        weight = tuple(b / 2 for b in bwd)
        weight = (bwd0 - bwd[0] / 2,) + weight[1:]
        bwd[0] = bwd0
        for zero_bubble in (False, True):
            orders = build_schedule(ScheduleConfig(R, V, num_micro, "identity", zero_bubble=zero_bubble))
            costs = Costs(tuple(fwd), tuple(bwd), weight=weight)
            sim = simulate(orders, costs) if weights is None else _stage0_varying(orders, costs, pf, pb, weights)
            name = f"{'zero-bubble' if zero_bubble else 'interleaved 1F1B'}, stage 0 keeps {keep}/4 layers"
            if best is None or sim.makespan < best[0]:
                best = (sim.makespan, name, sim)
    return best


def _stage0_varying(orders, costs, pf, pb, weights):
    """Simulate ``orders`` with stage 0's tower part weighed per micro: the body stays uniform, so the tower is
    moved out of stage 0's costs into a per-micro extra (a rank-0 ``TRANSPOSE_FWD``/``TRANSPOSE_BWD`` next to
    stage 0's ``F`` and backward, run on the same rank: the same as inside)."""
    import dataclasses
    from mpipe_hf.schedule.actions import Action, Kind
    from mpipe_hf.schedule.simulate import simulate
    fwd, bwd, weight = list(costs.forward), list(costs.backward), list(costs.weight)
    fwd[0] -= pf
    bwd[0] -= pb
    weight[0] -= pb
    inside = {}
    for rank, order in orders.items():
        out = []
        for a in order:
            if a.stage == 0 and a.kind is Kind.F:
                out.append(Action(Kind.TRANSPOSE_FWD, a.micro))
            out.append(a)
            if a.stage == 0 and a.kind is Kind.W or (a.stage == 0 and a.kind is Kind.B and not any(
                    b.kind is Kind.W and b.stage == 0 and b.micro == a.micro for b in order)):
                out.append(Action(Kind.TRANSPOSE_BWD, a.micro))
        inside[rank] = out
    costs = dataclasses.replace(costs, forward=tuple(fwd), backward=tuple(bwd), weight=tuple(weight),
                                preprocess_forward=pf, preprocess_backward=pb, micro_preprocess_weights=weights)
    return simulate(inside, costs)


def mimo_best(num_micro, pf, pb, weights):
    """The fastest MIMO-style layout: ``(step, name, simulation)``."""
    from mpipe_hf.schedule import Costs, ScheduleConfig, build_schedule, simulate
    from mpipe_hf.schedule.mimo import best_mimo, tower_owners
    best = None
    body_f, body_b = R * V * F_S, R * V * B_S
    for towers in range(1, R):
        text_ranks = R - towers
        stages = text_ranks * V
        for zero_bubble in (False, True):
            text = build_schedule(ScheduleConfig(text_ranks, V, num_micro, "identity", zero_bubble=zero_bubble))
            costs = Costs(body_f / stages, body_b / stages, pf, pb, weight=body_b / stages / 2,
                          micro_preprocess_weights=weights)
            sim, _, lead = best_mimo(text, towers, pb > 0, costs)
            name = f"K = {towers}, {'zero-bubble' if zero_bubble else 'interleaved 1F1B'} on {text_ranks} ranks"
            step = sim.makespan
            if pb == 0:  # a frozen tower may run a step ahead: the text waits for none of its features
                owners = tower_owners(num_micro, towers, weights)
                load = max(sum(pf * (1.0 if weights is None else weights[m]) for m in range(num_micro)
                               if owners[m] == t) for t in range(towers))
                text_sim = simulate(text, costs)
                ahead = max(text_sim.makespan, load)
                if ahead < step:
                    step, name, sim = ahead, name + ", towers a step ahead", text_sim
            if best is None or step < best[0]:
                best = (step, name, sim)
    return best


def mpipe_best(num_micro, pf, pb, weights, mode):
    """The fastest MPipe Transpose configuration: ``(step, name, simulation)``."""
    from mpipe_hf.schedule import Costs, ScheduleConfig, build_schedule, simulate
    from mpipe_hf.schedule.owners import step_owners, with_owners
    best = None
    variants = [("full", dict(overflow="full")), ("min", dict(overflow="min"))]
    variants.append(("fill", dict(placement="fill")) if mode == "frozen" else ("owner-backward",
                                                                                dict(owner_backward=True)))
    policies = ("modulo",) if weights is None else ("modulo", "balanced")
    for (name, fields), zero_bubble, policy in itertools.product(variants, (False, True), policies):
        cfg = ScheduleConfig(R, V, num_micro, mode, zero_bubble=zero_bubble, **fields)
        if policy == "balanced" and cfg.overflow != "full":  # overflow min fixes its owners
            continue
        recompute = pf if mode == "trainable" and not cfg.owner_backward else 0.0
        fill = cfg.placement == "fill"
        micro_w = None if weights is None else (weights + weights if fill else weights)
        costs = Costs(F_S, B_S, pf, pb + recompute, weight=B_S / 2, micro_preprocess_weights=micro_w)
        owners = step_owners(policy, weights, cfg) if weights is not None else None
        if owners is not None:  # load-aware owners (parallel.owners: balanced), the next step's alike
            cfg = with_owners(cfg, owners, owners if fill else None)
        orders = build_schedule(cfg, costs, **(dict(own=False, ahead=True) if fill else {}))
        sim = simulate(orders, costs)
        label = f"{name}{' + zero-bubble' if zero_bubble else ''}{', balanced owners' if owners else ''}"
        if best is None or sim.makespan < best[0]:
            best = (sim.makespan, label, sim)
    return best


def where_time_went(sim) -> str:
    """Bubble (mean idle share), imbalance (busiest rank's compute / mean compute), transfer and overhead."""
    busy = {r: sum(e.end - e.start for e in events if e.busy) for r, events in sim.timeline.items()}
    mean = statistics.fmean(busy.values())
    return (f"bubble {sim.mean_bubble:.1%} (per rank " + ", ".join(f"{sim.bubble[r]:.0%}" for r in sorted(busy))
            + f"), imbalance {max(busy.values()) / mean:.2f}x, transfer 0, overhead 0")


def crossover(num_micro: int, shares, modes=("frozen", "trainable")):
    """Every point of the map: ``[(mode, kind, share, torch, mimo, mpipe)]``, each layout its ``(step, name,
    simulation)``; and the data's own coefficient of variation."""
    weights, data_cv = demo_weights(num_micro)
    points = []
    for mode in modes:
        for kind in ("fixed", "varying"):
            w = None if kind == "fixed" else weights
            for share in shares:
                pf, pb = tower_costs(share, mode)
                points.append((mode, kind, share, torch_best(num_micro, pf, pb, w), mimo_best(num_micro, pf, pb, w),
                               mpipe_best(num_micro, pf, pb, w, mode)))
    return points, data_cv, weights


def report(points, data_cv, weights) -> list[str]:
    """The map as a markdown table, and the misses with where MPipe's time went."""
    lines = [f"Varying: per-micro tower weights from the demo data's visual tokens (its own coefficient of variation "
             f"{data_cv:.2f}, scaled to {TARGET_CV}): " + " ".join(f"{w:.2f}" for w in weights), "",
             "| P | tower cost | share | work / R s | torch best s | MIMO-style best s | MPipe best s | winner | "
             "MPipe / MIMO | goal | MIMO configuration | MPipe configuration |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    misses = []
    for mode, kind, share, torch, mimo, mpipe in points:
        pf, pb = tower_costs(share, mode)
        bound = len(weights) * (R * V * (F_S + B_S) + pf + pb) / R  # all the work over R: no schedule is faster
        steps = {"torch": torch[0], "MIMO-style": mimo[0], "MPipe": mpipe[0]}
        winner = min(steps, key=steps.get)
        ratio = mimo[0] / mpipe[0]
        met = ratio >= GOALS[kind] - 1e-9
        lines.append(f"| {mode} | {kind} | {share:g} | {bound:.3f} | {torch[0]:.3f} | {mimo[0]:.3f} | {mpipe[0]:.3f} | {winner} | "
                     f"{ratio:.3f} | {'met' if met else 'MISSED'} ({GOALS[kind]}) | {mimo[1]} | {mpipe[1]} |")
        if not met:
            reach = (f"MIMO-style is within {mimo[0] / bound - 1:.1%} of all the work over R: no schedule can be "
                     f"{GOALS[kind]}x it here" if mimo[0] < GOALS[kind] * bound else "MPipe could be faster")
            misses.append(f"- {mode} {kind} share {share:g}: MPipe {mpipe[0]:.3f} s ({mpipe[1]}): "
                          f"{where_time_went(mpipe[2])}, {mpipe[0] / bound - 1:.1%} above all the work over R; "
                          f"MIMO-style {mimo[0]:.3f} s ({mimo[1]}): {where_time_went(mimo[2])}; {reach}")
    return lines + (["", "Goal missed at:", ""] + misses if misses else ["", "Goal met at every point."])


def picture(points, path: str) -> None:
    """Save the map: per ``P`` mode and cost kind, each layout's step against the tower's share, winner marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(p[0], p[1]) for p in points})
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), sharey=False)
    for ax, (mode, kind) in zip(axes if len(panels) > 1 else [axes], panels):
        mine = [p for p in points if (p[0], p[1]) == (mode, kind)]
        shares = [p[2] for p in mine]
        for i, label in enumerate(("torch best", "MIMO-style", "MPipe")):
            ax.plot(shares, [p[3 + i][0] for p in mine], marker="o", label=label)
        ax.set_title(f"{mode} tower, {kind} cost")
        ax.set_xlabel("tower share of a step's compute")
        ax.set_ylabel("simulated step (s)")
    axes_list = axes if len(panels) > 1 else [axes]
    axes_list[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    """Build the map, print it, and save its table and picture under ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro", type=int, default=16, help="micro-batches per step (M)")
    parser.add_argument("--out", default="outputs/sim_mimo", help="folder for map.md and map.png")
    parser.add_argument("--smoke", action="store_true", help="two shares, frozen only (a quick check)")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    shares, modes = ((0.1, 0.4), ("frozen",)) if args.smoke else (SHARES, ("frozen", "trainable"))
    points, data_cv, weights = crossover(args.micro, shares, modes)
    lines = report(points, data_cv, weights)
    print("\n".join(lines), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "map.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    picture(points, os.path.join(args.out, "map.png"))
    print(f"wrote {args.out}/map.md and map.png")


if __name__ == "__main__":
    main()
