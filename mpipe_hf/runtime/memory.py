"""Counting activation memory: the distinct storages autograd saves for a backward, the weights left out.

A ``saved_tensors_hooks`` pack hook sees every tensor a forward saves (``F.linear`` saves ``weight.t()``, a new
tensor on the weight's storage, hence the count by storage). Under non-reentrant gradient checkpointing the
checkpointed region's inputs are what is kept, and the hook sees those.
"""

from __future__ import annotations

from torch.autograd.graph import saved_tensors_hooks


def storage_ids(tensors) -> set[int]:
    """The storages of ``tensors`` (a saved ``weight.t()`` is a new tensor on the weight's storage)."""
    return {t.untyped_storage()._cdata for t in tensors}


class SavedStorages:
    """While active (``with``), the distinct storages autograd saves for a backward, by the caller's current
    ``region`` (any hashable; ``None`` at first), the storages in ``params`` (parameters, :func:`storage_ids`)
    left out. Sizes in bytes."""

    def __init__(self, params: set[int]):
        self.params, self.region, self.by_region = params, None, {}

    def _pack(self, t):
        key = t.untyped_storage()._cdata
        if key not in self.params:
            self.by_region.setdefault(self.region, {})[key] = t.untyped_storage().nbytes()
        return t

    def __enter__(self) -> "SavedStorages":
        self.by_region = {}
        self._hooks = saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    def bytes(self, region=None) -> int:
        """Bytes saved while ``region`` was current."""
        return sum(self.by_region.get(region, {}).values())


def saved_bytes(fn, params: set[int]) -> int:
    """Bytes of the distinct storages that autograd saves while ``fn()`` runs, those in ``params`` (parameter
    storages, :func:`storage_ids`) excluded."""
    with SavedStorages(params) as saved:
        fn()
    return saved.bytes()
