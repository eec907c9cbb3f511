"""The interleaved 1F1B body order (Narayanan et al., 2021, "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", section 2.2). ``V = 1`` is 1F1B.

Micro-batches run in rounds of about ``R``. Within a round, a rank runs its chunks in order for the forward
(chunk 0 for every micro of the round, then chunk 1, ...) and in reverse for the backward. A rank first runs a
warm-up of forwards, then alternates one forward and one backward, then drains the remaining backwards
(cooldown). Where ``torch.distributed.pipelining.ScheduleInterleaved1F1B`` accepts ``(R, V, M)`` (``M`` a
multiple of ``max(1, M // R)``), the order is the same as torch's; elsewhere the rounds differ in size by at
most one micro.
"""

from __future__ import annotations

from .actions import Action, Kind


def rounds(pp_size: int, num_micro: int) -> list[list[int]]:
    """Split micros ``0..M-1`` into ``max(1, M // R)`` consecutive rounds, larger rounds first."""
    count = max(1, num_micro // pp_size)
    base, extra = divmod(num_micro, count)
    out, start = [], 0
    for k in range(count):
        size = base + (1 if k < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


def warmup_forwards(pp_size: int, vpp: int, num_micro: int, rank: int) -> int:
    """Forwards a rank runs before its first backward: ``(V-1) * round + 2 * (R-1-rank)``, at most ``M*V``."""
    first_round = len(rounds(pp_size, num_micro)[0])
    return min((vpp - 1) * first_round + 2 * (pp_size - 1 - rank), num_micro * vpp)


def body_order(pp_size: int, vpp: int, num_micro: int, rank: int) -> list[Action]:
    """The compute order (``F`` and ``B`` only) of ``rank``.

    Returns:
        ``2 * V * M`` actions; stage indices are global (``chunk * R + rank``).
    """
    forwards, backwards = [], []
    for group in rounds(pp_size, num_micro):
        for chunk in range(vpp):
            forwards += [Action(Kind.F, m, chunk * pp_size + rank) for m in group]
        for chunk in reversed(range(vpp)):
            backwards += [Action(Kind.B, m, chunk * pp_size + rank) for m in group]
    warmup = warmup_forwards(pp_size, vpp, num_micro, rank)
    order = forwards[:warmup]
    for fwd, bwd in zip(forwards[warmup:], backwards):
        order += [fwd, bwd]
    order += backwards[len(forwards) - warmup:]
    return order
