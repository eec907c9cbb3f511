"""Discrete-event simulation of a pipeline schedule: when every action of every rank starts and ends.

A rank runs its actions in order. A compute action (``F``, ``B``, ``W``, ``TRANSPOSE_FWD``,
``TRANSPOSE_BWD``, ``DATA_LOAD``) holds the rank for its cost. A send holds the sender for
``send_overhead`` and its message arrives ``latency + bytes / bandwidth`` later; a receive ends when its message
has arrived (the wait is idle time). Every action also holds its rank for ``dispatch``, the runtime's own time
per action. Messages between two ranks pair in order and must match (SPEC.md, "How the schedule is built": every
pair posts its sends and receives in the same order). A collective starts when the last rank reaches it and takes
``latency + bytes / bandwidth``. When no rank can move, the schedule is deadlocked and :class:`Deadlock` names who
waits for whom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .actions import COLLECTIVE_KINDS, COMPUTE_KINDS, RECV_KINDS, SEND_TO_RECV, Action, Kind
from .interleaved import peak_in_flight
from .swap import peak_resident

# channel of a transfer or collective kind, as Costs.message_bytes names it
CHANNELS = {Kind.SEND_F: "F", Kind.RECV_F: "F", Kind.SEND_B: "B", Kind.RECV_B: "B", Kind.DATA_SEND: "DATA",
            Kind.DATA_RECV: "DATA", Kind.FWD_SEND: "FWD", Kind.FWD_RECV: "FWD", Kind.GRAPH_SEND: "GRAPH",
            Kind.GRAPH_RECV: "GRAPH", Kind.GRAD_SEND: "GRAD", Kind.GRAD_RECV: "GRAD",
            Kind.PARAM_BROADCAST: "PARAM", Kind.GRAD_REDUCE: "REDUCE"}
BUSY_KINDS = COMPUTE_KINDS | {Kind.DATA_LOAD}
MICRO_WEIGHT_FIELDS = ("micro_weights", "micro_preprocess_weights")  # Costs' per-micro weights


@dataclass(frozen=True)
class Costs:
    """How long each action takes, in seconds (or any one unit used throughout).

    Attributes:
        forward, backward: a body ``F``/``B``; one number for every stage, or a tuple indexed by stage.
        preprocess_forward: a ``TRANSPOSE_FWD`` (``P`` on one micro-batch).
        preprocess_backward: a ``TRANSPOSE_BWD`` (the backward of ``P``, with its recompute on rank 0
            without owner-backward).
        data_load: a ``DATA_LOAD`` (read, decode and process one micro-batch).
        latency: added to every transfer and collective.
        bandwidth: bytes per unit of time (``inf``: transfers cost only their latency).
        message_bytes: bytes per message of a channel: ``F`` (activations), ``B`` (their gradients), ``DATA``,
            ``FWD``, ``GRAPH``, ``GRAD``, ``PARAM`` (the broadcast), ``REDUCE`` (the all-reduce); 0 when absent.
        send_overhead: how long posting a send holds the sender.
        dispatch: how long every action holds its rank besides the above: the runtime's own work per action
            (its Python, hand-overs, bookkeeping); measured as a runtime's CPU time per action on stages that do
            nothing (``scripts/bench/bench_schedules.py``).
        weight: the part of ``backward`` that is the weight gradient (one number, or a tuple by stage; ``None``:
            half, Zero Bubble PP's ``B = W``). In a zero-bubble schedule a ``B`` with its ``W`` costs
            ``backward - weight`` and the ``W`` costs ``weight``; a ``W`` alone (stage 0, whose inputs need no
            gradient) is the whole backward.
        micro_weights: per micro-batch ``m``, how many times the costs above its body ``F``, ``B`` and ``W`` take
            (``forward``/``backward``/``weight`` are those of the profile's micro-batch; a packed micro of other
            token counts costs ``weight[m]`` times them); ``None``: every micro 1 (uniform).
        micro_preprocess_weights: likewise for micro ``m``'s ``TRANSPOSE_FWD``, ``TRANSPOSE_BWD`` and
            ``DATA_LOAD`` (its image tokens); ``None``: uniform.
        all_to_all: expert parallelism: the time a body ``F`` spends in the all-to-alls of its MoE
            layers (each layer's dispatch and combine, :func:`~.hardware.moe_all_to_all_seconds`); one number, or
            a tuple by stage (a stage's MoE layers times one layer's). The all-to-all is a collective of the EP
            peers inside the stage's forward: they hold the same stage and run the same action list in step, so
            here it is time the rank spends, with no other rank to wait for (``tests/test_connect.py`` checks that
            the peers' all-to-alls pair up against the pipeline's transfers). Scaled by ``micro_weights`` (the
            rows dispatched follow the tokens). Context parallelism's Ulysses all-to-alls (four per attention
            layer, :func:`~.hardware.ulysses_seconds`) are collectives of the same kind, among the CP peers, and
            are added here (:func:`mpipe_hf.train.plan_context_parallel.with_ulysses`).
        all_to_all_backward: the same for a ``B`` (the all-to-alls' backwards; ``None``: as ``all_to_all``), or
            for a ``W`` that is the whole backward; a split ``W`` has none (the input gradient's ``B`` moves them).

    Both weight tuples hold one finite number ``>= 0`` per micro-batch of the simulated schedule (micros
    ``0 .. M-1``, or ``0 .. 2M-1`` with placement ``fill``'s look-ahead).

    Raises:
        ValueError: naming the field: a weight that is not a finite number ``>= 0``; in :func:`simulate`, a weight
            tuple whose length is not the schedule's number of micro-batches.
    """

    forward: float | tuple[float, ...] = 1.0
    backward: float | tuple[float, ...] = 2.0
    preprocess_forward: float = 1.0
    preprocess_backward: float = 2.0
    data_load: float = 0.0
    latency: float = 0.0
    bandwidth: float = math.inf
    message_bytes: dict[str, float] = field(default_factory=dict)
    send_overhead: float = 0.0
    dispatch: float = 0.0
    weight: float | tuple[float, ...] | None = None
    micro_weights: tuple[float, ...] | None = None
    micro_preprocess_weights: tuple[float, ...] | None = None
    all_to_all: float | tuple[float, ...] = 0.0
    all_to_all_backward: float | tuple[float, ...] | None = None

    def __post_init__(self):
        for name in MICRO_WEIGHT_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            try:
                values = tuple(float(w) for w in value)
            except (TypeError, ValueError):
                raise ValueError(f"Costs.{name} must be a sequence of numbers, one per micro-batch, or None; got "
                                 f"{value!r}") from None
            for m, w in enumerate(values):
                if not (math.isfinite(w) and w >= 0):
                    raise ValueError(f"Costs.{name}[{m}] = {w}: a micro-batch's weight must be finite and >= 0")
            object.__setattr__(self, name, values)

    def check_micros(self, orders: dict[int, list[Action]]) -> None:
        """Raise ``ValueError`` naming the field when a weight tuple's length is not the number of micro-batches
        of ``orders`` (its largest micro index plus one)."""
        given = [(name, getattr(self, name)) for name in MICRO_WEIGHT_FIELDS if getattr(self, name) is not None]
        if not given:
            return
        micros = 1 + max((a.micro for actions in orders.values() for a in actions if a.micro is not None), default=-1)
        for name, values in given:
            if len(values) != micros:
                raise ValueError(f"Costs.{name} gives {len(values)} weights for a schedule of {micros} "
                                 f"micro-batches: give one weight per micro-batch")

    def _scale(self, name: str, micro: int | None) -> float:
        weights = getattr(self, name)
        if weights is None or micro is None:
            return 1.0
        if micro >= len(weights):
            raise ValueError(f"Costs.{name} gives {len(weights)} weights, but the schedule has micro-batch {micro}: "
                             f"give one weight per micro-batch")
        return weights[micro]

    def compute(self, a: Action, split: bool = False) -> float:
        """Time ``a`` holds its rank computing (0 for transfers and collectives); ``split``: a ``B`` or ``W`` whose
        backward is split in two (the rank runs both). Scaled by ``a.micro``'s weight (:attr:`micro_weights`,
        :attr:`micro_preprocess_weights`)."""
        if a.kind in (Kind.F, Kind.B, Kind.W):
            return (self._body(a, split) + self._exchange(a, split)) * self._scale("micro_weights", a.micro)
        if a.kind is Kind.TRANSPOSE_FWD:
            cost = self.preprocess_forward
        elif a.kind is Kind.TRANSPOSE_BWD:
            cost = self.preprocess_backward
        elif a.kind is Kind.DATA_LOAD:
            cost = self.data_load
        else:
            return 0.0
        return cost * self._scale("micro_preprocess_weights", a.micro)

    def _body(self, a: Action, split: bool) -> float:
        """A body ``F``/``B``/``W`` of the profile's micro-batch (unweighted)."""
        cost = self.forward if a.kind is Kind.F else self.backward
        cost = cost[a.stage] if isinstance(cost, (tuple, list)) else cost
        if a.kind is Kind.F or not split:
            return cost
        weight = self.weight[a.stage] if isinstance(self.weight, (tuple, list)) else self.weight
        weight = cost / 2 if weight is None else min(weight, cost)
        return weight if a.kind is Kind.W else cost - weight

    def _exchange(self, a: Action, split: bool) -> float:
        """The all-to-alls of a body ``F``/``B``/``W`` of the profile's micro-batch (unweighted): ``all_to_all``
        for an ``F``, ``all_to_all_backward`` for a ``B`` or a whole-backward ``W``, 0 for a split ``W``."""
        if a.kind is Kind.W and split:
            return 0.0
        cost = self.all_to_all
        if a.kind is not Kind.F and self.all_to_all_backward is not None:
            cost = self.all_to_all_backward
        return cost[a.stage] if isinstance(cost, (tuple, list)) else cost

    def transfer(self, kind: Kind) -> float:
        """Time one message (or collective) of ``kind`` takes to arrive."""
        size = self.message_bytes.get(CHANNELS.get(kind, ""), 0.0)
        return self.latency + (size / self.bandwidth if size else 0.0)


@dataclass(frozen=True)
class Event:
    """One action on one rank: it started at ``start`` and ended at ``end``; ``busy`` when it computed."""

    start: float
    end: float
    action: Action

    @property
    def busy(self) -> bool:
        return self.action.kind in BUSY_KINDS


@dataclass
class Simulation:
    """What :func:`simulate` found.

    Attributes:
        timeline: ``{rank: [Event, ...]}`` in each rank's order.
        makespan: when the last action ended.
        bubble: ``{rank: share of the makespan the rank spent not computing}``.
        peak_activations: ``{rank: most stage forwards held for their backward at once}`` (a memory proxy).
        peak_resident: ``{rank: most of those whose activations are on the device at once}``: with activation
            swap, the forwards offloaded between ``SWAP_WAIT_OFFLOAD`` and ``SWAP_LAUNCH_LOAD`` are not
            (:func:`~.swap.peak_resident`); without, ``peak_activations``.
    """

    timeline: dict[int, list[Event]]
    makespan: float
    bubble: dict[int, float]
    peak_activations: dict[int, int]
    peak_resident: dict[int, int] = field(default_factory=dict)

    @property
    def mean_bubble(self) -> float:
        """``1 - sum busy / (ranks * makespan)``."""
        return sum(self.bubble.values()) / len(self.bubble) if self.bubble else 0.0


class Deadlock(ValueError):
    """The schedule cannot finish. ``waits`` maps each stuck rank to ``(its next action, the ranks it waits
    for)``; the message names a cycle of ranks that wait on each other when there is one."""

    def __init__(self, waits: dict[int, tuple[Action, list[int]]], note: str = ""):
        self.waits = waits
        cycle = _cycle({r: peers for r, (_, peers) in waits.items()})
        lines = [f"rank {r} waits at {a} for rank(s) {peers}" for r, (a, peers) in sorted(waits.items())]
        head = "deadlock" + (": ranks " + " -> ".join(map(str, cycle)) + " wait on each other" if cycle else "")
        super().__init__(head + "; " + "; ".join(lines) + (f"; {note}" if note else ""))


def _cycle(graph: dict[int, list[int]]) -> list[int]:
    for start in sorted(graph):
        path, node = [], start
        while node in graph and node not in path:
            path.append(node)
            node = next(iter(graph[node]), None)
        if node in path:
            return path[path.index(node):] + [node]
    return []


def split_pairs(order: list[Action]) -> set[tuple[int, int]]:
    """The ``(stage, micro)`` whose backward ``order`` runs as a ``B`` and a ``W``."""
    weights = {(a.stage, a.micro) for a in order if a.kind is Kind.W}
    return {(a.stage, a.micro) for a in order if a.kind is Kind.B and (a.stage, a.micro) in weights}


def simulate(orders: dict[int, list[Action]], costs: Costs | None = None) -> Simulation:
    """Run every rank's action list under ``costs``.

    Raises:
        ValueError: ``costs``' per-micro weights are not one per micro-batch of ``orders`` (naming the field).
        Deadlock: no rank can move and some have actions left (a receive whose send never comes or comes after
            the receiver's own wait, a collective some rank never reaches), or two ranks pair messages in
            different orders.
    """
    (costs := costs or Costs()).check_micros(orders)
    clock = {r: 0.0 for r in orders}
    pc = {r: 0 for r in orders}
    sent: dict[tuple[int, int], list[tuple[tuple, float]]] = {}
    taken: dict[tuple[int, int], int] = {}
    timeline: dict[int, list[Event]] = {r: [] for r in orders}
    left = sum(len(a) for a in orders.values())
    split = {r: split_pairs(actions) for r, actions in orders.items()}

    def run(rank: int, a: Action, start: float, end: float) -> None:
        nonlocal left
        end += costs.dispatch
        timeline[rank].append(Event(start, end, a))
        clock[rank], pc[rank], left = end, pc[rank] + 1, left - 1

    while left:
        moved = False
        for rank, actions in orders.items():
            while pc[rank] < len(actions) and actions[pc[rank]].kind not in COLLECTIVE_KINDS:
                a, start = actions[pc[rank]], clock[rank]
                if a.kind in RECV_KINDS:
                    queue, i = sent.get((a.peer, rank), []), taken.get((a.peer, rank), 0)
                    if i >= len(queue):
                        break
                    if queue[i][0] != a.message():
                        raise Deadlock({rank: (a, [a.peer])}, f"rank {a.peer}'s message number {i} to rank {rank} "
                                                              f"is {queue[i][0]}, but rank {rank} expects {a.message()}")
                    taken[(a.peer, rank)] = i + 1
                    ready = max(start, queue[i][1])
                    run(rank, a, start, ready + costs.compute(a))
                elif a.kind in SEND_TO_RECV:
                    end = start + costs.send_overhead
                    sent.setdefault((rank, a.peer), []).append((a.message(), end + costs.dispatch +
                                                                costs.transfer(a.kind)))
                    run(rank, a, start, end)
                else:
                    run(rank, a, start, start + costs.compute(a, (a.stage, a.micro) in split[rank]))
                moved = True
        heads = {r: orders[r][pc[r]] for r in orders if pc[r] < len(orders[r])}
        if heads and len(heads) == len(orders) and all(h.kind in COLLECTIVE_KINDS for h in heads.values()):
            if len({h.kind for h in heads.values()}) > 1:
                raise Deadlock({r: (h, [q for q in orders if q != r]) for r, h in heads.items()},
                               "ranks reached different collectives")
            start = max(clock.values())
            for rank, a in heads.items():
                run(rank, a, start, start + costs.transfer(a.kind))
            moved = True
        if not moved:
            raise _stuck(orders, heads)
    return _result(orders, timeline)


def _result(orders: dict[int, list[Action]], timeline: dict[int, list[Event]]) -> Simulation:
    """The :class:`Simulation` of a finished ``timeline``."""
    makespan = max((e.end for events in timeline.values() for e in events), default=0.0)
    bubble = {r: 1.0 - sum(e.end - e.start for e in events if e.busy) / makespan if makespan else 0.0
              for r, events in timeline.items()}
    return Simulation(timeline, makespan, bubble, {r: peak_in_flight(orders[r]) for r in orders},
                      {r: peak_resident(orders[r]) for r in orders})


def _stuck(orders: dict[int, list[Action]], heads: dict[int, Action]) -> Deadlock:
    """The :class:`Deadlock` of ranks stuck at ``heads``: a receive waits for its peer, a collective for the
    ranks not at it."""
    waits = {}
    for rank, a in heads.items():
        if a.kind in COLLECTIVE_KINDS:
            waits[rank] = (a, [q for q in orders if q not in heads or heads[q].kind is not a.kind])
        else:
            waits[rank] = (a, [a.peer])
    return Deadlock(waits)
