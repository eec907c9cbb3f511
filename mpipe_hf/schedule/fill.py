"""Bubble filling for a frozen preprocess: each transposed forward goes where its owner would otherwise wait,
not in a prefix, and the next step's go into this step's idle time (SPEC.md, "How the schedule is built"
gives the prefix this replaces).

A frozen ``P`` has no backward and no graph, so its forward on micro ``m`` can run anywhere on the owner before
rank 0 needs the features, at the stage-0 ``F`` of ``m``; and since its weights do not change between steps, the
forward of the *next* step's micro ``m`` (numbered ``M + m`` here) can run in this step, its data and features
kept on rank 0 for the next step. A *group* is what one micro needs off the body: on its owner ``DATA_LOAD``,
``TRANSPOSE_FWD`` and (remote owner) ``DATA_SEND``, ``FWD_SEND``; on rank 0 the matching ``DATA_RECV``,
``FWD_RECV``, placed before the micro's ``F(0, m)`` (a next-step micro: by the end of the step) and in the owner's
order of messages to rank 0.

Starting from a given placement, a greedy pass moves each group (latest micro first) to the position,
among the places where the simulator shows its owner waiting, that gives the shortest simulated step; groups of
one owner keep ascending order, so every pair of ranks still posts its sends and receives in one order. Only
positions change: the numerics are those of the prefix placement.
"""

from __future__ import annotations

from .actions import RECV_KINDS, Action, Kind
from .config import ScheduleConfig
from .simulate import Costs, Deadlock, simulate

GROUP_KINDS = frozenset({Kind.DATA_LOAD, Kind.TRANSPOSE_FWD, Kind.DATA_SEND, Kind.DATA_RECV, Kind.FWD_SEND,
                         Kind.FWD_RECV})
_EPS = 1e-12


def _groups(cfg: ScheduleConfig, micros: list[int]) -> dict[int, list[tuple[int, list[Action]]]]:
    """``{rank: [(micro, actions), ...]}``: each rank's movable groups, ascending micro (``micro >= M``: the next
    step's ``micro - M``, owned by the next step's owner, ``cfg.owner(micro)``)."""
    out: dict[int, list[tuple[int, list[Action]]]] = {r: [] for r in range(cfg.pp_size)}
    for m in micros:
        owner = cfg.owner(m)
        work = [Action(Kind.DATA_LOAD, m), Action(Kind.TRANSPOSE_FWD, m)]
        if owner:
            work += [Action(Kind.DATA_SEND, m, peer=0), Action(Kind.FWD_SEND, m, peer=0)]
        out[owner].append((m, work))
    return out


def _receive_slots(cfg, bare, groups, pos, need):
    """Where rank 0 receives each remote micro's group: before ``need[m]``, and between the same two body
    messages from the owner as the owner's group sits between (one channel per direction carries both, so the
    two sides must agree on the order). ``None`` when no such place exists (the owner sends too late)."""
    slots = {}
    for owner in range(1, cfg.pp_size):
        sends = [i for i, a in enumerate(bare[owner]) if a.peer == 0 and a.kind not in RECV_KINDS]
        recvs = [i for i, a in enumerate(bare[0]) if a.peer == owner and a.kind in RECV_KINDS]
        for m, _ in groups[owner]:
            k = sum(1 for i in sends if i < pos[m])  # body messages the owner sent before this group
            slot = min(need[m], recvs[k] if k < len(recvs) else len(bare[0]))
            if k and slot <= recvs[k - 1]:
                return None
            slots[m] = (slot, [Action(Kind.DATA_RECV, m, peer=owner), Action(Kind.FWD_RECV, m, peer=owner)])
    return slots


def _assemble(bare, groups, pos, receives):
    """Orders with every group inserted before ``bare[rank][pos[m]]`` (rank 0's receives at ``receives``), and for
    every emitted action the bare index it sits before (``at``)."""
    orders, at = {}, {}
    for rank, actions in bare.items():
        slots: dict[int, list[tuple[int, list[Action]]]] = {}
        for m, work in groups[rank]:
            slots.setdefault(pos[m], []).append((m, work))
        for m, (index, work) in (receives.items() if rank == 0 else ()):
            slots.setdefault(index, []).append((m, work))
        order, where = [], []
        for i in range(len(actions) + 1):
            for _, work in sorted(slots.get(i, []), key=lambda item: item[0]):
                order += work
                where += [i] * len(work)
            if i < len(actions):
                order.append(actions[i])
                where.append(i)
        orders[rank], at[rank] = order, where
    return orders, at


def place_groups(cfg: ScheduleConfig, orders: dict[int, list[Action]], costs: Costs | None = None,
                 own: bool = True, ahead: bool = False, passes: int = 1) -> dict[int, list[Action]]:
    """Place the groups of this step's micros (``own``; absent: their data and features are already on rank 0)
    and of the next step's (``ahead``) into ``orders``, a lowered frozen-``P`` schedule, under ``costs`` (unit
    costs when ``None``). This step's groups start where ``orders`` loads them, the next step's at the owners'
    ends; then the greedy pass of the module docstring moves them.

    Raises:
        ValueError: ``cfg.preprocess`` is not ``"frozen"``.
    """
    if cfg.preprocess != "frozen":
        raise ValueError(f"bubble filling moves the forwards of a frozen preprocess; preprocess is "
                         f"{cfg.preprocess!r} (use placement 'prefix')")
    costs, n = costs or Costs(), cfg.num_micro
    bare = {r: [a for a in actions if a.kind not in GROUP_KINDS] for r, actions in orders.items()}
    groups = _groups(cfg, (list(range(n)) if own else []) + (list(range(n, 2 * n)) if ahead else []))
    need = {a.micro: i for i, a in enumerate(bare[0]) if a.kind is Kind.F and a.stage == 0}
    need.update({m: len(bare[0]) for m in range(n, 2 * n)})
    pos = {m: len(bare[cfg.owner(m)]) for m in range(n, 2 * n)}
    for actions in orders.values():  # this step's groups start where the given schedule loads them
        count = 0
        for a in actions:
            if a.kind is Kind.DATA_LOAD:
                pos[a.micro] = count
            elif a.kind not in GROUP_KINDS:
                count += 1

    def build(trial):
        receives = _receive_slots(cfg, bare, groups, trial, need)
        return None if receives is None else _assemble(bare, groups, trial, receives)

    def makespan(trial):
        built = build(trial)
        try:
            return float("inf") if built is None else simulate(built[0], costs).makespan
        except Deadlock:
            return float("inf")
    best = makespan(pos)
    for _ in range(passes):
        for rank in range(cfg.pp_size):
            micros = [m for m, _ in groups[rank]]
            for k in reversed(range(len(micros))):
                m = micros[k]
                lo = pos[micros[k - 1]] if k else 0
                hi = min(pos[micros[k + 1]] if k + 1 < len(micros) else len(bare[rank]),
                         need[m] if rank == 0 else len(bare[rank]))
                current, at = build(pos)
                events = simulate(current, costs).timeline[rank]
                waits = {at[rank][i] for i, e in enumerate(events)
                         if e.action.kind in RECV_KINDS and e.end - e.start > _EPS}
                for candidate in sorted(c for c in waits | {lo, hi} if lo <= c <= hi and c != pos[m]):
                    trial = {**pos, m: candidate}
                    span = makespan(trial)
                    if span < best - _EPS:
                        best, pos = span, trial
    return build(pos)[0]


def carried_facts(cfg: ScheduleConfig) -> dict[int, set]:
    """What rank 0 holds at the start of a step whose micros were loaded and preprocessed the step before."""
    return {0: {(kind, m) for m in range(cfg.num_micro) for kind in ("data", "feat")}}
