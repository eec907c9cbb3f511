"""A model of NCCL's *eager* communicator set-up, and the pairs the runtime's groups cover.

When the default process group is bound to a device (``init_process_group(device_id=...)``), PyTorch makes the
NCCL communicator of every later group when the group is made (by ``ncclCommSplit`` of the default one), and a
send or receive on a group then runs on that group's one NCCL stream of the rank, in the order the host issued
it, behind every earlier operation of the same group. A send completes only together with its receive. So with
one group per *direction* (every send to a higher rank on ``up``), a send to rank ``C`` at the head of rank
``B``'s ``up`` stream holds up a receive from rank ``A`` queued behind it, whatever the peers do; a host that
then waits for its own sends (the step's drain) can wait for ever. With one group per *directed pair*, a stream
carries the messages of one pair in one direction only: the ``k``-th send of the pair meets the ``k``-th
receive, both at their stream's head once the earlier ones completed, so a message's completion depends only on
its receiver's host posting it, as under the lazy set-up once a pair is connected (:mod:`.connect`).

:func:`eager_streams` runs every rank's operations (:func:`.connect.step_ops`, optionally behind the connect
prologue) under that model for a given mapping of directed pairs to groups (:data:`PER_DIRECTION`,
:data:`PER_PAIR`) and reports who waits on what when nothing can move; optionally with what the plain stream model
leaves out: NCCL connecting a pair at its first use inside an eagerly made communicator (a host rendezvous of the
two ranks, which the connect prologue's messages are) and a rank's streams sharing CUDA's hardware queues (8 by
default), where an operation that cannot start holds the later ones of its queue. :func:`pipeline_pairs` is the set of
directed pairs the runtime makes a group for. Pure Python: no ``torch.distributed``.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from .connect import Op, Pair, SetupOutcome, barrier, channel

# a directed pair's group: one per direction (an older runtime, kept as the model's control), or one per
# directed pair (the runtime's own)
PER_DIRECTION: Callable[[int, int], object] = channel
PER_PAIR: Callable[[int, int], object] = lambda src, dst: (src, dst)


def pipeline_pairs(pp_size: int) -> list[Pair]:
    """Every directed pair of pipeline ranks a step can use, sorted (the order the runtime makes their groups
    in): each rank and its neighbours on the ring (a stage sends forward to the next stage's rank, its gradient
    back to the previous one; the tied embedding's exchange is between ranks ``R - 1`` and ``0``), and rank 0 with
    every rank (the MPipe transfers between the owners and rank 0). ``tests/test_connect.py`` checks that every
    schedule the builder makes stays within them."""
    pairs = set()
    for r in range(pp_size):
        for peer in ((r + 1) % pp_size, (r - 1) % pp_size, 0):
            if peer != r:
                pairs.update({(r, peer), (peer, r)})
    return sorted(pairs)


class _Streams:
    """The state of :func:`eager_streams`: each rank's host position, and its queued operations per group."""

    def __init__(self, ops: dict[int, list[Op]], group_of, conservative: bool, rendezvous: bool = False,
                 queues: int | None = None):
        self.ops, self.group_of, self.strict = ops, group_of, conservative
        self.rendezvous, self.n_queues = rendezvous, queues
        self.connected: set[Pair] = set()                  # pairs NCCL connected (rendezvous)
        self.arrived: dict[Pair, set[int]] = {}            # hosts at a pair's first use (rendezvous)
        self.hw: dict[tuple[int, object], int] = {}        # (rank, group) -> the hardware queue of its stream
        self.issued: dict[int, list] = {r: [] for r in ops}  # each rank's open device operations, in post order
        self.pc = {r: 0 for r in ops}
        self.changed = False                               # a pair got connected in this round (rendezvous)
        self.queues: dict[tuple[int, object], deque] = {}  # (rank, group) -> [(op, index on its pair, deps)]
        self.posted: dict[tuple[int, Pair], int] = {}      # (rank, pair) -> operations this rank posted on it
        self.done: set[tuple[int, Pair, int]] = set()      # (rank, pair, index) completed on the device
        self.recvs: dict[int, list] = {r: [] for r in ops}  # each rank's posted receives
        self.barriers = {r: 0 for r in ops}
        self.waiting: set[int] = set()

    def post(self, rank: int, op: Op) -> None:
        index = self.posted.get((rank, op.pair), 0)
        self.posted[(rank, op.pair)] = index + 1
        deps = list(self.recvs[rank]) if op.kind == "send" and self.strict else []
        if op.kind == "recv":
            self.recvs[rank].append((rank, op.pair, index))
        group = self.group_of(*op.pair)
        if (rank, group) not in self.hw:  # streams take the hardware queues in turn, in order of first use
            self.hw[(rank, group)] = sum(r == rank for r, _ in self.hw) % (self.n_queues or 1)
        self.queues.setdefault((rank, group), deque()).append((op, index, deps))
        self.issued[rank].append((group, op, index, deps))

    def host(self, rank: int, op: Op) -> tuple[str, list[int]] | None:
        """Why ``rank``'s host cannot do ``op`` now, or ``None`` after doing it."""
        if op.kind == "barrier":
            return barrier(self, rank)
        if op.kind == "drain":
            late = sorted({pair[1] for (r, pair), n in self.posted.items() if r == rank and pair[0] == rank
                           for i in range(n) if (rank, pair, i) not in self.done})
            return ("its sends to complete on the device", late) if late else None
        if self.rendezvous and op.pair not in self.connected:  # NCCL connects the pair inside this call (a
            here, peer = self.arrived.setdefault(op.pair, set()), op.dst if op.src == rank else op.src
            here.add(rank)  # receiver there has its header: the sender's host sent it before its NCCL call)
            if peer not in here:
                return f"NCCL's connection of {op.pair} at its first use (a host rendezvous)", [peer]
            self.connected.add(op.pair)
            self.changed = True  # progress, though the receive below may still wait
        if op.kind == "recv" and self.posted.get((op.src, op.pair), 0) <= self.posted.get((rank, op.pair), 0):
            return "the message's header (its send not posted)", [op.src]
        self.post(rank, op)
        return None

    def dispatchable(self) -> set[tuple[int, object]] | None:
        """The streams ``(rank, group)`` whose head the device can start now (``None``: every head, when streams
        do not share hardware queues). With ``n_queues`` queues per rank, a queue starts its operations in the
        order the host posted them, whatever their streams: one that cannot start (an earlier operation of its
        stream, or a receive it waits for, is not complete) holds every later one of the queue."""
        if self.n_queues is None:
            return None
        out = set()
        for rank, items in self.issued.items():
            items[:] = [it for it in items if (rank, it[1].pair, it[2]) not in self.done]
            held = set()
            for group, op, index, deps in items:
                queue = self.hw[(rank, group)]
                if queue in held:
                    continue
                if self.queues[(rank, group)][0][1] == index and all(d in self.done for d in deps):
                    out.add((rank, group))
                else:
                    held.add(queue)
        return out

    def first_open(self, rank: int):
        """``rank``'s oldest receive not completed yet (``None`` when all are)."""
        return next((r for r in self.recvs[rank] if r not in self.done), None)

    def device(self) -> bool:
        """Complete every send at a stream's head whose receive is at the head of the peer's stream of the same
        group (and, conservative, whose rank's earlier receives completed, and whose receive is its rank's oldest
        open one); whether any did."""
        moved, started = False, self.dispatchable()
        for (rank, group), queue in list(self.queues.items()):
            while queue and queue[0][0].kind == "send":
                op, index, deps = queue[0]
                peer = self.queues.get((op.dst, group))
                ready = all(d in self.done for d in deps) and (
                    not self.strict or self.first_open(op.dst) == (op.dst, op.pair, index)) and (
                    started is None or {(rank, group), (op.dst, group)} <= started)
                if not (ready and peer and peer[0][0].kind == "recv" and peer[0][0].pair == op.pair
                        and peer[0][1] == index):
                    break
                queue.popleft()
                peer.popleft()
                if started is not None:  # the streams' next heads: started or not, the next call tells
                    started -= {(rank, group), (op.dst, group)}
                self.done.update({(rank, op.pair, index), (op.dst, op.pair, index)})
                moved = True
        return moved

    def stuck(self) -> dict[int, tuple[Op, str, list[int]]]:
        """Operations left on the device once every host finished or waits: the streams' heads."""
        out = {}
        for (rank, group), queue in sorted(self.queues.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
            if queue and rank not in out:
                op = queue[0][0]
                out[rank] = (op, f"queued on the device behind nothing it can finish (group {group})",
                             [op.dst if op.src == rank else op.src])
        return out


def eager_streams(ops: dict[int, list[Op]], group_of=PER_DIRECTION, conservative: bool = False,
                  rendezvous: bool = False, queues: int | None = None) -> SetupOutcome:
    """Run every rank's ``ops`` with every communicator made before the step (eager set-up), each group one
    FIFO stream per rank (``group_of(src, dst)`` names a directed pair's group). The host posts a send and goes
    on; it posts a receive once the send's header arrived (the peer's host posted it: the runtime reads shapes
    from headers on the host), then goes on; a drain waits until this rank's sends completed on the device; a
    barrier until every rank reaches it. On the device, a send at the head of its stream completes together with
    its receive at the head of the peer's stream of the same group. ``conservative``: a send also waits for every
    receive its rank posted before it (its payload comes from compute queued after them), and a rank's receives
    complete in the order it posted them, whatever their groups (the runtime issues every payload receive on one
    side stream, which waits for each: :mod:`mpipe_hf.runtime.p2p`). Without it, a deadlock found is one the
    device cannot avoid; with it, a run that finishes is one the device finishes.

    ``rendezvous``: NCCL connects a pair inside an eagerly made communicator at the pair's first send or receive
    (its runtime connection), and that host call returns only once the peer's host made its own first call on the
    pair, as under the lazy set-up: the connect prologue's messages are those first uses. ``queues``: the streams
    of a rank share that many hardware queues (CUDA's ``CUDA_DEVICE_MAX_CONNECTIONS``, 8 by default), taken in
    turn in the order the streams are first used; a queue starts operations in the order they were posted, so one
    that cannot start yet holds every later one on its queue, whatever its stream (:meth:`_Streams.dispatchable`).

    Returns:
        :class:`~.connect.SetupOutcome`: the hosts' waits, or the device's stuck stream heads, when some rank
        cannot finish; ``first_uses`` empty (there is no lazy set-up).
    """
    model = _Streams(ops, group_of, conservative, rendezvous, queues)
    moved = True
    while moved:
        moved, waits, model.changed = model.device(), {}, False
        for rank, rank_ops in ops.items():
            while model.pc[rank] < len(rank_ops):
                blocked = model.host(rank, rank_ops[model.pc[rank]])
                if blocked is not None:
                    waits[rank] = (rank_ops[model.pc[rank]], *blocked)
                    break
                model.pc[rank] += 1
                moved = True
        moved = moved or model.changed
    return SetupOutcome(waits or model.stuck(), {r: [] for r in ops})
