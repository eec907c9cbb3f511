"""The model layer: one generic splitter (:mod:`.generic`) driven by a short declaration per family
(:class:`~.family.Family`, each in its group's package, :mod:`mpipe_hf.families`), and :func:`split`, the one entry
point, which finds the declaration by ``config.model_type``.

The registry's names are imported on first use (PEP 562): importing a light submodule (the recipe's
:mod:`.freeze`) does not load every family's transformers classes (about 4 s), so ``mpipe-hf`` answers a bad
recipe at once."""

from __future__ import annotations

import importlib

_LAZY = {"SplitModel": ".base", "balanced_layers": ".base", "Family": ".family", "FAMILIES": ".registry",
         "get_family": ".registry", "register": ".registry", "split": ".registry",
         "unregister": ".registry"}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)
