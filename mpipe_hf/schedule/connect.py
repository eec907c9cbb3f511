"""Point-to-point communicator set-up: the order every rank connects its peers in, and a model of NCCL's lazy
set-up that shows why it is needed.

The runtime sends each transfer over one of two process groups, ``up`` (to a higher rank) and ``down`` (to a
lower one; :meth:`mpipe_hf.runtime.p2p.P2P.channel`). NCCL builds the two-rank communicator of a (group, pair of
ranks) lazily, at the pair's first send or receive on that group, and that call blocks the host until the other
rank makes its own first call on the same (group, pair). A (group, pair) is named here by its *directed pair*
``(src, dst)``: ``up`` carries ``lo -> hi`` and ``down`` ``hi -> lo``, so the directed pair fixes the group. When
rank ``A``'s first operation with ``B`` is on one group and ``B``'s first with ``A`` is on the other, each waits
for the other to come to a group it never reaches first: the first step hangs. Gloo connects every pair when a
group is made, so CPU runs never see it.

The fix: before a step's first transfer, each rank connects every directed pair its own action list uses that is
not connected yet (:func:`connect_order`), one after the other in one global order, the sorted directed pairs;
the source sends one element, the destination receives it, and both wait for it. Every transfer of a step is in
both ranks' lists, so both connect the same pairs, and a rank blocked on pair ``p`` waits for a peer that is on a
pair below ``p`` in the order (it still has ``p`` ahead). A chain of such waits goes down the order, which is
finite, so it ends at a rank that can move: no deadlock, as with locks taken in one global order. The prologue
runs on every backend (on gloo it is one tiny message per pair), so CPU tests run the same code.

:func:`step_ops` gives a rank's communication operations in order; :func:`lazy_setup` runs every rank's
operations under the lazy set-up model and reports who waits on what when nothing can move. Pure Python: no
``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from .actions import COLLECTIVE_KINDS, RECV_KINDS, SEND_TO_RECV, Action

Pair = tuple[int, int]  # a directed pair (source rank, destination rank)
CONNECT = "connect"     # what names the operations of the connect prologue (and P2P.first_uses its first uses)


def channel(src: int, dst: int) -> str:
    """The group a transfer from ``src`` to ``dst`` goes over, as :meth:`P2P.channel` picks it."""
    return "up" if src < dst else "down"


@dataclass(frozen=True)
class Op:
    """One communication operation of one rank.

    Attributes:
        kind: ``"send"`` (posted, the host goes on), ``"recv"`` (the host waits until the message's send is
            posted: the NCCL path reads each transfer's shapes on the host), ``"drain"`` (the host waits until
            every send this rank posted was received: :meth:`P2P.drain`) or ``"barrier"`` (a collective on the
            pipeline group: every rank must reach it).
        src, dst: the transfer's ranks (``None`` for a drain or a barrier).
        what: what it comes from (an :class:`~.actions.Action` or a label), for reports.
    """

    kind: str
    src: int | None = None
    dst: int | None = None
    what: object = None

    @property
    def pair(self) -> Pair | None:
        """The directed pair ``(src, dst)`` of a send or receive, else ``None``."""
        return None if self.src is None else (self.src, self.dst)

    @property
    def group(self) -> str | None:
        """``"up"`` or ``"down"`` for a send or receive (:func:`channel`), else ``None``."""
        return None if self.src is None else channel(self.src, self.dst)

    def __str__(self) -> str:
        where = f" {self.src}->{self.dst} on {self.group}" if self.src is not None else ""
        return f"{self.kind}{where}" + (f" ({self.what})" if self.what is not None else "")


def action_ops(rank: int, actions: Iterable[Action]) -> list[Op]:
    """``rank``'s operations of an action list, in order, as the handlers run them: a sending kind posts one
    transfer to ``a.peer``, a receiving kind takes one from it, ``PARAM_BROADCAST``/``GRAD_REDUCE`` are
    collectives on the pipeline group; every other kind is local."""
    ops = []
    for a in actions:
        if a.kind in SEND_TO_RECV:
            ops.append(Op("send", rank, a.peer, a))
        elif a.kind in RECV_KINDS:
            ops.append(Op("recv", a.peer, rank, a))
        elif a.kind in COLLECTIVE_KINDS:
            ops.append(Op("barrier", what=a))
    return ops


def step_ops(rank: int, actions: Iterable[Action], tied_peers: Sequence[int] = ()) -> list[Op]:
    """``rank``'s operations of a whole step as the executor runs it: the action list, the drain of its sends,
    the all-reduce of the step's sums, then the exchange of tied gradients (a send to each of ``tied_peers``, then
    a receive from each, then a drain). An evaluation is the same with no tied peers (its drain and all-reduce
    end it)."""
    ops = action_ops(rank, actions) + [Op("drain", what="the step's sends"), Op("barrier", what="the loss sums")]
    ops += [Op("send", rank, peer, "TIED_GRAD") for peer in tied_peers]
    ops += [Op("recv", peer, rank, "TIED_GRAD") for peer in tied_peers]
    return ops + [Op("drain", what="the tied gradients")]


def connect_order(rank: int, ops: Iterable[Op], connected: Iterable[Pair] = ()) -> list[Pair]:
    """The directed pairs ``rank`` connects before the step (module docstring): every pair of ``ops`` not in
    ``connected``, in the global order (sorted)."""
    done = set(connected)
    return sorted({op.pair for op in ops if op.src is not None and op.pair not in done and rank in op.pair})


def step_pairs(rank: int, actions: Iterable[Action], tied_peers: Sequence[int] = ()) -> list[Pair]:
    """``connect_order(rank, step_ops(rank, actions, tied_peers))``, the pairs the executor passes to
    :meth:`P2P.connect` each step, without building the operations (a tenth of the time: the executor calls it
    every step)."""
    pairs = {(rank, a.peer) if a.kind in SEND_TO_RECV else (a.peer, rank) for a in actions if a.peer is not None}
    return sorted(pairs.union(*([(rank, q), (q, rank)] for q in tied_peers)))


def connect_ops(rank: int, pairs: Iterable[Pair]) -> list[Op]:
    """The operations of :meth:`P2P.connect` over ``pairs`` (in their order) on ``rank``: the source sends one
    element and waits for it to be received, the destination receives it."""
    ops = []
    for src, dst in pairs:
        if rank == src:
            ops += [Op("send", src, dst, CONNECT), Op("drain", what=CONNECT)]
        elif rank == dst:
            ops.append(Op("recv", src, dst, CONNECT))
    return ops


def with_connect(ops: dict[int, list[Op]]) -> dict[int, list[Op]]:
    """Every rank's ``ops`` behind its connect prologue (:func:`connect_order`, nothing connected before)."""
    return {r: connect_ops(r, connect_order(r, rank_ops)) + rank_ops for r, rank_ops in ops.items()}


@dataclass
class SetupOutcome:
    """What :func:`lazy_setup` found.

    Attributes:
        waits: ``{rank: (its next operation, why it waits, the ranks it waits for)}`` for every rank that could not
            finish; empty when every rank did.
        first_uses: ``{rank: [the operation of each first use of a directed pair, in order]}``.
    """

    waits: dict[int, tuple[Op, str, list[int]]]
    first_uses: dict[int, list[Op]]

    @property
    def deadlocked(self) -> bool:
        """Some rank could not finish."""
        return bool(self.waits)

    def __str__(self) -> str:
        if not self.waits:
            return "every rank finished"
        return "deadlock: " + "; ".join(f"rank {r} waits at {op}: {why}, for rank(s) {peers}"
                                        for r, (op, why, peers) in sorted(self.waits.items()))


def barrier(model, rank: int) -> tuple[str, list[int]] | None:
    """``rank`` at a collective of every rank, in a model holding ``barriers`` (``{rank: collectives reached, the
    one it waits at included}``) and ``waiting`` (the ranks whose arrival is counted): whom it waits for, or
    ``None`` once every rank reached it."""
    if rank not in model.waiting:  # its arrival counts once
        model.barriers[rank] += 1
        model.waiting.add(rank)
    late = [q for q, n in model.barriers.items() if n < model.barriers[rank]]
    if late:
        return "a collective", late
    model.waiting.discard(rank)
    return None


class _Model:
    """The state of :func:`lazy_setup`: where each rank is, what is connected, posted and received."""

    def __init__(self, ops: dict[int, list[Op]]):
        self.ops, self.pc = ops, {r: 0 for r in ops}
        self.connected: set[Pair] = set()
        self.arrived: dict[Pair, set[int]] = {}   # ranks blocked in the first use of a directed pair
        self.sent: dict[Pair, int] = {}           # messages posted on a directed pair
        self.received: dict[Pair, int] = {}       # messages received on it
        self.barriers = {r: 0 for r in ops}       # barriers each rank reached (the one it waits at included)
        self.waiting: set[int] = set()            # ranks whose arrival at their current barrier is counted
        self.first_uses: dict[int, list[Op]] = {r: [] for r in ops}
        self.changed = False                      # a pair got connected since the flag was last cleared

    def block(self, rank: int, op: Op) -> tuple[str, list[int]] | None:
        """Why ``rank`` cannot do ``op`` now (and whom it waits for), or ``None`` after doing it."""
        if op.kind == "barrier":
            return barrier(self, rank)
        if op.kind == "drain":
            late = sorted({d for (s, d), n in self.sent.items() if s == rank and self.received.get((s, d), 0) < n})
            return ("its sends to be received", late) if late else None
        pair, peer = op.pair, op.dst if op.src == rank else op.src
        if pair not in self.connected:
            here = self.arrived.setdefault(pair, set())
            if rank not in here:
                here.add(rank)
                self.first_uses[rank].append(op)
            if peer not in here:
                return f"the set-up of {op.group} {pair}", [peer]
            self.connected.add(pair)
            self.changed = True  # progress even when the receive below still waits
        if op.kind == "send":
            self.sent[pair] = self.sent.get(pair, 0) + 1
            return None
        if self.received.get(pair, 0) >= self.sent.get(pair, 0):
            return "the message's send", [peer]
        self.received[pair] = self.received.get(pair, 0) + 1
        return None


def lazy_setup(ops: dict[int, list[Op]]) -> SetupOutcome:
    """Run every rank's ``ops`` (:func:`step_ops`, optionally behind :func:`with_connect`'s prologue) under
    NCCL's lazy set-up: the first use of a directed pair blocks until the peer also reaches its first use of it;
    once connected a send is posted without waiting; a receive waits until its message's send is posted (messages
    of a pair match in order); a drain until this rank's sends were received; a barrier until every rank reaches
    it. Each rank runs as far as it can until all are done or none can move: the outcome does not depend on the
    interleaving, since nothing that lets a rank move is ever taken back.

    Returns:
        :class:`SetupOutcome`, with the waits of a deadlock (empty when every rank finished).
    """
    model = _Model(ops)
    moved = True
    while moved:
        moved, waits, model.changed = False, {}, False
        for rank, rank_ops in ops.items():
            while model.pc[rank] < len(rank_ops):
                op = rank_ops[model.pc[rank]]
                blocked = model.block(rank, op)
                if blocked is not None:
                    waits[rank] = (op, *blocked)
                    break
                model.pc[rank] += 1
                moved = True
        moved = moved or model.changed
    return SetupOutcome(waits, model.first_uses)


def lost_peer(run, ops: dict[int, list[Op]], lost: int, at: int) -> dict[int, list[int]]:
    """What the other ranks wait on when rank ``lost`` dies before its operation ``at`` (its process gone: it posts
    nothing after), under set-up model ``run`` (:func:`lazy_setup`, or :func:`~.eager.eager_streams` with its
    options bound): ``{rank: its chain of waits}`` for every live rank that cannot finish, each chain the ranks it
    waits for, one after the other, up to the lost rank (a rank waiting on several follows the first that leads
    there). A live rank whose waits lead only to live ranks that never move (a cycle among the living) is given the
    chain ``[]``: it would wait for ever though its peers know of the failure. With no such rank, every wait ends
    once the one before it in its chain does: the waits on the lost rank end by its connections' errors or the
    timeout, and a rank that ends (aborting its communicators) releases the ranks waiting on it."""
    outcome = run({r: rank_ops[:at] if r == lost else rank_ops for r, rank_ops in ops.items()})
    peers = {r: wait[2] for r, wait in outcome.waits.items() if r != lost}
    chains: dict[int, list[int]] = {}

    def chain(rank: int, seen: tuple[int, ...]) -> list[int]:
        for peer in peers[rank]:
            if peer == lost:
                return [lost]
            if peer in peers and peer not in seen:
                rest = chain(peer, seen + (peer,))
                if rest:
                    return [peer, *rest]
        return []

    for rank in peers:
        chains[rank] = chain(rank, (rank,))
    return chains
