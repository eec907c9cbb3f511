"""The schedule configuration: the numbers and modes that fix a schedule (SPEC.md, "Terms")."""

from __future__ import annotations

from dataclasses import dataclass

PREPROCESS_MODES = ("identity", "frozen", "trainable")
OVERFLOW_MODES = ("full", "min")
PLACEMENTS = ("prefix", "fill")


@dataclass(frozen=True)
class ScheduleConfig:
    """What a schedule is built from. Validated on construction, so errors come before any collective.

    Attributes:
        pp_size: ``R``, the number of pipeline ranks (>= 1).
        vpp: ``V``, model chunks (virtual stages) per rank (>= 1); stage ``s`` lives on rank ``s % R``.
        num_micro: ``M``, micro-batches per schedule run (>= 1).
        preprocess: how the transposed preprocess ``P`` is treated: ``"frozen"`` (no gradient, no graph kept),
            ``"trainable"`` (rank 0 optimises it and broadcasts it each step), or ``"identity"`` (``T = 0``:
            dataload-only; only raw data moves, with no broadcast and no ``P`` forward or backward).
        overflow: ``"full"`` (owner of micro ``m`` is ``m % NT``) or ``"min"`` (owner is ``m`` for ``m < NT``,
            else rank 0, which runs those micros inline, right before their stage-0 forward).
        owner_backward: trainable ``P`` only. Owners keep ``P``'s graph; after the body, rank 0 ships each
            feature gradient back and the owner backprops it (no recompute, no ``GRAPH`` transfer), then
            ``GRAD_REDUCE`` sums ``P``'s gradient over the pipeline group.
        less_memory: a shallower warm-up of the interleaved body (``R-1-r`` instead of ``2(R-1-r)`` extra
            forwards on rank ``r``): fewer activations in flight, possibly more bubble.
        placement: where the transposed forwards go: ``"prefix"`` (each owner runs them before its body, as the
            spec builds it) or ``"fill"`` (frozen ``P`` only: where the simulator finds each owner idle, see
            :mod:`.fill`).

    Raises:
        ValueError: naming the field and the allowed values.
    """

    pp_size: int
    vpp: int = 1
    num_micro: int = 1
    preprocess: str = "frozen"
    overflow: str = "full"
    owner_backward: bool = False
    less_memory: bool = False
    placement: str = "prefix"

    def __post_init__(self):
        for field in ("pp_size", "vpp", "num_micro"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field} must be an integer >= 1, got {value!r}")
        if self.preprocess not in PREPROCESS_MODES:
            raise ValueError(f"preprocess must be one of {PREPROCESS_MODES}, got {self.preprocess!r}")
        if self.overflow not in OVERFLOW_MODES:
            raise ValueError(f"overflow must be one of {OVERFLOW_MODES}, got {self.overflow!r}")
        for field in ("owner_backward", "less_memory"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"{field} must be true or false, got {getattr(self, field)!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.placement == "fill" and self.preprocess != "frozen":
            raise ValueError(f"placement 'fill' moves the forwards of a frozen preprocess; preprocess is "
                             f"{self.preprocess!r} (use placement 'prefix')")
        if self.owner_backward and self.preprocess != "trainable":
            raise ValueError(f"owner_backward needs preprocess 'trainable' (a {self.preprocess} preprocess has no "
                             f"backward), got preprocess {self.preprocess!r}")

    @property
    def num_stages(self) -> int:
        """``S = R * V``."""
        return self.pp_size * self.vpp

    @property
    def num_owners(self) -> int:
        """``NT = min(R, M)``: the number of ranks that own micro-batches."""
        return min(self.pp_size, self.num_micro)

    @property
    def trainable(self) -> bool:
        """``P`` has parameters to train: broadcast, graph or owner-backward, and ``P``'s backward."""
        return self.preprocess == "trainable"

    @property
    def transposed(self) -> bool:
        """``P`` computes something (``T > 0``): ``TRANSPOSE_FWD`` runs and its output travels to rank 0."""
        return self.preprocess != "identity"

    def stage_rank(self, stage: int) -> int:
        """The rank that holds ``stage`` (``stage % R``)."""
        return stage % self.pp_size

    def owner(self, micro: int) -> int:
        """The rank that loads micro ``micro`` and runs the preprocess on it (SPEC.md, "Terms")."""
        if self.overflow == "min":
            return micro if micro < self.num_owners else 0
        return micro % self.num_owners

    def owned(self, rank: int) -> list[int]:
        """Micro-batches owned by ``rank``, ascending."""
        return [m for m in range(self.num_micro) if self.owner(m) == rank]
