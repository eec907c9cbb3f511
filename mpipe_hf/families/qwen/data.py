"""The data path of the Qwen group: each type's :class:`~mpipe_hf.data.family_data.FamilyData` (PIL image
processor, stock processor class, ChatML chat template, markers), and :func:`qwen2_5_vl_processor`, the demo's.

- ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``: the stock ``Qwen2VLProcessor`` / ``Qwen2_5_VLProcessor`` /
  ``Qwen3VLProcessor`` over ``Qwen2VLImageProcessorPil`` (14-px patches; Qwen3-VL 16-px), videos through the
  torchvision-free video processor (:mod:`mpipe_hf.data.video_processor`; Qwen3-VL's :mod:`.qwen3_video_processor`),
  ChatML with Qwen2's default system message (Qwen3-VL: none);
- ``qwen3_5``, ``qwen3_5_moe``, ``qwen3_vl_moe``: ``Qwen3VLProcessor`` in the tower's patch sizes, always ours;
- ``qwen2_5_omni_thinker``, ``qwen3_omni_moe_thinker``: ``Qwen2_5OmniProcessor`` / ``Qwen3OmniMoeProcessor`` over
  ``Qwen2VLImageProcessorPil`` and a ``WhisperFeatureExtractor`` (the processor requires one; audio is refused at
  load), no video processor, ChatML (Qwen2.5-Omni with its default system message, images between
  ``<|vision_bos|>``/``<|vision_eos|>``).
"""

from __future__ import annotations

from ...data.family_data import FamilyData
from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class
from ...data.templates import QWEN_VIDEO, chatml
from ...data.video_processor import video_processor_from_image
from .qwen3_video_processor import qwen3_video_processor_from_image

_VIDEO = "'" + QWEN_VIDEO + "'"
QWEN2_TEMPLATE = chatml("You are a helpful assistant.", video=_VIDEO)  # Qwen2-VL's, Qwen2.5-VL's (hub format)
QWEN3_TEMPLATE = chatml(None, video=_VIDEO)  # Qwen3-VL's: no default system message
STOCK = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor",
         "qwen3_5": "Qwen3VLProcessor", "qwen3_5_moe": "Qwen3VLProcessor", "qwen3_vl_moe": "Qwen3VLProcessor"}
QWEN3_LIKE = ("qwen3_vl", "qwen3_5", "qwen3_5_moe", "qwen3_vl_moe")  # Qwen3-VL's video processor
_FIXED_PATCH = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 16}  # set by type, not read from the config


def grid_image_processor(cls_name: str):
    """``image_processor(config, min_pixels, max_pixels)`` of the PIL class ``cls_name`` of :mod:`transformers`
    (Qwen2-VL's or one built like it), in the tower's patch, temporal patch (1 when it has none) and merge sizes,
    resizing to between ``min_pixels`` and ``max_pixels``."""
    def build(config, min_pixels: int, max_pixels: int):
        import transformers
        vision = config.vision_config
        return getattr(transformers, cls_name)(
            patch_size=vision.patch_size, temporal_patch_size=getattr(vision, "temporal_patch_size", 1),
            merge_size=vision.spatial_merge_size, size={"shortest_edge": min_pixels, "longest_edge": max_pixels})
    return build


def _fixed_patch_images(config, min_pixels: int, max_pixels: int):
    """``Qwen2VLImageProcessorPil`` in the type's patch (:data:`_FIXED_PATCH`), its default temporal patch and
    merge sizes, resizing to between ``min_pixels`` and ``max_pixels``."""
    from transformers import Qwen2VLImageProcessorPil
    return Qwen2VLImageProcessorPil(patch_size=_FIXED_PATCH[config.model_type],
                                    size={"shortest_edge": min_pixels, "longest_edge": max_pixels})


def _processor(model_type: str, own_video: bool):
    """``processor(config, tokenizer, image_processor, video_processor=None)``: the stock class of ``model_type``
    (:data:`STOCK`, without torchvision's video processor) over ``tokenizer`` (Qwen's markers are its own), with
    ``video_processor`` where ``own_video`` and one is given, else the one the image processor implies."""
    import transformers
    cls = conversation_class(getattr(transformers, STOCK[model_type]), model_type)
    derive = qwen3_video_processor_from_image if model_type in QWEN3_LIKE else video_processor_from_image

    def build(config, tokenizer, image_processor, video_processor=None):
        if video_processor is None or not own_video:
            video_processor = derive(image_processor)
        return cls(image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor)
    return build


def _snapshot_video(model_type: str):
    """``video_from_snapshot(image_processor, config, settings)``: the type's video processor with a snapshot's
    settings."""
    derive = qwen3_video_processor_from_image if model_type in QWEN3_LIKE else video_processor_from_image
    return lambda image_processor, config, settings: derive(image_processor, settings)


def _qwen(model_type: str) -> FamilyData:
    stock = model_type in _FIXED_PATCH  # a hub class of its own, loaded as the stock one where it can be
    return FamilyData(
        image_processor=_fixed_patch_images if stock else grid_image_processor("Qwen2VLImageProcessorPil"),
        processor=_processor(model_type, own_video=stock),
        template=QWEN2_TEMPLATE if model_type in ("qwen2_vl", "qwen2_5_vl") else QWEN3_TEMPLATE, repeated=True,
        pixel_bounded=True, videos=True, video_from_snapshot=_snapshot_video(model_type),
        snapshot_video_class="Qwen3VLVideoProcessor" if model_type == "qwen3_vl" else None, always_ours=not stock,
        stock_classes=(STOCK[model_type],) if stock else (), template_owner=True)


def _omni_processor(class_name: str, model_type: str):
    """``processor(config, tokenizer, image_processor)`` for a Qwen Omni thinker: the stock class without a video
    processor, with a 128-bin ``WhisperFeatureExtractor`` (its check requires one), over the named tokenizer."""
    def build(config, tokenizer, image_processor):
        import transformers
        cls = conversation_class(getattr(transformers, class_name), model_type)
        return cls(image_processor=image_processor, video_processor=None,
                   feature_extractor=transformers.WhisperFeatureExtractor(feature_size=128),
                   tokenizer=named_tokenizer(tokenizer, config))
    return build


_OMNI_IDS = {"image_token": "image_token_id", "video_token": "video_token_id", "audio_token": "audio_token_id",
             "vision_bos_token": "vision_start_token_id", "vision_eos_token": "vision_end_token_id",
             "audio_bos_token": "audio_start_token_id", "audio_eos_token": "audio_end_token_id"}


def _omni_tokens(image: str, video: str, audio: str, vision: tuple[str, str], audio_marks: tuple[str, str]) -> dict:
    """A thinker's markers (hub token, Qwen2 token in the same slot of the vocabulary: :func:`.tiny.thinker_ids`)."""
    return {"image_token": (image, "<|image_pad|>"), "video_token": (video, "<|video_pad|>"),
            "audio_token": (audio, "<|object_ref_start|>"), "vision_bos_token": (vision[0], "<|vision_start|>"),
            "vision_eos_token": (vision[1], "<|vision_end|>"),
            "audio_bos_token": (audio_marks[0], "<|object_ref_end|>"),
            "audio_eos_token": (audio_marks[1], "<|box_start|>")}


_OMNI_SYSTEM = ("You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
                "auditory and visual inputs, as well as generating text and speech.")

DATA: dict[str, FamilyData] = {t: _qwen(t) for t in STOCK}
DATA["qwen2_5_omni_thinker"] = FamilyData(
    grid_image_processor("Qwen2VLImageProcessorPil"),
    _omni_processor("Qwen2_5OmniProcessor", "qwen2_5_omni_thinker"),
    chatml(_OMNI_SYSTEM, "'<|vision_bos|>IMAGE_TOKEN<|vision_eos|>'"), hub_image_token="<|IMAGE|>",
    tokens=_omni_tokens("<|IMAGE|>", "<|VIDEO|>", "<|AUDIO|>", ("<|vision_bos|>", "<|vision_eos|>"),
                        ("<|audio_bos|>", "<|audio_eos|>")),
    config_ids=_OMNI_IDS, repeated=True, pixel_bounded=True)
DATA["qwen3_omni_moe_thinker"] = FamilyData(
    grid_image_processor("Qwen2VLImageProcessorPil"),
    _omni_processor("Qwen3OmniMoeProcessor", "qwen3_omni_moe_thinker"), chatml(None),
    hub_image_token="<|image_pad|>",
    tokens=_omni_tokens("<|image_pad|>", "<|video_pad|>", "<|audio_pad|>", ("<|vision_start|>", "<|vision_end|>"),
                        ("<|audio_start|>", "<|audio_end|>")),
    config_ids=_OMNI_IDS, repeated=True, pixel_bounded=True)


def qwen2_5_vl_processor(tokenizer, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112, image_processor=None):
    """The Qwen2.5-VL processor (the bundled demo's) over ``tokenizer``, images and video frames resized to between
    ``min_pixels`` and ``max_pixels`` (``image_processor``: that one instead)."""
    if image_processor is None:
        from transformers import Qwen2VLImageProcessorPil
        image_processor = Qwen2VLImageProcessorPil(size={"shortest_edge": min_pixels, "longest_edge": max_pixels})
    return DATA["qwen2_5_vl"].processor(None, tokenizer, image_processor)
