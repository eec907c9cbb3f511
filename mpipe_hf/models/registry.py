"""Model families by ``config.model_type``, and :func:`split`, the one entry point.

Adding a family
---------------
A family is a :class:`~.family.Family` declaration in its group's package (``mpipe_hf/families/<group>/split.py``,
docs/adding_a_family.md): where the model keeps its vision part and text model, the keys its
``get_image_features`` takes, its positions and masks; :mod:`mpipe_hf.families.registry` finds it by
``model_type``. Or call ``mpipe_hf.models.register("my_model_type", Family(...))``; :func:`split` and
``mpipe-hf train`` pick it up by ``model_type``. Any object with these two methods also serves:

``layer_counts(config, cfg, layers_per_stage=None, text_layers=0) -> list[int]``
    Decoder layers per stage for the HF ``config``; raises ``ValueError`` naming the field when the layout,
    ``text_layers`` or the model does not fit ``cfg``. It needs no weights, so it runs before any process starts.

``split(model, cfg, rank, layers_per_stage=None, text_layers=0) -> SplitModel``
    Carve the HF ``model`` for pipeline rank ``rank``: say which modules form ``P`` and each stage, and give
    each stage a module mapping a dict of tensors to a dict of tensors (the last one returns
    ``{"loss": summed token loss, "num_tokens": label tokens}``).
"""

from __future__ import annotations

from typing import Iterable

from torch import nn

from ..families import registry as _registry
from ..schedule import ScheduleConfig
from .base import SplitModel
from .family import Family


def __getattr__(name: str):
    if name == "FAMILIES":  # every declared family (each group imported on first use)
        return _registry.all_families()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(model_types: str | Iterable[str], family) -> None:
    """Make ``family`` (a :class:`~.family.Family`, or any object with ``layer_counts`` and ``split`` as above)
    the splitter of ``model_types``, replacing any earlier one.

    Raises:
        ValueError: ``family`` lacks ``layer_counts`` or ``split``.
    """
    missing = [name for name in ("layer_counts", "split") if not callable(getattr(family, name, None))]
    if missing:
        raise ValueError(f"a model family needs callables layer_counts and split; {family!r} lacks {missing}")
    _registry.register(model_types, family)


def unregister(model_types: str | Iterable[str]) -> None:
    """Undo :func:`register` for ``model_types``: their declarations, if any, serve again."""
    _registry.unregister(model_types)


def get_family(model_type: str) -> Family:
    """The family of ``model_type`` (its declaration, or a registered splitter).

    Raises:
        ValueError: ``model_type`` has no family: for a type of transformers' image-text-to-text map, the reason
            (:mod:`.coverage`); for any other, the list of the supported ones.
    """
    declared = _registry.family(model_type)
    if declared is None:
        from .coverage import NOT_DECLARED, image_text_types
        reason = _registry.refusal(model_type)
        if reason is not None or model_type in image_text_types():
            raise ValueError(f"model_type {model_type!r} cannot be split: {reason or NOT_DECLARED} (docs/models.md "
                             f"lists every image-text-to-text model type and its status)")
        raise ValueError(f"model_type {model_type!r} has no splitter; supported model_type values: "
                         f"{sorted(_registry.all_families())}")
    return declared


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
