"""The cost model and the report of ``scripts/bench/bench_compute.py``: stage costs from the parts' timed costs, each
row's work per rank and its order run with no overhead, and the printed tables with where the time went."""

from __future__ import annotations

import dataclasses

import numpy as np

GOALS = {"frozen": 1.30, "trainable": 1.8}  # the speed goals: MPipe over the best torch row
MATMUL_GOAL = 0.80


@dataclasses.dataclass
class PipelineCosts:
    """Seconds per micro-batch of each stage (forward, input-gradient and weight-gradient parts of the backward)
    and of a transposed tower (``pf``, ``pb``; 0 when the tower is inside stage 0)."""

    fwd: tuple[float, ...]
    bwd_in: tuple[float, ...]
    bwd_w: tuple[float, ...]
    pf: float = 0.0
    pb: float = 0.0

    @property
    def bwd(self) -> tuple[float, ...]:
        """The whole backward of each stage."""
        return tuple(i + w for i, w in zip(self.bwd_in, self.bwd_w))

    def simulator(self):
        """The simulator's ``Costs``, no runtime overhead."""
        from mpipe_hf.schedule import Costs
        return Costs(self.fwd, self.bwd, self.pf, self.pb, weight=self.bwd_w)


def stage_costs_of(costs: dict, layout: list[int], inside: bool, recompute: bool = False) -> PipelineCosts:
    """:class:`PipelineCosts` of ``layout`` (decoder layers per stage) from ``part_costs``' figures: the LM head on
    the last stage; the tower inside stage 0 (``inside``: its backward on the weight path) or transposed (its
    backward plus, with ``recompute``, rank 0's recompute of its forward). A backward splits in halves."""
    fwd = [n * costs["layer_f"] for n in layout]
    bwd = [n * costs["layer_b"] for n in layout]
    fwd[-1] += costs["head_f"]
    bwd[-1] += costs["head_b"]
    bwd_w = [b / 2 for b in bwd]
    if inside:
        fwd[0] += costs["tower_f"]
        bwd_w[0] += costs["tower_b"]
        return PipelineCosts(tuple(fwd), tuple(b / 2 for b in bwd), tuple(bwd_w))
    pb = costs["tower_b"] + (costs["tower_f"] if recompute else 0.0)
    return PipelineCosts(tuple(fwd), tuple(b / 2 for b in bwd), tuple(bwd_w), costs["tower_f"], pb)


def torch_work(order: dict, sc: PipelineCosts) -> dict[int, float]:
    """Seconds of compute per rank in torch's order (``{rank: [_Action or None]}``), with the costs
    ``bench_schedules_stages.torch_makespan`` charges."""
    def cost(kind, s):
        return {"F": sc.fwd[s], "B": sc.bwd[s], "I": 0.0 if s == 0 else sc.bwd_in[s],
                "W": sc.bwd[s] if s == 0 else sc.bwd_w[s]}.get(kind, 0.0)
    return {r: sum(cost(a.computation_type.value, a.stage_index) for a in actions if a is not None)
            for r, actions in order.items()}


def row_figures(costs: dict, layout: list[int], micro: int, cfg, result, family: str) -> dict | None:
    """``{"zero": the row's order run with the timed costs and no overhead, "busiest": the busiest rank's
    compute, "mean": the mean rank's compute}`` (seconds), or ``None`` for a row that failed. Our rows: the
    simulator on the order our executor runs; torch's: a replay of the order it ran (``result[2]``)."""
    if result is None:
        return None
    if family == "torch":
        from bench_schedules_stages import StageCosts, torch_makespan
        sc = stage_costs_of(costs, layout, inside=True)
        work = torch_work(result[2], sc)
        zero = torch_makespan(result[2], StageCosts(sc.fwd, sc.bwd_in, sc.bwd_w))
    else:
        from mpipe_hf.schedule import build_schedule
        from mpipe_hf.schedule.simulate import simulate
        model = stage_costs_of(costs, layout, inside=False,
                               recompute=cfg.trains_preprocess and not cfg.owner_backward).simulator()
        orders = build_schedule(cfg, model, **(dict(own=False, ahead=True) if cfg.placement == "fill" else {}))
        sim = simulate(orders, model)
        work = {r: sum(e.end - e.start for e in events if e.busy) for r, events in sim.timeline.items()}
        zero = sim.makespan
    return {"zero": zero, "busiest": max(work.values()), "mean": float(np.mean(list(work.values())))}


def where(name: str, step: float, fig: dict) -> str:
    """One row's time over the ideal (the mean rank's compute), split into imbalance, bubble and overhead."""
    return (f"  {name}: {step:.3f} s = ideal {fig['mean']:.3f} + imbalance {fig['busiest'] - fig['mean']:.3f} "
            f"+ bubble {fig['zero'] - fig['busiest']:.3f} + overhead {step - fig['zero']:.3f} (runtime and machine)")


def mode_lines(mode: str, rows: list, costs: dict, micro: int) -> list[str]:
    """Part 3's table for one tower mode, the speed-up against its goal, and where the time went."""
    chunk_f = costs["layer_f"] * 2
    lines = [f"### {mode} tower: a decoder layer {costs['layer_f'] * 1e3:.1f} / {costs['layer_b'] * 1e3:.1f} ms "
             f"(forward / backward), the head {costs['head_f'] * 1e3:.1f} / {costs['head_b'] * 1e3:.1f} ms, the tower "
             f"{costs['tower_f'] * 1e3:.1f} / {costs['tower_b'] * 1e3:.1f} ms ({costs['tower_f'] / chunk_f:.1f}x a "
             f"2-layer chunk's forward), per micro-batch on one thread; M = {micro}; the tower's "
             f"{costs['tower_params'] / 1e6:.1f}M parameters ({costs['tower_params'] * 4 / 2**20:.0f} MiB of fp32 "
             f"gradient summed over the ranks each step with owner-backward; not counted in the ideal)", "",
             "| schedule | step s | best torch / this | ideal s | busiest rank s | no-overhead s | step / ideal |",
             "|---|---|---|---|---|---|---|"]
    ran = [r for r in rows if r[2] is not None]
    best_torch = min((r for r in ran if r[1] == "torch"), key=lambda r: r[2], default=None)
    best_mpipe = min((r for r in ran if r[1] == "mpipe"), key=lambda r: r[2], default=None)
    for name, _, step, error, fig in rows:
        if step is None:
            lines.append(f"| {name} | failed: {error[:150]} | | | | | |")
            continue
        ratio = "-" if best_torch is None else f"{best_torch[2] / step:.3f}"
        lines.append(f"| {name} | {step:.3f} | {ratio} | {fig['mean']:.3f} | {fig['busiest']:.3f} | "
                     f"{fig['zero']:.3f} | {step / fig['mean']:.3f} |")
    if best_torch is None or best_mpipe is None:
        return lines + ["", "no speed-up: a family of rows did not run"]
    speed = best_torch[2] / best_mpipe[2]
    goal = GOALS[mode]
    lines += ["", f"best torch {best_torch[0]} {best_torch[2]:.3f} s; best MPipe {best_mpipe[0]} "
              f"{best_mpipe[2]:.3f} s; speed-up {speed:.3f}x; goal {goal:.2f}x: {'met' if speed >= goal else 'MISSED'}"]
    if speed < goal:
        lines += ["where the time went (seconds per step over the ideal):",
                  where(best_mpipe[0], best_mpipe[2], best_mpipe[4]),
                  where(best_torch[0], best_torch[2], best_torch[4]),
                  f"  with no overhead the speed-up would be {best_torch[4]['zero'] / best_mpipe[4]['zero']:.3f}x"]
    return lines


def pipeline_report(results: dict, micro: int, took: float) -> str:
    """Part 3's report over both tower modes."""
    lines = ["## MPipe against the best torch schedule, real layers, R = 2 (one thread each), V = 2", ""]
    for mode, result in results.items():
        if len(result) == 4:
            lines += [f"### {mode} tower: failed: {result[3]}", ""]
            continue
        rows, costs, _ = result
        lines += mode_lines(mode, rows, costs, micro) + [""]
    lines.append(f"part 3 took {took:.0f} s")
    return "\n".join(lines)


def packing_report(results: list[dict]) -> str:
    """Part 2's goal and where the time went: packed over padded label tokens/s split into the work per label
    token (decoder multiply-adds, attention within rows), the share of the step a rank computes (1 - bubble), and
    the multiply-adds per busy second (what per-call overhead lowers)."""
    packed, padded, plain = results
    speed = packed["label_tok_s"] / padded["label_tok_s"]
    met = speed >= 1.5 and packed["padding"] <= 0.05
    lines = ["## Packing at the compute shape", "",
             f"packed / padded label tokens/s {speed:.3f}x (padding {packed['padding']:.3f} packed, "
             f"{padded['padding']:.3f} padded); packed / plain HF Trainer "
             f"{packed['label_tok_s'] / plain['label_tok_s']:.3f}x; goal 1.5x with <= 5% padding: "
             f"{'met' if met else 'MISSED'}"]
    busy = {}
    for row in (packed, padded):
        share = 1 - float(np.mean(row["bubble_per_rank"]))
        rate = row["macs_rows"] * row["labels_per_step"] / (row["step_s"] * share)
        busy[row["run"]] = (share, rate)
        lines.append(f"  {row['run']}: {row['macs_rows']:.3g} decoder multiply-adds per label token, busy "
                     f"{share:.3f} of the step (bubble {1 - share:.3f}), {rate / 1e9:.2f} G multiply-adds per busy "
                     f"second")
    (s_pk, r_pk), (s_pd, r_pd) = busy[packed["run"]], busy[padded["run"]]
    lines.append(f"  packed / padded = work {padded['macs_rows'] / packed['macs_rows']:.3f}x x busy share "
                 f"{s_pk / s_pd:.3f}x x rate {r_pk / r_pd:.3f}x (rate below 1: per-call overhead of the packed rows)")
    lines.append("  (the simulated columns above use the demo model's profile, recipes/profiles/"
                 "qwen2_5_vl_demo.yaml, not this shape's)")
    return "\n".join(lines)


def share_lines(whole: dict, stage: dict, batch_shape: tuple) -> list[str]:
    """Part 1's lines: the matmul shares and the costliest ops, against the 80% goal."""
    out = ["## Matmul share of a step (torch.profiler, one thread)"]
    for name, fig in ((f"unsplit model, an optimizer step: padded micro-batches {batch_shape}, then AdamW", whole),
                      ("pipeline stage, 2 decoder layers, forward + backward", stage)):
        share = fig["gemm"] + fig["attention"]
        out.append(f"  {name}: {fig['wall']:.3f} s; GEMM and convolution {fig['gemm']:.3f}, attention kernels "
                   f"{fig['attention']:.3f}, together {share:.3f} (goal {MATMUL_GOAL:.2f}: "
                   f"{'met' if share >= MATMUL_GOAL else 'MISSED'}); costliest: "
                   + ", ".join(f"{k} {v:.3f}" for k, v in fig["top"]))
    return out
