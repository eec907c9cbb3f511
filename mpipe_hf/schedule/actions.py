"""The action IR of a pipeline schedule (SPEC.md, "Actions").

An action is ``(kind, micro, stage, peer)``. It prints compactly, in the manner of
``torch.distributed.pipelining``: ``2F0`` is the forward of stage 2 on micro-batch 0, ``1SEND_F3@2`` sends
stage 1's output for micro 3 to rank 2, ``DATA_RECV5@1`` receives micro 5's raw inputs from rank 1, and
``PARAM_BROADCAST`` has neither micro nor stage. :func:`format_schedule` and :func:`parse_schedule` turn a
whole schedule into CSV text (one row per rank) and back.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Kind(str, enum.Enum):
    """Action kinds. Body kinds come from interleaved 1F1B; the rest are MPipe's (SPEC.md, "Actions")."""

    F = "F"
    B = "B"
    W = "W"  # zero-bubble: the weight gradient of a split backward (:mod:`.zero_bubble`)
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    PARAM_BROADCAST = "PARAM_BROADCAST"
    DATA_LOAD = "DATA_LOAD"
    TRANSPOSE_FWD = "TRANSPOSE_FWD"
    DATA_SEND = "DATA_SEND"
    DATA_RECV = "DATA_RECV"
    FWD_SEND = "FWD_SEND"
    FWD_RECV = "FWD_RECV"
    GRAPH_SEND = "GRAPH_SEND"
    GRAPH_RECV = "GRAPH_RECV"
    TRANSPOSE_BWD = "TRANSPOSE_BWD"
    GRAD_SEND = "GRAD_SEND"
    GRAD_RECV = "GRAD_RECV"  # owner-backward: the feature gradient; the owner backprops it in TRANSPOSE_BWD
    GRAD_REDUCE = "GRAD_REDUCE"
    SWAP_SET_GROUP = "SWAP_SET_GROUP"  # activation swap (:mod:`.swap`): local to the rank, no message
    SWAP_LAUNCH_OFFLOAD = "SWAP_LAUNCH_OFFLOAD"
    SWAP_WAIT_OFFLOAD = "SWAP_WAIT_OFFLOAD"
    SWAP_LAUNCH_LOAD = "SWAP_LAUNCH_LOAD"
    SWAP_WAIT_LOAD = "SWAP_WAIT_LOAD"


BODY_KINDS = frozenset({Kind.F, Kind.B, Kind.W, Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B})
COMPUTE_KINDS = frozenset({Kind.F, Kind.B, Kind.W, Kind.TRANSPOSE_FWD, Kind.TRANSPOSE_BWD})
COLLECTIVE_KINDS = frozenset({Kind.PARAM_BROADCAST, Kind.GRAD_REDUCE})
# Point-to-point kinds: sender kind -> (receiver kind, channel name of the message).
SEND_TO_RECV = {
    Kind.SEND_F: Kind.RECV_F,
    Kind.SEND_B: Kind.RECV_B,
    Kind.DATA_SEND: Kind.DATA_RECV,
    Kind.FWD_SEND: Kind.FWD_RECV,
    Kind.GRAPH_SEND: Kind.GRAPH_RECV,
    Kind.GRAD_SEND: Kind.GRAD_RECV,
}
RECV_KINDS = frozenset(SEND_TO_RECV.values())

_PATTERN = re.compile(r"^(\d*)([A-Z_]+?)(\d*)(?:@(\d+))?$")


@dataclass(frozen=True, order=True)
class Action:
    """One step of one rank's schedule.

    Attributes:
        kind: what to do.
        micro: micro-batch index, or ``None`` for per-step actions (``PARAM_BROADCAST``, ``GRAD_REDUCE``).
        stage: pipeline stage index for body actions, else ``None``.
        peer: the other rank of a point-to-point action (in the pipeline group), else ``None``.
    """

    kind: Kind
    micro: int | None = None
    stage: int | None = None
    peer: int | None = None

    def __str__(self) -> str:
        stage = "" if self.stage is None else str(self.stage)
        micro = "" if self.micro is None else str(self.micro)
        peer = "" if self.peer is None else f"@{self.peer}"
        return f"{stage}{self.kind.value}{micro}{peer}"

    __repr__ = __str__

    @classmethod
    def parse(cls, text: str) -> "Action":
        """Parse the form printed by ``str(action)``; raises ``ValueError`` on anything else."""
        match = _PATTERN.match(text.strip())
        if match is None or match.group(2) not in Kind.__members__:
            raise ValueError(f"cannot parse action {text!r}; expected e.g. '2F0', '1SEND_F3@2', 'DATA_LOAD4'")
        stage, kind, micro, peer = match.groups()
        return cls(Kind(kind), int(micro) if micro else None, int(stage) if stage else None,
                   int(peer) if peer else None)

    def message(self) -> tuple:
        """The identity of the message a point-to-point action carries, equal on both ends.

        A ``SEND_F`` of stage ``s`` and the ``RECV_F`` of stage ``s + 1`` carry ``("F", s, m)``; a ``SEND_B`` of
        stage ``s`` and the ``RECV_B`` of stage ``s - 1`` carry ``("B", s, m)``; MPipe transfers carry
        ``(kind, m)``.
        """
        if self.kind in (Kind.SEND_F, Kind.SEND_B):
            return (self.kind.value[-1], self.stage, self.micro)
        if self.kind is Kind.RECV_F:
            return ("F", self.stage - 1, self.micro)
        if self.kind is Kind.RECV_B:
            return ("B", self.stage + 1, self.micro)
        if self.kind in SEND_TO_RECV or self.kind in RECV_KINDS:
            return (self.kind.value.split("_")[0], self.micro)
        raise ValueError(f"{self} is not a point-to-point action")


def format_schedule(orders: dict[int, list[Action]]) -> str:
    """CSV text of a schedule: one line per rank, ``rank,action,action,...``."""
    return "\n".join(f"{rank}," + ",".join(map(str, actions)) for rank, actions in sorted(orders.items())) + "\n"


def parse_schedule(text: str) -> dict[int, list[Action]]:
    """Inverse of :func:`format_schedule`."""
    orders = {}
    for line in text.strip().splitlines():
        rank, *cells = line.split(",")
        orders[int(rank)] = [Action.parse(cell) for cell in cells if cell.strip()]
    return orders
