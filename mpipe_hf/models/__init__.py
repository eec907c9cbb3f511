"""Model-family splitters (one file per family) and their registry."""

from .base import SplitModel, balanced_layers
from .registry import FAMILIES, get_family, get_splitter

__all__ = ["FAMILIES", "SplitModel", "balanced_layers", "get_family", "get_splitter"]
