"""Insert the body's point-to-point transfers into compute orders.

Sends go right after the compute that produces them. Receives are posted in the sender's order: before a compute
that needs a message from rank ``p``, the rank receives every message ``p`` sent it up to and including that one.
So each pair of ranks posts its sends and receives in the same order, by construction (NCCL matches point-to-point
operations by order per pair, never by tag), and a receive never waits longer than its consumer would have.

The owner-backward feature gradients (``GRAD_SEND``, placed by :mod:`.mpipe` right after rank 0's stage-0 ``B``)
are received the same way: an owner's ``TRANSPOSE_BWD`` of micro ``m`` needs ``("GRAD", m)`` from rank 0, and a
gradient that rank 0 sent before a body message is received (``GRAD_RECV``) before that message. The other
MPipe transfers are explicit in the orders and are never passed over.
"""

from __future__ import annotations

from collections import defaultdict

from .actions import RECV_KINDS, SEND_TO_RECV, Action, Kind
from .config import ScheduleConfig


IMPLICIT = ("F", "B", "GRAD")  # the messages whose receives this module places


class ScheduleError(ValueError):
    """A schedule that would hang, mismatch its transfers, or run an action before its inputs exist."""


def _needed_message(cfg: ScheduleConfig, rank: int, action: Action) -> tuple[int, tuple] | None:
    """``(source rank, message)`` a body compute needs from another rank, or ``None``."""
    if action.kind is Kind.F and action.stage > 0:
        src = cfg.stage_rank(action.stage - 1)
        return (src, ("F", action.stage - 1, action.micro)) if src != rank else None
    if action.kind is Kind.TRANSPOSE_BWD and rank != 0:  # owner-backward: the gradient comes from rank 0
        return 0, ("GRAD", action.micro)
    backward = action.kind is Kind.B or (action.kind is Kind.W and not cfg.needs_input_grad(action.stage))
    if backward and action.stage < cfg.num_stages - 1:
        src = cfg.stage_rank(action.stage + 1)
        return (src, ("B", action.stage + 1, action.micro)) if src != rank else None
    return None


def _recv_for(message: tuple, src: int) -> Action:
    if message[0] == "GRAD":
        return Action(Kind.GRAD_RECV, message[1], peer=src)
    kind, stage, micro = message
    if kind == "F":
        return Action(Kind.RECV_F, micro, stage + 1, src)
    return Action(Kind.RECV_B, micro, stage - 1, src)


def _with_sends(cfg: ScheduleConfig, rank: int, actions: list[Action]) -> list[Action]:
    out = []
    for action in actions:
        out.append(action)
        if action.kind is Kind.F and action.stage < cfg.num_stages - 1:
            dst = cfg.stage_rank(action.stage + 1)
            if dst != rank:
                out.append(Action(Kind.SEND_F, action.micro, action.stage, dst))
        elif action.kind is Kind.B and action.stage > 0:
            dst = cfg.stage_rank(action.stage - 1)
            if dst != rank:
                out.append(Action(Kind.SEND_B, action.micro, action.stage, dst))
    return out


def add_transfers(cfg: ScheduleConfig, orders: dict[int, list[Action]]) -> dict[int, list[Action]]:
    """Return ``orders`` with ``SEND_F``/``SEND_B``/``RECV_F``/``RECV_B`` inserted (see the module docstring).

    Explicit MPipe transfers already in ``orders`` are kept where they are and take their place in each pair's
    message sequence.

    Raises:
        ScheduleError: if an explicit receive does not match its sender's order.
    """
    orders = {r: _with_sends(cfg, r, actions) for r, actions in orders.items()}
    channels: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    for src, actions in orders.items():
        for action in actions:
            if action.kind in SEND_TO_RECV:
                channels[(src, action.peer)].append(action.message())
    lowered = {}
    for dst, actions in orders.items():
        position: dict[int, int] = defaultdict(int)
        received = set()
        out = []
        for action in actions:
            if action.kind in RECV_KINDS:
                queue, i = channels[(action.peer, dst)], position[action.peer]
                if i >= len(queue) or queue[i] != action.message():
                    raise ScheduleError(f"rank {dst}: {action} does not match rank {action.peer}'s send order "
                                        f"(next message is {queue[i] if i < len(queue) else None})")
                position[action.peer] += 1
            need = _needed_message(cfg, dst, action)
            if need is not None and need not in received:
                src, message = need
                queue = channels[(src, dst)]
                while True:
                    i = position[src]
                    if i >= len(queue) or queue[i][0] not in IMPLICIT:
                        raise ScheduleError(f"rank {dst}: {action} needs {message} from rank {src}, "
                                            f"which rank {src} never sends before {queue[i:i + 1]}")
                    out.append(_recv_for(queue[i], src))
                    received.add((src, queue[i]))
                    position[src] += 1
                    if queue[i] == message:
                        break
            out.append(action)
        lowered[dst] = out
    return lowered
