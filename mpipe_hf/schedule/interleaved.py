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


def warmup_forwards(pp_size: int, vpp: int, num_micro: int, rank: int, less_memory: bool = False) -> int:
    """Forwards a rank runs before its first backward: ``(V-1) * round + 2 * (R-1-rank)`` (torch's and
    Megatron-LM's depth), or ``(V-1) * round + (R-1-rank)`` with ``less_memory`` (for ``V = 1`` this is the
    classic 1F1B warm-up of PipeDream-Flush, Narayanan et al., 2021); at most ``M*V``."""
    first_round = len(rounds(pp_size, num_micro)[0])
    depth = (pp_size - 1 - rank) * (1 if less_memory else 2)
    return min((vpp - 1) * first_round + depth, num_micro * vpp)


def body_order(pp_size: int, vpp: int, num_micro: int, rank: int, less_memory: bool = False) -> list[Action]:
    """The compute order (``F`` and ``B`` only) of ``rank``; ``less_memory`` takes the shallow warm-up.

    Returns:
        ``2 * V * M`` actions; stage indices are global (``chunk * R + rank``).
    """
    forwards, backwards = [], []
    for group in rounds(pp_size, num_micro):
        for chunk in range(vpp):
            forwards += [Action(Kind.F, m, chunk * pp_size + rank) for m in group]
        for chunk in reversed(range(vpp)):
            backwards += [Action(Kind.B, m, chunk * pp_size + rank) for m in group]
    warmup = warmup_forwards(pp_size, vpp, num_micro, rank, less_memory)
    order = forwards[:warmup]
    for fwd, bwd in zip(forwards[warmup:], backwards):
        order += [fwd, bwd]
    order += backwards[len(forwards) - warmup:]
    return order


def peak_in_flight(order: list[Action]) -> int:
    """The most forwards whose backward has not run yet, at any point of ``order``: how many micro-batches'
    activations a rank holds at its peak (a memory proxy, in units of one stage's activations). A backward split
    into ``B`` and ``W`` (zero bubble) holds them until its ``W``, which still reads them."""
    done = {(a.stage, a.micro): i for i, a in enumerate(order) if a.kind in (Kind.B, Kind.W)}
    live = peak = 0
    for i, a in enumerate(order):
        live += (a.kind is Kind.F) - (a.kind in (Kind.B, Kind.W) and done[(a.stage, a.micro)] == i)
        peak = max(peak, live)
    return peak
