"""The activation swap manager: a stage forward's saved tensors go to host memory between its forward and its
backward, grouped by ``(stage, micro)`` (the schedule's swap actions, :mod:`mpipe_hf.schedule.swap`).

It works on ``torch.autograd.graph.saved_tensors_hooks``. While a swapped forward runs, the pack hook files every
tensor autograd saves under the forward's group, by storage (a tensor saved twice, or two views of one storage,
are one entry), and hands autograd a handle that does not hold the tensor; the weights are left alone.
``SWAP_LAUNCH_OFFLOAD`` copies the group's storages of at least ``min_bytes`` to the host (pinned memory, on a
side CUDA stream, on a GPU; a plain copy on CPU) and ``SWAP_WAIT_OFFLOAD`` drops the group's references to the
device tensors once the copies are done; ``SWAP_LAUNCH_LOAD`` and ``SWAP_WAIT_LOAD`` bring them back before the
backward, where the unpack hook rebuilds each saved view. Dropping a reference never invalidates a tensor that
something else still holds, so nothing is ever resized under a reader.

- The pipeline's own boundary tensors are not offloaded: the stage's inputs (stage 0's token inputs and
  injected features, a received activation) and its outputs (what the P2P still sends, the last stage's loss),
  which the forward handler names (:meth:`SwapManager.keep`); copying them would free nothing.
- A tensor changed in place between its pack and its offload (its version counter moved) raises
  ``RuntimeError`` naming the group: its copy would no longer be what the backward needs.
- Under non-reentrant gradient checkpointing the checkpointed layers' own hooks take the tensors saved inside
  them; what this manager files and swaps is what checkpointing keeps.
- On CPU, device and host are one memory: the copy is real and the original tensors are dropped, so the bytes
  the pipeline holds for its backwards (:attr:`SwapManager.resident_bytes`) go down, the process's do not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.autograd.graph import saved_tensors_hooks

from .memory import weight_copy


@dataclass
class _Saved:
    """One saved storage of a group: the whole storage as flat bytes while on the device (``base``, uint8), its
    copy while on the host (``host``), and each saved view, detached (no ``grad_fn``, so no reference cycle through
    autograd), with its version at pack time, until the offload."""

    base: torch.Tensor | None
    nbytes: int
    views: list = field(default_factory=list)
    host: torch.Tensor | None = None

    def drop(self) -> None:
        self.base, self.host, self.views = None, None, []


@dataclass
class _Group:
    saved: dict[int, _Saved] = field(default_factory=dict)  # by storage
    kept: set[int] = field(default_factory=set)  # storages of the boundary tensors
    offloaded: list[_Saved] = field(default_factory=list)
    event: object = None  # the CUDA event of the group's last launched copies


class _Handle:
    """What autograd keeps for a saved tensor of a swapped forward: its entry, which of the entry's views it is,
    and the view's geometry and dtype (it holds no tensor)."""

    __slots__ = ("entry", "index", "shape", "stride", "offset", "dtype", "key")

    def __init__(self, entry: _Saved, t: torch.Tensor, key: tuple[int, int]):
        self.entry, self.index, self.key = entry, len(entry.views) - 1, key
        self.shape, self.stride, self.offset, self.dtype = t.shape, t.stride(), t.storage_offset(), t.dtype


class SwapManager:
    """Saved-activation swap for one rank's executor (module docstring; SPEC.md, "Activation swap").

    Args:
        device: the rank's device.
        weights: storage ids (:func:`~.memory.storage_ids`) never filed: the parameters and buffers.
        min_bytes: storages smaller than this stay on the device (they are counted all the same).

    Attributes:
        resident_bytes: bytes of the filed storages now on the device, over every group of the step.
        offloaded_bytes: bytes copied to the host this step.
    """

    def __init__(self, device: torch.device, weights: set[int], min_bytes: int = 2 ** 16):
        self.device, self.weights, self.min_bytes = device, weights, min_bytes
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.groups: dict[tuple[int, int], _Group] = {}
        self.current: tuple[int, int] | None = None
        self.resident_bytes = self.offloaded_bytes = 0

    def reset(self) -> None:
        """Drop every group and its tensors (a failed step leaves none behind: autograd may still hold the
        handles of a graph that never ran backward) and the counts."""
        for group in self.groups.values():
            for entry in group.saved.values():
                entry.drop()
        self.groups.clear()
        self.current = None
        self.resident_bytes = self.offloaded_bytes = 0

    # ---- the forward -----------------------------------------------------------------------------------

    def set_group(self, key: tuple[int, int]) -> None:
        """``SWAP_SET_GROUP``: the next forward's saved tensors belong to ``key = (stage, micro)``."""
        self.current = key
        self.groups[key] = _Group()

    def hooks(self) -> saved_tensors_hooks:
        """The hooks the forward of the current group runs under."""
        return saved_tensors_hooks(self._pack, self._unpack)

    def keep(self, key: tuple[int, int], tensors) -> None:
        """Name the group's boundary tensors (the stage's inputs and outputs): never offloaded."""
        self.groups[key].kept |= {t.untyped_storage()._cdata for t in tensors if isinstance(t, torch.Tensor)}
        if self.current == key:
            self.current = None

    def _pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        sid = storage._cdata
        if sid in self.weights or weight_copy(t):  # a weight's bf16 copy is one per step, not the micro's
            return t
        key = self.current
        group = self.groups[key]
        entry = group.saved.get(sid)
        if entry is None:
            base = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),))
            entry = group.saved[sid] = _Saved(base, storage.nbytes())
            self.resident_bytes += entry.nbytes
        entry.views.append((t.detach(), t._version))  # detach() shares the version counter
        return _Handle(entry, t, key)

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        entry = packed.entry
        if entry.views:  # never offloaded: the version check autograd would do, for this view
            view, version = entry.views[packed.index]
            if view._version != version:
                raise RuntimeError(_changed(packed.key, version, view._version))
        if entry.base is None:
            if entry.host is None:
                raise RuntimeError(f"activation swap: stage {packed.key[0]} micro {packed.key[1]}'s saved "
                                   f"tensors were released before its backward (a failed step's graph?)")
            entry.base = entry.host.to(self.device)  # offloaded, and no SWAP_LAUNCH_LOAD ran: load it now
            self.resident_bytes += entry.nbytes
        return entry.base.view(packed.dtype).as_strided(packed.shape, packed.stride, packed.offset)

    # ---- the swap actions ------------------------------------------------------------------------------

    def launch_offload(self, key: tuple[int, int]) -> None:
        """``SWAP_LAUNCH_OFFLOAD``: start copying the group's storages (not the boundary ones, not the small
        ones) to the host.

        Raises:
            RuntimeError: a saved tensor was changed in place since the forward saved it.
        """
        group = self.groups[key]
        moving = [e for sid, e in group.saved.items() if sid not in group.kept and e.nbytes >= self.min_bytes]
        for entry in moving:
            for view, version in entry.views:
                if view._version != version:
                    raise RuntimeError(_changed(key, version, view._version))
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                for entry in moving:
                    entry.host = torch.empty(entry.base.shape, dtype=entry.base.dtype, pin_memory=True)
                    entry.host.copy_(entry.base, non_blocking=True)
                    entry.base.record_stream(self.stream)
                group.event = self.stream.record_event()
        else:
            for entry in moving:
                entry.host = entry.base.clone()
        group.offloaded = moving

    def wait_offload(self, key: tuple[int, int]) -> None:
        """``SWAP_WAIT_OFFLOAD``: the copies are done; drop the device tensors (and the saved views)."""
        group = self.groups[key]
        if group.event is not None:  # the compute stream waits; the host does not (record_stream keeps the block)
            torch.cuda.current_stream(self.device).wait_event(group.event)
        for entry in group.offloaded:
            entry.base, entry.views = None, []
            self.resident_bytes -= entry.nbytes
            self.offloaded_bytes += entry.nbytes

    def launch_load(self, key: tuple[int, int]) -> None:
        """``SWAP_LAUNCH_LOAD``: start copying the group's offloaded storages back to the device."""
        group = self.groups[key]
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            for entry in group.offloaded:  # allocated on the compute stream, whose pool the backward reuses
                entry.base = torch.empty_like(entry.host, device=self.device)
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream):
                for entry in group.offloaded:
                    entry.base.copy_(entry.host, non_blocking=True)
                    entry.base.record_stream(self.stream)
                group.event = self.stream.record_event()
        else:
            for entry in group.offloaded:
                entry.base = entry.host
        self.resident_bytes += sum(e.nbytes for e in group.offloaded)

    def wait_load(self, key: tuple[int, int]) -> None:
        """``SWAP_WAIT_LOAD``: the copies back are done; the backward may read them."""
        group = self.groups[key]
        if self.cuda and group.event is not None:
            torch.cuda.current_stream(self.device).wait_event(group.event)
        for entry in group.offloaded:
            entry.host = None

    def release(self, key: tuple[int, int]) -> None:
        """After the group's backward: forget it (autograd has dropped its handles)."""
        group = self.groups.pop(key, None)
        if group is not None:
            self.resident_bytes -= sum(e.nbytes for e in group.saved.values() if e.base is not None)
            for entry in group.saved.values():
                entry.drop()


def _changed(key: tuple[int, int], before: int, after: int) -> str:
    stage, micro = key
    return (f"activation swap: a tensor that stage {stage}'s forward of micro {micro} saved for its backward was "
            f"changed in place afterwards (version {before} -> {after}); its saved copy would be stale. Make the "
            f"in-place operation out of place, or leave this stage out of swap (swap.ranks, swap.min_swap_gap)")
