"""Point-to-point transfer of tensor dictionaries, each carrying its own shapes and dtypes (SPEC.md, "Numerics
contract": no fixed buffers, no padding to a maximum).

A transfer is a fixed-size first message (``HEADER_CAP`` int64s: the header's length, then the header, which names
every key, dtype, ``requires_grad`` flag and shape), the rest of the header in a second message only when it does
not fit, then one message per non-empty tensor. Each direction has a
group of its own (lower to higher rank, and back), so on NCCL a large send, which waits for its receive, never
sits on the same stream in front of a receive from the same peer (in the 1F1B steady state both neighbours send
before they receive). Sends are
non-blocking and are drained at the end of a step; receives wait through the :class:`~.watchdog.Watchdog`, so
they end on a timeout or on another rank's failure.
"""

from __future__ import annotations

from collections import Counter, deque

import torch
import torch.distributed as dist

from .watchdog import Watchdog, describe

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)
_CODE = {dtype: i for i, dtype in enumerate(DTYPES)}
HEADER_CAP = 64  # int64s in a transfer's first message; a longer header sends its rest in a second one


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
        self.bytes_sent: Counter = Counter()

    def channel(self, src: int, dst: int) -> dist.ProcessGroup:
        """The group that carries transfers from ``src`` to ``dst``."""
        return self.up if src < dst else self.down

    def _isend(self, tensor: torch.Tensor, dst: int, what: str) -> None:
        tensor = tensor.detach().to(self.device).contiguous()
        while self.pending and self.pending[0][0].is_completed():  # free finished sends, oldest first: O(1)
            self.pending.popleft()
        work = dist.isend(tensor, group=self.channel(self.rank, dst), group_dst=dst)
        self.pending.append((work, tensor, dst, what))

    def _recv(self, tensor: torch.Tensor, src: int, what: str) -> torch.Tensor:
        work = dist.irecv(tensor, group=self.channel(src, self.rank), group_src=src)
        self.watchdog.wait(work, f"{what} from pipeline rank {src}", describe("recv", tensor, src=src))
        return tensor

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
        for key, tensor in payload.items():
            if tensor.numel():
                self._isend(tensor, dst, what)
                self.bytes_sent[f"{channel}/{key}"] += tensor.numel() * tensor.element_size()

    def recv(self, src: int, what: str) -> dict[str, torch.Tensor]:
        """Receive the next transfer from ``src``.

        Raises:
            TimeoutError: nothing arrived within the watchdog's timeout.
            PeerFailed: another rank failed meanwhile.
        """
        first = self._recv(torch.empty(HEADER_CAP, dtype=torch.int64, device=self.device), src, what).tolist()
        size, header = first[0], first[1:1 + first[0]]
        if size > HEADER_CAP - 1:
            rest = self._recv(torch.empty(size - HEADER_CAP + 1, dtype=torch.int64, device=self.device), src, what)
            header += rest.tolist()
        out = {}
        for key, dtype, grad, shape in decode_header(header):
            tensor = torch.empty(shape, dtype=dtype, device=self.device)
            if tensor.numel():
                self._recv(tensor, src, what)
            out[key] = tensor.requires_grad_(grad) if grad else tensor
        return out

    def drain(self) -> None:
        """Wait for every posted send (bounded by the watchdog)."""
        pending, self.pending = list(self.pending), deque()
        for work, tensor, dst, what in pending:
            self.watchdog.wait(work, f"{what} (send to pipeline rank {dst})", describe("send", tensor, dst=dst))

    def discard(self) -> list[tuple[dist.Work, torch.Tensor, int, str]]:
        """Hand over the posted sends of a failed step (the caller keeps them alive: a dropped send is cancelled,
        and its receiver would wait for it)."""
        pending, self.pending = list(self.pending), deque()
        return pending
