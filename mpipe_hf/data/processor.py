"""The Hugging Face processor of each vision-language family, built from a tokenizer and a PIL image processor (no
torchvision needed), as the family's :class:`~.family_data.FamilyData` declares it (its package's ``data.py``,
found through :mod:`mpipe_hf.families.registry`). Mistral 3's processor class (Pixtral's) imports torchvision, so
without it Mistral 3 gets a stand-in that expands images as it does (``mpipe_hf/families/mistral``).
"""

from __future__ import annotations

from ..families.registry import all_data, family_data


def image_processor_for(config, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112):
    """A PIL image processor for ``config`` (no checkpoint needed), set from the config as the hub checkpoints set
    theirs (the family's :class:`~.family_data.FamilyData`); a pixel-bounded family resizes to between
    ``min_pixels`` and ``max_pixels``.

    Raises:
        ValueError: ``config.model_type`` has no processor here (the message lists the supported ones).
    """
    return _declared(config.model_type, "image processor").image_processor(config, min_pixels, max_pixels)


def build_processor(config, tokenizer, image_processor=None, min_pixels: int = 56 * 56,
                    max_pixels: int = 112 * 112, video_processor=None):
    """The HF processor of ``config.model_type`` over ``tokenizer`` and ``image_processor`` (from
    :func:`image_processor_for` when ``None``), as the family's :class:`~.family_data.FamilyData` builds it: the
    stock class over the tokenizer with the family's markers named. A family that takes videos takes
    ``video_processor`` too (``None``: the torchvision-free one with the image processor's settings, as
    ``AutoVideoProcessor`` builds the hub's; docs/video.md).

    Raises:
        ValueError: ``config.model_type`` has no processor here (the message lists the supported ones); a marker
            has no token in the vocabulary.
    """
    declared = _declared(config.model_type, "image processor" if image_processor is None else "processor")
    if image_processor is None:
        image_processor = declared.image_processor(config, min_pixels, max_pixels)
    if declared.videos:
        return declared.processor(config, tokenizer, image_processor, video_processor=video_processor)
    return declared.processor(config, tokenizer, image_processor)


def _declared(model_type: str, what: str):
    declared = family_data(model_type)
    if declared is None:
        raise ValueError(f"model_type {model_type!r} has no {what}; supported: {sorted(all_data())}")
    return declared


def __getattr__(name: str):
    if name == "PROCESSOR_TYPES":  # every family with a data path here (each group imported on first use)
        return sorted(all_data())
    if name == "PIXEL_BOUNDED_TYPES":  # families whose image processor resizes to a recipe's data.min/max_pixels
        return frozenset(t for t, d in all_data().items() if d.pixel_bounded)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
