"""The wire row: a micro-batch sent through the runtime's sender and wire code onto the device and run by stage 0.

A world of one process has no peer, so the row builds a loopback pair of pipeline ranks 0 and 1 inside this
process and routes the step's ``DATA`` and ``FWD`` payloads (what rank 0 receives from an owner) through it: the
real ``DATA_SEND``/``FWD_SEND`` handlers on a :class:`~mpipe_hf.runtime.p2p.P2P` of rank 1 (the owner), the real
``DATA_RECV``/``FWD_RECV`` handlers on one of rank 0, whose stage 0 then runs what it received.

- CUDA: the headers go over a real gloo pair (two ``ProcessGroupGloo`` over loopback, the header groups of the
  NCCL path); the payload, packed on the device by the sender (:func:`~mpipe_hf.runtime.wire.pack`), goes over a
  loopback standing for NCCL: the receive copies it into the receiver's buffer on the receiver's side stream,
  after an event recorded on the sender's stream at the send (the order NCCL keeps), and the receiver unpacks it
  on the device (:func:`~mpipe_hf.runtime.wire.device_unpack`). Every action, the transfers included, runs under
  sync-debug mode ``"error"``.
- CPU: headers and payloads over the real gloo pair (the gloo path: no header groups).

PASS: the step's loss equals the step's without the loopback, and (CUDA) nothing synchronised.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import threading
from collections import deque
from datetime import timedelta

import torch
import torch.distributed as dist

from .common import Row, Setup, closing, drop_grads, executor_for, sync_debug_step

CHECK = "wire loopback to stage 0"
TIMEOUT = timedelta(seconds=60)


class Done:
    """A finished work (the loopback's copies are ordered on the device when they are posted)."""

    def is_completed(self) -> bool:
        """Always true."""
        return True

    def wait(self, timeout=None) -> bool:
        """Nothing to wait for on the host."""
        return True


class DeviceLoopback:
    """One rank's end of a device loopback standing for an NCCL pair: a send records an event on the current
    stream and leaves the tensor; the matching receive makes its current stream wait for that event and copies
    the tensor into its buffer there (the buffer is then as a finished NCCL receive leaves it)."""

    def __init__(self, rank: int, queues: dict):
        self._rank, self.queues = rank, queues

    def rank(self) -> int:
        """This end's rank."""
        return self._rank

    def size(self) -> int:
        """Two ranks."""
        return 2

    def send(self, tensors, dst: int, tag: int) -> Done:
        """Leave ``tensors[0]`` for ``dst``, with an event on the sender's current stream."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(tensors[0].device))
        self.queues.setdefault((self._rank, dst, tag), deque()).append((tensors[0], event))
        return Done()

    def recv(self, tensors, src: int, tag: int) -> Done:
        """Copy the next tensor ``src`` sent into ``tensors[0]``, on the current stream after the send's event."""
        sent, event = self.queues[(src, self._rank, tag)].popleft()
        stream = torch.cuda.current_stream(tensors[0].device)
        stream.wait_event(event)
        tensors[0].copy_(sent, non_blocking=True)
        sent.record_stream(stream)  # the sender's buffer is read on this stream
        return Done()


class HostGroup:
    """A gloo group made outside the world's registry, which ``dist.get_backend`` does not know: ``P2P`` asks it
    (:func:`host_backend` answers for it)."""

    def __init__(self, group):
        self.group = group

    def rank(self) -> int:
        """This end's rank."""
        return self.group.rank()

    def size(self) -> int:
        """The group's size."""
        return self.group.size()

    def send(self, tensors, dst: int, tag: int):
        """gloo's send."""
        return self.group.send(tensors, dst, tag)

    def recv(self, tensors, src: int, tag: int):
        """gloo's receive."""
        return self.group.recv(tensors, src, tag)


def gloo_pair(prefix: str) -> dict[int, list]:
    """``{rank: [up, down]}``: two gloo groups of two ranks, both ends in this process, over loopback."""
    store, made, errors = dist.HashStore(), {}, []

    def make(rank: int) -> None:
        try:
            options = dist.ProcessGroupGloo._Options()
            options._timeout = TIMEOUT
            options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            made[rank] = [HostGroup(dist.ProcessGroupGloo(dist.PrefixStore(f"{prefix}/{name}", store), rank, 2,
                                                          options)) for name in ("up", "down")]
        except Exception as err:  # noqa: BLE001 - raised in the caller
            errors.append(err)
    threads = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return made


@contextlib.contextmanager
def host_backend():
    """``dist.get_backend`` answers ``"gloo"`` for a :class:`HostGroup` and ``"nccl"`` for a
    :class:`DeviceLoopback` (``P2P`` asks its groups' backends)."""
    original = dist.get_backend
    names = {HostGroup: "gloo", DeviceLoopback: "nccl"}
    dist.get_backend = lambda group=None: names.get(type(group)) or original(group)
    try:
        yield
    finally:
        dist.get_backend = original


def loopback(device: torch.device) -> tuple:
    """``(owner, rank0)``: the two :class:`~mpipe_hf.runtime.p2p.P2P` ends (pipeline ranks 1 and 0)."""
    from mpipe_hf.runtime.p2p import P2P
    from mpipe_hf.runtime.watchdog import Watchdog
    gloo, queues, ends = gloo_pair(f"gpu_check/{id(device)}"), {}, {}
    per_pair = "pairs" in inspect.signature(P2P.__init__).parameters  # a group per directed pair, or up/down
    for rank in (0, 1):
        watchdog = Watchdog(dist.HashStore(), f"loopback{rank}", TIMEOUT, threaded=True)
        cuda = device.type == "cuda"
        data = DeviceLoopback(rank, queues) if cuda else gloo[rank][0]  # carries rank 1 -> 0, the one pair used
        headers = tuple(gloo[rank]) if cuda else None
        with host_backend():
            ends[rank] = (P2P(rank, {(1, 0): data}, device, watchdog, headers) if per_pair
                          else P2P(data, data, device, watchdog, headers))
    return ends[1], ends[0]


@contextlib.contextmanager
def through_wire(owner, rank0, breaks: bool = False):
    """While active, every ``DATA_LOAD`` and ``TRANSPOSE_FWD`` of the executor ships what it made for stage 0
    from ``owner`` to ``rank0`` with the runtime's send and receive handlers, and stage 0 gets what arrived
    (``breaks``: one received floating tensor is perturbed)."""
    from mpipe_hf.runtime import handlers
    from mpipe_hf.schedule.actions import Action, Kind
    table, saved = handlers.HANDLERS, dict(handlers.HANDLERS)

    def shipping(kind: Kind, send: Kind, recv: Kind, store: str):
        """The handler of ``kind`` followed by ``send`` on the owner's end and ``recv`` on rank 0's of the
        micro's entry in ``ctx.<store>``."""
        def run(ctx, a) -> None:
            saved[kind](ctx, a)
            if a.micro not in getattr(ctx, store):
                return
            saved[send](dataclasses.replace(ctx, p2p=owner), Action(send, a.micro, peer=0))
            rank0.expect([1])
            saved[recv](dataclasses.replace(ctx, p2p=rank0), Action(recv, a.micro, peer=1))
            owner.drain()
            rank0.drain()
            got = getattr(ctx, store)[a.micro]
            floats = [k for k, v in got.items() if v.is_floating_point()]
            if breaks and floats:
                got[floats[0]] = got[floats[0]] * 1.5
        return run
    table[Kind.DATA_LOAD] = shipping(Kind.DATA_LOAD, Kind.DATA_SEND, Kind.DATA_RECV, "data")
    table[Kind.TRANSPOSE_FWD] = shipping(Kind.TRANSPOSE_FWD, Kind.FWD_SEND, Kind.FWD_RECV, "feats")
    try:
        yield
    finally:
        table.update(saved)


WIRE_CASES = ("sync-debug qwen2.5-vl frozen", "sync-debug qwen2.5-vl packed")


def through_loopback(setup: Setup, case, owner, rank0) -> tuple[str | None, float, float]:
    """``case``'s step as it is, then a warm-up and a step through the loopback (on CUDA under sync-debug):
    ``(the first line that synchronised or None, loss through the loopback, loss without)``."""
    from .families import split_case
    carved, cfg, micros = split_case(case, setup.device)
    params = carved.trainable_parameters(cfg, 0)
    with closing(executor_for(carved, cfg, setup.device)[0]) as ex:
        plain = ex.step(micros.__getitem__).loss
        drop_grads(params)
        with through_wire(owner, rank0, setup.broken(CHECK)):
            ex.step(micros.__getitem__)  # warm-up: the receivers' plans, the side stream
            drop_grads(params)
            where, stats = sync_debug_step(ex, micros.__getitem__) if setup.cuda else (
                None, ex.step(micros.__getitem__))
        drop_grads(params)
    return where, (stats.loss if stats is not None else float("nan")), plain


def wire_row(setup: Setup) -> Row:
    """Tiny Qwen2.5-VL with a frozen tower (padded micro-batches) and a trainable one (packed: host integers in
    the headers), ``R = 1, V = 2``: each a step as it is, then steps whose stage-0 inputs and tower features
    arrive through the loopback, every action under sync-debug mode ``"error"`` on CUDA; the losses must be
    equal."""
    from .families import CASES
    owner, rank0 = loopback(setup.device)
    how = ("headers over a gloo pair, payloads over a device loopback for NCCL" if setup.cuda
           else "headers and payloads over a gloo pair (the gloo path)")
    results = {}
    try:
        for check in WIRE_CASES:
            case = next(c for c in CASES if c.check == check)
            results[case.shape] = through_loopback(setup, case, owner, rank0)
    finally:
        for end in (owner, rank0):
            end.watchdog.close()
    sent = sum(owner.bytes_sent.values())
    for shape, (where, _, _) in results.items():
        if where is not None:
            return Row(CHECK, "FAIL", f"{shape}: {where} ({how})", {"error": where})
    same = {shape: got == plain or (setup.cuda and abs(got - plain) <= 1e-6 * abs(plain))
            for shape, (_, got, plain) in results.items()}
    losses = "; ".join(f"{shape} loss {got:.6f} vs {plain:.6f} without ({'equal' if same[shape] else 'DIFFERS'})"
                       for shape, (_, got, plain) in results.items())
    figures = (f"loopback in one process ({how}); {sent} payload bytes; {losses}"
               + ("; every action under sync-debug 'error'" if setup.cuda else "; sync-debug n/a on cpu"))
    return Row(CHECK, "PASS" if all(same.values()) else "FAIL", figures,
               {"losses": {k: v[1:] for k, v in results.items()}, "bytes_sent": sent})


def rows() -> tuple:
    """``(check, measure)`` of this module's rows."""
    return ((CHECK, wire_row),)

