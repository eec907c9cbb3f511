"""Point-to-point transfer of tensor dictionaries, each carrying its own shapes and dtypes (SPEC.md, "Numerics
contract": no fixed buffers, no padding to a maximum).

A transfer starts with a message of ``FIRST_BYTES`` bytes: the header's length in int64 words, then the header
(every key, dtype, ``requires_grad`` flag and shape, one int64 each), then, at the next multiple of ``ALIGN``
bytes, the payload when it fits there (every non-empty tensor's bytes, each at a multiple of ``ALIGN``). Small
transfers (the data a stage reads, a small activation) are thus one message. A payload that does not fit follows
as a second message, every tensor in one buffer (a single tensor as it is, without a copy); a header that does not
fit sends its rest in a message between the two. The receiver knows from the header which case it is. On the
receiver the largest tensor is a view of the buffer it arrived in and the others are copies.

Each direction has a group of its own (lower to higher rank, and back), so on NCCL a large send, which waits for
its receive, never sits on the same stream in front of a receive from the same peer (in the 1F1B steady state
both neighbours send before they receive). Sends are non-blocking and are drained at the end of a step.

On gloo, :meth:`P2P.expect` posts, for each peer the step receives from, the first message of its first transfer
ahead, and every receive posts the next one from that peer as soon as its own messages are posted (a gloo channel
matches messages in the order receives are posted, so one first message ahead per peer is what the order allows).
A message whose receive is already posted is written by the sender at once and lands while this rank computes.
Every wait runs in the caller; :class:`~.watchdog.Watchdog` ends it on a timeout or on another rank's failure.

On NCCL nothing is posted ahead (a receive posted early would hold up the sends behind it on the stream). The
first message is received on a side stream and read by the host (the one host synchronisation of a transfer: its
shapes); a second message is received on the current stream, which waits for it on the device, not on the host.
"""

from __future__ import annotations

import math
import struct
from collections import Counter, deque
from typing import Iterable

import numpy as np
import torch
import torch.distributed as dist

from .watchdog import Watchdog

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)
_CODE = {dtype: i for i, dtype in enumerate(DTYPES)}
FIRST_BYTES = 4096  # bytes of a transfer's first message: header length, header, and the payload if it fits
ALIGN = 16          # bytes: where each tensor starts in a payload buffer (any dtype can be viewed there)
_WORDS = FIRST_BYTES // 8
# NumPy's view of each dtype, and the torch dtype to view the result as (bfloat16 travels as its int16 bits)
_NUMPY = {torch.float32: (np.float32, None), torch.float16: (np.float16, None), torch.bfloat16: (np.int16,
          torch.bfloat16), torch.float64: (np.float64, None), torch.int64: (np.int64, None), torch.int32:
          (np.int32, None), torch.int16: (np.int16, None), torch.int8: (np.int8, None), torch.uint8: (np.uint8, None),
          torch.bool: (np.bool_, None)}


def encode_header(payload: dict[str, torch.Tensor]) -> list[int]:
    """``[n, (len(key), *key_bytes, dtype_code, requires_grad, ndim, *shape) * n]``.

    Raises:
        TypeError: a tensor's dtype is not one of ``DTYPES``.
    """
    out = [len(payload)]
    for key, tensor in payload.items():
        if tensor.dtype not in _CODE:
            raise TypeError(f"cannot send {key!r} of dtype {tensor.dtype}; supported: {DTYPES}")
        raw = key.encode()
        out += [len(raw), *raw, _CODE[tensor.dtype], int(tensor.requires_grad), tensor.dim(), *tensor.shape]
    return out


def decode_header(values: list[int]) -> list[tuple[str, torch.dtype, bool, tuple[int, ...]]]:
    """Inverse of :func:`encode_header`: ``[(key, dtype, requires_grad, shape), ...]``."""
    entries, i = [], 1
    for _ in range(values[0]):
        n = values[i]
        key = bytes(values[i + 1:i + 1 + n]).decode()
        i += 1 + n
        dtype, grad, ndim = DTYPES[values[i]], bool(values[i + 1]), values[i + 2]
        shape = tuple(values[i + 3:i + 3 + ndim])
        i += 3 + ndim
        entries.append((key, dtype, grad, shape))
    return entries


def _layout(sizes: list[int]) -> tuple[list[int], int]:
    """Where each of ``sizes`` bytes starts in a payload buffer (at a multiple of ``ALIGN``; an empty one takes no
    room), and the buffer's length in bytes."""
    starts, end = [], 0
    for size in sizes:
        if size:
            end = -(-end // ALIGN) * ALIGN
        starts.append(end if size else 0)
        end += size
    return starts, end


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat ``uint8`` tensor (a view when it is contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The payload buffer (``uint8``, 1-D) of ``tensors``: their bytes at the starts :func:`_layout` gives."""
    raw = [_bytes(t) for t in tensors]
    if len(raw) == 1:
        return raw[0]
    starts, size = _layout([r.numel() for r in raw])
    flat = torch.empty(size, dtype=torch.uint8, device=raw[0].device)
    for r, start in zip(raw, starts):
        flat[start:start + r.numel()].copy_(r)
    return flat


def _sizes(entries: list[tuple[str, torch.dtype, bool, tuple[int, ...]]]) -> list[int]:
    """Bytes of each tensor a header's ``entries`` name."""
    return [math.prod(shape) * dtype.itemsize for _, dtype, _, shape in entries]


def payload_size(entries: list[tuple[str, torch.dtype, bool, tuple[int, ...]]]) -> int:
    """Bytes of the payload buffer of a header's ``entries``."""
    return _layout(_sizes(entries))[1]



Plan = tuple  # (entries, sizes, starts, payload bytes, index of the largest tensor or None): see _plan


def _plan(entries: list[tuple[str, torch.dtype, bool, tuple[int, ...]]]) -> Plan:
    """What :func:`unpack` needs of a header's ``entries``, computed once per header."""
    sizes = _sizes(entries)
    starts, total = _layout(sizes)
    largest = max(range(len(sizes)), key=sizes.__getitem__, default=None)
    return entries, sizes, starts, total, largest


def _host_unpack(plan: Plan, buf: np.ndarray, offset: int) -> dict[str, torch.Tensor]:
    """:func:`unpack` of the payload at byte ``offset`` of a host buffer, with NumPy's slicing (a tenth of the
    cost of torch's on small tensors)."""
    entries, sizes, starts, _, largest = plan
    out = {}
    for i, ((key, dtype, grad, shape), size, start) in enumerate(zip(entries, sizes, starts)):
        seg = buf[offset + start:offset + start + size]
        np_dtype, back = _NUMPY[dtype]
        tensor = torch.from_numpy((seg if i == largest else seg.copy()).view(np_dtype).reshape(shape))
        if back is not None:
            tensor = tensor.view(back)
        out[key] = tensor.requires_grad_(grad) if grad else tensor
    return out


def _device_unpack(plan: Plan, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """:func:`unpack` of a device buffer."""
    entries, sizes, starts, _, largest = plan
    out = {}
    for i, ((key, dtype, grad, shape), size, start) in enumerate(zip(entries, sizes, starts)):
        tensor = flat[start:start + size].view(dtype).view(shape)
        tensor = tensor if i == largest else tensor.clone()
        out[key] = tensor.requires_grad_(grad) if grad else tensor
    return out


def unpack(entries: list[tuple[str, torch.dtype, bool, tuple[int, ...]]], flat: torch.Tensor) -> dict:
    """Inverse of :func:`pack`: ``{key: tensor}`` for a header's ``entries``. The largest is a view of ``flat``;
    the others are copies, so no two share storage (an in-place change to one, such as a mask, must not touch
    another that autograd saved)."""
    plan = _plan(entries)
    if flat.device.type == "cpu":
        return _host_unpack(plan, flat.numpy(), 0)
    return _device_unpack(plan, flat)


def _host_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A host tensor's bytes as a flat NumPy ``uint8`` array (a view when it is contiguous)."""
    tensor = tensor.detach()
    if tensor.is_cuda:
        tensor = tensor.cpu()
    if tensor.dtype is torch.bfloat16:  # NumPy has no bfloat16: its bits as int16
        tensor = tensor.view(torch.int16)
    return tensor.numpy().reshape(-1).view(np.uint8)


def inline_start(header_len: int) -> int:
    """Byte offset of an inline payload in a first message whose header is ``header_len`` int64s long."""
    return -(-8 * (1 + header_len) // ALIGN) * ALIGN


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
        up, down: two groups over the same pipeline ranks, for transfers to a higher and to a lower rank;
            ``dst``/``src`` are ranks within them.
        device: where received tensors are placed (``cuda`` for NCCL, ``cpu`` for gloo).
        watchdog: bounds every wait and ends it when another rank fails.

    Attributes:
        bytes_sent: payload bytes sent since construction, keyed ``"CHANNEL/key"`` (e.g. ``"DATA_SEND/input_ids"``),
            for tests and reports.
    """

    def __init__(self, up: dist.ProcessGroup, down: dist.ProcessGroup, device: torch.device, watchdog: Watchdog):
        self.up, self.down, self.device, self.watchdog = up, down, device, watchdog
        self.rank = up.rank()
        self.cuda = device.type == "cuda"
        self.ahead = not self.cuda and dist.get_backend(up) == "gloo"  # post first messages ahead (gloo)
        self.pending: deque[tuple[dist.Work, torch.Tensor, int, object]] = deque()  # posted sends
        self._order: deque[int] = deque()   # the source of each receive the step still expects, in order
        self._left: Counter = Counter()     # expected receives per source whose first message is not posted
        self._posted: dict[int, tuple] = {}  # (work, buffer, host array) of the first message posted ahead
        self._plans: dict[tuple, Plan] = {}  # by header: the shapes of a pipeline repeat from micro to micro
        self._landing: list = []            # NCCL: second messages received on the device this step
        self._side = None                   # NCCL: the stream first messages are received and read on
        self.bytes_sent: Counter = Counter()

    def channel(self, src: int, dst: int) -> dist.ProcessGroup:
        """The group that carries transfers from ``src`` to ``dst``."""
        return self.up if src < dst else self.down

    def _isend(self, tensor: torch.Tensor, dst: int, what) -> None:
        if self.cuda:  # NCCL reports completion: free the finished sends, oldest first
            while self.pending and self.pending[0][0].is_completed():
                self.pending.popleft()
        try:  # the group's own call: dist.isend's checks cost more than the send on small messages
            work = self.channel(self.rank, dst).send([tensor], dst, 0)
        except RuntimeError as err:
            raise self.watchdog.failure(err, f"{what} (send to pipeline rank {dst})") from err
        self.pending.append((work, tensor, dst, what))

    def _irecv(self, tensor: torch.Tensor, src: int, what) -> dist.Work:
        try:
            return self.channel(src, self.rank).recv([tensor], src, 0)
        except RuntimeError as err:
            raise self.watchdog.failure(err, f"{what} from pipeline rank {src}") from err

    def send(self, payload: dict[str, torch.Tensor], dst: int, what, channel: str = "message") -> None:
        """Post the transfer of ``payload`` to ``dst`` without waiting for it. ``what`` (a string or anything that
        formats as one, such as an action) names it in errors; ``channel`` names it in :attr:`bytes_sent`.

        Raises:
            TypeError: a tensor of a dtype not in ``DTYPES``.
            PeerFailed: another rank failed this step (and broke the channel).
        """
        header = encode_header(payload)
        n = len(header)
        tensors = [t for t in payload.values() if t.numel()]
        starts, size = _layout([t.numel() * t.element_size() for t in tensors])
        offset = inline_start(n)
        inline = n < _WORDS and offset + size <= FIRST_BYTES
        words = np.zeros(_WORDS, dtype=np.int64)
        k = min(n, _WORDS - 1)
        struct.pack_into(f"={1 + k}q", words, 0, n, *header[:k])  # one C call (a NumPy assignment costs more)
        if self.cuda:  # the header from pinned memory (the copy does not wait on the host), the payload on device
            first = torch.empty(FIRST_BYTES, dtype=torch.uint8, device=self.device)
            head = torch.from_numpy(words[:1 + k].view(np.uint8)).pin_memory()
            first[:head.numel()].copy_(head, non_blocking=True)
            for t, start in zip(tensors if inline else (), starts):
                raw = _bytes(t.to(self.device))
                first[offset + start:offset + start + raw.numel()].copy_(raw)
        else:
            buf = words.view(np.uint8)
            for t, start in zip(tensors if inline else (), starts):
                raw = _host_bytes(t)
                buf[offset + start:offset + start + raw.size] = raw
            first = torch.from_numpy(buf)
        self._isend(first, dst, what)
        if n > _WORDS - 1:
            self._isend(torch.tensor(header[_WORDS - 1:], dtype=torch.int64, device=self.device), dst, what)
        if tensors and not inline:
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
        if self.cuda:
            with torch.cuda.stream(self._side_stream()):  # the stream this waits on holds nothing but the receive
                first = torch.empty(FIRST_BYTES, dtype=torch.uint8, device=self.device)
                return self._irecv(first, src, what), first, None
        host = np.empty(FIRST_BYTES, dtype=np.uint8)
        first = torch.from_numpy(host)
        if self._left.get(src):
            self._left[src] -= 1
            if not self._left[src]:
                del self._left[src]
        return self._irecv(first, src, what), first, host

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
        self._wait(work, label)
        if self.cuda:  # the shapes: the one host synchronisation, and only with this copy
            with torch.cuda.stream(self._side):
                host = first.cpu().numpy()
            first.record_stream(torch.cuda.current_stream(self.device))
        words = host.view(np.int64)
        length = int(words[0])
        header = words[1:1 + min(length, _WORDS - 1)].tolist()
        if length > _WORDS - 1:  # a long header's rest (a dictionary of many tensors)
            rest = torch.empty(length - _WORDS + 1, dtype=torch.int64, device=self.device)
            self._wait(self._irecv(rest, src, what), label)
            header += rest.tolist()
        key = tuple(header)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 4096:
                self._plans.clear()
            plan = self._plans[key] = _plan(decode_header(header))
        size, offset = plan[3], inline_start(length)
        if length <= _WORDS - 1 and offset + size <= FIRST_BYTES:  # the payload came with the header
            if self.ahead and src in self._left:  # the next first message, in the channel's order
                self._posted[src] = self._post_first(src, what)
            return _device_unpack(plan, first[offset:offset + size]) if self.cuda else _host_unpack(plan, host,
                                                                                                    offset)
        if self.cuda:
            flat = torch.empty(size, dtype=torch.uint8, device=self.device)
            work = self._irecv(flat, src, what)
            work.wait()  # the current stream waits for it on the device; the host goes on
            self._landing.append(work)
            return _device_unpack(plan, flat)
        host = np.empty(size, dtype=np.uint8)
        work = self._irecv(torch.from_numpy(host), src, what) if size else None
        if self.ahead and src in self._left:  # after this transfer's own messages: the channel's order
            self._posted[src] = self._post_first(src, what)
        if work is not None:
            self._wait(work, label)
        return _host_unpack(plan, host, 0)

    def _side_stream(self):
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    def _wait(self, work: dist.Work, what) -> None:
        """A host wait for one of this rank's receives or sends: gloo's complete only inside ``wait`` (the caller
        blocks, and the watchdog breaks the channel to end it), NCCL's report completion (polled)."""
        if self.cuda:
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
        self._landing.clear()

    def discard(self) -> list:
        """Forget a failed step's transfers and hand over what is still posted (sends, and receives on their
        way), which must stay alive until the step's channels are broken (gloo) or aborted (NCCL)."""
        held = list(self.pending) + self._landing + list(self._posted.values())
        self.pending, self._landing, self._posted = deque(), [], {}
        self._order.clear()
        self._left.clear()
        return held
