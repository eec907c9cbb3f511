"""The processors of the LLaVA group's families whose stock image processor has a PIL twin: the stock processor
class (through :func:`~mpipe_hf.data.stock_classes.conversation_class`, which accepts ``video_processor=None`` and
saves what a hub snapshot holds) over the PIL image processor and over
:func:`~mpipe_hf.data.markers.named_tokenizer`'s copy of the tokenizer, with the family's arguments from the
config (tokens per image or tile, patch sizes, feature strategy) as the hub checkpoints' ``processor_config.json``
holds them. ``<type>_images(config, min_pixels, max_pixels)`` builds the image processor,
``<type>(config, tokenizer, image_processor)`` the processor.

LLaVA's is the plain ``LlavaProcessor`` over the tokenizer as given, its image token the config's.
LLaVA-OneVision's takes videos through the torchvision-free :mod:`.video_processor_onevision`.
"""

from __future__ import annotations

from transformers import (AriaProcessor, AyaVisionProcessor, LlavaNextProcessor, LlavaNextVideoProcessor,
                          LlavaOnevisionProcessor, LlavaProcessor, VideoLlavaProcessor)

from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class, tower_patch, tower_side


def _square(config) -> dict:
    return {"height": tower_side(config), "width": tower_side(config)}


def clip_images(config, min_pixels: int, max_pixels: int):
    """LLaVA, VipLLaVA: resized (shortest edge) and centre-cropped to the tower's side."""
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    return CLIPImageProcessorPil(size={"shortest_edge": tower_side(config)}, crop_size=_square(config))


def llava(config, tokenizer, image_processor):
    """LLaVA's ``LlavaProcessor``: its patch size, feature strategy and image token from ``config`` (one extra
    position for a CLIP tower's CLS token)."""
    vision = config.vision_config
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=vision.patch_size,
                          vision_feature_select_strategy=config.vision_feature_select_strategy,
                          image_token=tokenizer.convert_ids_to_tokens(config.image_token_id),
                          num_additional_image_tokens=1 if vision.model_type == "clip_vision_model" else 0)


def vipllava(config, tokenizer, image_processor):
    """VipLLaVA's processor (the hub's ``LlavaProcessor``): ``image_seq_length`` tokens an image, CLS dropped."""
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(LlavaProcessor, config.model_type)(
        image_processor, tok, patch_size=tower_patch(config), vision_feature_select_strategy="default",
        image_token=tok.image_token, num_additional_image_tokens=1)


def anyres_images(config, min_pixels: int, max_pixels: int):
    """LLaVA-NeXT(-Video): "anyres" grids of ``config.image_grid_pinpoints`` of tower-side crops."""
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil
    return LlavaNextImageProcessorPil(size={"shortest_edge": tower_side(config)}, crop_size=_square(config),
                                      image_grid_pinpoints=config.image_grid_pinpoints)


def llava_next(config, tokenizer, image_processor):
    """LLaVA-NeXT's ``LlavaNextProcessor``: anyres images, one extra position for a CLIP tower's CLS token."""
    tok = named_tokenizer(tokenizer, config)
    cls_token = config.vision_config.model_type == "clip_vision_model"
    return conversation_class(LlavaNextProcessor, "llava_next")(
        image_processor, tok, patch_size=tower_patch(config), image_token=tok.image_token,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
        num_additional_image_tokens=1 if cls_token else 0)


def llava_next_video(config, tokenizer, image_processor):
    """LLaVA-NeXT-Video's processor without a video processor (its videos are refused at load), CLS dropped."""
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(LlavaNextVideoProcessor, config.model_type)(
        None, image_processor, tok, patch_size=tower_patch(config), image_token=tok.image_token,
        video_token=tok.video_token, vision_feature_select_strategy=config.vision_feature_select_strategy,
        num_additional_image_tokens=1)


def onevision_images(config, min_pixels: int, max_pixels: int):
    """LLaVA-OneVision: tower-side crops in "anyres" grids of ``config.image_grid_pinpoints``."""
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import \
        LlavaOnevisionImageProcessorPil
    return LlavaOnevisionImageProcessorPil(size=_square(config), image_grid_pinpoints=config.image_grid_pinpoints)


def llava_onevision(config, tokenizer, image_processor, video_processor=None):
    """LLaVA-OneVision's processor, its videos through the torchvision-free
    :func:`~.video_processor_onevision.onevision_video_processor` of ``config`` (docs/video.md), whatever
    ``video_processor`` is given."""
    from .video_processor_onevision import onevision_video_processor
    tok = named_tokenizer(tokenizer, config)
    tiles = (tower_side(config) // tower_patch(config)) ** 2
    return conversation_class(LlavaOnevisionProcessor, "llava_onevision")(
        image_processor, tok, onevision_video_processor(config), num_image_tokens=tiles, image_token=tok.image_token,
        video_token=tok.video_token, vision_aspect_ratio=config.vision_aspect_ratio,
        vision_feature_select_strategy=config.vision_feature_select_strategy)


def video_llava_images(config, min_pixels: int, max_pixels: int):
    """Video-LLaVA: resized (shortest edge) and centre-cropped to the tower's side (its only image processor)."""
    from transformers.models.video_llava.image_processing_video_llava import VideoLlavaImageProcessor
    return VideoLlavaImageProcessor(size={"shortest_edge": tower_side(config)}, crop_size=_square(config))


class _VideoLlavaImages(VideoLlavaProcessor):
    """Video-LLaVA's processor with its images under the name its model's ``forward`` and
    ``get_image_features`` take (``pixel_values``; the stock call writes ``pixel_values_images``, which the model
    accepts as a deprecated alias)."""

    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        if "pixel_values_images" in out:
            out["pixel_values"] = out.pop("pixel_values_images")
        return out


def video_llava(config, tokenizer, image_processor):
    """Video-LLaVA's processor without a video processor (its videos are refused at load)."""
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(_VideoLlavaImages, config.model_type)(
        image_processor, None, tok, patch_size=tower_patch(config), image_token=tok.image_token,
        video_token=tok.video_token, vision_feature_select_strategy=config.vision_feature_select_strategy)


def tiles(config, min_pixels: int, max_pixels: int, max_patches: int = 4):
    """Aya Vision: GOT-OCR2's tiling, up to ``max_patches`` tower-side tiles and a thumbnail."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
    return GotOcr2ImageProcessorPil(size=_square(config), crop_to_patches=True, min_patches=1,
                                    max_patches=max_patches)


def aya_vision(config, tokenizer, image_processor):
    """Aya Vision's processor: each tile's pixel-shuffled patches between the markers the tokenizer names."""
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(AyaVisionProcessor, config.model_type)(
        image_processor, tok, patch_size=tower_patch(config), img_size=tower_side(config),
        downsample_factor=config.downsample_factor, image_token="<image>", start_of_img_token=tok.start_of_img_token,
        end_of_img_token=tok.end_of_img_token, img_patch_token=tok.image_token,
        img_line_break_token=tok.img_line_break_token)


def aria_images(config, min_pixels: int, max_pixels: int):
    """Aria: one crop of the tower's side an image (no splitting), at least half that side."""
    from transformers.models.aria.image_processing_pil_aria import AriaImageProcessorPil
    side = tower_side(config)
    return AriaImageProcessorPil(max_image_size=side, min_image_size=side // 2, split_image=False)


class _AriaProcessor(AriaProcessor):
    """Aria's processor with the crop side its image processor sets (``max_image_size``; the stock class pins the
    hub's 980 px in its call defaults)."""

    images_kwargs = {"split_image": False}


def aria(config, tokenizer, image_processor):
    """Aria's processor: the projector's queries a crop for the tower's side (``size_conversion``)."""
    queries = {tower_side(config): q for q in config.projector_patch_to_query_dict.values()}
    return conversation_class(_AriaProcessor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), size_conversion=queries)
