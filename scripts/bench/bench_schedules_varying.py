"""The varying-cost points of ``scripts/bench/bench_schedules.py`` and the MPipe against MIMO-style summary: sleeping
stages whose tower (``P``) costs micro-batch ``m`` ``Pf w[m]`` forward and ``Pb w[m]`` backward, with ``w`` the
packed demo data's own visual-token counts scaled to a coefficient of variation of 0.5
(``scripts/bench/sim_mimo.py``'s :func:`demo_weights`), and where each best row's time went.

The micro's index rides in its raw input ``x`` (every element of micro ``m``'s ``x`` is ``m``: our executor's
``load(m)`` and torch's split of its ``M``-row batch alike), so the stage or the transposed ``P`` that reads ``x``
knows whose cost to sleep. ``P`` is a node on the weight path (its input is raw data), forward ``Pf w[m]`` and
backward ``Pb w[m]``: inside stage 0 for the torch rows and ours with ``P`` inside, transposed for MPipe's.
"""

from __future__ import annotations

import functools
import os
import sys

import torch
from torch import nn

from bench_schedules_stages import SleepingStages, SleepModule
from sleeping import Sleep

GOALS = {False: 0.97, True: 1.10}  # MPipe / MIMO-style wanted: at fixed-cost points, at varying ones


@functools.lru_cache(maxsize=None)
def tower_weights(num_micro: int) -> tuple[float, ...]:
    """The per-micro tower weights (mean 1, coefficient of variation 0.5) of ``sim_mimo.demo_weights``: the same
    floats on every rank (a seeded draw)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sim_mimo import demo_weights
    return demo_weights(num_micro)[0]


def micro_of(x: torch.Tensor) -> int:
    """The micro index a raw input carries (its first element)."""
    return int(x.reshape(-1)[0])


class Tower(nn.Module):
    """``P`` as one weight-path node: ``tower(m)`` sleeps ``pf w[m]`` and, in backward, ``pb w[m]``; multiply a
    stage's output by it."""

    def __init__(self, pf, pb, weights):
        super().__init__()
        self.t = nn.Parameter(torch.ones(1))
        self.pf, self.pb, self.weights = pf, pb, weights

    def forward(self, m):
        return Sleep.apply(self.t, self.pf * self.weights[m], self.pb * self.weights[m])


class TowerInside(nn.Module):
    """Stage 0 with ``P`` inside it: ``body`` (a :class:`SleepModule`, tensors in and out, or our executor's dict
    stage) times :class:`Tower` of the input's micro."""

    def __init__(self, body, tower):
        super().__init__()
        self.body, self.tower = body, tower

    def forward(self, x):
        if isinstance(x, dict):
            out = self.body(x)
            return dict(out, hidden_states=out["hidden_states"] * self.tower(micro_of(x["x"])))
        return self.body(x) * self.tower(micro_of(x))


class TransposedTower(nn.Module):
    """The transposed ``P`` of our executor: ``x -> feat``, sleeping as :class:`Tower` of the micro."""

    def __init__(self, tower):
        super().__init__()
        self.tower = tower

    def forward(self, inputs):
        return {"feat": inputs["x"] * self.tower(micro_of(inputs["x"]))}


class VaryingStages(SleepingStages):
    """:class:`SleepingStages` of the body ``sc`` (no ``P`` in it) with ``P`` costing micro ``m`` ``pf w[m]`` forward
    and ``pb w[m]`` backward: inside stage 0 unless ``transposed``."""

    def __init__(self, sc, pf, pb, weights, transposed):
        super().__init__(sc)
        self.tower, self.transposed = (pf, pb, weights), transposed

    def stage(self, s, last):
        stage = super().stage(s, last)
        return stage if s or self.transposed else TowerInside(stage, Tower(*self.tower))

    def preprocess(self):
        return TransposedTower(Tower(*self.tower))

    def load(self, m):
        return {"x": torch.full((1, 16), float(m))}

    def torch_stage(self, s):
        stage = SleepModule(self.sc.fwd[s], self.sc.bwd_in[s], self.sc.bwd_w[s])
        return stage if s else TowerInside(stage, Tower(*self.tower))

    def torch_inputs(self, num_micro):
        rows = torch.arange(num_micro, dtype=torch.float32).unsqueeze(1).expand(num_micro, 16).contiguous()
        return [rows], torch.ones(num_micro, 16)


def balanced_owners(cfg, weights, model):
    """MPipe's load-aware owners over ``weights`` as the trainer picks them (``parallel.owners: balanced``:
    :func:`~mpipe_hf.schedule.owners.step_owners`, under placement ``fill`` starting each owner at minus its idle
    time, :func:`~mpipe_hf.schedule.owners.fill_headroom` over ``model``, in units of a mean micro's ``P``), the
    next step's alike; ``None`` for overflow ``min`` (which fixes its owners). Returns the config's ``owners``
    field: ``M`` ranks, ``2 M`` under placement ``fill``."""
    from mpipe_hf.schedule.owners import fill_headroom, step_owners
    if cfg.overflow != "full":
        return None
    fill = cfg.placement == "fill"
    headroom = [h / model.preprocess_forward for h in fill_headroom(cfg, model)] if fill else None
    owners = step_owners("balanced", weights, cfg, headroom)
    return owners + owners if fill else owners


def inside_predicted(orders, costs, pf, pb, weights):
    """The simulator's step of ``orders`` whose stage 0 holds ``P`` (``costs``: its mean, ``pf`` and ``pb``, inside
    stage 0's), the tower weighed per micro when ``weights`` is given (``sim_mimo``'s stage-0 model)."""
    from mpipe_hf.schedule.simulate import simulate
    if weights is None:
        return simulate(orders, costs).makespan
    from sim_mimo import _stage0_varying
    return _stage0_varying(orders, costs, pf, pb, weights).makespan


def time_split(simulate_with, measured, work):
    """Where a row's measured step went, from the simulator on the row's own order: ``simulate_with(latency,
    dispatch)`` returns its simulation (``latency`` / ``dispatch`` ``None``: zero; ``True``: the runtime's
    measured one). The parts: all the work over ``R`` (``work``), the schedule's own bubble and imbalance (its
    step with no overhead, less the work), transfer (the measured link latency's share), dispatch (the measured
    CPU time per action's share) and the rest (measured less predicted: overhead the simulator does not model).
    Returns one text line."""
    from sim_mimo import where_time_went
    bare, linked, full = (simulate_with(*flags) for flags in ((False, False), (True, False), (True, True)))
    return (f"{measured:.3f} s = work / R {work:.3f} + bubble and imbalance {bare.makespan - work:+.3f} "
            f"({where_time_went(bare).split(', transfer')[0]}) + transfer {linked.makespan - bare.makespan:+.3f} + "
            f"dispatch {full.makespan - linked.makespan:+.3f} + unmodelled overhead {measured - full.makespan:+.3f}")


def mimo_summary(points):
    """Per point, the best MIMO-style row against the best MPipe row, the goal (``GOALS``) met or missed, and
    where a goal is missed where both rows' time went (markdown lines)."""
    lines = ["", "Per point: the best MIMO-style row ((n), (o)) against the best MPipe row ((d) to (h)): MPipe / "
             "MIMO = MIMO step / MPipe step (above 1: MPipe faster); the goal: at least 1.10 where the tower's cost "
             "varies per micro-batch, 0.97 at fixed-cost points.", "",
             "| M | P | Pf ms | best MIMO-style | step s | best MPipe | step s | MPipe / MIMO | goal |",
             "|---|---|---|---|---|---|---|---|---|"]
    misses = []
    for rows, _, _ in points:
        m, mode, pf = rows[0].point
        best = {family: min((row for row in rows if row.family == family and row.measured is not None),
                            key=lambda row: row.measured, default=None) for family in ("mimo", "mpipe")}
        if best["mimo"] is None or best["mpipe"] is None:
            continue
        goal = GOALS["varying" in mode]
        ratio = best["mimo"].measured / best["mpipe"].measured
        met = ratio >= goal
        lines.append(f"| {m} | {mode} | {pf:g} | {best['mimo'].name} | {best['mimo'].measured:.3f} | "
                     f"{best['mpipe'].name} | {best['mpipe'].measured:.3f} | {ratio:.3f} | "
                     f"{'met' if met else 'MISSED'} ({goal:.2f}) |")
        if not met:
            misses.append(f"- M = {m} {mode} Pf = {pf:g} ms: MPipe {best['mpipe'].name}: "
                          f"{best['mpipe'].split or 'n/a'}; MIMO-style {best['mimo'].name}: "
                          f"{best['mimo'].split or 'n/a'}")
    if misses:
        lines += ["", "Where the goal is missed, where each step went (the simulator on the row's own order with "
                  "this run's measured latency and dispatch; bubble per rank of the order with no overhead):", ""]
    return lines + misses
