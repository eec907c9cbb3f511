"""Model-family splitters (one file per family), their registry and :func:`split`, the one entry point."""

from .base import SplitModel, balanced_layers
from .registry import FAMILIES, get_family, register, split

__all__ = ["FAMILIES", "SplitModel", "balanced_layers", "get_family", "register", "split"]
