"""Splitters by ``config.model_type``."""

from __future__ import annotations

from typing import Callable

from . import qwen2_5_vl

SPLITTERS: dict[str, Callable] = {"qwen2_5_vl": qwen2_5_vl.split}


def get_splitter(model_type: str) -> Callable:
    """The splitter for ``model_type``; raises ``ValueError`` naming the supported types."""
    if model_type not in SPLITTERS:
        raise ValueError(f"model_type {model_type!r} has no splitter; supported: {sorted(SPLITTERS)}")
    return SPLITTERS[model_type]
