"""Communicator set-up and the NCCL receive path, on CPU: the lazy-set-up model over a
random sweep of the builder's schedules, :meth:`P2P.connect` against fake groups, and the payload receive on a side
stream against fake CUDA streams. Single process, a few seconds."""

import contextlib
import dataclasses
import functools
import os
import random
import types

import pytest
import torch
import torch.distributed as dist

from mpipe_hf.runtime.handlers import HANDLERS
from mpipe_hf.runtime.step_context import Preprocess, StepContext
from mpipe_hf.runtime.p2p import CONNECT, CONNECT_TAG, P2P, decode_header, encode_header, payload_size
from mpipe_hf.schedule import Action, Kind, ScheduleConfig, build_schedule
from mpipe_hf.schedule.actions import COLLECTIVE_KINDS, RECV_KINDS, SEND_TO_RECV
from mpipe_hf.schedule.connect import (Op, action_ops, connect_ops, connect_order, lazy_setup, lost_peer, step_ops,
                                      step_pairs, with_connect)
from mpipe_hf.schedule.eager import PER_DIRECTION, PER_PAIR, eager_streams, pipeline_pairs
from mpipe_hf.schedule.forward import build_forward_schedule
from mpipe_hf.schedule.simulate import Costs
from mpipe_hf.schedule.swap import SwapConfig, with_swaps

PER_PEER = lambda src, dst: (min(src, dst), max(src, dst))  # noqa: E731 - torch's per-peer P2P communicator


def random_case(rng: random.Random):
    """One configuration ``build_schedule`` accepts, with the variant of the step the executor would run."""
    R, V = rng.randint(2, 8), rng.choice((1, 1, 2, 2, 3))
    M = rng.randint(1, 2 * R)
    preprocess = rng.choice(("identity", "frozen", "trainable"))
    placement = rng.choice(("prefix", "fill")) if preprocess == "frozen" else "prefix"
    overflow = rng.choice(("full", "min"))
    fill = placement == "fill"
    own, ahead = rng.choice(((True, False), (True, True), (False, True), (False, False))) if fill else (True, False)
    owners = None
    if overflow == "full" and rng.random() < 0.3:  # load-aware owners (look-ahead ones too)
        owners = tuple(rng.randrange(min(R, M)) for _ in range(M * (2 if fill and ahead else 1)))
    cfg = ScheduleConfig(R, V, M, preprocess=preprocess, overflow=overflow, placement=placement,
                         owner_backward=preprocess == "trainable" and rng.random() < 0.5,
                         less_memory=rng.random() < 0.3, zero_bubble=rng.random() < 0.3 and R * V * M <= 48,
                         owners=owners)
    costs = None if rng.random() < 0.5 else Costs(forward=rng.uniform(0.5, 2), backward=rng.uniform(1, 4),
                                                  preprocess_forward=rng.uniform(0.2, 3), data_load=rng.uniform(0, 1))
    swap = SwapConfig(True, rng.randint(2, 4)) if rng.random() < 0.3 else None
    return dict(cfg=cfg, costs=costs, own=own, ahead=ahead, swap=swap, tied=rng.random() < 0.5,
                forward=rng.random() < 0.15)


def case_ops(cfg, costs, own, ahead, swap, tied, forward) -> dict[int, list[Op]]:
    """Every rank's operations of the step (an evaluation when ``forward``) as the executor runs it, with an
    embedding tied between the first and last rank when ``tied``; checks :func:`step_pairs` on the way."""
    R = cfg.pp_size
    if forward:  # as evaluate builds it: this step's owners only
        cfg = dataclasses.replace(cfg, owners=cfg.owners and cfg.owners[:cfg.num_micro])
    orders = build_forward_schedule(cfg) if forward else build_schedule(cfg, costs, own, ahead)
    peers = {0: [R - 1], R - 1: [0]} if tied and not forward else {}
    ops = {}
    for r in orders:
        order = with_swaps(orders[r], swap, r)
        ops[r] = step_ops(r, order, peers.get(r, ()))
        assert step_pairs(r, order, peers.get(r, ())) == connect_order(r, ops[r])
    return ops


def sweep(n: int = 180, seed: int = 37) -> dict[str, int]:
    """Deadlocks over ``n`` random configurations of the builder (and evaluation's, and the tied exchange):
    lazy set-up without the connect prologue (a runtime that connects lazily) and with it (every first use then a
    connect, checked); with the prologue, eager set-up with a group per direction (an earlier runtime;
    sends free to start at their stream's head, so every deadlock found is one the device cannot avoid) and with a
    group per directed pair (the runtime now; conservatively, each send also waiting for its rank's earlier
    receives, and each rank's receives completing in the order it posted them, as on the runtime's one side
    stream; with NCCL connecting each pair at its first use, a host rendezvous, and the streams sharing CUDA's 8
    hardware queues). Controls, on the first ``n // 3``: eager per pair with the rendezvous but without the
    prologue, with the streams on one hardware queue, and with a communicator per peer carrying both directions
    (torch's own per-peer P2P communicators; sends free to start). Also checks that every pair a step uses has a group
    (:func:`pipeline_pairs`)."""
    rng = random.Random(seed)
    found = {"lazy without prologue": 0, "lazy": 0, "eager per direction": 0, "eager per pair": 0,
             "eager rendezvous without prologue": 0, "eager one hardware queue": 0,
             "eager per peer, both directions": 0}
    for i in range(n):
        case = random_case(rng)
        bare = case_ops(**case)
        ops = with_connect(bare)
        used = {op.pair for rank_ops in ops.values() for op in rank_ops if op.src is not None}
        assert used <= set(pipeline_pairs(case["cfg"].pp_size)), (case["cfg"], used)
        found["lazy without prologue"] += lazy_setup(bare).deadlocked
        outcome = lazy_setup(ops)
        found["lazy"] += outcome.deadlocked
        stray = [op for uses in outcome.first_uses.values() for op in uses if op.what != CONNECT]
        assert not stray, (case, stray)
        found["eager per direction"] += eager_streams(ops, PER_DIRECTION).deadlocked
        found["eager per pair"] += eager_streams(ops, PER_PAIR, True, rendezvous=True, queues=8).deadlocked
        if i < n // 3:
            found["eager rendezvous without prologue"] += eager_streams(bare, PER_PAIR, True,
                                                                        rendezvous=True).deadlocked
            found["eager one hardware queue"] += eager_streams(ops, PER_PAIR, True, queues=1).deadlocked
            found["eager per peer, both directions"] += eager_streams(ops, PER_PEER, rendezvous=True).deadlocked
    return found


def test_no_set_up_deadlocks_the_builders_schedules_with_a_group_per_directed_pair():
    """Over 180 of the builder's configurations (identity, frozen and trainable ``P``, fill
    placement, owner-backward, zero-bubble, swap, tied embeddings, evaluation), lazy set-up deadlocks in some
    without the connect prologue and in none with it; under NCCL's eager set-up (one FIFO stream per group) a
    group per direction deadlocks in some, a group per directed pair in none, also with NCCL connecting each pair
    at its first use (a host rendezvous inside the eagerly made communicator, which the prologue's messages are)
    and a rank's streams sharing 8 hardware queues. Controls: without the prologue that rendezvous deadlocks some;
    with every stream of a rank on one hardware queue, some deadlock; so do a pair's two directions on one
    communicator's stream."""
    found = sweep()
    print(f"180 random configurations: {found}")
    assert found["lazy without prologue"] > 0, "the model finds the deadlock the runtime had without the prologue"
    assert found["eager per direction"] > 0, "the model finds the hangs of a group per direction"
    assert found["eager rendezvous without prologue"] > 0, "eager set-up needs the prologue too"
    assert found["eager one hardware queue"] > 0, "the model finds the hangs of streams sharing a queue"
    assert found["eager per peer, both directions"] > 0, "a pair's two directions on one stream hang"
    assert found["eager per pair"] == 0 and found["lazy"] == 0, found


def test_a_peer_lost_in_the_prologue_leaves_every_live_wait_on_a_chain_to_it():
    """A rank dies during the connect prologue (before a random one of its operations there): under the lazy
    set-up and the eager one (rendezvous at first use, 8 hardware queues), every live rank that cannot finish
    waits on the lost rank or on a live rank that does, never in a cycle among the living, so every wait ends
    once the lost rank's neighbours' do. Control: two live ranks whose first uses cross wait on each other."""
    rng, longest = random.Random(11), 0
    eager = functools.partial(eager_streams, group_of=PER_PAIR, conservative=True, rendezvous=True, queues=8)
    for _ in range(40):
        case = random_case(rng)
        ops = with_connect(case_ops(**case))
        lost = rng.randrange(case["cfg"].pp_size)
        at = rng.randint(0, sum(op.what == CONNECT for op in ops[lost]))
        for run in (lazy_setup, eager):
            chains = lost_peer(run, ops, lost, at)
            assert all(chains.values()), (case["cfg"], lost, at, chains)
            longest = max([longest, *map(len, chains.values())])
    print(f"longest chain of waits to the lost rank: {longest}")
    crossed = {0: [Op("send", 0, 1), Op("recv", 1, 0), Op("drain")], 1: [Op("send", 1, 0), Op("recv", 0, 1),
                                                                        Op("drain")], 2: [Op("recv", 0, 2)]}
    assert lost_peer(lazy_setup, crossed, 2, 0) == {0: [], 1: []}


def test_pair_groups_made_by_their_members_in_sorted_order_cannot_deadlock():
    """Each rank makes the groups of its own pairs only (:func:`~mpipe_hf.runtime.groups.pair_groups`), each
    creation a rendezvous of the pair's two ranks (eager NCCL: ``ncclCommInitRank``; gloo: its connections), in the
    sorted order: no deadlock for any ``R`` up to 16, and a rank lost at any point leaves every live rank on a
    chain of waits to it. Control: ranks that take their pairs in different orders (odd ranks reversed) hang."""
    for R in range(2, 17):
        mine = {r: [p for p in pipeline_pairs(R) if r in p] for r in range(R)}
        made = {r: connect_ops(r, pairs) for r, pairs in mine.items()}
        assert not lazy_setup(made).deadlocked, R
        for at in range(0, len(made[R // 2]) + 1, 2):
            assert all(lost_peer(lazy_setup, made, R // 2, at).values()), (R, at)
        if R >= 3:
            crossed = {r: connect_ops(r, pairs[::-1] if r % 2 else pairs) for r, pairs in mine.items()}
            assert lazy_setup(crossed).deadlocked, R


@pytest.mark.skipif(os.environ.get("MPIPE_HF_FULL") != "1", reason="about 200 s: MPIPE_HF_FULL=1")
def test_no_eager_deadlock_at_twelve_and_sixteen_ranks():
    """The eager model (rendezvous at first use, 8 hardware queues, conservative) on 20 configurations at
    ``R = 12`` and 16, where rank 0's 30 pair streams share its 8 queues: none deadlocks."""
    rng, found, n = random.Random(5), 0, 0
    while n < 20:
        case, R = random_case(rng), rng.choice((12, 16))
        case["cfg"] = dataclasses.replace(case["cfg"], pp_size=R, num_micro=rng.randint(R, 2 * R), owners=None)
        try:
            ops = with_connect(case_ops(**case))
        except ValueError:  # a configuration the builder refuses at this size
            continue
        n += 1
        found += eager_streams(ops, PER_PAIR, True, rendezvous=True, queues=8).deadlocked
    assert found == 0


def test_eager_streams_hold_a_receive_behind_another_pairs_send():
    """A hang of a group per direction: rank 1's receive from rank 2 is queued on ``down`` behind its send to
    rank 0, which rank 0 receives only after its drain, which waits for rank 2 to receive, which rank 2 does only
    after its own drain, which waits for that receive of rank 1. With a group per directed pair each message has
    a stream of its own."""
    ops = {0: [Op("send", 0, 2), Op("drain"), Op("recv", 1, 0)],
           1: [Op("send", 1, 0), Op("recv", 2, 1), Op("drain")],
           2: [Op("send", 2, 1), Op("drain"), Op("recv", 0, 2)]}
    stuck = eager_streams(ops, PER_DIRECTION)
    assert stuck.deadlocked and all("complete on the device" in why for _, why, _ in stuck.waits.values()), stuck
    assert not eager_streams(ops, PER_PAIR, conservative=True).deadlocked
    assert not lazy_setup(with_connect(ops)).deadlocked, "lazily set up, the pairs' messages do not queue"


def test_pipeline_pairs_are_the_ring_and_rank_zero():
    assert pipeline_pairs(1) == []
    assert pipeline_pairs(2) == [(0, 1), (1, 0)]
    assert pipeline_pairs(4) == [(0, 1), (0, 2), (0, 3), (1, 0), (1, 2), (2, 0), (2, 1), (2, 3), (3, 0), (3, 2)]
    assert len(pipeline_pairs(8)) == 26


def test_every_placement_fill_first_step_deadlocks_without_the_prologue():
    """The fill-placement deadlock: a fill schedule's owners send to rank 0 on ``down`` before rank 0, whose first
    transfer with them is a forward to rank 1 on ``up``, receives from them."""
    cfg = ScheduleConfig(4, 1, 8, placement="fill")
    ops = case_ops(cfg, None, True, True, None, False, False)
    outcome = lazy_setup(ops)
    assert outcome.deadlocked and "set-up" in str(outcome)
    assert not lazy_setup(with_connect(ops)).deadlocked


def two_ranks(first0: list[Op], first1: list[Op]) -> dict[int, list[Op]]:
    """The operations of ranks 0 and 1."""
    return {0: first0, 1: first1}


def test_model_deadlocks_on_a_cross_group_first_use():
    """Each rank first sends to the other: rank 0 on ``up``, rank 1 on ``down``; both wait in the set-up."""
    ops = two_ranks([Op("send", 0, 1), Op("recv", 1, 0), Op("drain")], [Op("send", 1, 0), Op("recv", 0, 1),
                                                                          Op("drain")])
    outcome = lazy_setup(ops)
    assert outcome.deadlocked
    assert {r: (op.pair, peers) for r, (op, _, peers) in outcome.waits.items()} == {0: ((0, 1), [1]),
                                                                                    1: ((1, 0), [0])}
    assert all("set-up" in why for _, why, _ in outcome.waits.values())
    assert connect_order(0, ops[0]) == connect_order(1, ops[1]) == [(0, 1), (1, 0)]
    assert not lazy_setup(with_connect(ops)).deadlocked


def test_model_runs_a_consistent_order_and_catches_the_other_hangs():
    """A consistent first use finishes; receives before sends, unreceived sends and a lone collective hang."""
    consistent = two_ranks([Op("recv", 1, 0), Op("send", 0, 1), Op("drain"), Op("barrier")],
                           [Op("send", 1, 0), Op("recv", 0, 1), Op("drain"), Op("barrier")])
    outcome = lazy_setup(consistent)
    assert not outcome.deadlocked and str(outcome) == "every rank finished"
    assert [op.pair for op in outcome.first_uses[0]] == [(1, 0), (0, 1)]
    both_receive = with_connect(two_ranks([Op("recv", 1, 0), Op("send", 0, 1)], [Op("recv", 0, 1),
                                                                                Op("send", 1, 0)]))
    waits = lazy_setup(both_receive).waits
    assert {r: (why, peers) for r, (_, why, peers) in waits.items()} == {0: ("the message's send", [1]),
                                                                         1: ("the message's send", [0])}
    unreceived = two_ranks([Op("send", 0, 1), Op("send", 0, 1), Op("drain")], [Op("recv", 0, 1), Op("barrier")])
    waits = lazy_setup(unreceived).waits
    assert (waits[0][1], waits[0][2]) == ("its sends to be received", [1]) and waits[1][2] == [0]
    alone = two_ranks([Op("barrier")], [])
    assert lazy_setup(alone).waits[0][2] == [1]


def test_action_ops_follow_the_handlers():
    """Every transfer kind: the op the model takes is the call its handler makes on the runtime's P2P."""
    calls = []
    p2p = types.SimpleNamespace(send=lambda payload, dst, what, channel="": calls.append(("send", dst)),
                                recv=lambda src, what: calls.append(("recv", src)) or {}, device=torch.device("cpu"))
    ctx = StepContext(ScheduleConfig(6, 1, 4), 4, {}, Preprocess(None, (), ()), p2p, None, None, None)
    for kind in Kind:
        action = Action(kind, micro=3, stage=2, peer=5)
        ops = action_ops(4, [action])
        if kind in SEND_TO_RECV or kind in RECV_KINDS:
            for store in (ctx.data, ctx.pin, ctx.feats, ctx.feat_grad):  # what a sending handler ships
                store[3] = {}
            ctx.act[(2, 3)], ctx.grad[(2, 3)] = {}, {}
            calls.clear()
            HANDLERS[kind](ctx, action)
            assert calls == [(ops[0].kind, 5)], kind
            assert ops[0].pair == ((4, 5) if kind in SEND_TO_RECV else (5, 4))
        else:
            assert [op.kind for op in ops] == (["barrier"] if kind in COLLECTIVE_KINDS else []), kind


class FakeWork:
    def __init__(self, log, label):
        self.log, self.label = log, label

    def is_completed(self):
        return True

    def wait(self):
        self.log.append(("work.wait", self.label, torch.cuda.current_stream()))


class FakeGroup:
    """One rank's end of a pair's group of two (its lower pipeline rank group rank 0, as the runtime's) whose
    messages land at once; logs every call, in pipeline ranks, with the stream current then."""

    def __init__(self, rank, pair, queues, log):
        self._rank, self.members, self.queues, self.log = rank, sorted(pair), queues, log

    def rank(self):
        return self.members.index(self._rank)

    def size(self):
        return 2

    def send(self, tensors, dst, tag):
        dst = self.members[dst]
        self.queues.setdefault((self._rank, dst, tag), []).append(tensors[0].clone())
        self.log.append(("send", (self._rank, dst, tag), tensors[0].numel()))
        return FakeWork(self.log, "send")

    def recv(self, tensors, src, tag):
        src = self.members[src]
        tensors[0].copy_(self.queues[(src, self._rank, tag)].pop(0))
        self.log.append(("recv", (src, self._rank, tag), tensors[0].numel(), torch.cuda.current_stream()))
        return FakeWork(self.log, tensors[0].numel())


def fake_pairs(rank, queues, log, world=4):
    """``{(src, dst): FakeGroup}`` for every directed pair of ``world`` ranks that has ``rank``."""
    return {(s, d): FakeGroup(rank, (s, d), queues, log) for s in range(world) for d in range(world)
            if s != d and rank in (s, d)}


class FakeWatchdog:
    def __init__(self, log):
        self.log = log

    def wait(self, work, what):
        self.log.append(("host wait", str(what)))

    block = wait

    def failure(self, err, what):
        return err


def fake_p2p(rank, queues, log):
    return P2P(rank, fake_pairs(rank, queues, log), torch.device("cpu"), FakeWatchdog(log))


@contextlib.contextmanager
def fake_cuda(monkeypatch):
    """Fake CUDA streams and events on ``torch.cuda``, and ``record_stream`` on tensors; yields the log."""
    log, current = [], ["compute"]

    class Event:
        def record(self, stream=None):
            self.stream = stream or current[-1]
            log.append(("event.record", self, self.stream))

    class Stream(str):
        def wait_event(self, event):
            log.append(("wait_event", str(self), event))

        def wait_stream(self, other):
            log.append(("wait_stream", str(self), str(other)))

    @contextlib.contextmanager
    def stream(s):
        current.append(s)
        try:
            yield
        finally:
            current.pop()
    current[0] = Stream("compute")
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream("side"))
    monkeypatch.setattr(torch.cuda, "Event", lambda **kwargs: Event())
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[-1])
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: log.append(("record_stream", self.numel(),
                                                                                    str(s))))
    monkeypatch.setattr(dist, "get_backend", lambda group: "fake")
    yield log


def test_connect_walks_its_pairs_in_the_global_order_once(monkeypatch):
    """:meth:`P2P.connect` takes its own pairs not connected yet, sorted, each once; the runtime's first uses
    record which were connects."""
    with fake_cuda(monkeypatch):  # (the fake groups log the current stream; the gloo path uses none)
        log, queues = [], {(0, 1, CONNECT_TAG): [torch.zeros(1, dtype=torch.uint8)],
                           (2, 1, CONNECT_TAG): [torch.zeros(1, dtype=torch.uint8)]}
        p2p = fake_p2p(1, queues, log)
        p2p.connect([(2, 1), (1, 0), (0, 2), (0, 1), (1, 0)])
        assert [entry[1] for entry in log if entry[0] in ("send", "recv")] == [
            (0, 1, CONNECT_TAG), (1, 0, CONNECT_TAG), (2, 1, CONNECT_TAG)], "sorted, each once, this rank's only"
        assert sum(entry[0] == "host wait" for entry in log) == 3, "each side waits for its connect message"
        assert p2p.first_uses == [("0->1", 0, CONNECT), ("1->0", 0, CONNECT), ("2->1", 2, CONNECT)]
        log.clear()
        p2p.connect([(0, 1), (1, 0)])
        assert log == [], "a connected pair is not connected again"
        p2p.send({"x": torch.ones(3)}, 0, "SEND_B")
        p2p.send({"x": torch.ones(3)}, 2, "SEND_F")
        assert p2p.stray_first_uses() == [("1->2", 2, "SEND_F")]
        p2p.expect([0, 2])
        p2p.connect([(0, 1), (1, 0)])  # connected already: nothing to do
        with pytest.raises(RuntimeError, match="before the step's expect"):
            p2p.connect([(1, 3)])


def test_payload_is_received_on_a_side_stream_and_the_consumer_waits_on_an_event(monkeypatch):
    """NCCL path (faked): the second message's receive is issued on the side stream, the side stream waits for
    it, and the compute stream waits on an event recorded after it: nothing of it on the host, and the received
    tensors are the sent ones."""
    with fake_cuda(monkeypatch) as log:
        queues = {}
        sender = fake_p2p(0, queues, [])
        payload = {"x": torch.randn(2000), "m": torch.arange(10)}
        sender.send(payload, 1, "0SEND_F3@1")
        receiver = fake_p2p(1, queues, log)
        receiver.cuda = True  # the CUDA path, with tensors on the host
        got = receiver.recv(0, "1RECV_F3@0")
    assert all(torch.equal(got[k], payload[k]) for k in payload)
    size = payload_size(decode_header(encode_header(payload)))  # the second message: x's bytes, then m's
    assert size > 4096
    recvs = [entry for entry in log if entry[0] == "recv"]
    assert [(n, str(s)) for _, _, n, s in recvs] == [(4096, "side"), (size, "side")], \
        "every receive, the payload's too, is issued on the side stream"
    assert [str(e[2]) for e in log if e[0] == "work.wait" and e[1] == size] == ["side"]
    events = [e for e in log if e[0] == "event.record"]
    waited = [e for e in log if e[0] == "wait_event"]
    assert len(events) == 1 and str(events[0][2]) == "side"
    assert [(e[1], e[2]) for e in waited] == [("compute", events[0][1])], "the compute stream waits on the event"
    assert log.index(events[0]) > log.index(next(e for e in log if e[0] == "work.wait" and e[1] == size))
    assert ("record_stream", size, "compute") in log
    assert [e for e in log if e[0] == "host wait"] == [("host wait", "1RECV_F3@0 from pipeline rank 0")], \
        "the host waits for the first message (its shapes) only"


@pytest.mark.parametrize("tied", [False, True])
def test_step_ops_end_with_the_tied_exchange(tied):
    """Ranks 0 and 2 of a 3-rank, one-chunk schedule whose owners are ranks 0 and 1 never talk but for tied
    gradients: the tied pairs are in the prologue exactly when tied."""
    order = build_schedule(ScheduleConfig(3, 1, 2))[2]
    ops = step_ops(2, order, [0] if tied else [])
    tail = ["drain", "barrier", "send", "recv", "drain"] if tied else ["drain", "barrier", "drain"]
    assert [op.kind for op in ops[-len(tail):]] == tail
    assert [p for p in connect_order(2, ops) if 0 in p] == ([(0, 2), (2, 0)] if tied else [])
