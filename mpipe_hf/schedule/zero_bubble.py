"""Zero-bubble MPipe: each body backward split into ``B`` and ``W``, and each ``W`` run where its rank would
otherwise wait (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024; the memory-neutral ZB-H1 of its
section 3).

A stage's backward is two computations. ``B`` is the gradient of the stage's inputs: the next rank down waits for
it. ``W`` is the gradient of its weights: nobody waits for it until the optimizer step. :func:`split_backwards`
turns every ``B(s, m)`` of the interleaved 1F1B body into ``B(s, m), W(s, m)``, and into a ``W(s, m)`` alone for a
stage whose inputs need no gradient (stage 0, unless ``P`` is trainable: :meth:`.ScheduleConfig.needs_input_grad`;
its whole backward can then wait).

:func:`place_weights` then lists every rank's actions again by running the schedule under its costs, one action
at a time in the order of the ranks' clocks: a rank that would wait for a message runs its oldest pending ``W``
instead when the ``W`` ends before the message arrives, and so does a rank about to start a forward while it
holds as many forwards in flight (forwards whose ``W`` has not run: ``W`` still reads their activations) as the
unsplit schedule's peak over the ranks, so no rank holds more activations than the unsplit schedule's fullest rank
(rank 0) does: the pipeline's peak stays that of 1F1B (ZB-H1; ranks past 0 may hold more than they did, up to
rank 0's count). The pending ``W`` run before any collective and at the end. The other actions keep their order,
so every pair of ranks still posts its sends and receives in one order. Where no listing is faster under the
costs than ``W`` right after ``B``, that is kept. Only the moment a weight gradient is computed changes: the
numerics are the unsplit schedule's.

The preprocess's backward, ``TRANSPOSE_BWD``, is weight work of the same kind (``P``'s inputs take no gradient)
and is listed the same way, after the pending ``W`` (it holds no stage's activations): on rank 0 from its place
after the stage-0 ``B``, and with owner-backward on every other owner from the moment its feature gradient is
received (``GRAD_RECV``). A rank takes a gradient as soon as it has arrived and is its pair's next message, and
must take it before a later message of the pair (:mod:`.lowering` keeps each pair's order), so the tower's
backward runs in the owners' waits instead of after their bodies (where SPEC.md's step 4 sent every gradient
after the body).
"""

from __future__ import annotations

from collections import deque

from .actions import COLLECTIVE_KINDS, RECV_KINDS, SEND_TO_RECV, Action, Kind
from .config import ScheduleConfig
from .interleaved import peak_in_flight
from .simulate import Costs, simulate, split_pairs


def split_backwards(cfg: ScheduleConfig, order: list[Action]) -> list[Action]:
    """``order`` (a body order, ``F``/``B``) with each ``B(s, m)`` followed by its ``W(s, m)``, or replaced by a
    ``W(s, m)`` alone where stage ``s``'s inputs need no gradient."""
    out = []
    for a in order:
        if a.kind is Kind.B:
            out += ([a] if cfg.needs_input_grad(a.stage) else []) + [Action(Kind.W, a.micro, a.stage)]
        else:
            out.append(a)
    return out


def place_weights(orders: dict[int, list[Action]], costs: Costs | None = None,
                  passes: int = 32) -> dict[int, list[Action]]:
    """Move the weight work of a lowered schedule (each ``W`` right after its ``B``; each ``TRANSPOSE_BWD``
    after its stage-0 ``B`` or, on an owner, after the body) and the owners' ``GRAD_RECV`` into the ranks' waits,
    as the module docstring says, under ``costs`` (unit costs when ``None``).

    Weight work goes into a wait only when it ends before the awaited message arrives, so it never delays a
    message another rank waits for. A message not sent yet is expected when it arrived in the previous listing
    (the first listing expects them as ``orders`` has them); the listings repeat until one equals the one before
    (at most ``passes``).

    Returns:
        ``{rank: [Action, ...]}``: the same actions, the weight work and gradient receives moved; the fastest
        (under ``costs``) of the listings and ``orders``.
    """
    costs = costs or Costs()
    best, best_span = orders, simulate(orders, costs).makespan
    expected, previous = _arrivals(orders, costs), None
    for _ in range(passes):
        listed = _list_weights(orders, costs, expected)
        if listed is None or listed == previous:
            break
        previous = listed
        span = simulate(listed, costs).makespan
        if span < best_span - 1e-12:
            best, best_span = listed, span
        expected = _arrivals(listed, costs)
    return best


def _arrivals(orders: dict[int, list[Action]], costs: Costs) -> dict[tuple, float]:
    """``{(sender, receiver, message): when it arrives}`` when ``orders`` runs under ``costs``."""
    out = {}
    for r, events in simulate(orders, costs).timeline.items():
        for e in events:
            if e.action.kind in SEND_TO_RECV:
                out[(r, e.action.peer, e.action.message())] = e.end + costs.transfer(e.action.kind)
    return out


WEIGHT_KINDS = (Kind.W, Kind.TRANSPOSE_BWD)  # the work a listing moves into the ranks' waits


def _list_weights(orders: dict[int, list[Action]], costs: Costs,
                  expected: dict[tuple, float]) -> dict[int, list[Action]] | None:
    """One listing of :func:`place_weights`; ``None`` if it gets stuck (never for a validated schedule).

    The weight work leaves the orders: the ``W`` (pending from the position of the action before it) and the
    ``TRANSPOSE_BWD`` (pending after its ``GRAD_RECV`` on an owner past rank 0, else from its position), and so
    do the ``GRAD_RECV``: a rank takes its channel's next message when that is a gradient that has arrived, or
    when it must (the rank receives a later message of the channel, or has nothing else left)."""
    return _Listing(orders, costs, expected).run()


def _releases(orders: dict[int, list[Action]], after_grad: dict[int, dict[int, Action]]):
    """Where the orders put the weight work and the gradient receives, counted in base actions (the others):
    ``({rank: {base index: the work it makes pending}}, {rank: {GRAD_RECV: the base index it must come before}})``.
    A ``TRANSPOSE_BWD`` in ``after_grad`` is made pending by its ``GRAD_RECV`` instead."""
    release: dict[int, dict[int, list[Action]]] = {r: {} for r in orders}
    due: dict[int, dict[Action, int]] = {r: {} for r in orders}
    for r, actions in orders.items():
        count = 0
        for a in actions:
            if a.kind in WEIGHT_KINDS and a is not after_grad[r].get(a.micro):
                release[r].setdefault(count, []).append(a)
            elif a.kind is Kind.GRAD_RECV:
                due[r][a] = count
            elif a.kind not in WEIGHT_KINDS:
                count += 1
    return release, due


def _channels(orders: dict[int, list[Action]]) -> dict[tuple[int, int], list[tuple]]:
    """Every pair's messages, ``{(sender, receiver): [message, ...]}``, in the sender's order."""
    channel: dict[tuple[int, int], list[tuple]] = {}
    for src, actions in orders.items():
        for a in actions:
            if a.kind in SEND_TO_RECV:
                channel.setdefault((src, a.peer), []).append(a.message())
    return channel


class _Listing:
    """One listing's run of the ranks under ``costs``: what the orders fix (each rank's base actions, where its
    weight work becomes pending, its gradient receives, every pair's messages, the in-flight cap) and each rank's
    state (its clock, its next base action ``pc``, its pending weight work, its forwards in flight ``live``, the
    actions listed so far, the messages sent and taken)."""

    def __init__(self, orders: dict[int, list[Action]], costs: Costs, expected: dict[tuple, float]):
        self.costs, self.expected = costs, expected
        self.grads = {r: [a for a in actions if a.kind is Kind.GRAD_RECV] for r, actions in orders.items()}
        self.after_grad = {r: {a.micro: a for a in actions if a.kind is Kind.TRANSPOSE_BWD and a.micro in {
            g.micro for g in self.grads[r]}} for r, actions in orders.items()}  # micro -> its TRANSPOSE_BWD
        self.base = {r: [a for a in actions if a.kind not in WEIGHT_KINDS and a.kind is not Kind.GRAD_RECV]
                     for r, actions in orders.items()}
        self.release, self.due = _releases(orders, self.after_grad)
        self.channel = _channels(orders)
        self.split = {r: split_pairs(actions) for r, actions in orders.items()}
        self.cap = max(peak_in_flight(actions) for actions in orders.values())
        self.clock = {r: 0.0 for r in orders}
        self.pc = {r: 0 for r in orders}
        self.pending: dict[int, dict[Kind, deque]] = {r: {k: deque() for k in WEIGHT_KINDS} for r in orders}
        self.live = {r: 0 for r in orders}
        self.out: dict[int, list[Action]] = {r: [] for r in orders}
        self.sent: dict[tuple[int, int], list[tuple[tuple, float]]] = {}
        self.taken: dict[tuple[int, int], int] = {}

    def run(self) -> dict[int, list[Action]] | None:
        """List every rank's actions, one move at a time in the order of the ranks' clocks; ``None`` if stuck."""
        ranks = list(self.base)
        moves = {r: self.move(r) for r in ranks}  # a rank's move changes only when it acts or a message reaches it
        while any(m is not None for m in moves.values()) or any(
                self.pc[r] < len(self.base[r]) or self.grads[r] for r in ranks):
            ready = [r for r, m in moves.items() if m is not None]
            if ready:
                r = min(ready, key=lambda q: (self.clock[q], q))
                reached = self.act(r, moves[r])
                if reached is not None:
                    moves[reached] = self.move(reached)
                moves[r] = self.move(r)
                continue
            if not self.collective():
                return None
            moves = {r: self.move(r) for r in ranks}
        return self.out

    def act(self, r: int, move) -> int | None:
        """Make rank ``r``'s ``move`` (see :meth:`move`); the rank a send of it reaches, else ``None``."""
        if isinstance(move, Action):  # a GRAD_RECV: its TRANSPOSE_BWD becomes pending
            self.grads[r].remove(move)
            self.receive(r, move, self.clock[r])
            self.pending[r][Kind.TRANSPOSE_BWD].append(self.after_grad[r][move.micro])
            return None
        if move in WEIGHT_KINDS:
            a = self.pending[r][move].popleft()
            self.emit(r, a, self.clock[r] + self.compute(r, a))
            return None
        a = self.base[r][self.pc[r]]
        self.run_base(r)
        return a.peer if a.kind in SEND_TO_RECV else None

    def collective(self) -> bool:
        """Run the collective every rank has reached with nothing local left, from the latest clock; ``False``
        (stuck) where some rank has not reached it or still has work to do before it."""
        heads = {r: self.base[r][self.pc[r]] for r in self.base if self.pc[r] < len(self.base[r])}
        if len(heads) != len(self.base) or any(h.kind not in COLLECTIVE_KINDS for h in heads.values()) or any(
                self.oldest(r) is not None or any(self.due[r][g] <= self.pc[r] for g in self.grads[r])
                for r in self.base):
            return False
        start = max(self.clock.values())
        for r, a in heads.items():
            self.pc[r] += 1
            self.clock[r] = start
            self.emit(r, a, start + self.costs.transfer(a.kind))
        return True

    def compute(self, r: int, a: Action) -> float:
        return self.costs.compute(a, (a.stage, a.micro) in self.split[r])

    def emit(self, r: int, a: Action, end: float) -> None:
        """List ``a`` on rank ``r``, ending at ``end``, and count the forwards it puts in flight or retires."""
        self.out[r].append(a)
        self.clock[r] = end + self.costs.dispatch
        if a.kind is Kind.F:
            self.live[r] += 1
        elif a.kind is Kind.W or (a.kind is Kind.B and (a.stage, a.micro) not in self.split[r]):
            self.live[r] -= 1

    def head(self, r: int, peer: int) -> tuple[tuple | None, float | None]:
        """The next message ``peer`` -> ``r``, and when it arrives (``None``: not sent yet; then its expected
        arrival comes from the previous listing)."""
        queue, i = self.channel.get((peer, r), []), self.taken.get((peer, r), 0)
        if i >= len(queue):
            return None, None
        done = self.sent.get((peer, r), [])
        return queue[i], (done[i][1] if i < len(done) else None)

    def arrived_grad(self, r: int, ready_by: float, only_due: bool = False):
        """A ``GRAD_RECV`` of ``r`` whose gradient is its channel's next message and arrives by ``ready_by``
        (``only_due``: one of those the orders have before ``r``'s next action)."""
        for g in self.grads[r]:
            if only_due and self.due[r][g] > self.pc[r]:
                continue
            message, at = self.head(r, g.peer)
            if message == g.message() and at is not None and at <= ready_by + 1e-12:
                return g
        return None

    def fitting(self, r: int, arrival: float):
        """The oldest ``W``, else the oldest ``TRANSPOSE_BWD``, that ends before ``arrival``."""
        for kind in WEIGHT_KINDS:
            work = self.pending[r][kind]
            if work and self.clock[r] + self.compute(r, work[0]) + self.costs.dispatch <= arrival + 1e-12:
                return kind
        return None

    def oldest(self, r: int):
        return next((kind for kind in WEIGHT_KINDS if self.pending[r][kind]), None)

    def move(self, r: int):
        """The move rank ``r`` makes next: a weight kind (run that pending work), a ``GRAD_RECV`` (take it),
        ``"base"``, or ``None`` (it waits)."""
        for a in self.release[r].pop(self.pc[r], []):
            self.pending[r][a.kind].append(a)
        grad = self.arrived_grad(r, self.clock[r])
        if grad is not None:
            return grad
        a = self.base[r][self.pc[r]] if self.pc[r] < len(self.base[r]) else None
        if a is None or a.kind in COLLECTIVE_KINDS:  # everything local must be done first
            if self.oldest(r) is not None:
                return self.oldest(r)
            return self.arrived_grad(r, float("inf"), only_due=True)
        if a.kind is Kind.F and self.live[r] >= self.cap and self.pending[r][Kind.W]:
            return Kind.W
        if a.kind in RECV_KINDS:
            return self.wait_move(r, a)
        return "base"

    def wait_move(self, r: int, a: Action):
        """Rank ``r``'s move at its receive ``a``: pending weight work that ends before the message arrives, else
        the receive (``"base"``) or the gradient its channel holds first, or ``None`` while nothing was sent."""
        message, at = self.head(r, a.peer)
        arrival = at if at is not None else self.expected.get((a.peer, r, message), 0.0)
        kind = self.fitting(r, arrival)
        if kind is not None:
            return kind
        if at is None:
            return None
        return "base" if message == a.message() else Action(Kind.GRAD_RECV, message[1], peer=a.peer)

    def run_base(self, r: int) -> None:
        """Run rank ``r``'s next base action: a receive waits for its message, a send posts one."""
        a, start = self.base[r][self.pc[r]], self.clock[r]
        self.pc[r] += 1
        if a.kind in RECV_KINDS:
            self.receive(r, a, start)
        elif a.kind in SEND_TO_RECV:
            end = start + self.costs.send_overhead
            self.sent.setdefault((r, a.peer), []).append(
                (a.message(), end + self.costs.dispatch + self.costs.transfer(a.kind)))
            self.emit(r, a, end)
        else:
            self.emit(r, a, start + self.compute(r, a))

    def receive(self, r: int, a: Action, start: float) -> None:
        i = self.taken.get((a.peer, r), 0)
        self.taken[(a.peer, r)] = i + 1
        self.emit(r, a, max(start, self.sent[(a.peer, r)][i][1]) + self.compute(r, a))
