"""MPipe Transpose layering on top of the interleaved 1F1B body (SPEC.md, "How the schedule is built").

The preprocess ``P`` runs on the owner of each micro-batch during that rank's warm-up idle time. Each rank's
order is: prefix (broadcast, loads, transposed forwards, type-major transfers to rank 0), then the body, with
rank 0's patch (overflow loads in mode ``min``; after each stage-0 backward of a trainable ``P``, its
``TRANSPOSE_BWD``, or with owner-backward the ``GRAD_SEND`` of the feature gradient to a remote owner), then,
with owner-backward, the suffix (each owner's ``TRANSPOSE_BWD`` of its micros, ``GRAD_REDUCE``).

Owner-backward's placement differs from SPEC.md ("How the schedule is built", 4), which sends every gradient
after the body. For the zero-bubble trainable target (the backward split into B and W) the gradients go back inline, in each pair's message order
(:mod:`.lowering` receives them), and :func:`~.zero_bubble.place_weights` then moves every ``P`` backward into
its rank's waits.
"""

from __future__ import annotations

import dataclasses

from .actions import Action, Kind
from .config import ScheduleConfig
from .fill import carried_facts, place_groups
from .interleaved import body_order
from .lowering import add_transfers
from .simulate import MICRO_WEIGHT_FIELDS, Costs
from .validate import validate
from .zero_bubble import place_weights, split_backwards


def prefix_micros(cfg: ScheduleConfig, rank: int) -> list[int]:
    """Micros ``rank`` loads in its prefix: all it owns in mode ``full``, only micro ``rank`` in mode ``min``."""
    if cfg.overflow == "full":
        return cfg.owned(rank)
    return [rank] if rank < cfg.num_owners else []


def transfer_kinds(cfg: ScheduleConfig) -> list[tuple[Kind, Kind]]:
    """The owner -> rank 0 transfers of every remote micro, in type-major order: raw data, then ``P``'s output
    (not for an identity ``P``), then ``P``'s input for rank 0's recompute (trainable ``P`` without
    owner-backward)."""
    kinds = [(Kind.DATA_SEND, Kind.DATA_RECV)]
    if cfg.transposed:
        kinds.append((Kind.FWD_SEND, Kind.FWD_RECV))
    if cfg.trains_preprocess and not cfg.owner_backward:
        kinds.append((Kind.GRAPH_SEND, Kind.GRAPH_RECV))
    return kinds


def _load(cfg: ScheduleConfig, micro: int) -> list[Action]:
    return [Action(Kind.DATA_LOAD, micro)] + ([Action(Kind.TRANSPOSE_FWD, micro)] if cfg.transposed else [])


def prefix(cfg: ScheduleConfig, rank: int) -> list[Action]:
    """Rank ``rank``'s prefix: ``PARAM_BROADCAST`` (trainable ``P``), its loads and transposed forwards, then the
    transfers to or from rank 0 in type-major order (:func:`transfer_kinds`), each in ascending micro order."""
    out = [Action(Kind.PARAM_BROADCAST)] if cfg.trains_preprocess else []
    mine = prefix_micros(cfg, rank)
    for m in mine:
        out += _load(cfg, m)
    kinds = transfer_kinds(cfg)
    if rank != 0:
        out += [Action(send, m, peer=0) for send, _ in kinds for m in mine]
    else:
        remote = [m for m in range(cfg.num_micro) if cfg.owner(m) != 0]
        out += [Action(recv, m, peer=cfg.owner(m)) for _, recv in kinds for m in remote]
    return out


def patch_rank0(cfg: ScheduleConfig, body: list[Action]) -> list[Action]:
    """Rank 0's body with the inline overflow loads (mode ``min``) and, after each stage-0 backward of a
    trainable ``P``, ``TRANSPOSE_BWD`` (with owner-backward: for rank 0's own micros, on its kept graph) or the
    ``GRAD_SEND`` of the feature gradient to the micro's owner (owner-backward, remote micros)."""
    inline = set(range(cfg.num_owners, cfg.num_micro)) if cfg.overflow == "min" else set()
    out = []
    for action in body:
        stage0 = action.stage == 0
        if action.kind is Kind.F and stage0 and action.micro in inline:
            out += _load(cfg, action.micro)
        out.append(action)
        if action.kind is Kind.B and stage0 and cfg.trains_preprocess:
            owner = cfg.owner(action.micro) if cfg.owner_backward else 0
            out.append(Action(Kind.TRANSPOSE_BWD, action.micro) if owner == 0 else
                       Action(Kind.GRAD_SEND, action.micro, peer=owner))
    return out


def suffix(cfg: ScheduleConfig, rank: int) -> list[Action]:
    """Owner-backward only: each owner past rank 0 backprops its micros (``TRANSPOSE_BWD``, ascending; the
    lowering receives their gradients), then every rank runs ``GRAD_REDUCE``."""
    if not cfg.owner_backward:
        return []
    own = [Action(Kind.TRANSPOSE_BWD, m) for m in cfg.owned(rank)] if rank != 0 else []
    return own + [Action(Kind.GRAD_REDUCE)]


def this_step_costs(costs: Costs | None, num_micro: int) -> Costs | None:
    """``costs`` with its per-micro weights cut to this step's ``num_micro`` micros: placement ``fill``'s costs
    also weigh the next step's (micros ``M .. 2M - 1``), which the weights are placed before."""
    if costs is None:
        return None
    cut = {name: getattr(costs, name)[:num_micro] for name in MICRO_WEIGHT_FIELDS
           if getattr(costs, name) is not None and len(getattr(costs, name)) > num_micro}
    return dataclasses.replace(costs, **cut) if cut else costs


def build_schedule(cfg: ScheduleConfig, costs: Costs | None = None, own: bool = True,
                   ahead: bool = False) -> dict[int, list[Action]]:
    """The full, validated MPipe Transpose schedule: ``{rank: [Action, ...]}`` with all transfers in place.

    Args:
        costs: the costs the simulator places the transposed forwards (placement ``fill``) and the weight
            gradients (``zero_bubble``'s ``W``, owner-backward's ``TRANSPOSE_BWD``) by (unit costs when
            ``None``); unused otherwise.
        own, ahead: placement ``fill`` only. ``own=False``: this step's micros were loaded and preprocessed by
            the previous step (rank 0 holds their data and features); ``ahead=True``: this step also loads and
            preprocesses the next step's micros (numbered ``M + m``) in its idle time (:mod:`.fill`).

    Raises:
        ValueError: ``own``/``ahead`` other than the defaults without placement ``fill``.
        ScheduleError: if the built schedule fails static validation (a bug, never expected).
    """
    if (not own or ahead) and cfg.placement != "fill":
        raise ValueError("carrying micro-batches across steps (own=False or ahead=True) needs placement 'fill'")
    orders = {}
    for rank in range(cfg.pp_size):
        body = body_order(cfg.pp_size, cfg.vpp, cfg.num_micro, rank, cfg.less_memory)
        body = split_backwards(cfg, body) if cfg.zero_bubble else body
        body = patch_rank0(cfg, body) if rank == 0 else body
        orders[rank] = prefix(cfg, rank) + body + suffix(cfg, rank)
    orders = add_transfers(cfg, orders)
    if cfg.zero_bubble or cfg.owner_backward:
        orders = place_weights(orders, this_step_costs(costs, cfg.num_micro))
    if cfg.placement == "fill":
        orders = place_groups(cfg, orders, costs, own, ahead)
    validate(cfg, orders, None if own else carried_facts(cfg))
    return orders


def strip_mpipe(orders: dict[int, list[Action]]) -> dict[int, list[Action]]:
    """The plain body (``F``/``B`` only; ``W`` dropped) of a schedule, for comparison with the interleaved 1F1B order."""
    return {r: [a for a in actions if a.kind in (Kind.F, Kind.B)] for r, actions in orders.items()}
