"""The forward-only schedule of evaluation: the training schedule with every backward action taken out.

Evaluation runs each micro-batch through the stages once and sums the loss; nothing is kept for a backward. The
schedule is MPipe Transpose's with ``P`` treated as frozen (the owners run it without a graph and ship only its
features, never the pixels) and placement ``prefix``; then ``B``, its transfers, ``TRANSPOSE_BWD``, the feature
gradients, ``GRAD_REDUCE`` and ``PARAM_BROADCAST`` are removed. Removing actions only removes waits: every
forward still follows the forwards and transfers it reads, in the order the training schedule proved
deadlock-free, so each rank's forwards run in the order they would in training (the warm-up order of the
interleaved 1F1B body, SPEC.md, "The schedule").
"""

from __future__ import annotations

import dataclasses

from .actions import Action, Kind
from .config import ScheduleConfig
from .mpipe import build_schedule

BACKWARD_KINDS = frozenset({Kind.B, Kind.SEND_B, Kind.RECV_B, Kind.TRANSPOSE_BWD, Kind.GRAD_SEND, Kind.GRAD_RECV,
                            Kind.GRAD_REDUCE, Kind.PARAM_BROADCAST, Kind.GRAPH_SEND, Kind.GRAPH_RECV})


def forward_config(cfg: ScheduleConfig) -> ScheduleConfig:
    """``cfg`` as evaluation runs it: a trainable ``P`` treated as frozen, no owner-backward, placement
    ``prefix``, no zero bubble (there is no backward to split)."""
    preprocess = "frozen" if cfg.preprocess == "trainable" else cfg.preprocess
    return dataclasses.replace(cfg, preprocess=preprocess, owner_backward=False, placement="prefix",
                               zero_bubble=False)


def build_forward_schedule(cfg: ScheduleConfig) -> dict[int, list[Action]]:
    """``{rank: [Action, ...]}``: every rank's forward-only action list for ``cfg`` (module docstring)."""
    orders = build_schedule(forward_config(cfg))
    return {rank: [a for a in actions if a.kind not in BACKWARD_KINDS] for rank, actions in orders.items()}
