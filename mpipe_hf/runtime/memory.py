"""Counting activation memory: the distinct storages autograd saves for a backward, the weights left out.

A ``saved_tensors_hooks`` pack hook sees every tensor a forward saves (``F.linear`` saves ``weight.t()``, a new
tensor on the weight's storage, hence the count by storage). Under non-reentrant gradient checkpointing the
checkpointed region's inputs are what is kept, and the hook sees those.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

# autograd nodes of a single-input view or cast: a saved tensor made by them from a parameter is the parameter's
_VIEWS_AND_CASTS = frozenset({"ToCopyBackward0", "TBackward0", "TransposeBackward0", "PermuteBackward0",
                              "ViewBackward0", "UnsafeViewBackward0", "ExpandBackward0", "AliasBackward0"})


def storage_ids(tensors) -> set[int]:
    """The storages of ``tensors`` (a saved ``weight.t()`` is a new tensor on the weight's storage)."""
    return {t.untyped_storage()._cdata for t in tensors}


def weight_copy(t: torch.Tensor) -> bool:
    """Whether a saved tensor is a parameter or a view or cast of one: autocast's bf16 copy of a trained
    weight (cached for the whole step and shared by every micro-batch, so not a micro's activation), or FSDP2's
    unsharded parameter. Walks ``t``'s autograd history through single-input views and casts to the
    ``AccumulateGrad`` of a parameter; a frozen parameter has no history, so ``t`` or its view base must be one."""
    if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
        return True
    fn = t.grad_fn
    for _ in range(4):
        if fn is None:
            return False
        name = type(fn).__name__
        if name == "AccumulateGrad":
            return isinstance(fn.variable, nn.Parameter)
        if name not in _VIEWS_AND_CASTS or not fn.next_functions:
            return False
        fn = fn.next_functions[0][0]
    return False


class SavedStorages:
    """While active (``with``), the distinct storages autograd saves for a backward, by the caller's current
    ``region`` (any hashable; ``None`` at first), the storages in ``params`` (parameters, :func:`storage_ids`)
    and the weights' copies (:func:`weight_copy`) left out. Sizes in bytes."""

    def __init__(self, params: set[int]):
        self.params, self.region, self.by_region = params, None, {}

    def _pack(self, t):
        key = t.untyped_storage()._cdata
        if key not in self.params and not weight_copy(t):
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
