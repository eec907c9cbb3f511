"""A device emulated on the CPU, for counting what would stall a GPU (issue 27).

:class:`DeviceModel` is a ``TorchFunctionMode`` that tracks which tensors live "on the device": the modules'
parameters and buffers, whatever is moved or created on :data:`DEVICE` (``cpu:0``, a device that is the host's
memory but compares unequal to ``cpu``), and every result of an op that reads one. Such a tensor reports
``cpu:0`` as its ``.device``, as a CUDA tensor reports ``cuda:0``, so code that places tensors "on the same device
as x" places them there too. While the mode is on it counts host synchronisations: every ``.item()``,
``.tolist()``, ``int()``, ``float()``, ``bool()`` or ``.numpy()`` of a device tensor, every op whose output size
or value the host needs (``nonzero``, ``unique``, ``masked_select``, ``equal``, ``allclose``, a boolean index,
``repeat_interleave`` by a tensor), every copy from the device to the host (``.cpu()``, ``.to``, ``copy_``), and
every copy from the host to the device that is not ``non_blocking`` (from pageable memory such a copy waits for
the device). What runs inside autograd's C++ backward is not seen. Point-to-point transfers are the device's
own (NCCL): :meth:`transport` wraps a ``P2P`` so that its sends and receives are not counted and what it receives
is on the device (but the host integers of its header). ``tests/dist/host_syncs_worker.py`` runs NCCL's own path
instead, with gloo groups standing for NCCL's.
"""

from __future__ import annotations

import traceback
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from mpipe_hf.runtime.wire import in_header

DEVICE = torch.device("cpu", 0)
HOST = torch.device("cpu")
_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__, torch.Tensor.__float__,
          torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.is_nonzero,
          # ops whose result's size or value the host needs: CUDA reads the device back for them
          torch.equal, torch.Tensor.equal, torch.allclose, torch.Tensor.allclose, torch.nonzero, torch.Tensor.nonzero,
          torch.argwhere, torch.Tensor.argwhere, torch.unique, torch.Tensor.unique, torch.masked_select,
          torch.Tensor.masked_select, torch.unique_consecutive, torch.Tensor.unique_consecutive}
_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.index_put, torch.Tensor.index_put_}
_DEVICE_PROPERTY = torch._C.TensorBase.__dict__["device"]


def rooted(path: str) -> str:
    """``path`` from its package's root (``mpipe_hf/runtime/wire.py``, ``transformers/masking_utils.py``,
    ``tests/...``), else its last two parts: what a count's ``where`` names, so a test can tell the project's own
    reads from a library's."""
    for root in ("/mpipe_hf/", "/transformers/", "/tests/"):
        if root in path:
            return root[1:] + path.rsplit(root, 1)[1]
    return "/".join(path.split("/")[-2:])


def on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, "_on_emulated_device", False)


def _mark(out):
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor):
            t._on_emulated_device = True
    return out


def _target(args, kwargs):
    """The device a ``Tensor.to`` call names, if any."""
    for a in (*args[1:], kwargs.get("device")):
        if isinstance(a, torch.device):
            return a
        if isinstance(a, str) and a.startswith("cpu"):
            return torch.device(a)
        if isinstance(a, torch.Tensor):
            return DEVICE if on_device(a) else HOST
    return None


class DeviceModel(TorchFunctionMode):
    """Counts host synchronisations on an emulated device (see the module docstring).

    Attributes:
        syncs: ``Counter`` of ``"kind at file:line"`` (the innermost frame outside torch and this file; the file
            from its package's root, :func:`rooted`).
        paused: while > 0 nothing is counted (a transport's internals).
    """

    def __init__(self, modules=()):
        super().__init__()
        self.syncs: Counter = Counter()
        self.paused = 0
        for module in modules:
            for t in [*module.parameters(), *module.buffers()]:
                t._on_emulated_device = True

    def total(self) -> int:
        return sum(self.syncs.values())

    def _count(self, kind: str) -> None:
        if self.paused:
            return
        where = "?"
        for frame in reversed(traceback.extract_stack()[:-2]):
            if "/torch/" not in frame.filename and not frame.filename.endswith("device_model.py"):
                where = f"{rooted(frame.filename)}:{frame.lineno}"
                break
        self.syncs[f"{kind} at {where}"] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is _DEVICE_PROPERTY:  # ``t.device``
            return DEVICE if on_device(args[0]) else func(*args)
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        reads_device = any(on_device(t) for t in tensors)
        if func in _READS:
            if reads_device:
                self._count(func.__name__)
            return func(*args, **kwargs)
        if func in _INDEXING and any(t.dtype == torch.bool and on_device(t) for t in tree_leaves(args[1:2])
                                     if isinstance(t, torch.Tensor)):
            self._count("boolean index")  # its nonzero() reads the count back
        if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave) and reads_device and \
                isinstance(args[1] if len(args) > 1 else kwargs.get("repeats"), torch.Tensor) and \
                kwargs.get("output_size") is None:
            self._count("repeat_interleave")
        if func in (torch.Tensor.copy_, torch.Tensor.__setitem__) and not on_device(args[0]) and \
                on_device(args[-1]):
            self._count("copy to host")
            return func(*args, **kwargs)  # the destination stays on the host
        if func in (torch.Tensor.to, torch.Tensor.cpu):
            target = HOST if func is torch.Tensor.cpu else _target(args, kwargs)
            if target is not None and target.index is None and reads_device:  # device -> host
                self._count("copy to host")
                return func(*args, **kwargs).clone()
            if target == DEVICE and not reads_device:  # host -> device
                if not kwargs.get("non_blocking", False):
                    self._count("blocking copy to device")
                return _mark(func(*args, **kwargs).clone())
        out = func(*args, **kwargs)
        if reads_device or kwargs.get("device") in (DEVICE, "cpu:0"):
            _mark(out)
        return out

    def transport(self, p2p):
        """Wrap ``p2p`` (a :class:`~mpipe_hf.runtime.P2P`) as the device's own channel: its calls are not
        counted, and what it receives is on the device, but the host integers that travel in the header
        (:func:`~mpipe_hf.runtime.wire.in_header`; on this host transport a FlashAttention tower's boundaries,
        which travel on the device, are taken for them too)."""
        model = self
        send, recv = p2p.send, p2p.recv

        def quiet_send(*args, **kwargs):
            model.paused += 1
            try:
                return send(*args, **kwargs)
            finally:
                model.paused -= 1

        def device_recv(*args, **kwargs):
            model.paused += 1
            try:
                got = recv(*args, **kwargs)
            finally:
                model.paused -= 1
            _mark([t for k, t in got.items() if not in_header(k, t)])  # the header's integers arrive on the host
            return got
        p2p.send, p2p.recv = quiet_send, device_recv


def syncs_per_step(built, preprocess: str, pool: list, world, offset: int = 0) -> dict[int, Counter]:
    """``{M: the device reads of one step}`` for ``M`` = 2 and 3 micro-batches: a copy of the model ``built``
    split at ``R = 1``, ``V = 2`` with ``preprocess``, micro ``m`` being ``pool[(m + offset) % len(pool)]``, its
    second step counted under :class:`DeviceModel` in strict device mode (the first warms up)."""
    import copy
    from mpipe_hf.models import split
    from mpipe_hf.runtime import PipelineExecutor
    from mpipe_hf.schedule import ScheduleConfig
    counts = {}
    for num_micro in (2, 3):
        cfg = ScheduleConfig(1, 2, num_micro, preprocess)
        carved = split(copy.deepcopy(built), cfg, 0)
        params = carved.trainable_parameters(cfg, 0)
        modules = [*carved.stages.values(), *([carved.preprocess.module] if carved.preprocess.module else [])]
        data = [pool[(m + offset) % len(pool)] for m in range(num_micro)]
        with DeviceModel(modules) as counter:
            ex = PipelineExecutor(cfg, 0, carved.stages, carved.preprocess, world, DEVICE, params.values(),
                                  strict=True)
            counter.transport(ex.p2p)
            ex.step(lambda m: data[m])
            counter.syncs.clear()
            ex.step(lambda m: data[m])
        ex.close()
        counts[num_micro] = counter.syncs
    return counts
