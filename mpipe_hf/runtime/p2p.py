"""Point-to-point transfer of tensor dictionaries, each carrying its own shapes and dtypes (SPEC.md, "Numerics
contract": no fixed buffers, no padding to a maximum).

A transfer is two messages: a fixed-size first one (``HEADER_CAP`` int64s: the header's length, then the header,
which names every key, dtype, ``requires_grad`` flag and shape), then the payload: every non-empty tensor's bytes
in one buffer, each starting at a multiple of ``ALIGN`` bytes (a single tensor is sent as it is, without a copy).
A header too long for the first message sends its rest in a message between the two. On the receiver the largest
tensor is a view of the payload buffer and the others are copies. Each direction has a group of its own (lower to higher rank, and back), so on NCCL a
large send, which waits for its receive, never sits on the same stream in front of a receive from the same peer
(in the 1F1B steady state both neighbours send before they receive). Sends are non-blocking and are drained at
the end of a step; a receive is one :meth:`~.watchdog.Watchdog.run` job (header, then payload), so it ends on a
timeout or on another rank's failure, and on gloo costs one hand-over to the waiting thread.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, deque
from typing import Callable, Iterable

import torch
import torch.distributed as dist

from .watchdog import Watchdog, describe

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)
_CODE = {dtype: i for i, dtype in enumerate(DTYPES)}
HEADER_CAP = 64  # int64s in a transfer's first message; a longer header sends its rest in a second one
ALIGN = 16       # bytes: where each tensor starts in a payload buffer (any dtype can be viewed there)


def encode_header(payload: dict[str, torch.Tensor]) -> list[int]:
    """``[n, (len(key), *key_bytes, dtype_code, requires_grad, ndim, *shape) * n]``."""
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


def pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The payload buffer (``uint8``, 1-D) of ``tensors``: their bytes at the starts :func:`_layout` gives."""
    raw = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
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


def unpack(entries: list[tuple[str, torch.dtype, bool, tuple[int, ...]]], flat: torch.Tensor) -> dict:
    """Inverse of :func:`pack`: ``{key: tensor}`` for a header's ``entries``. The largest is a view of ``flat``;
    the others are copies, so no two share storage (an in-place change to one, such as a mask, must not touch
    another that autograd saved)."""
    sizes = _sizes(entries)
    largest = max(range(len(sizes)), key=sizes.__getitem__, default=None)
    out = {}
    for i, ((key, dtype, grad, shape), size, start) in enumerate(zip(entries, sizes, _layout(sizes)[0])):
        tensor = flat[start:start + size].view(dtype).view(shape)
        tensor = tensor if i == largest else tensor.clone()
        out[key] = tensor.requires_grad_(grad) if grad else tensor
    return out


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
        self.pending: deque[tuple[dist.Work, torch.Tensor, int, str]] = deque()
        self._ahead: deque[tuple[int, object]] = deque()  # (source rank, ticket) of receives posted ahead
        self._posting = threading.Lock()  # one thread at a time posts on the groups (the caller, the recv lane)
        self.bytes_sent: Counter = Counter()

    def channel(self, src: int, dst: int) -> dist.ProcessGroup:
        """The group that carries transfers from ``src`` to ``dst``."""
        return self.up if src < dst else self.down

    def _isend(self, tensor: torch.Tensor, dst: int, what: str) -> None:
        tensor = tensor.detach().to(self.device).contiguous()
        while self.pending and self.pending[0][0].is_completed():  # free finished sends, oldest first: O(1)
            self.pending.popleft()
        with self._posting:
            work = dist.isend(tensor, group=self.channel(self.rank, dst), group_dst=dst)
        self.pending.append((work, tensor, dst, what))

    def send(self, payload: dict[str, torch.Tensor], dst: int, what: str, channel: str = "message") -> None:
        """Post the transfer of ``payload`` to ``dst`` without waiting for it; ``channel`` names it in
        :attr:`bytes_sent`."""
        header = encode_header(payload)
        first = torch.zeros(HEADER_CAP, dtype=torch.int64)
        head = [len(header)] + header[:HEADER_CAP - 1]
        first[:len(head)] = torch.tensor(head, dtype=torch.int64)
        self._isend(first, dst, what)
        if len(header) > HEADER_CAP - 1:
            self._isend(torch.tensor(header[HEADER_CAP - 1:], dtype=torch.int64), dst, what)
        tensors = [t.to(self.device) for t in payload.values() if t.numel()]
        if tensors:
            self._isend(pack(tensors), dst, what)
        for key, tensor in payload.items():
            self.bytes_sent[f"{channel}/{key}"] += tensor.numel() * tensor.element_size()

    def expect(self, sources: Iterable[int]) -> None:
        """Post, in order, the receives the step will ask for (the source rank of each), so that on gloo they
        run in the background while this rank computes; :meth:`recv` answers them in the same order (on NCCL
        each still runs when asked for)."""
        for src in sources:
            self._ahead.append((src, self.watchdog.submit(self._receive(src))))

    def recv(self, src: int, what: str) -> dict[str, torch.Tensor]:
        """Receive the next transfer from ``src`` (the next one :meth:`expect` posted, if any).

        Raises:
            TimeoutError: nothing arrived within the watchdog's timeout.
            PeerFailed: another rank failed meanwhile.
            RuntimeError: the step's next expected receive is from another rank (the schedule broke its order).
        """
        if self._ahead:
            expected, ticket = self._ahead.popleft()
            if expected != src:
                raise RuntimeError(f"{what}: asked to receive from pipeline rank {src}, but the next expected "
                                   f"receive is from rank {expected}")
        else:
            ticket = self.watchdog.submit(self._receive(src))
        return self.watchdog.answer(ticket, f"{what} from pipeline rank {src}")

    def _receive(self, src: int) -> Callable:
        """The job that receives one transfer from ``src``: its header, then its payload."""
        group, device = self.channel(src, self.rank), self.device

        def receive(wait_for) -> dict[str, torch.Tensor]:
            def post(tensor: torch.Tensor) -> dist.Work:
                with self._posting:
                    return dist.irecv(tensor, group=group, group_src=src)

            def into(tensor: torch.Tensor) -> torch.Tensor:
                wait_for(lambda: post(tensor), describe("recv", tensor, src=src))
                return tensor
            first = into(torch.empty(HEADER_CAP, dtype=torch.int64, device=device)).tolist()
            size, header = first[0], first[1:1 + first[0]]
            if size > HEADER_CAP - 1:
                header += into(torch.empty(size - HEADER_CAP + 1, dtype=torch.int64, device=device)).tolist()
            entries = decode_header(header)
            flat = torch.empty(payload_size(entries), dtype=torch.uint8, device=device)
            return unpack(entries, into(flat) if flat.numel() else flat)
        return receive

    def drain(self) -> None:
        """Wait for every posted send (bounded by the watchdog).

        Raises:
            RuntimeError: a receive :meth:`expect` posted was never asked for.
        """
        if self._ahead:
            raise RuntimeError(f"{len(self._ahead)} expected receives were never asked for")
        pending, self.pending = list(self.pending), deque()
        for work, tensor, dst, what in pending:
            self.watchdog.wait(work, f"{what} (send to pipeline rank {dst})", describe("send", tensor, dst=dst))

    def discard(self) -> list[tuple[dist.Work, torch.Tensor, int, str]]:
        """Hand over the posted sends of a failed step (the caller keeps them alive: a dropped send is cancelled,
        and its receiver would wait for it)."""
        pending, self.pending = list(self.pending), deque()
        self._ahead.clear()
        return pending
