"""The Hugging Face processor of each vision-language family, built from a tokenizer and a PIL image processor (no
torchvision needed): Qwen2-VL, Qwen2.5-VL (with a torchvision-free video processor, :mod:`.video_processor`),
Qwen3-VL and LLaVA here, the other families in :mod:`.processors_vlm`.

Every family of :data:`PROCESSOR_TYPES` has a PIL image processor in ``transformers`` 5.24; Mistral 3's processor
class (Pixtral's) imports torchvision, so without it Mistral 3 gets a stand-in that expands images as it does
(:class:`~.processors_vlm._PilPixtralProcessor`).
"""

from __future__ import annotations

from transformers import (LlavaProcessor, Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil, Qwen2VLProcessor,
                          Qwen3VLProcessor)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from ..families.registry import all_data, family_data
from .more_families import MORE
from .processors_vlm import (FAMILY_TYPES, GLM_LIKE, QWEN3_LIKE, conversation_class, family_image_processor,
                             family_processor)
from .video_processor import video_processor_from_image
from ..families.qwen.qwen3_video_processor import qwen3_video_processor_from_image

QWEN_PROCESSORS = {"qwen2_vl": Qwen2VLProcessor, "qwen2_5_vl": Qwen2_5_VLProcessor, "qwen3_vl": Qwen3VLProcessor}
QWEN_PATCH = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 16}

VIDEO_TYPES = ("qwen2_vl", "qwen2_5_vl", *QWEN3_LIKE)  # families whose processor here takes videos (docs/video.md)
# without torchvision's video processor (:func:`~.processors_vlm.conversation_class`): ours
_IMAGE_ONLY = {model_type: conversation_class(cls, model_type) for model_type, cls in QWEN_PROCESSORS.items()}


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


def legacy_image_processor(config, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112):
    """A PIL image processor for ``config`` (no checkpoint needed): Qwen families resize to between ``min_pixels``
    and ``max_pixels`` in multiples of ``patch * merge`` px; LLaVA resizes and crops to the tower's image size;
    the other families as :func:`~.processors_vlm.family_image_processor`.

    Raises:
        ValueError: ``config.model_type`` has no processor here (the message lists the supported ones).
    """
    if config.model_type in QWEN_PROCESSORS:
        return Qwen2VLImageProcessorPil(patch_size=QWEN_PATCH[config.model_type],
                                        size={"shortest_edge": min_pixels, "longest_edge": max_pixels})
    if config.model_type == "llava":
        side = config.vision_config.image_size
        return CLIPImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    if config.model_type in FAMILY_TYPES:
        return family_image_processor(config, min_pixels, max_pixels)
    if config.model_type in MORE:
        return MORE[config.model_type].image_processor(config, min_pixels, max_pixels)
    raise ValueError(f"model_type {config.model_type!r} has no image processor; supported: {sorted(all_data())}")


def legacy_processor(config, tokenizer, image_processor=None, min_pixels: int = 56 * 56,
                    max_pixels: int = 112 * 112, video_processor=None):
    """The HF processor of ``config.model_type`` over ``tokenizer`` and ``image_processor`` (from
    :func:`image_processor_for` when ``None``). Qwen2-VL's and Qwen2.5-VL's take videos too, through
    ``video_processor`` (``None``: the torchvision-free :class:`~.video_processor.QwenVideoProcessor` with the
    image processor's settings, as ``AutoVideoProcessor`` builds theirs; docs/video.md), and so do the Qwen3-VL
    family's (:class:`~mpipe_hf.families.qwen.qwen3_video_processor.Qwen3VideoProcessor`) and GLM-4.1V / GLM-4.5V's
    (:func:`~mpipe_hf.families.glm.processor.glm_processor`). LLaVA's takes its patch
    size, feature strategy and image token from ``config`` (one extra position for a CLIP tower's CLS token); the
    other families' are :func:`~.processors_vlm.family_processor`'s (the tokenizer copied with the family's image
    markers named).

    Raises:
        ValueError: ``config.model_type`` has no processor here (the message lists the supported ones).
    """
    if config.model_type in QWEN_PROCESSORS:
        if video_processor is None and config.model_type in VIDEO_TYPES:
            video_processor = (qwen3_video_processor_from_image if config.model_type in QWEN3_LIKE
                               else video_processor_from_image)(image_processor)
        return _IMAGE_ONLY[config.model_type](image_processor=image_processor, tokenizer=tokenizer,
                                              video_processor=video_processor)
    if config.model_type == "llava":
        vision = config.vision_config
        return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=vision.patch_size,
                              vision_feature_select_strategy=config.vision_feature_select_strategy,
                              image_token=tokenizer.convert_ids_to_tokens(config.image_token_id),
                              num_additional_image_tokens=1 if vision.model_type == "clip_vision_model" else 0)
    if config.model_type in FAMILY_TYPES:
        return family_processor(config, tokenizer, image_processor, video_processor)
    if config.model_type in MORE:
        return MORE[config.model_type].processor(config, tokenizer, image_processor)
    raise ValueError(f"model_type {config.model_type!r} has no processor; supported: {sorted(all_data())}")


def qwen2_5_vl_processor(tokenizer, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112, image_processor=None):
    """The Qwen2.5-VL processor (the bundled demo's), images and video frames resized to between ``min_pixels``
    and ``max_pixels``."""
    if image_processor is None:
        image_processor = Qwen2VLImageProcessorPil(size={"shortest_edge": min_pixels, "longest_edge": max_pixels})
    return _IMAGE_ONLY["qwen2_5_vl"](image_processor=image_processor, tokenizer=tokenizer,
                                     video_processor=video_processor_from_image(image_processor))
