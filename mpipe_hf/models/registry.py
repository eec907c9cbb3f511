"""Model families by ``config.model_type``: each module has ``split`` and ``layer_counts``."""

from __future__ import annotations

from types import ModuleType
from typing import Callable

from . import causal_lm, qwen2_5_vl

FAMILIES: dict[str, ModuleType] = {"qwen2_5_vl": qwen2_5_vl, "llama": causal_lm, "qwen2": causal_lm}


def get_family(model_type: str) -> ModuleType:
    """The family module for ``model_type``; raises ``ValueError`` naming the supported types."""
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} has no splitter; supported model_type values: "
                         f"{sorted(FAMILIES)}")
    return FAMILIES[model_type]


def get_splitter(model_type: str) -> Callable:
    """``split(model, cfg, rank, layers_per_stage=None, text_layers=0) -> SplitModel`` for ``model_type``."""
    return get_family(model_type).split
