"""A device emulated on the CPU, for counting what would stall a GPU.

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

The second half puts expert parallelism's all-to-all into the op order of the stream model of
:mod:`mpipe_hf.schedule.eager`: :func:`ep_ops` gives every process of several pipeline replicas its transfers with
each MoE layer's all-to-alls inside its stage's ``F`` and ``B``, and :func:`ep_streams` runs them
(``tests/test_ep_deadlock.py``).

:class:`NcclLikeComm` stands for NCCL's streams when a peer is lost: a host wait that only the communicator's abort
ends (``tests/test_liveness.py``).
"""

from __future__ import annotations

import threading
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


def _batched(t: torch.Tensor) -> bool:
    """Whether ``t`` is a functorch batched tensor (inside ``torch.vmap``)."""
    return torch._C._functorch.is_batchedtensor(t)


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
        if func is torch.Tensor.to and any(_batched(t) for t in tensors):
            # inside transformers' vmap-ed mask functions (and_masks: ``mask(...).to(result.device)``) the mark of
            # a batched tensor is not seen, so its device reads as the host; every operand there is on one device
            return func(*args, **kwargs)
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


# ---- expert parallelism's all-to-all in the communicator model -----------------------------------------

def all_to_all_ops(me: int, group: list[int], label) -> list:
    """``me``'s operations of one all-to-all over ``group`` (global ranks), as the pairwise exchanges it is made of
    (NCCL runs an all-to-all as a send to and a receive from every peer on the group's one stream): each pair
    ``(i, j)``, ``i < j``, in sorted order, ``i`` sending to ``j`` and then receiving from it (``j`` the reverse).
    Every member walks its pairs in that one order, so on the FIFO stream model of
    :func:`~mpipe_hf.schedule.eager.eager_streams` the exchange completes exactly when every member reaches it (and
    a member that never does holds the others), as the collective does."""
    from itertools import combinations

    from mpipe_hf.schedule.connect import Op
    ops = []
    for i, j in combinations(sorted(group), 2):
        if me == i:
            ops += [Op("send", i, j, label), Op("recv", j, i, label)]
        elif me == j:
            ops += [Op("recv", i, j, label), Op("send", j, i, label)]
    return ops


def ep_stage_ops(me: int, group: list[int], action, layers: int, whole: bool = False) -> list:
    """The all-to-alls of a body ``F``, ``B`` or ``W`` of a stage with ``layers`` MoE layers under transformers'
    ``AllToAllEP``: per layer forward, the per-expert counts (which the host reads back: a ``sync``), the rows'
    dispatch and the combine; per layer backward, in reverse layer order, the combine's and the dispatch's
    backwards, run by the ``B`` (zero-bubble's ``W`` runs only the experts' weight GEMMs) or by a ``W`` that is the
    ``whole`` backward. Labelled ``(kind, stage, layer, part)``: the micro is not in it, EP peers run their own."""
    from mpipe_hf.schedule import Kind
    from mpipe_hf.schedule.connect import Op
    ops = []
    if action.kind is Kind.F:
        for layer in range(layers):
            tag = ("F", action.stage, layer)
            ops += all_to_all_ops(me, group, (*tag, "counts")) + [Op("sync", what=(*tag, "split sizes"))]
            ops += all_to_all_ops(me, group, (*tag, "dispatch")) + all_to_all_ops(me, group, (*tag, "combine"))
    elif action.kind is Kind.B or (action.kind is Kind.W and whole):
        for layer in reversed(range(layers)):
            tag = ("B", action.stage, layer)
            ops += all_to_all_ops(me, group, (*tag, "combine")) + all_to_all_ops(me, group, (*tag, "dispatch"))
    return ops


def ep_ops(replicas: list[dict], moe_layers: list[int]) -> dict[int, list]:
    """Every process's operations of one step of ``len(replicas)`` pipeline replicas that form EP groups
    (``replicas[e]``: replica ``e``'s ``{pipeline rank: action list}``; global rank ``e * R + p``; the EP group of
    pipeline rank ``p`` is ``{e * R + p}``, so its peers hold the same stages): each replica's pipeline operations
    as the executor runs them (:func:`~mpipe_hf.schedule.connect.step_ops`, behind the connect prologue), with a
    stage's all-to-alls (:func:`ep_stage_ops`, ``moe_layers[stage]`` layers) right after each of its ``F`` and
    ``B`` (and a zero-bubble ``W`` that is a whole backward). The step's all-reduce (``barrier``) is taken over
    every process (more waiting than its pipeline group's: a model that finishes with it finishes without it)."""
    from mpipe_hf.schedule.connect import Op, action_ops, connect_ops, connect_order, step_ops
    from mpipe_hf.schedule.simulate import split_pairs
    pp_size, out = len(replicas[0]), {}

    def moved(ops, base):
        """A replica's operations on the global ranks (its rank ``q`` is process ``base + q``)."""
        return [op if op.src is None else Op(op.kind, base + op.src, base + op.dst, op.what) for op in ops]
    for e, orders in enumerate(replicas):
        for p, order in orders.items():
            me, group = e * pp_size + p, [q * pp_size + p for q in range(len(replicas))]
            ops, split = moved(connect_ops(p, connect_order(p, action_ops(p, order))), e * pp_size), split_pairs(order)
            for a in order:
                ops += moved(action_ops(p, [a]), e * pp_size)
                layers = 0 if a.stage is None else moe_layers[a.stage]
                ops += ep_stage_ops(me, group, a, layers, (a.stage, a.micro) not in split)
            out[me] = ops + moved(step_ops(p, []), e * pp_size)
    return out


def ep_streams(ops: dict[int, list], pp_size: int):
    """:func:`~mpipe_hf.schedule.eager.eager_streams`, conservative, with a group per directed pair of pipeline
    ranks and one EP group per pipeline rank (its all-to-alls on that group's one stream), and the host's ``sync``:
    it waits until every receive and every EP operation the rank posted completed on the device (the compute stream
    waited for them before the split sizes it reads back)."""
    from mpipe_hf.schedule.eager import SetupOutcome, _Streams

    def group_of(src, dst):
        return ("ep", src % pp_size) if src % pp_size == dst % pp_size else (src, dst)

    class Streams(_Streams):
        def host(self, rank, op):
            if op.kind != "sync":
                return super().host(rank, op)
            late = sorted({pair[0] if pair[1] == rank else pair[1] for (r, pair), n in self.posted.items()
                           if r == rank and (pair[1] == rank or group_of(*pair)[0] == "ep")
                           for i in range(n) if (rank, pair, i) not in self.done})
            return ("the split sizes' all-to-all and the receives before it", late) if late else None

    model = Streams(ops, group_of, conservative=True)
    moved = True
    while moved:
        moved, waits = model.device(), {}
        for rank, rank_ops in ops.items():
            while model.pc[rank] < len(rank_ops):
                blocked = model.host(rank, rank_ops[model.pc[rank]])
                if blocked is not None:
                    waits[rank] = (rank_ops[model.pc[rank]], *blocked)
                    break
                model.pc[rank] += 1
                moved = True
    return SetupOutcome(waits or model.stuck(), {r: [] for r in ops})


def ep_labels(ops: dict[int, list], me: int) -> list:
    """The labels of ``me``'s all-to-alls in order, one per all-to-all (its operations are consecutive and share
    a label; two all-to-alls in a row never do: their parts differ)."""
    out = []
    for op in ops[me]:
        if isinstance(op.what, tuple) and op.kind in ("send", "recv") and (not out or out[-1] != op.what):
            out.append(op.what)
    return out


class NcclLikeComm:
    """NCCL's answer to a lost peer, on the CPU (the liveness tests' device): a host wait on
    work that needs a peer's data (``synchronize()``, a host read of a tensor the work writes, an all-to-all inside
    a stage) neither fails nor times out when the peer's process is gone or stopped, since NCCL's kernels do not
    notice a closed socket; only the communicator's abort (``ncclCommAbort``, torch's ``_abort_process_group``)
    releases it, with an error. :meth:`wait` blocks so, and records what it blocked in."""

    def __init__(self):
        self.aborted = threading.Event()
        self.blocked: list[str] = []

    def wait(self, what: str, timeout: float | None = None) -> None:
        """Block in ``what`` until :meth:`abort` (``timeout``: the test's own bound, then ``TimeoutError``).

        Raises:
            RuntimeError: the communicator was aborted (NCCL's error after an abort).
            TimeoutError: still blocked after ``timeout`` seconds.
        """
        self.blocked.append(what)
        if self.aborted.wait(timeout):
            raise RuntimeError(f"NCCL communicator was aborted while blocked in {what}")
        raise TimeoutError(f"still blocked in {what} after {timeout}s")

    def abort(self) -> None:
        self.aborted.set()
