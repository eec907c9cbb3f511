"""Load-aware owners: which rank loads and preprocesses each micro-batch of a step.

With ragged images the preprocess ``P`` (the vision tower) costs each micro-batch a very different amount: the
workload of a batch varies up to 4.15x in PipeWeaver's traces (arXiv 2504.14145), and
Megatron-Bridge#4609 asks for the reordering done here. The owner rule of SPEC.md ("Terms", overflow mode
``full``: micro ``m`` goes to rank ``m % NT``) ignores the costs, so one owner can draw the heavy micros and make
every rank wait for it: with placement ``prefix`` rank 0 starts its body only once every owner has shipped its
features, so the step pays the *largest* owner load, not the mean.

:func:`balance_owners` assigns the micros by the LPT rule (longest processing time first; Graham, 1969,
"Bounds on multiprocessing timing anomalies", SIAM J. Appl. Math. 17(2)): the heaviest micro goes to the owner
with the least load so far, which keeps the largest load within ``4/3 - 1/(3 NT)`` of the optimum. It is a pure
function of the costs with deterministic tie-breaks (equal costs: the lower micro first; equal loads: the owner
with fewer micros, then the lower rank), so every rank computes the same owners from the same costs without any
collective. Pass the same integers (image tokens) or the same bit-identical floats on every rank.

The owners travel in :attr:`ScheduleConfig.owners <mpipe_hf.schedule.config.ScheduleConfig.owners>`, which every
schedule builder and validator reads through ``cfg.owner(m)``; :func:`with_owners` builds that config for one
step, the look-ahead micros of placement ``fill`` (numbered ``M + m``, the next step's micro ``m``, owned by the
*next* step's owners) included. :func:`step_owners` is the trainer's policy (``parallel.owners: balanced``);
:func:`reassign` and :func:`relabel` turn a schedule built once into any step's with the same owner counts, by
renaming the micros of the owner actions only, so per-step owners cost no schedule build; :func:`fill_headroom`
measures where placement ``fill`` hides ``P`` for free; :class:`MicroCosts` gives the simulator each micro's own
``P`` cost.

How the ranks agree: each derives the owners from the step's per-micro costs, which every rank knows without a
collective and without decoding an image: the conversation loader reads every image's size from its file header
on every rank and counts its tokens (``ConversationDataset.image_tokens``), and ``MicroBatchPlan.micro_costs``
sums them over each micro's rows. A rank that computed other owners would post other messages; nothing checks
it at run time (that would cost a collective a step), so the costs must be computed alike on every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from .actions import Action, Kind
from .config import ScheduleConfig
from .simulate import Costs

OWNER_POLICIES = ("modulo", "balanced")


def _check_costs(costs: Sequence[float], name: str = "costs") -> list[float]:
    values = list(costs)
    for i, c in enumerate(values):
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not c >= 0 or c == float("inf"):
            raise ValueError(f"{name}[{i}] must be a finite number >= 0 (a micro-batch's preprocess cost), got {c!r}")
    return values


def modulo_owners(num_micro: int, num_owners: int) -> tuple[int, ...]:
    """The default owners of overflow mode ``full``: micro ``m`` to rank ``m % num_owners`` (SPEC.md, "Terms").

    Raises:
        ValueError: ``num_micro`` or ``num_owners`` below 1.
    """
    if num_micro < 1 or num_owners < 1:
        raise ValueError(f"num_micro and num_owners must be >= 1, got {num_micro} and {num_owners}")
    return tuple(m % num_owners for m in range(num_micro))


def balance_owners(costs: Sequence[float], num_owners: int, start: Sequence[float] | None = None,
                   counts: Sequence[int] | None = None) -> tuple[int, ...]:
    """Owners that balance the preprocess load: LPT greedy (module docstring).

    Micros are taken heaviest first (equal costs: lower micro first) and each goes to the owner whose load
    ``start[r] + sum of its costs so far`` is least (equal loads: fewer micros, then lower rank), among the owners
    that still have room when ``counts`` caps them. With zero or equal costs this spreads the micros evenly.

    Args:
        costs: ``M`` costs, one per micro-batch, any unit (image tokens, seconds), each ``>= 0``.
        num_owners: ``NT``, the ranks ``0 .. NT-1`` that own micros (``ScheduleConfig.num_owners``).
        start: optional ``NT`` loads the owners start with, in the unit of ``costs`` (other work of that rank,
            or minus its idle time under placement ``fill``); all zero when ``None``.
        counts: optional ``NT`` numbers of micros each owner gets exactly (summing to ``M``), e.g. those of
            ``m % NT`` (:func:`modulo_counts`), so that the step's schedule is a relabelling of one built
            before (:func:`reassign`); any numbers when ``None``.

    Returns:
        ``owners``, ``M`` ranks in ``[0, NT)``: ``owners[m]`` loads and preprocesses micro ``m``.

    Raises:
        ValueError: no costs, a cost that is negative, infinite or not a number, ``num_owners < 1``, a
            ``start`` of the wrong length, or ``counts`` that are not ``NT`` integers >= 0 summing to ``M``.
    """
    values = _check_costs(costs)
    if not values:
        raise ValueError("costs must give at least one micro-batch's cost")
    if not isinstance(num_owners, int) or isinstance(num_owners, bool) or num_owners < 1:
        raise ValueError(f"num_owners must be an integer >= 1, got {num_owners!r}")
    loads = [0.0] * num_owners if start is None else [float(s) for s in start]
    if len(loads) != num_owners:
        raise ValueError(f"start must give {num_owners} loads (one per owner), got {len(loads)}")
    room = [len(values)] * num_owners if counts is None else list(counts)
    if counts is not None and (len(room) != num_owners or sum(room) != len(values) or any(
            not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in room)):
        raise ValueError(f"counts must be {num_owners} integers >= 0 summing to {len(values)} (the micros), "
                         f"got {counts!r}")
    taken = [0] * num_owners
    owners = [0] * len(values)
    for m in sorted(range(len(values)), key=lambda i: (-values[i], i)):
        r = min((k for k in range(num_owners) if taken[k] < room[k]), key=lambda k: (loads[k], taken[k], k))
        owners[m] = r
        loads[r] += values[m]
        taken[r] += 1
    return tuple(owners)


def modulo_counts(num_micro: int, num_owners: int) -> tuple[int, ...]:
    """How many micros each owner has under ``m % NT``: ``M // NT``, one more for the first ``M % NT``."""
    return tuple(num_micro // num_owners + (1 if r < num_micro % num_owners else 0) for r in range(num_owners))


def owner_loads(costs: Sequence[float], owners: Sequence[int], num_owners: int) -> list[float]:
    """``[sum of costs[m] over micros m owned by r for r in 0 .. num_owners-1]``.

    Raises:
        ValueError: ``costs`` and ``owners`` of different lengths, or an owner outside ``[0, num_owners)``.
    """
    values = _check_costs(costs)
    if len(values) != len(owners):
        raise ValueError(f"costs has {len(values)} entries but owners has {len(owners)}")
    loads = [0.0] * num_owners
    for c, r in zip(values, owners):
        if not 0 <= r < num_owners:
            raise ValueError(f"owner {r} is outside [0, {num_owners})")
        loads[r] += c
    return loads


COUNTS_TOLERANCE = 0.05  # how much larger a largest load "balanced" accepts to keep the counts of m % NT


def fill_headroom(cfg: ScheduleConfig, costs: Costs | None = None) -> list[float]:
    """How long each owner ``r < NT`` sits idle at the end of a steady step of placement ``fill`` (the step's
    micros loaded the step before, the next step's loaded in it) whose ``P`` costs nothing: the makespan minus the
    end of the rank's last body compute, in the unit of ``costs`` (seconds; unit costs when ``None``). In an
    interleaved 1F1B body rank ``r`` finishes about ``r`` backwards before rank 0, and there the next step's
    transposed forwards cost the step nothing; as the ``headroom`` of :func:`step_owners` it gives the later ranks
    more of them.

    Raises:
        ValueError: ``cfg`` is not placement ``fill``.
    """
    from .mpipe import build_schedule  # not at the top: mpipe imports fill, which the executor imports with this
    from .simulate import simulate
    if cfg.placement != "fill":
        raise ValueError(f"headroom is that of placement 'fill', got placement {cfg.placement!r}")
    base = costs or Costs()
    orders = build_schedule(dataclasses.replace(cfg, owners=None), base, own=False, ahead=True)
    sim = simulate(orders, MicroCosts.of(base, [0.0] * 2 * cfg.num_micro))
    body = {Kind.F, Kind.B} | ({Kind.W} if "W" in Kind.__members__ else set())
    return [sim.makespan - max((e.end for e in sim.timeline[r] if e.action.kind in body), default=0.0)
            for r in range(cfg.num_owners)]


def step_owners(policy: str, costs: Sequence[float], cfg: ScheduleConfig,
                headroom: Sequence[float] | None = None) -> tuple[int, ...] | None:
    """The owners of one step under ``policy``: ``"modulo"`` gives ``None`` (the config's own rule),
    ``"balanced"`` gives :func:`balance_owners` of ``costs`` over ``cfg.num_owners`` owners.

    ``"balanced"`` keeps each owner's number of micros of ``m % NT`` (``counts=modulo_counts(...)``) unless that
    leaves the largest load more than :data:`COUNTS_TOLERANCE` above the unconstrained LPT's: with those counts
    the step's schedule is the default schedule relabelled (:func:`reassign`), so no step builds a schedule of its
    own. With placement ``fill`` it always keeps them: a fill schedule of other counts is placed by simulating
    every move (seconds on a loaded CPU, against milliseconds for a prefix build). On ragged draws (1 to 16
    images a micro, 4 owners) the constrained largest load is on average 3% above the free one at ``M = 8``, and
    0.3% at ``M = 16``.

    Args:
        policy: ``"modulo"`` or ``"balanced"``.
        costs: ``M`` costs, one per micro-batch (image tokens, seconds), the same on every rank.
        cfg: the step's schedule configuration (``num_micro``, ``num_owners``, ``placement``, ``overflow``).
        headroom: optional idle time of each owner that hides ``P`` for free (:func:`fill_headroom`), in the unit
            of ``costs``: each owner starts the greedy at minus its headroom.

    Raises:
        ValueError: an unknown policy; ``costs`` not of length ``cfg.num_micro``; ``"balanced"`` with overflow
            mode ``min`` (which fixes its owners); a ``headroom`` not of length ``NT``.
    """
    if policy not in OWNER_POLICIES:
        raise ValueError(f"owners must be one of {OWNER_POLICIES}, got {policy!r}")
    if policy == "modulo":
        return None
    if cfg.overflow != "full":
        raise ValueError(f"owners 'balanced' needs overflow 'full' (mode 'min' fixes its owners), got overflow "
                         f"{cfg.overflow!r}")
    if len(costs) != cfg.num_micro:
        raise ValueError(f"costs must give one cost per micro-batch ({cfg.num_micro}), got {len(costs)}")
    start = [0.0] * cfg.num_owners if headroom is None else [-float(h) for h in headroom]
    if len(start) != cfg.num_owners:
        raise ValueError(f"headroom must give {cfg.num_owners} times (one per owner), got {len(start)}")
    kept = balance_owners(costs, cfg.num_owners, start, modulo_counts(cfg.num_micro, cfg.num_owners))
    if cfg.placement == "fill":  # a fill schedule of other counts would be built by simulation: seconds a step
        return kept
    free = balance_owners(costs, cfg.num_owners, start)

    def largest(owners):
        return max(s + load for s, load in zip(start, owner_loads(costs, owners, cfg.num_owners)))
    return kept if largest(kept) <= largest(free) + abs(largest(free)) * COUNTS_TOLERANCE else free


def with_owners(cfg: ScheduleConfig, owners: Sequence[int] | None = None,
                next_owners: Sequence[int] | None = None) -> ScheduleConfig:
    """``cfg`` with the owners of one step: ``owners`` for this step's micros ``0 .. M-1`` (``None``: the
    overflow mode's rule) and, placement ``fill`` with look-ahead, ``next_owners`` for the next step's, which
    the schedule numbers ``M .. 2M-1`` (``None``: the rule). Returns ``cfg`` itself when both are ``None``.

    Raises:
        ValueError: as :class:`ScheduleConfig` (``owners`` field): wrong lengths, a rank outside ``[0, NT)``,
            overflow mode ``min``, ``next_owners`` without placement ``fill``.
    """
    if owners is None and next_owners is None:
        return cfg
    this = tuple(owners) if owners is not None else tuple(cfg.owner(m) for m in range(cfg.num_micro))
    if owners is not None and len(this) != cfg.num_micro:
        raise ValueError(f"owners must give one rank per micro-batch ({cfg.num_micro}), got {len(this)}")
    if next_owners is not None:
        this += tuple(next_owners)
        if len(this) != 2 * cfg.num_micro:
            raise ValueError(f"next_owners must give one rank per micro-batch of the next step ({cfg.num_micro}), "
                             f"got {len(tuple(next_owners))}")
    return dataclasses.replace(cfg, owners=this)


@dataclass(frozen=True)
class MicroCosts(Costs):
    """:class:`~.simulate.Costs` where each micro's ``P`` has its own cost: ``preprocess_micro[m]`` for the
    ``TRANSPOSE_FWD`` of micro ``m`` and ``preprocess_backward_micro[m]`` for its ``TRANSPOSE_BWD``. Micros
    ``M + m`` (placement ``fill``'s look-ahead) read index ``M + m`` when the tuple is that long; a micro past the
    tuple's end takes the uniform ``preprocess_forward`` / ``preprocess_backward``.
    Units as :class:`~.simulate.Costs` (seconds)."""

    preprocess_micro: tuple[float, ...] = ()
    preprocess_backward_micro: tuple[float, ...] = ()

    def compute(self, a: Action, *args, **kwargs) -> float:
        """Time ``a`` holds its rank computing; the per-micro ``P`` costs where given (other arguments, as
        :meth:`Costs.compute <.simulate.Costs.compute>` takes them, pass through)."""
        if a.kind is Kind.TRANSPOSE_FWD and a.micro is not None and a.micro < len(self.preprocess_micro):
            return self.preprocess_micro[a.micro]
        if (a.kind is Kind.TRANSPOSE_BWD and a.micro is not None
                and a.micro < len(self.preprocess_backward_micro)):
            return self.preprocess_backward_micro[a.micro]
        return super().compute(a, *args, **kwargs)

    @classmethod
    def of(cls, base: Costs | None, forward: Sequence[float], backward: Sequence[float] = ()) -> "MicroCosts":
        """``base`` (unit :class:`~.simulate.Costs` when ``None``) with the per-micro ``P`` costs ``forward``
        and ``backward`` (seconds per micro).

        Raises:
            ValueError: a cost that is negative or not a finite number.
        """
        base = base or Costs()
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Costs)}
        return cls(**fields, preprocess_micro=tuple(_check_costs(forward, "forward")),
                   preprocess_backward_micro=tuple(_check_costs(backward, "backward")))


# Kinds whose micro is an owner's micro-batch rather than a slot of the body: relabelled by :func:`relabel`.
RELABELED_KINDS = frozenset({Kind.DATA_LOAD, Kind.TRANSPOSE_FWD, Kind.DATA_SEND, Kind.DATA_RECV, Kind.FWD_SEND,
                             Kind.FWD_RECV, Kind.GRAPH_SEND, Kind.GRAPH_RECV})


def canonical_owners(counts: Sequence[int]) -> tuple[int, ...]:
    """The assignment with ``counts[r]`` micros on owner ``r`` that takes the owners round-robin, skipping those
    that are full: for the counts of ``m % NT`` (:func:`modulo_counts`) it is ``m % NT`` itself.

    Raises:
        ValueError: a count that is not an integer >= 0.
    """
    left = list(counts)
    if any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in left):
        raise ValueError(f"counts must be integers >= 0, got {counts!r}")
    out, r = [], 0
    while len(out) < sum(counts):
        if left[r]:
            out.append(r)
            left[r] -= 1
        r = (r + 1) % len(left)
    return tuple(out)


def _counts(owners: Sequence[int], num_owners: int) -> tuple[int, ...]:
    return tuple(sum(1 for o in owners if o == r) for r in range(num_owners))


def _mapping(source: Sequence[int], target: Sequence[int], offset: int) -> dict[int, int]:
    """``{offset + j: offset + m}``: the ``i``-th micro of each owner under ``source`` to its ``i``-th under
    ``target`` (both with the same counts), so each owner keeps its ascending order."""
    mine: dict[int, list[int]] = {}
    for m, r in enumerate(target):
        mine.setdefault(r, []).append(m)
    seen: dict[int, int] = {}
    out = {}
    for j, r in enumerate(source):
        out[offset + j] = offset + mine[r][seen.get(r, 0)]
        seen[r] = seen.get(r, 0) + 1
    return out


def reassign(cfg: ScheduleConfig, own: bool = True, ahead: bool = False
             ) -> tuple[ScheduleConfig, dict[int, int]] | None:
    """A cheap way to the schedule of ``cfg`` (a step's owners): ``(base, mapping)`` when that schedule is the
    schedule of ``base`` with the micro of every owner action (:data:`RELABELED_KINDS`) relabelled by ``mapping``
    (:func:`relabel`); ``None`` when it must be built (``build_schedule``).

    ``base`` has the same owner counts as ``cfg`` in :func:`canonical_owners` order (for the counts of ``m % NT``:
    no ``owners`` at all), so few distinct bases are ever built, and ``mapping`` sends the ``i``-th micro of each
    owner in ``base`` to its ``i``-th in ``cfg``. That is exact where nothing of the body depends on which micro an
    owner action carries: placement ``prefix`` (every owner action of micro ``m < M`` runs before the body; all of
    ``P``'s inputs and outputs are on rank 0 before its first forward), and placement ``fill`` for a step whose
    micros were loaded the step before (``own=False``; its look-ahead micros ``M + m`` are due only at the end of
    the step, and each owner keeps its order). Not with owner-backward (rank 0's ``TRANSPOSE_BWD`` goes to its own
    micros only), nor for placement ``fill`` with ``own`` (each group is due before its micro's stage-0 forward).
    Each pair of ranks sends and receives the relabelled messages in the order of ``base``, which validates.
    """
    if cfg.assignment is None or cfg.owner_backward or (cfg.placement == "fill" and own):
        return None
    n, nt = cfg.num_micro, cfg.num_owners
    rule = dataclasses.replace(cfg, owners=None)
    modulo = tuple(rule.owner(m) for m in range(n))
    if cfg.placement == "prefix":
        target = cfg.assignment[:n]
        source = canonical_owners(_counts(target, nt))
        base, mapping = (None if source == modulo else source), _mapping(source, target, 0)
    elif not ahead:  # carried micros and no look-ahead: no owner action at all
        base, mapping = None, {}
    else:  # only the look-ahead micros M + m have owner actions; this step's owners do not matter
        target = cfg.assignment[n:] if len(cfg.assignment) == 2 * n else modulo
        source = canonical_owners(_counts(target, nt))
        base, mapping = (None if source == modulo else modulo + source), _mapping(source, target, n)
    base_cfg = dataclasses.replace(cfg, owners=base)
    if base_cfg == cfg:
        return None
    return base_cfg, {j: m for j, m in mapping.items() if j != m}


def relabel(actions: Sequence[Action], mapping: dict[int, int]) -> list[Action]:
    """``actions`` with the micro of every owner action (:data:`RELABELED_KINDS`) replaced by ``mapping[micro]``
    where ``mapping`` has it (see :func:`reassign`); the body's actions are left as they are."""
    return [dataclasses.replace(a, micro=mapping[a.micro]) if a.kind in RELABELED_KINDS and a.micro in mapping
            else a for a in actions]
