"""The wire format of a point-to-point transfer (:mod:`.p2p`): a tensor dictionary carrying its own shapes and
dtypes (SPEC.md, "Numerics contract": no fixed buffers, no padding to a maximum).

A transfer starts with a message of ``FIRST_BYTES`` bytes: the header's length in int64 words, then the header
(every key, dtype, ``requires_grad`` flag and shape, one int64 each), then, at the next multiple of ``ALIGN``
bytes, the payload when it fits there (every non-empty tensor's bytes, each at a multiple of ``ALIGN``). Small
transfers (the data a stage reads, a small activation) are thus one message. A payload that does not fit follows
as a second message, every tensor in one buffer (a single tensor as it is, without a copy); a header that does not
fit sends its rest in a message between the two. The receiver knows from the header which case it is. On the
receiver the largest tensor is a view of the buffer it arrived in and the others are copies.

Pure functions of tensors and NumPy arrays: nothing here sends or receives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)
_CODE = {dtype: i for i, dtype in enumerate(DTYPES)}
FIRST_BYTES = 4096  # bytes of a transfer's first message: header length, header, and the payload if it fits
ALIGN = 16          # bytes: where each tensor starts in a payload buffer (any dtype can be viewed there)
WORDS = FIRST_BYTES // 8
# NumPy's view of each dtype, and the torch dtype to view the result as (bfloat16 travels as its int16 bits)
_NUMPY = {torch.float32: (np.float32, None), torch.float16: (np.float16, None), torch.bfloat16: (np.int16,
          torch.bfloat16), torch.float64: (np.float64, None), torch.int64: (np.int64, None), torch.int32:
          (np.int32, None), torch.int16: (np.int16, None), torch.int8: (np.int8, None), torch.uint8: (np.uint8, None),
          torch.bool: (np.bool_, None)}


# keys whose small integer tensors, when they are on the host, travel in the header, as their values, and arrive on
# the host: integers a receiving stage needs in Python, which a payload on the device would make it read back, one
# host synchronisation per read. A packed micro's row lengths
# (mpipe_hf.models.packed), the image and video grids and the vision tower's attention boundaries (the keys
# mpipe_hf.models.host_metadata keeps on the owner's host; with FlashAttention the boundaries are on the device,
# which its kernel reads, and travel in the payload as any other tensor)
HEADER_KEYS = frozenset({"packed_lengths", "image_grid_thw", "video_grid_thw"} | {
    prefix + key for prefix in ("vision_meta.", "video_meta.")
    for key in ("cu_seqlens", "max_seqlen", "cu_window_seqlens", "max_window_seqlen")})
_HEADER_CODE = len(DTYPES)  # the dtype code of a header key's entry: its dtype's code, shape and values follow
HOST = torch.device("cpu")


def in_header(key: str, tensor: torch.Tensor) -> bool:
    """Whether ``payload[key] = tensor`` travels in the header: a :data:`HEADER_KEYS` entry on the host (one on
    the device travels in the payload)."""
    return key in HEADER_KEYS and tensor.device == HOST


@dataclass(frozen=True)
class HeaderInts:
    """The "dtype" of a header entry (:func:`in_header`) in a decoded header: its values and its real dtype; it
    takes no payload bytes (``itemsize`` 0) and is rebuilt on the host by :func:`unpack`."""

    values: tuple[int, ...]
    dtype: torch.dtype = torch.int64
    itemsize: int = 0

    def tensor(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The entry as a host tensor of ``shape``."""
        return torch.tensor(self.values, dtype=self.dtype).view(shape)


def encode_header(payload: dict[str, torch.Tensor]) -> list[int]:
    """``[n, (len(key), *key_bytes, dtype_code, requires_grad, ndim, *shape) * n]``; a header entry
    (:func:`in_header`) has the code ``len(DTYPES)``, its dtype's code in place of ``requires_grad``, and its
    values after its shape.

    Raises:
        TypeError: a tensor's dtype is not one of ``DTYPES``; a header entry's is not an integer (or bool) one.
    """
    out = [len(payload)]
    for key, tensor in payload.items():
        if tensor.dtype not in _CODE or (in_header(key, tensor) and tensor.is_floating_point()):
            raise TypeError(f"cannot send {key!r} of dtype {tensor.dtype}; supported: {DTYPES}, integers or bool "
                            f"for {sorted(HEADER_KEYS)} on the host")
        raw = key.encode()
        if in_header(key, tensor):  # on the host: reading its values is no synchronisation
            out += [len(raw), *raw, _HEADER_CODE, _CODE[tensor.dtype], tensor.dim(), *tensor.shape,
                    *tensor.reshape(-1).tolist()]
            continue
        out += [len(raw), *raw, _CODE[tensor.dtype], int(tensor.requires_grad), tensor.dim(), *tensor.shape]
    return out


def decode_header(values: list[int]) -> list[tuple[str, torch.dtype, bool, tuple[int, ...]]]:
    """Inverse of :func:`encode_header`: ``[(key, dtype, requires_grad, shape), ...]`` (a header entry's dtype a
    :class:`HeaderInts` holding its values and dtype)."""
    entries, i = [], 1
    for _ in range(values[0]):
        n = values[i]
        key = bytes(values[i + 1:i + 1 + n]).decode()
        i += 1 + n
        code, flag, ndim = values[i], values[i + 1], values[i + 2]
        shape = tuple(values[i + 3:i + 3 + ndim])
        i += 3 + ndim
        if code != _HEADER_CODE:
            entries.append((key, DTYPES[code], bool(flag), shape))
            continue
        count = math.prod(shape)
        entries.append((key, HeaderInts(tuple(values[i:i + count]), DTYPES[flag]), False, shape))
        i += count
    return entries


def payload_tensors(payload: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The tensors of ``payload`` whose bytes go in the payload: every non-empty one but the header entries
    (:func:`in_header`)."""
    return [t for k, t in payload.items() if t.numel() and not in_header(k, t)]


def layout(sizes: list[int]) -> tuple[list[int], int]:
    """Where each of ``sizes`` bytes starts in a payload buffer (at a multiple of ``ALIGN``; an empty one takes no
    room), and the buffer's length in bytes."""
    starts, end = [], 0
    for size in sizes:
        if size:
            end = -(-end // ALIGN) * ALIGN
        starts.append(end if size else 0)
        end += size
    return starts, end


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat ``uint8`` tensor (a view when it is contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The payload buffer (``uint8``, 1-D) of ``tensors``: their bytes at the starts :func:`layout` gives."""
    raw = [raw_bytes(t) for t in tensors]
    if len(raw) == 1:
        return raw[0]
    starts, size = layout([r.numel() for r in raw])
    flat = torch.empty(size, dtype=torch.uint8, device=raw[0].device)
    for r, start in zip(raw, starts):
        flat[start:start + r.numel()].copy_(r)
    return flat


def _sizes(entries: list[tuple[str, torch.dtype, bool, tuple[int, ...]]]) -> list[int]:
    """Bytes of each tensor a header's ``entries`` name."""
    return [math.prod(shape) * dtype.itemsize for _, dtype, _, shape in entries]


def payload_size(entries: list[tuple[str, torch.dtype, bool, tuple[int, ...]]]) -> int:
    """Bytes of the payload buffer of a header's ``entries``."""
    return layout(_sizes(entries))[1]


Plan = tuple  # (entries, sizes, starts, payload bytes, index of the largest tensor or None): see make_plan


def make_plan(entries: list[tuple[str, torch.dtype, bool, tuple[int, ...]]]) -> Plan:
    """What :func:`unpack` needs of a header's ``entries``, computed once per header."""
    sizes = _sizes(entries)
    starts, total = layout(sizes)
    largest = max(range(len(sizes)), key=sizes.__getitem__, default=None)
    return entries, sizes, starts, total, largest


def host_unpack(plan: Plan, buf: np.ndarray, offset: int) -> dict[str, torch.Tensor]:
    """:func:`unpack` of the payload at byte ``offset`` of a host buffer, with NumPy's slicing (a tenth of the
    cost of torch's on small tensors)."""
    entries, sizes, starts, _, largest = plan
    out = {}
    for i, ((key, dtype, grad, shape), size, start) in enumerate(zip(entries, sizes, starts)):
        if isinstance(dtype, HeaderInts):
            out[key] = dtype.tensor(shape)
            continue
        seg = buf[offset + start:offset + start + size]
        np_dtype, back = _NUMPY[dtype]
        tensor = torch.from_numpy((seg if i == largest else seg.copy()).view(np_dtype).reshape(shape))
        if back is not None:
            tensor = tensor.view(back)
        out[key] = tensor.requires_grad_(grad) if grad else tensor
    return out


def device_unpack(plan: Plan, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """:func:`unpack` of a device buffer (torch's slicing; the copies are kernels on the current stream)."""
    entries, sizes, starts, _, largest = plan
    out = {}
    for i, ((key, dtype, grad, shape), size, start) in enumerate(zip(entries, sizes, starts)):
        if isinstance(dtype, HeaderInts):  # on the host, from the header: nothing to read back
            out[key] = dtype.tensor(shape)
            continue
        tensor = flat[start:start + size].view(dtype).view(shape)
        tensor = tensor if i == largest else tensor.clone()
        out[key] = tensor.requires_grad_(grad) if grad else tensor
    return out


def unpack(entries: list[tuple[str, torch.dtype, bool, tuple[int, ...]]], flat: torch.Tensor) -> dict:
    """Inverse of :func:`pack`: ``{key: tensor}`` for a header's ``entries``. The largest is a view of ``flat``;
    the others are copies, so no two share storage (an in-place change to one, such as a mask, must not touch
    another that autograd saved)."""
    plan = make_plan(entries)
    if flat.device.type == "cpu":
        return host_unpack(plan, flat.numpy(), 0)
    return device_unpack(plan, flat)


def host_bytes(tensor: torch.Tensor) -> np.ndarray:
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
