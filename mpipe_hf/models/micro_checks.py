"""``Family.validate`` builders that several family groups share beside
:func:`~.image_tokens.validate_counted_micro`: refusing a modality the split does not carry
(:func:`refuse_other_modalities`) and running several checks as one (:func:`all_checks`)."""

from __future__ import annotations

import torch
from torch import nn

Tensors = dict[str, torch.Tensor]


def refuse_other_modalities(keys: dict[str, str]):
    """``Family.validate``: raise ``ValueError`` naming the modality when a micro-batch holds one of ``keys``
    (``{raw key: modality}``): the image path alone is split."""
    def build(model: nn.Module):
        def validate_micro(raw: Tensors) -> None:
            for key, modality in keys.items():
                if raw.get(key) is not None:
                    raise ValueError(f"{model.config.model_type}: {modality} inputs ({key}) are not supported; "
                                     f"only the image path is split across pipeline stages")
        return validate_micro
    return build


def all_checks(*checks):
    """One ``Family.validate`` running each of ``checks`` (each ``check(model) -> (raw -> None)``) in turn."""
    def build(model: nn.Module):
        built = [check(model) for check in checks]

        def validate_micro(raw: Tensors) -> None:
            for check in built:
                check(raw)
        return validate_micro
    return build
