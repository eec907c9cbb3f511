"""MPipe Transpose layering on top of the interleaved 1F1B body (SPEC.md, "How the schedule is built").

The preprocess ``P`` runs on the owner of each micro-batch during that rank's warm-up idle time. Each rank's
order is: prefix (broadcast, loads, transposed forwards, type-major transfers to rank 0), then the body, with
rank 0's patch (overflow loads in mode ``min``, ``TRANSPOSE_BWD`` after each stage-0 backward for a trainable
``P``).
"""

from __future__ import annotations

from .actions import Action, Kind
from .config import ScheduleConfig
from .interleaved import body_order
from .lowering import add_transfers
from .validate import validate


def prefix(cfg: ScheduleConfig, rank: int) -> list[Action]:
    """Rank ``rank``'s prefix: ``PARAM_BROADCAST`` (trainable ``P``), its loads and transposed forwards, then the
    transfers to or from rank 0 in type-major order (data, then ``P`` outputs, then ``P`` inputs), each ascending.
    """
    out = [Action(Kind.PARAM_BROADCAST)] if cfg.trainable else []
    mine = cfg.owned(rank) if cfg.overflow == "full" else ([rank] if rank < cfg.num_owners else [])
    for m in mine:
        out += [Action(Kind.DATA_LOAD, m), Action(Kind.TRANSPOSE_FWD, m)]
    kinds = [(Kind.DATA_SEND, Kind.DATA_RECV), (Kind.FWD_SEND, Kind.FWD_RECV)]
    if cfg.trainable:
        kinds.append((Kind.GRAPH_SEND, Kind.GRAPH_RECV))
    if rank != 0:
        out += [Action(send, m, peer=0) for send, _ in kinds for m in mine]
    else:
        remote = [m for m in range(cfg.num_micro) if cfg.owner(m) != 0]
        out += [Action(recv, m, peer=cfg.owner(m)) for _, recv in kinds for m in remote]
    return out


def patch_rank0(cfg: ScheduleConfig, body: list[Action]) -> list[Action]:
    """Rank 0's body with the inline overflow loads (mode ``min``) and ``TRANSPOSE_BWD`` (trainable ``P``)."""
    out = []
    for action in body:
        if action.kind is Kind.F and action.stage == 0 and cfg.owner(action.micro) == 0 \
                and cfg.overflow == "min" and action.micro >= cfg.num_owners:
            out += [Action(Kind.DATA_LOAD, action.micro), Action(Kind.TRANSPOSE_FWD, action.micro)]
        out.append(action)
        if action.kind is Kind.B and action.stage == 0 and cfg.trainable:
            out.append(Action(Kind.TRANSPOSE_BWD, action.micro))
    return out


def build_schedule(cfg: ScheduleConfig) -> dict[int, list[Action]]:
    """The full, validated MPipe Transpose schedule: ``{rank: [Action, ...]}`` with all transfers in place.

    Raises:
        ScheduleError: if the built schedule fails static validation (a bug, never expected).
    """
    orders = {}
    for rank in range(cfg.pp_size):
        body = body_order(cfg.pp_size, cfg.vpp, cfg.num_micro, rank)
        orders[rank] = prefix(cfg, rank) + (patch_rank0(cfg, body) if rank == 0 else body)
    orders = add_transfers(cfg, orders)
    validate(cfg, orders)
    return orders


def strip_mpipe(orders: dict[int, list[Action]]) -> dict[int, list[Action]]:
    """The plain body (``F``/``B`` only) of a schedule, for comparison with the interleaved 1F1B order."""
    return {r: [a for a in actions if a.kind in (Kind.F, Kind.B)] for r, actions in orders.items()}
