"""Static validation of a lowered schedule, by running it symbolically (SPEC.md, "How the schedule is built").

Checks, raising :class:`ScheduleError` on the first failure:

- each rank runs ``F`` and ``B`` exactly once per (its stage, micro), every ``F`` before its ``B``; in a
  zero-bubble schedule also one ``W`` per (stage, micro), after its ``B`` (or alone, where the stage's inputs
  need no gradient: :meth:`~.config.ScheduleConfig.needs_input_grad`);
- per pair of ranks, the sequence of sends equals the sequence of receives;
- a symbolic run in which sends never block, receives wait for their message, and collectives wait for every
  rank, finishes: every action's inputs exist before it runs, and nothing hangs;
- each swapped ``(stage, micro)`` has its five swap actions once each, ``SWAP_SET_GROUP`` right before its ``F``
  and the rest in order between ``F`` and ``B`` (:mod:`.swap`).
"""

from __future__ import annotations

from collections import defaultdict, deque

from .actions import COLLECTIVE_KINDS, RECV_KINDS, SEND_TO_RECV, Action, Kind
from .config import ScheduleConfig
from .lowering import ScheduleError
from .swap import first_backward


def _requires(cfg: ScheduleConfig, a: Action) -> list[tuple]:
    """Facts that must hold on the acting rank before ``a`` runs."""
    m, s = a.micro, a.stage
    if a.kind is Kind.F:
        if s > 0:
            return [("act", s - 1, m)]
        return [("data", m)] + ([("feat", m)] if cfg.transposed else [])
    if a.kind is Kind.B or (a.kind is Kind.W and not cfg.needs_input_grad(s)):
        return [("fwd", s, m)] + ([("grad", s + 1, m)] if s < cfg.num_stages - 1 else [])
    if a.kind is Kind.W:
        return [("input_grad", s, m)]
    return {
        Kind.SEND_F: [("act", s, m)],
        Kind.SEND_B: [("grad", s, m)],
        Kind.TRANSPOSE_FWD: [("pin", m)] + ([("params",)] if cfg.trains_preprocess else []),
        Kind.DATA_SEND: [("data", m)],
        Kind.FWD_SEND: [("feat", m)],
        Kind.GRAPH_SEND: [("pin", m)],
        Kind.TRANSPOSE_BWD: [("grad", 0, m), ("kept", m) if cfg.owner_backward else ("pin", m)],
        Kind.GRAD_SEND: [("grad", 0, m)],
    }.get(a.kind, [])


def _produces(cfg: ScheduleConfig, a: Action) -> list[tuple]:
    """Facts that hold on the acting rank after ``a`` ran."""
    m, s = a.micro, a.stage
    return {
        Kind.F: [("act", s, m), ("fwd", s, m)],
        Kind.B: [("grad", s, m), ("input_grad", s, m)],
        Kind.RECV_F: [("act", s - 1 if s is not None else None, m)],
        Kind.RECV_B: [("grad", s + 1 if s is not None else None, m)],
        Kind.GRAD_RECV: [("grad", 0, m)],
        Kind.DATA_LOAD: [("data", m), ("pin", m)],
        Kind.TRANSPOSE_FWD: [("feat", m)] + ([("kept", m)] if cfg.owner_backward else []),
        Kind.DATA_RECV: [("data", m)],
        Kind.FWD_RECV: [("feat", m)],
        Kind.GRAPH_RECV: [("pin", m)],
        Kind.PARAM_BROADCAST: [("params",)],
    }.get(a.kind, [])


def _check_counts(cfg: ScheduleConfig, orders: dict[int, list[Action]]) -> None:
    for rank, actions in orders.items():
        seen: dict[tuple, int] = {}
        for i, a in enumerate(actions):
            if a.kind in (Kind.F, Kind.B, Kind.W):
                if cfg.stage_rank(a.stage) != rank:
                    raise ScheduleError(f"rank {rank} runs {a}, but stage {a.stage} lives on rank "
                                        f"{cfg.stage_rank(a.stage)}")
                key = (a.kind, a.stage, a.micro)
                if key in seen:
                    raise ScheduleError(f"rank {rank} runs {a} twice")
                if a.kind is not Kind.F and (Kind.F, a.stage, a.micro) not in seen:
                    raise ScheduleError(f"rank {rank} runs {a} before its forward")
                seen[key] = i
        expected = set()
        for s in range(rank, cfg.num_stages, cfg.pp_size):
            kinds = [Kind.F] + ([Kind.B] if not cfg.zero_bubble or cfg.needs_input_grad(s) else []) + (
                [Kind.W] if cfg.zero_bubble else [])
            expected |= {(k, s, m) for k in kinds for m in range(cfg.num_micro)}
        if set(seen) - expected:
            extra = sorted(f"{s}{k.value}{m}" for k, s, m in set(seen) - expected)
            raise ScheduleError(f"rank {rank} runs body actions its schedule has no place for: {extra[:8]}")
        if set(seen) != expected:
            missing = sorted(f"{s}{k.value}{m}" for k, s, m in expected - set(seen))
            raise ScheduleError(f"rank {rank} misses body actions {missing[:8]}")


def _check_channels(orders: dict[int, list[Action]]) -> None:
    sends, recvs = defaultdict(list), defaultdict(list)
    for rank, actions in orders.items():
        for a in actions:
            if a.kind in SEND_TO_RECV:
                sends[(rank, a.peer)].append(a.message())
            elif a.kind in RECV_KINDS:
                recvs[(a.peer, rank)].append(a.message())
    for pair in set(sends) | set(recvs):
        if sends[pair] != recvs[pair]:
            raise ScheduleError(f"ranks {pair[0]}->{pair[1]}: sends {sends[pair]} but receives {recvs[pair]}")


SWAP_ORDER = (Kind.SWAP_SET_GROUP, Kind.F, Kind.SWAP_LAUNCH_OFFLOAD, Kind.SWAP_WAIT_OFFLOAD, Kind.SWAP_LAUNCH_LOAD,
              Kind.SWAP_WAIT_LOAD)


def _check_swaps(orders: dict[int, list[Action]]) -> None:
    for rank, actions in orders.items():
        where: dict[tuple, list[int]] = defaultdict(list)
        for i, a in enumerate(actions):
            where[(a.kind, a.stage, a.micro)].append(i)
        groups = {(a.stage, a.micro) for a in actions if a.kind.value.startswith("SWAP_")}
        backward = first_backward(actions)
        for s, m in sorted(groups):
            at = [where.get((k, s, m), []) for k in SWAP_ORDER] + [[backward[(s, m)]] if (s, m) in backward else []]
            if any(len(p) != 1 for p in at):
                counts = {k.value: len(p) for k, p in zip(SWAP_ORDER, at)}
                raise ScheduleError(f"rank {rank}: stage {s} micro {m} needs each swap action once, with its F and "
                                    f"B; counts {counts}")
            pos = [p[0] for p in at]
            if pos != sorted(pos) or pos[1] != pos[0] + 1:
                raise ScheduleError(f"rank {rank}: stage {s} micro {m}'s swap actions are out of order: "
                                    f"{[str(actions[i]) for i in pos]} (SWAP_SET_GROUP right before F, the others "
                                    f"in this order before B)")


def run_symbolic(cfg: ScheduleConfig, orders: dict[int, list[Action]],
                 initial: dict[int, set] | None = None) -> list[tuple[int, Action]]:
    """Run the schedule symbolically from the facts ``initial`` (``{rank: {fact, ...}}``, e.g. micro-batches
    carried over from the previous step); return the global order in which actions completed.

    Raises:
        ScheduleError: when an action's inputs never appear (a missing dependency or a hang).
    """
    facts = {r: set((initial or {}).get(r, ())) for r in orders}
    pc = {r: 0 for r in orders}
    wire: dict[tuple[int, int], deque] = defaultdict(deque)
    trace = []
    total = sum(len(a) for a in orders.values())
    while len(trace) < total:
        progressed = False
        for rank, actions in orders.items():
            while pc[rank] < len(actions):
                a = actions[pc[rank]]
                if a.kind in COLLECTIVE_KINDS:
                    break
                if any(f not in facts[rank] for f in _requires(cfg, a)):
                    break
                if a.kind in RECV_KINDS:
                    queue = wire[(a.peer, rank)]
                    if not queue or queue[0] != a.message():
                        break
                    queue.popleft()
                if a.kind in SEND_TO_RECV:
                    wire[(rank, a.peer)].append(a.message())
                facts[rank].update(_produces(cfg, a))
                trace.append((rank, a))
                pc[rank] += 1
                progressed = True
        heads = [orders[r][pc[r]] if pc[r] < len(orders[r]) else None for r in orders]
        if all(h is not None and h.kind in COLLECTIVE_KINDS for h in heads):
            if len({h.kind for h in heads}) != 1:
                raise ScheduleError(f"ranks enter different collectives at once: {heads}")
            for rank in orders:
                facts[rank].update(_produces(cfg, heads[rank]))
                trace.append((rank, heads[rank]))
                pc[rank] += 1
            progressed = True
        if not progressed:
            stuck = {r: str(h) for r, h in enumerate(heads) if h is not None}
            raise ScheduleError(f"schedule hangs; each rank's next action: {stuck}")
    return trace


def validate(cfg: ScheduleConfig, orders: dict[int, list[Action]], initial: dict[int, set] | None = None) -> None:
    """Run every static check (see the module docstring) from the facts ``initial``. Raises
    :class:`ScheduleError`."""
    if sorted(orders) != list(range(cfg.pp_size)):
        raise ScheduleError(f"schedule has ranks {sorted(orders)}, expected 0..{cfg.pp_size - 1}")
    _check_counts(cfg, orders)
    _check_channels(orders)
    _check_swaps(orders)
    run_symbolic(cfg, orders, initial)
