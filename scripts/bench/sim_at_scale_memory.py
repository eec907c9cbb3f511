"""Per-rank memory of a simulated schedule for ``sim_at_scale.py``: ZeRO-1 parameter state plus the activation
peak the action order holds (the walk of ``mpipe_hf.train.plan``'s memory plan, with zero-bubble's ``W`` and the
held inputs added)."""

from __future__ import annotations

from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.schedule.actions import Kind
from mpipe_hf.schedule.hardware import Estimate, zero1_state_bytes
from mpipe_hf.schedule.tune import Profile

W_KIND = getattr(Kind, "W", None)


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


def rank_memory(est: Estimate, variant, cfg: ScheduleConfig, layout: list[int], tower: str, dp: int,
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


def state_floor(est: Estimate, pp: int, dp: int) -> float:
    """A lower bound of the fullest rank's parameter state: the trained parameters spread evenly over ``pp``."""
    total = est.profile.num_layers * est.layer_params + est.embed_params + est.head_params
    return zero1_state_bytes(total / pp, dp)
