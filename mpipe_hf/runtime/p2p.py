"""Point-to-point transfer of tensor dictionaries, each carrying its own shapes and dtypes (the wire format is
:mod:`.wire`'s; SPEC.md, "Numerics contract": no fixed buffers, no padding to a maximum).

Each directed pair of ranks has a group of its own (:func:`~.groups.pair_groups`), so on NCCL a send, which
waits for its receive, never sits on a stream in front of another pair's transfer or of a receive from the same
peer (in the 1F1B steady state both neighbours send before they receive), whether NCCL made the group's
communicator eagerly or makes it at first use (:mod:`mpipe_hf.schedule.eager`). Sends are non-blocking and are
drained at the end of a step.

Communicator set-up (:mod:`mpipe_hf.schedule.connect`). Without a device bound to the default group, NCCL builds a
group's communicator lazily at its first send or receive, and that call blocks until the peer makes its own; two
ranks whose first operations with each other are on different pairs' groups would wait for each other for ever. So
before a step's first transfer the executor calls :meth:`P2P.connect` with every directed pair the rank's step uses:
it connects the ones not connected yet, one at a time, in one global order (sorted pairs), which cannot deadlock
(the argument is in :mod:`mpipe_hf.schedule.connect`). It runs on every backend, so CPU tests take the same path;
:attr:`P2P.first_uses` records what made each first use, so a test can check that every one was a connect. The
header groups (below) are gloo's, whose pairs are connected when the group is made: neither the prologue nor
``first_uses`` covers them.

On gloo, :meth:`P2P.expect` posts, for each peer the step receives from, the first message of its first transfer
ahead, and every receive posts the next one from that peer as soon as its own messages are posted (a gloo channel
matches messages in the order receives are posted, so one first message ahead per peer is what the order allows).
A message whose receive is already posted is written by the sender at once and lands while this rank computes.
Every wait runs in the caller; :class:`~.watchdog.Watchdog` ends it on a timeout or on another rank's failure.

On NCCL the headers travel on the host: :func:`~.groups.fresh_groups` adds two gloo groups over the same ranks,
one per direction (``headers``). A sender writes the header words on the host (the shapes are the host's already)
and sends them over gloo, then sends every tensor's bytes as one buffer, packed on the device, over NCCL (never
inline: copying a payload into a host message would wait for the device). A receiver posts its header receives
ahead over gloo by the rules above (a header group is a gloo channel), waits for the header on the host (in the
caller, bounded and breakable as any gloo wait: :meth:`~.watchdog.Watchdog.block`), and only then issues the
payload's receive, on a side stream, so NCCL's stream waits only for that stream, not for the compute queued on
the current one: the transfer overlaps it. The side stream waits for the receive, records an event, and the
current (consumer) stream waits on that event when the tensors are handed out; the buffer is marked as used by the
consumer stream (``record_stream``), so the allocator does not hand it to the side stream while it is read. No
device memory is read by the host, on either side. Nothing else is posted ahead on NCCL (a receive posted early
would hold up the sends behind it on the stream). A P2P on CUDA built without header groups receives its first
messages on the device and reads them on the host: one host synchronisation per transfer.
"""

from __future__ import annotations

import contextlib
import struct
from collections import Counter, deque
from typing import Iterable

import numpy as np
import torch
import torch.distributed as dist

from ..schedule.connect import CONNECT
from .watchdog import Watchdog
from .wire import (ALIGN, DTYPES, FIRST_BYTES, WORDS, HeaderInts, Plan, decode_header, device_unpack, encode_header,
                   host_bytes, host_unpack, inline_start, layout, make_plan, pack, payload_size, payload_tensors,
                   raw_bytes, unpack)

__all__ = ["ALIGN", "CONNECT", "CONNECT_TAG", "DTYPES", "FIRST_BYTES", "P2P", "decode_header", "encode_header",
           "pack", "payload_size", "unpack"]

CONNECT_TAG = 1       # the tag of connect's message (gloo matches by tag: it never meets a transfer's receive)


class _Named:
    """A transfer's name in errors, its action and peer; formatted only when an error needs it (most transfers
    end well, and formatting an action costs more than the rest of a small transfer's bookkeeping)."""

    __slots__ = ("what", "peer", "sending")

    def __init__(self, what, peer: int, sending: bool):
        self.what, self.peer, self.sending = what, peer, sending

    def __str__(self) -> str:
        if self.sending:
            return f"{self.what} (send to pipeline rank {self.peer})"
        return f"{self.what} from pipeline rank {self.peer}"


class P2P:
    """Tensor-dictionary transfers between the pipeline ranks.

    Args:
        rank: this rank's pipeline rank; ``dst``/``src`` below are pipeline ranks.
        pairs: ``{(src, dst): group}``, the group of each directed pair this rank sends or receives on
            (:func:`~.groups.pair_groups`): a group of the pair's two ranks, the lower pipeline rank group rank 0
            (a group over more ranks is read as over the pipeline, a rank's group rank its pipeline rank), carrying
            that pair's transfers only.
        device: where received tensors are placed (``cuda`` for NCCL, ``cpu`` for gloo).
        watchdog: bounds every wait and ends it when another rank fails.

    Attributes:
        bytes_sent: payload bytes sent since construction, keyed ``"CHANNEL/key"`` (e.g. ``"DATA_SEND/input_ids"``),
            for tests and reports.
        first_uses: ``[(group, peer, what)]``: the first operation on each directed pair's group, in order;
            ``group`` names the pair (``"0->1"``), ``what`` is ``CONNECT`` for :meth:`connect`'s, else the
            transfer's name.
        cuda: receives go through CUDA streams (NCCL): ``device`` is a CUDA device.
        headers: the header groups ``(up, down)`` (gloo, over the pipeline ranks, to a higher rank and to a lower
            one) that carry every
            transfer's header when the data groups are NCCL's; ``None`` on gloo (a header travels with its payload).
    """

    def __init__(self, rank: int, pairs: dict[tuple[int, int], dist.ProcessGroup], device: torch.device,
                 watchdog: Watchdog, headers: tuple[dist.ProcessGroup, dist.ProcessGroup] | None = None):
        self.rank, self.pairs, self.device, self.watchdog, self.headers = rank, pairs, device, watchdog, headers
        self.cuda = device.type == "cuda"
        # post first messages ahead: on gloo, and on the header groups (gloo too)
        gloo = all(dist.get_backend(g) == "gloo" for g in pairs.values()) if pairs else True
        self.ahead = headers is not None or (not self.cuda and gloo)
        self.pending: deque[tuple[dist.Work, torch.Tensor, int, object]] = deque()  # posted sends
        self._held: deque[tuple[dist.Work, torch.Tensor, int, object]] = deque()  # header sends (gloo)
        self._order: deque[int] = deque()   # the source of each receive the step still expects, in order
        self._left: Counter = Counter()     # expected receives per source whose first message is not posted
        self._posted: dict[int, tuple] = {}  # (work, buffer, host array) of the first message posted ahead
        self._plans: dict[tuple, Plan] = {}  # by header: the shapes of a pipeline repeat from micro to micro
        self._landing: list = []            # NCCL: second messages received on the device this step
        self._side = None                   # NCCL: the stream every receive is issued on
        self._used: set[tuple[int, int]] = set()  # directed pairs (src, dst) with this rank used so far
        self.first_uses: list[tuple[str, int, str]] = []
        self.bytes_sent: Counter = Counter()

    def channel(self, src: int, dst: int, lead: bool = False) -> tuple[dist.ProcessGroup, int]:
        """``(group, the peer's rank in it)`` for transfers from ``src`` to ``dst`` (``lead``: their first
        messages and long headers' rests, which go over the header groups when there are any).

        Raises:
            RuntimeError: no group was made for the pair (it is not one of
                :func:`~mpipe_hf.schedule.eager.pipeline_pairs`).
        """
        peer = dst if src == self.rank else src
        if lead and self.headers is not None:
            return self.headers[0 if src < dst else 1], peer
        group = self.pairs.get((src, dst))
        if group is None:
            raise RuntimeError(f"no process group for the transfers from pipeline rank {src} to {dst}: the schedule "
                               f"uses a pair that mpipe_hf.schedule.eager.pipeline_pairs does not list")
        return group, (peer if group.size() > 2 else int(peer > self.rank))  # a pair group's ranks: lower first

    def _post(self, tensor: torch.Tensor, src: int, dst: int, what, tag: int = 0, lead: bool = False) -> dist.Work:
        """Issue this rank's side of one message from ``src`` to ``dst`` on their group; note a data group's first
        use (a header group is gloo's, connected when made)."""
        sending, pair = src == self.rank, (src, dst)
        if pair not in self._used and not (lead and self.headers is not None):
            self._used.add(pair)
            self.first_uses.append((f"{src}->{dst}", dst if sending else src, str(what)))
        group, peer = self.channel(src, dst, lead)
        try:  # the group's own call: dist.isend's checks cost more than the send on small messages
            return group.send([tensor], peer, tag) if sending else group.recv([tensor], peer, tag)
        except RuntimeError as err:
            raise self.watchdog.failure(err, str(_Named(what, dst if sending else src, sending))) from err

    def _isend(self, tensor: torch.Tensor, dst: int, what, lead: bool = False) -> None:
        if lead and self.headers is not None:  # gloo: complete only in wait (drain)
            self._held.append((self._post(tensor, self.rank, dst, what, lead=True), tensor, dst, what))
            return
        if self.cuda:  # NCCL reports completion: free the finished sends, oldest first
            while self.pending and self.pending[0][0].is_completed():
                self.pending.popleft()
        self.pending.append((self._post(tensor, self.rank, dst, what), tensor, dst, what))

    def _irecv(self, tensor: torch.Tensor, src: int, what, lead: bool = False) -> dist.Work:
        return self._post(tensor, src, self.rank, what, lead=lead)

    def _on_device(self, lead: bool) -> bool:
        """Whether a message goes through device memory: a payload on CUDA, a first message on CUDA without
        header groups."""
        return self.cuda and not (lead and self.headers is not None)

    def connect(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Set up the communicator of every directed pair ``(src, dst)`` of ``pairs`` that has this rank in it and
        was not used yet, one at a time in the global order (sorted): the source sends one byte, the destination
        receives it, and both wait for it (bounded by the watchdog). Call it before the step's first transfer and
        before :meth:`expect`, with :func:`~mpipe_hf.schedule.connect.step_pairs` of the rank's step: a pair
        passed on one of its ranks must be passed on the other in the same step (every transfer of a step is in
        both ranks' action lists, so the step's pairs are).

        Raises:
            RuntimeError: receives are already expected this step (:meth:`expect` ran first).
            TimeoutError, PeerFailed: as :meth:`recv`.
        """
        todo = [(src, dst) for src, dst in sorted(set(pairs)) if src != dst and self.rank in (src, dst)
                and (src, dst) not in self._used]
        if todo and (self._order or self._posted):
            raise RuntimeError("P2P.connect must run before the step's expect (a receive posted ahead would be the "
                               "pair's first use)")
        for src, dst in todo:
            sending = src == self.rank
            with torch.cuda.stream(self._side_stream()) if self.cuda else contextlib.nullcontext():
                token = torch.zeros(1, dtype=torch.uint8, device=self.device)
                work = self._post(token, src, dst, CONNECT, CONNECT_TAG)
                self._wait(work, _Named(CONNECT, dst if sending else src, sending))

    def stray_first_uses(self) -> list[tuple[str, int, str]]:
        """The first uses of a (group, peer) that :meth:`connect` did not make (empty when the executor connected
        every pair its steps used): what a multi-process test asserts empty."""
        return [use for use in self.first_uses if use[2] != CONNECT]

    def send(self, payload: dict[str, torch.Tensor], dst: int, what, channel: str = "message") -> None:
        """Post the transfer of ``payload`` to ``dst`` without waiting for it. ``what`` (a string or anything that
        formats as one, such as an action) names it in errors; ``channel`` names it in :attr:`bytes_sent`.

        Raises:
            TypeError: a tensor of a dtype not in ``DTYPES``.
            PeerFailed: another rank failed this step (and broke the channel).
        """
        header = encode_header(payload)
        n = len(header)
        tensors = payload_tensors(payload)
        starts, size = layout([t.numel() * t.element_size() for t in tensors])
        offset = inline_start(n)
        # header groups: no payload inline (its copy to the host would wait for the device)
        inline = n < WORDS and offset + size <= FIRST_BYTES and self.headers is None
        words = np.zeros(WORDS, dtype=np.int64)
        k = min(n, WORDS - 1)
        struct.pack_into(f"={1 + k}q", words, 0, n, *header[:k])  # one C call (a NumPy assignment costs more)
        lead_device = self._on_device(lead=True)
        if lead_device:  # the header from pinned memory (the copy does not wait on the host), the payload on device
            first = torch.empty(FIRST_BYTES, dtype=torch.uint8, device=self.device)
            head = torch.from_numpy(words[:1 + k].view(np.uint8)).pin_memory()
            first[:head.numel()].copy_(head, non_blocking=True)
            for t, start in zip(tensors if inline else (), starts):
                raw = raw_bytes(t.to(self.device))
                first[offset + start:offset + start + raw.numel()].copy_(raw)
        else:
            buf = words.view(np.uint8)
            for t, start in zip(tensors if inline else (), starts):
                raw = host_bytes(t)
                buf[offset + start:offset + start + raw.size] = raw
            first = torch.from_numpy(buf)
        self._isend(first, dst, what, lead=True)
        if n > WORDS - 1:
            rest = torch.tensor(header[WORDS - 1:], dtype=torch.int64, device=self.device if lead_device else None)
            self._isend(rest, dst, what, lead=True)
        if tensors and not inline:  # one buffer, packed on the device (it goes by the data group)
            self._isend(pack([t.to(self.device) for t in tensors]), dst, what)
        for key, tensor in payload.items():
            self.bytes_sent[f"{channel}/{key}"] += tensor.numel() * tensor.element_size()

    def expect(self, sources: Iterable[int]) -> None:
        """Note, in order, the source rank of every receive the step will ask for; :meth:`recv` checks that it is
        asked in that order. On gloo the first message from each source is posted at once, so it lands while
        this rank computes."""
        sources = list(sources)
        self._order.extend(sources)
        if self.ahead:
            self._left.update(sources)
            for src in list(self._left):
                if src not in self._posted:
                    self._posted[src] = self._post_first(src, "a receive posted ahead")

    def _post_first(self, src: int, what) -> tuple:
        """Post a first message from ``src``: ``(work, buffer, host array)``."""
        if self._on_device(lead=True):
            with torch.cuda.stream(self._side_stream()):  # the stream this waits on holds nothing but the receive
                first = torch.empty(FIRST_BYTES, dtype=torch.uint8, device=self.device)
                return self._irecv(first, src, what), first, None
        host = np.empty(FIRST_BYTES, dtype=np.uint8)
        first = torch.from_numpy(host)
        if self._left.get(src):
            self._left[src] -= 1
            if not self._left[src]:
                del self._left[src]
        return self._irecv(first, src, what, lead=True), first, host

    def recv(self, src: int, what) -> dict[str, torch.Tensor]:
        """Receive the next transfer from ``src`` (the next one :meth:`expect` named, if any); ``what`` names it in
        errors.

        Raises:
            TimeoutError: nothing arrived within the watchdog's timeout.
            PeerFailed: another rank failed meanwhile.
            RuntimeError: the step's next expected receive is from another rank (the schedule broke its order).
        """
        if self._order:
            expected = self._order.popleft()
            if expected != src:
                raise RuntimeError(f"{what}: asked to receive from pipeline rank {src}, but the next expected "
                                   f"receive is from rank {expected}")
        label = _Named(what, src, sending=False)
        posted = self._posted.pop(src, None)
        work, first, host = posted if posted is not None else self._post_first(src, what)
        self._wait(work, label, lead=True)
        if host is None:  # CUDA without header groups: the shapes, one host synchronisation (this copy)
            with torch.cuda.stream(self._side):
                host = first.cpu().numpy()
            first.record_stream(torch.cuda.current_stream(self.device))
        length, plan = self._header(host, src, what, label)
        size, offset = plan[3], inline_start(length)
        if self.headers is not None:  # the header came on the host; the payload, if any, by the data group
            if src in self._left:  # the next first message, after this one's rest: the channel's order
                self._posted[src] = self._post_first(src, what)
            if not size:
                return device_unpack(plan, torch.empty(0, dtype=torch.uint8, device=self.device))
            return self._device_payload(plan, src, what)
        if length <= WORDS - 1 and offset + size <= FIRST_BYTES:  # the payload came with the header
            if self.ahead and src in self._left:  # the next first message, in the channel's order
                self._posted[src] = self._post_first(src, what)
            return device_unpack(plan, first[offset:offset + size]) if self.cuda else host_unpack(plan, host,
                                                                                                  offset)
        if self.cuda:
            return self._device_payload(plan, src, what)
        host = np.empty(size, dtype=np.uint8)
        work = self._irecv(torch.from_numpy(host), src, what) if size else None
        if self.ahead and src in self._left:  # after this transfer's own messages: the channel's order
            self._posted[src] = self._post_first(src, what)
        if work is not None:
            self._wait(work, label)
        return host_unpack(plan, host, 0)

    def _header(self, host: np.ndarray, src: int, what, label) -> tuple[int, Plan]:
        """The header's length in words and its plan, from a first message read into ``host`` (and, for a long
        header, its rest, received from ``src`` and read by the host)."""
        words = host.view(np.int64)
        length = int(words[0])
        header = words[1:1 + min(length, WORDS - 1)].tolist()
        if length > WORDS - 1:  # a long header's rest (a dictionary of many tensors), where the first message was
            on_device = self._on_device(lead=True)
            with torch.cuda.stream(self._side_stream()) if on_device else contextlib.nullcontext():
                rest = torch.empty(length - WORDS + 1, dtype=torch.int64, device=self.device if on_device else None)
                self._wait(self._irecv(rest, src, what, lead=True), label, lead=True)
                header += rest.tolist()
        key = tuple(header)
        plan = self._plans.get(key)
        if plan is None:
            entries = decode_header(header)
            plan = make_plan(entries)
            # a header that carries host values (grids, boundaries, row lengths) differs from micro to micro: not
            # kept, or the cache would fill with headers seen once
            if not any(isinstance(dtype, HeaderInts) for _, dtype, _, _ in entries):
                if len(self._plans) > 4096:
                    self._plans.clear()
                self._plans[key] = plan
        return length, plan

    def _device_payload(self, plan: Plan, src: int, what) -> dict[str, torch.Tensor]:
        """NCCL: a transfer's payload message, issued on the side stream (NCCL's stream waits for that stream, not
        for the compute queued on the current one); the current stream waits for it on the device, by an event
        the side stream records after it: the host goes on."""
        side, consumer = self._side_stream(), torch.cuda.current_stream(self.device)
        with torch.cuda.stream(side):
            flat = torch.empty(plan[3], dtype=torch.uint8, device=self.device)
            work = self._irecv(flat, src, what)
            work.wait()  # the side stream (current here) waits for the receive, on the device
            landed = torch.cuda.Event()
            landed.record(side)
        consumer.wait_event(landed)
        flat.record_stream(consumer)  # read on the consumer stream: not reused before that reading is done
        self._landing.append(work)
        return device_unpack(plan, flat)

    def _side_stream(self):
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    def _wait(self, work: dist.Work, what, lead: bool = False) -> None:
        """A host wait for one of this rank's receives or sends (``lead``: a first message or a header's rest):
        gloo's complete only inside ``wait`` (the caller blocks, and the watchdog breaks the channel to end it),
        NCCL's report completion (polled)."""
        if self._on_device(lead):
            self.watchdog.wait(work, what)
        else:
            self.watchdog.block(work, what)

    def drain(self) -> None:
        """Wait for every posted send (bounded by the watchdog).

        Raises:
            RuntimeError: a receive :meth:`expect` named was never asked for.
            TimeoutError, PeerFailed: as :meth:`recv`.
        """
        if self._order or self._posted:  # (a receive posted ahead is also in the order)
            raise RuntimeError(f"{max(len(self._order), len(self._posted))} expected receives were never asked for")
        pending, self.pending = list(self.pending), deque()
        for work, tensor, dst, what in pending:
            self._wait(work, _Named(what, dst, sending=True))
        held, self._held = list(self._held), deque()
        for work, tensor, dst, what in held:
            self.watchdog.block(work, _Named(what, dst, sending=True))
        self._landing.clear()

    def discard(self) -> list:
        """Forget a failed step's transfers and hand over what is still posted (sends, and receives on their
        way), which must stay alive until the step's channels are broken (gloo) or aborted (NCCL)."""
        held = list(self.pending) + list(self._held) + self._landing + list(self._posted.values())
        self.pending, self._held, self._landing, self._posted = deque(), deque(), [], {}
        self._order.clear()
        self._left.clear()
        return held
