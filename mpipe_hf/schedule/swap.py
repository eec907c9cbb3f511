"""Activation swap in the schedule (SPEC.md, "How the schedule is built", step 5): which ``(stage, micro)``
forwards move their saved activations to host memory until their backward, and the five actions that do it.

For every forward ``F(s, m)`` of a swapping rank whose backward ``B(s, m)`` lies at least ``min_swap_gap`` compute
actions later, :func:`inject_swaps` inserts

- ``SWAP_SET_GROUP`` right before ``F``: the tensors the forward saves form the group ``(s, m)``;
- ``SWAP_LAUNCH_OFFLOAD`` right after ``F`` (after its ``SEND_F`` when that follows): the copies to the host
  start;
- ``SWAP_WAIT_OFFLOAD`` right after the next compute action: the copies are done, the device storage is freed;
- ``SWAP_LAUNCH_LOAD`` right before the last compute action before ``B``: the copies back start;
- ``SWAP_WAIT_LOAD`` right before ``B``: they are done.

(In a zero-bubble schedule, "``B``" is the backward's first action: its ``B``, or a ``W`` alone.)

With ``min_swap_gap >= 2`` the offload completes after one compute and the load starts before another, so each
copy overlaps a compute (PipeOffload, Wan et al., ICML 2025). Pure Python, like the rest of the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from .actions import COMPUTE_KINDS, Action, Kind

SWAP_KINDS = (Kind.SWAP_SET_GROUP, Kind.SWAP_LAUNCH_OFFLOAD, Kind.SWAP_WAIT_OFFLOAD, Kind.SWAP_LAUNCH_LOAD,
              Kind.SWAP_WAIT_LOAD)


@dataclass(frozen=True)
class SwapConfig:
    """``swap:`` activation swap (off by default).

    Attributes:
        enabled: offload the saved activations of the forwards that wait long enough for their backward.
        min_swap_gap: the fewest compute actions between a forward and its backward for it to swap (>= 2: one
            compute hides the offload, another the load).
        ranks: the pipeline ranks that swap (rank 0 holds the most forwards in flight in interleaved 1F1B, and
            a VLM's image features); ``None``: every rank.
        min_bytes: saved tensors smaller than this stay on the device (their copies would cost more in launches
            than they free).

    Raises:
        ValueError: a flag that is not a boolean; a ``min_swap_gap`` that is not an integer >= 2; ``ranks``
            that are not null or a list of distinct integers >= 0; a ``min_bytes`` that is not an integer >= 0.
    """

    enabled: bool = False
    min_swap_gap: int = 2
    ranks: list[int] | None = None
    min_bytes: int = 2 ** 16

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise ValueError(f"swap.enabled must be true or false, got {self.enabled!r}")
        if not isinstance(self.min_swap_gap, int) or isinstance(self.min_swap_gap, bool) or self.min_swap_gap < 2:
            raise ValueError(f"swap.min_swap_gap must be an integer >= 2, got {self.min_swap_gap!r}")
        ranks = self.ranks
        if ranks is not None and (not isinstance(ranks, (list, tuple)) or any(
                not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in ranks) or len(set(ranks)) != len(ranks)):
            raise ValueError(f"swap.ranks must be null or a list of distinct pipeline ranks (integers >= 0), got "
                             f"{ranks!r}")
        if isinstance(ranks, tuple):
            object.__setattr__(self, "ranks", list(ranks))
        if not isinstance(self.min_bytes, int) or isinstance(self.min_bytes, bool) or self.min_bytes < 0:
            raise ValueError(f"swap.min_bytes must be an integer >= 0, got {self.min_bytes!r}")

    def check(self, pp_size: int) -> None:
        """Raises ``ValueError`` when ``ranks`` names a rank the pipeline does not have."""
        if self.ranks is not None and any(r >= pp_size for r in self.ranks):
            raise ValueError(f"swap.ranks {self.ranks} names ranks beyond parallel.pp_size = {pp_size} "
                             f"(ranks 0 .. {pp_size - 1})")

    def swaps(self, rank: int) -> bool:
        """Whether ``rank`` swaps."""
        return self.enabled and (self.ranks is None or rank in self.ranks)


def first_backward(order: list[Action]) -> dict[tuple[int, int], int]:
    """``{(stage, micro): index}`` of each backward's first action in ``order``: its ``B``, or its ``W`` where
    the backward is a ``W`` alone (zero bubble, stage 0)."""
    out: dict[tuple[int, int], int] = {}
    for i, a in enumerate(order):
        if a.kind in (Kind.B, Kind.W):
            out.setdefault((a.stage, a.micro), i)
    return out


def swap_groups(order: list[Action], min_swap_gap: int) -> list[tuple[int, int]]:
    """``[(stage, micro)]`` of the forwards in ``order`` whose backward comes at least ``min_swap_gap`` compute
    actions later (``COMPUTE_KINDS`` strictly between), in the order of their forwards."""
    computes = [i for i, a in enumerate(order) if a.kind in COMPUTE_KINDS]
    backward = first_backward(order)
    groups = []
    for i, a in enumerate(order):
        if a.kind is Kind.F and (a.stage, a.micro) in backward:
            j = backward[(a.stage, a.micro)]
            if sum(i < c < j for c in computes) >= min_swap_gap:
                groups.append((a.stage, a.micro))
    return groups


def inject_swaps(order: list[Action], groups: list[tuple[int, int]]) -> list[Action]:
    """``order`` with the five swap actions of every group in ``groups`` (:func:`swap_groups`) inserted where the
    module docstring says. Zero groups give ``order`` unchanged.

    Raises:
        ValueError: a group whose forward and backward have fewer than two compute actions between them.
    """
    before: dict[int, list[Action]] = {}
    after: dict[int, list[Action]] = {}
    index = {(a.kind, a.stage, a.micro): i for i, a in enumerate(order) if a.kind in (Kind.F, Kind.SEND_F)}
    backward = first_backward(order)
    computes = [i for i, a in enumerate(order) if a.kind in COMPUTE_KINDS]
    for s, m in groups:
        f, b = index[(Kind.F, s, m)], backward[(s, m)]
        between = [c for c in computes if f < c < b]
        if len(between) < 2:
            raise ValueError(f"stage {s} micro {m} has {len(between)} compute actions between its F and B; a swap "
                             f"needs two (min_swap_gap >= 2)")
        send = index.get((Kind.SEND_F, s, m))
        launch = send if send is not None and send == f + 1 else f
        before.setdefault(f, []).append(Action(Kind.SWAP_SET_GROUP, m, s))
        after.setdefault(launch, []).append(Action(Kind.SWAP_LAUNCH_OFFLOAD, m, s))
        after.setdefault(between[0], []).append(Action(Kind.SWAP_WAIT_OFFLOAD, m, s))
        before.setdefault(between[-1], []).append(Action(Kind.SWAP_LAUNCH_LOAD, m, s))
        before.setdefault(b, []).append(Action(Kind.SWAP_WAIT_LOAD, m, s))
    out = []
    for i, a in enumerate(order):
        out += before.get(i, []) + [a] + after.get(i, [])
    return out


def with_swaps(order: list[Action], swap: SwapConfig | None, rank: int) -> list[Action]:
    """``rank``'s ``order`` with its swaps (none when ``swap`` is ``None``, off, or not for this rank)."""
    if swap is None or not swap.swaps(rank):
        return order
    return inject_swaps(order, swap_groups(order, swap.min_swap_gap))


def peak_resident(order: list[Action]) -> int:
    """The most stage forwards whose saved activations are on the device at once (in units of one stage's
    activations, as :func:`~.interleaved.peak_in_flight`): a forward adds one, its ``SWAP_WAIT_OFFLOAD`` takes it
    away, its ``SWAP_LAUNCH_LOAD`` brings it back, its last backward action (``B``, or the ``W`` of a split one)
    frees it. Without swap actions this is ``peak_in_flight``."""
    done = {(a.stage, a.micro): i for i, a in enumerate(order) if a.kind in (Kind.B, Kind.W)}
    live = peak = 0
    for i, a in enumerate(order):
        freed = a.kind is Kind.SWAP_WAIT_OFFLOAD or (a.kind in (Kind.B, Kind.W) and done[(a.stage, a.micro)] == i)
        live += (a.kind in (Kind.F, Kind.SWAP_LAUNCH_LOAD)) - freed
        peak = max(peak, live)
    return peak
