"""The stock processor of a vision-language family that mpipe_hf has no processor of: the timm-tower families
(FastVLM, Perception-LM, Gemma 3n), whose towers need torchvision and timm anyway. Every family whose stock image
processor exists in ``transformers`` only with a torchvision backend has a torchvision-free one in its family's
package (``FamilyData.no_torchvision_images``: Llama 4, LFM2-VL, Cohere2-Vision, Molmo2, Step3p7 and MiniMax-M3-VL
in ``families/llava``; Kimi K2.5 and MiniCPM-OCR in ``families/qwen_like``; Unlimited-OCR in ``families/ocr``;
Gemma 4 Unified, Muse Glimmer and Muse Spark in ``families/gemma``; Inkling and Nemotron-H Omni in theirs).

Training uses the checkpoint's own processor (``AutoProcessor`` over the checkpoint's files, with its chat
template); where its stock image processor needs torchvision and torchvision does not import, or there is no
checkpoint, :func:`processor_problem` says so before any process starts (``mpipe-hf check`` and ``train``),
naming the fix."""

from __future__ import annotations


def stock_image_backends(model_type: str) -> dict:
    """``{backend: class name}`` of the family's stock image processor (``{}`` where it has none)."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type) or {}
    return dict(names) if isinstance(names, dict) else {}


def _has_vision_tower(model_type: str) -> bool:
    """Whether transformers' default config of ``model_type`` has a vision tower (``vision_config``)."""
    from transformers import AutoConfig
    try:
        return getattr(AutoConfig.for_model(model_type), "vision_config", None) is not None
    except (KeyError, ValueError, ImportError, TypeError):
        return False


def checkpoint_image_processor(model_type: str, directory: str, **settings):
    """A checkpoint's image processor, ``settings`` over its own: ``AutoImageProcessor``'s, except where torchvision
    does not import for a family whose stock image processor needs it (``FamilyData.no_torchvision_images``: ours
    over the same settings)."""
    from transformers import AutoImageProcessor
    from transformers.utils import is_torchvision_available

    from ..families.registry import family_data
    declared = None if is_torchvision_available() else family_data(model_type)
    own = declared.no_torchvision_images if declared is not None else None
    return (own or AutoImageProcessor).from_pretrained(directory, **settings)


def needs_stock_processor(model_type: str) -> bool:
    """Whether the family has no processor here (:func:`~mpipe_hf.families.registry.family_data`) but one in transformers: a
    stock image processor, or a vision tower whose checkpoint names its processor (FastVLM's and Gemma 3n's, whose
    timm towers need torchvision anyway; Perception-LM's, torchvision only)."""
    from ..families.registry import family_data
    if family_data(model_type) is not None:
        return False
    return bool(stock_image_backends(model_type)) or _has_vision_tower(model_type)


def processor_problem(model_type: str, checkpoint: str | None) -> str | None:
    """What stops the data path of ``model_type`` (a vision-language family) from building micro-batches, with
    the fix, or ``None``: torchvision missing for a family that needs the stock processor, or no checkpoint to
    take that processor's settings and chat template from (``checkpoint``: ``model.name_or_path``)."""
    if not needs_stock_processor(model_type):
        return None
    from transformers.utils import is_torchvision_available
    backends = stock_image_backends(model_type)
    name = backends.get("torchvision") or next(iter(backends.values()), "the one its files name")
    if set(backends) == {"torchvision"} and not is_torchvision_available():
        return (f"model_type {model_type!r}: its stock image processor ({name}) exists in transformers only with "
                f"torchvision, which does not import here, and mpipe_hf has no torchvision-free one for it; "
                f"install torchvision (pip install torchvision, the release paired with your torch)")
    if checkpoint is None:
        return (f"model_type {model_type!r}: training uses the checkpoint's own processor ({name} with its "
                f"settings and chat template); set model.name_or_path to a checkpoint that has its processor files")
    return None


def stock_processor(model_type: str, checkpoint: str | None, tokenizer_dir: str | None = None, **settings):
    """The checkpoint's own processor (``AutoProcessor``: the stock classes, its chat template) for a family of
    ``model_type``, ``settings`` over its own (e.g. the recipe's pixel bounds), with the tokenizer of
    ``tokenizer_dir`` where given (the recipe's ``model.tokenizer``; its chat template wins where it has one).

    Raises:
        ValueError: :func:`processor_problem`'s reason, where there is one (no torchvision, or no checkpoint).
    """
    from transformers import AutoProcessor, AutoTokenizer
    problem = processor_problem(model_type, checkpoint)
    if problem:
        raise ValueError(problem)
    tokenizer = None if tokenizer_dir is None else AutoTokenizer.from_pretrained(tokenizer_dir)
    if tokenizer is not None:
        settings["tokenizer"] = tokenizer
    processor = AutoProcessor.from_pretrained(checkpoint, **settings)
    if tokenizer is not None and tokenizer.chat_template:
        processor.chat_template = tokenizer.chat_template
    return processor
