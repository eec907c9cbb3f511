"""The model layer: one generic splitter (:mod:`.generic`) driven by a short declaration per family
(:class:`~.family.Family`, all of them in :mod:`.families`), the registry and :func:`split`, the one entry point."""

from .base import SplitModel, balanced_layers
from .family import Family
from .registry import FAMILIES, get_family, register, split

__all__ = ["FAMILIES", "Family", "SplitModel", "balanced_layers", "get_family", "register", "split"]
