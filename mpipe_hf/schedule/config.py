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
        owner_backward: trainable ``P`` only. Owners keep ``P``'s graph; right after each stage-0 backward rank 0
            ships the feature gradient back, and the owner backprops it where it would otherwise wait (no
            recompute, no ``GRAPH`` transfer; :mod:`.mpipe`), then ``GRAD_REDUCE`` sums ``P``'s gradient over
            the pipeline group.
        less_memory: a shallower warm-up of the interleaved body (``R-1-r`` instead of ``2(R-1-r)`` extra
            forwards on rank ``r``): fewer activations in flight, possibly more bubble.
        placement: where the transposed forwards go: ``"prefix"`` (each owner runs them before its body, as the
            spec builds it) or ``"fill"`` (frozen ``P`` only: where the simulator finds each owner idle, see
            :mod:`.fill`).
        zero_bubble: split each body backward into ``B``, the gradient of the stage's inputs, and ``W``, the
            gradient of its weights, and run each ``W`` where its rank would otherwise wait, holding no more
            forwards in flight than the unsplit schedule (ZB-H1 of Zero Bubble Pipeline Parallelism, Qi et al.,
            ICLR 2024; :mod:`.zero_bubble`).
        owners: overflow mode ``full`` only: the owner of each micro-batch, replacing ``m % NT`` (load-aware
            owners, :mod:`.owners`): a tuple of ``M`` ranks in ``[0, NT)`` (a list is taken as a tuple), or with
            placement ``fill`` ``2M``, the last ``M`` the owners of the look-ahead micros ``M + m`` (the next
            step's micro ``m``); ``None``: the mode's rule. Every rank must build its schedule with the same owners.

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
    zero_bubble: bool = False
    owners: tuple[int, ...] | None = None

    def __post_init__(self):
        for field in ("pp_size", "vpp", "num_micro"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field} must be an integer >= 1, got {value!r}")
        if self.preprocess not in PREPROCESS_MODES:
            raise ValueError(f"preprocess must be one of {PREPROCESS_MODES}, got {self.preprocess!r}")
        if self.overflow not in OVERFLOW_MODES:
            raise ValueError(f"overflow must be one of {OVERFLOW_MODES}, got {self.overflow!r}")
        for field in ("owner_backward", "less_memory", "zero_bubble"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"{field} must be true or false, got {getattr(self, field)!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        self._check_owners()
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
    def trains_preprocess(self) -> bool:
        """``P`` has parameters to train: broadcast, graph or owner-backward, and ``P``'s backward."""
        return self.preprocess == "trainable"

    @property
    def transposed(self) -> bool:
        """``P`` computes something (``T > 0``): ``TRANSPOSE_FWD`` runs and its output travels to rank 0."""
        return self.preprocess != "identity"

    def needs_input_grad(self, stage: int) -> bool:
        """Whether ``stage``'s backward must give its inputs a gradient: every stage's but stage 0's, whose
        inputs are the raw data and ``P``'s output, unless ``P`` is trainable. In a zero-bubble schedule a
        stage without it has no ``B``: its whole backward is its ``W``."""
        return stage > 0 or self.trains_preprocess

    def stage_rank(self, stage: int) -> int:
        """The rank that holds ``stage`` (``stage % R``)."""
        return stage % self.pp_size

    def _check_owners(self) -> None:
        """Validate ``owners`` (a list becomes a tuple). Raises ``ValueError`` naming the field."""
        owners, n = self.owners, self.num_micro
        if owners is None:
            return
        if not isinstance(owners, (tuple, list)):
            raise ValueError(f"owners must be null or a list of {n} ranks (one per micro-batch), got {owners!r}")
        object.__setattr__(self, "owners", tuple(owners))
        if self.overflow != "full":
            raise ValueError(f"owners needs overflow 'full' (mode {self.overflow!r} fixes its owners), got "
                             f"overflow {self.overflow!r}")
        lengths = (n, 2 * n) if self.placement == "fill" else (n,)
        if len(owners) not in lengths:
            allowed = f"{n} (or {2 * n} with the look-ahead micros of placement 'fill')" if self.placement == \
                "fill" else f"{n}"
            raise ValueError(f"owners must give {allowed} ranks, one per micro-batch, got {len(owners)}")
        bad = [r for r in owners if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < self.num_owners]
        if bad:
            raise ValueError(f"owners must be ranks in [0, {self.num_owners}) (NT = min(pp_size, num_micro); every "
                             f"owner within pp_size = {self.pp_size}), got {bad[0]!r} in {list(owners)}")

    @property
    def assignment(self) -> tuple[int, ...] | None:
        """The explicit owners (``owners``), or ``None`` where the overflow mode's rule decides."""
        return self.owners

    def owner(self, micro: int) -> int:
        """The rank that loads micro ``micro`` and runs the preprocess on it (SPEC.md, "Terms"): ``owners[micro]``
        when given, else the overflow mode's rule. A micro ``M + m`` (``0 <= m < M``: placement ``fill``'s
        look-ahead of the next step's micro ``m``) has the next step's owner: ``owners[M + m]`` when ``owners``
        gives ``2M`` ranks, else the rule's owner of ``m``."""
        table = self.assignment
        if table is not None and micro < len(table):
            return table[micro]
        if micro >= self.num_micro:
            micro -= self.num_micro
        if self.overflow == "min":
            return micro if micro < self.num_owners else 0
        return micro % self.num_owners

    def owned(self, rank: int) -> list[int]:
        """Micro-batches owned by ``rank``, ascending."""
        return [m for m in range(self.num_micro) if self.owner(m) == rank]
