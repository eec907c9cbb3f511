"""Model families by ``config.model_type``, and :func:`split`, the one entry point.

Adding a family
---------------
A family is one module (one file, as ``transformers/models/*``) with two functions:

``layer_counts(config, cfg, layers_per_stage=None, text_layers=0) -> list[int]``
    Decoder layers per stage for the HF ``config``; raises ``ValueError`` naming the field when the layout,
    ``text_layers`` or the model does not fit ``cfg``. It needs no weights, so it runs before any process starts.

``split(model, cfg, rank, layers_per_stage=None, text_layers=0) -> SplitModel``
    Carve the HF ``model`` for pipeline rank ``rank``: say which modules form ``P`` and each stage, and give
    each stage a module mapping a dict of tensors to a dict of tensors (the last one returns
    ``{"loss": summed token loss, "num_tokens": label tokens}``).

Most families need only a few lines on top of the shared parts: :func:`~.vision_language.split_vision_language`
for a vision tower in front of a decoder (fill a :class:`~.vision_language.VisionLanguageParts`; see ``llava.py``),
or ``causal_lm.split`` for a decoder-only LM whose text model has ``embed_tokens``, ``layers``, ``norm`` and
``rotary_emb``. Then, from that same file, call ``mpipe_hf.models.register("my_model_type", sys.modules[__name__])``
(or add it to :data:`FAMILIES` here); :func:`split` and ``mpipe-hf train`` pick it up by ``model_type``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Iterable

from torch import nn

from ..schedule import ScheduleConfig
from . import causal_lm, llava, qwen2_vl, qwen3_vl
from .base import SplitModel

FAMILIES: dict[str, ModuleType] = {
    "qwen2_vl": qwen2_vl, "qwen2_5_vl": qwen2_vl, "qwen3_vl": qwen3_vl, "llava": llava,
    "llama": causal_lm, "qwen2": causal_lm, "qwen3": causal_lm,
}


def register(model_types: str | Iterable[str], family) -> None:
    """Make ``family`` (a module, or any object with ``layer_counts`` and ``split`` as above) the splitter of
    ``model_types``, replacing any earlier one.

    Raises:
        ValueError: ``family`` lacks ``layer_counts`` or ``split``.
    """
    missing = [name for name in ("layer_counts", "split") if not callable(getattr(family, name, None))]
    if missing:
        raise ValueError(f"a model family needs callables layer_counts and split; {family!r} lacks {missing}")
    for model_type in [model_types] if isinstance(model_types, str) else model_types:
        FAMILIES[model_type] = family


def get_family(model_type: str) -> ModuleType:
    """The family module for ``model_type``.

    Raises:
        ValueError: ``model_type`` has no family; the message lists the supported ones.
    """
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} has no splitter; supported model_type values: "
                         f"{sorted(FAMILIES)}")
    return FAMILIES[model_type]


def split(model: nn.Module, cfg: ScheduleConfig, rank: int, layers_per_stage: list[int] | None = None,
          text_layers: int = 0) -> SplitModel:
    """Carve a Hugging Face ``model`` for pipeline rank ``rank`` of ``cfg``, by its ``config.model_type``.

    Args:
        model: e.g. ``AutoModelForImageTextToText.from_pretrained(path)`` or ``AutoModelForCausalLM...``.
        cfg: the schedule configuration (``cfg.preprocess``: identity, frozen or trainable ``P``).
        rank: this process's pipeline rank (``0 .. cfg.pp_size - 1``).
        layers_per_stage: decoder layers per stage (``cfg.pp_size * cfg.vpp`` entries); balanced when ``None``.
        text_layers: ``T``, the decoder layers ``P`` takes from stage 0.

    Returns:
        The :class:`~.base.SplitModel` of this rank.

    Raises:
        ValueError: an unsupported ``model_type`` (the message lists the supported ones), or a layout or
            ``text_layers`` that does not fit (the message names the field).
    """
    return get_family(model.config.model_type).split(model, cfg, rank, layers_per_stage, text_layers)
