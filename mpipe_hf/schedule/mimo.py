"""A MIMO-style layout as a schedule the simulator runs: the vision tower on ranks of its own, the text model on the
others (Megatron's MIMO: the encoder on separate ranks, its features sent to the language model's first stage and
their gradient sent back).

``towers`` ranks (``0 .. towers - 1``) run only the tower: each runs the ``TRANSPOSE_FWD`` of the micro-batches it
is given and sends their features (``FWD_SEND``) to the rank of text stage 0; when the tower trains, it receives
each feature gradient (``GRAD_RECV``) and runs the ``TRANSPOSE_BWD``. The text ranks (``towers .. R - 1``) run any
body schedule (:func:`~.build_schedule` of an ``identity`` config: interleaved 1F1B, zero-bubble), with a
``FWD_RECV`` before stage 0's first forward of each micro-batch and, when the tower trains, a ``GRAD_SEND`` after
stage 0's backward of it. The tower's costs are :class:`~.simulate.Costs`' ``preprocess_forward`` and
``preprocess_backward`` (weighted per micro-batch by ``micro_preprocess_weights``), the transfers' ``FWD`` and
``GRAD`` channels.
"""

from __future__ import annotations

from .actions import COLLECTIVE_KINDS, Action, Kind
from .simulate import Costs, Deadlock, simulate


def tower_owners(num_micro: int, towers: int, weights: tuple[float, ...] | None = None) -> list[int]:
    """Which tower rank runs each micro-batch: in micro order, the one whose queue ends earliest (list scheduling
    over the per-micro tower ``weights``; uniform when ``None``, which is round robin). Raises ``ValueError`` when
    ``towers < 1``."""
    if towers < 1:
        raise ValueError(f"a MIMO-style layout needs at least one tower rank, got {towers}")
    busy = [0.0] * towers
    owners = []
    for m in range(num_micro):
        t = min(range(towers), key=lambda k: (busy[k], k))
        busy[t] += 1.0 if weights is None else weights[m]
        owners.append(t)
    return owners


def _stage0_backward(order: list[Action]) -> dict[int, int]:
    """``{micro: index of the last backward action (B or W) of stage 0 for it}`` in ``order``."""
    last = {}
    for i, a in enumerate(order):
        if a.stage == 0 and a.kind in (Kind.B, Kind.W):
            last[a.micro] = i
    return last


def _text_rank(text: dict[int, list[Action]], owners: list[int], towers: int, rank: int,
               trainable: bool) -> list[Action]:
    """Text rank ``rank``'s actions with peers shifted past the towers, a ``FWD_RECV`` before each stage-0 first
    forward and (``trainable``) a ``GRAD_SEND`` after each stage-0 backward."""
    order, out, received = text[rank], [], set()
    backward = _stage0_backward(order) if trainable else {}
    for i, a in enumerate(order):
        if a.kind in COLLECTIVE_KINDS:
            raise ValueError(f"text rank {rank} has the collective {a}: a MIMO-style layout takes a body schedule "
                             f"without collectives (the tower ranks would not reach them)")
        if a.stage == 0 and a.kind is Kind.F and a.micro not in received:
            received.add(a.micro)
            out.append(Action(Kind.FWD_RECV, a.micro, None, owners[a.micro]))
        out.append(a if a.peer is None else Action(a.kind, a.micro, a.stage, a.peer + towers))
        if backward.get(a.micro) == i:
            out.append(Action(Kind.GRAD_SEND, a.micro, None, owners[a.micro]))
    return out


def mimo_orders(text: dict[int, list[Action]], towers: int, trainable: bool, owners: list[int] | None = None,
                lead: int | None = None) -> dict[int, list[Action]]:
    """The whole MIMO-style schedule: ranks ``0 .. towers - 1`` the tower, ``towers ..`` the text ranks of
    ``text`` (a body schedule whose stage 0 is on its rank 0, without collectives).

    Args:
        text: ``{rank: actions}`` of the text pipeline, ranks from 0.
        towers: tower ranks ``K >= 1``.
        trainable: the tower has a backward (feature gradients come back).
        owners: the tower rank of each micro-batch (default :func:`tower_owners`'s round robin).
        lead: how many of its forwards a tower rank runs before its first backward, then one forward per
            backward (``None``: every forward first).

    Raises:
        ValueError: ``towers < 1``; a text rank with a collective; text stage 0 not on text rank 0.
    """
    micros = sorted({a.micro for a in text[0] if a.stage == 0 and a.kind is Kind.F})
    if not micros:
        raise ValueError("text rank 0 runs no forward of stage 0: put the text model's first stage on its rank 0")
    owners = owners or tower_owners(len(micros), towers)
    orders = {t: [] for t in range(towers)}
    for rank in text:
        orders[rank + towers] = _text_rank(text, owners, towers, rank, trainable)
    grads = [a.micro for a in orders[towers] if a.kind is Kind.GRAD_SEND]
    for t in range(towers):
        mine = [m for m in micros if owners[m] == t]
        back = [m for m in grads if owners[m] == t]
        ahead = len(mine) if lead is None or not trainable else max(1, lead)
        for i, m in enumerate(mine):
            orders[t] += [Action(Kind.TRANSPOSE_FWD, m), Action(Kind.FWD_SEND, m, None, towers)]
            if i + 1 >= ahead and back:
                m_back = back.pop(0)
                orders[t] += [Action(Kind.GRAD_RECV, m_back, None, towers), Action(Kind.TRANSPOSE_BWD, m_back)]
        for m_back in back:
            orders[t] += [Action(Kind.GRAD_RECV, m_back, None, towers), Action(Kind.TRANSPOSE_BWD, m_back)]
    return orders


def best_mimo(text: dict[int, list[Action]], towers: int, trainable: bool, costs: Costs,
              leads: tuple[int | None, ...] = (None, 1, 2, 4, 8)):
    """The fastest of :func:`mimo_orders` over the towers' ``leads`` (their micro-batches given by
    :func:`tower_owners` over ``costs.micro_preprocess_weights``): ``(simulation, orders, lead)``, leads that
    deadlock skipped (every forward first never does). ``costs``' body costs are the text stages'; raises as
    :func:`mimo_orders` does."""
    micros = 1 + max(a.micro for a in text[0] if a.micro is not None)
    owners = tower_owners(micros, towers, costs.micro_preprocess_weights)
    best = None
    for lead in leads if trainable else (None,):
        orders = mimo_orders(text, towers, trainable, owners, lead)
        try:
            sim = simulate(orders, costs)
        except Deadlock:  # a lead shorter than the text pipeline's warm-up: its first gradient never comes
            continue
        if best is None or sim.makespan < best[0].makespan:
            best = (sim, orders, lead)
    return best
