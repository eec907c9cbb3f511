"""Model-family splitters (one file per family) and their registry."""

from .base import SplitModel, balanced_layers
from .registry import SPLITTERS, get_splitter

__all__ = ["SPLITTERS", "SplitModel", "balanced_layers", "get_splitter"]
