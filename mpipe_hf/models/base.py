"""What a splitter returns, and the layout helpers every family shares (SPEC.md, "The job")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..runtime import Preprocess
from ..schedule import ScheduleConfig


def balanced_layers(num_layers: int, num_stages: int) -> list[int]:
    """Layers per stage, as even as possible; the spare layers go to the middle stages first, because stage 0
    also embeds and the last stage also runs the LM head and loss.

    Raises:
        ValueError: when there are more stages than layers.
    """
    if num_stages > num_layers:
        raise ValueError(f"pp_size * vpp = {num_stages} stages exceeds the model's {num_layers} decoder layers; "
                         f"every stage needs at least one layer, so lower pp_size or vpp")
    base, extra = divmod(num_layers, num_stages)
    order = list(range(1, num_stages - 1)) + [0, num_stages - 1] if num_stages > 2 else list(range(num_stages))
    counts = [base] * num_stages
    for s in order[:extra]:
        counts[s] += 1
    return counts


def check_layers_per_stage(counts: list[int], num_layers: int, num_stages: int) -> list[int]:
    """Validate a user layout. Raises ``ValueError`` naming ``layers_per_stage``."""
    if len(counts) != num_stages or any(c < 1 for c in counts) or sum(counts) != num_layers:
        raise ValueError(f"layers_per_stage must list {num_stages} positive counts (pp_size * vpp) that sum to "
                         f"{num_layers} decoder layers, got {counts}")
    return list(counts)


@dataclass
class SplitModel:
    """A Hugging Face model carved for one pipeline rank.

    Attributes:
        model: the HF model; modules this rank does not hold are replaced by ``nn.Identity``.
        stages: ``{stage index: module}`` of this rank.
        preprocess: the transposed block ``P`` (a full replica on every rank).
        layout: module FQNs of every stage, all ranks (``layout[s]``).
        preprocess_fqn: FQN of ``P`` in ``model``.
        validate_micro: raises ``ValueError`` when a micro-batch's raw inputs do not fit the model.
    """

    model: nn.Module
    stages: dict[int, nn.Module]
    preprocess: Preprocess
    layout: list[list[str]]
    preprocess_fqn: str
    validate_micro: Callable[[dict[str, torch.Tensor]], None]

    def owned_prefixes(self, cfg: ScheduleConfig, rank: int) -> list[str]:
        """FQN prefixes whose parameters ``rank`` trains and saves; rank 0 owns ``P``."""
        prefixes = [fqn for s in range(rank, cfg.num_stages, cfg.pp_size) for fqn in self.layout[s]]
        return prefixes + ([self.preprocess_fqn] if rank == 0 else [])

    def _owned(self, cfg: ScheduleConfig, rank: int, name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in self.owned_prefixes(cfg, rank))

    def trainable_parameters(self, cfg: ScheduleConfig, rank: int) -> dict[str, nn.Parameter]:
        """``{name: parameter}`` this rank optimises (``P``'s only on rank 0, and only when trainable)."""
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad and self._owned(cfg, rank, n)}

    def state_dict(self, cfg: ScheduleConfig, rank: int) -> dict[str, torch.Tensor]:
        """This rank's share of the model's ``state_dict`` (the names ``from_pretrained`` accepts)."""
        return {n: t for n, t in self.model.state_dict().items() if self._owned(cfg, rank, n)}
