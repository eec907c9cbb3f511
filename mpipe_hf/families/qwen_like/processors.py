"""The Qwen-like group's image processors and processors, each set from the tiny (or hub) config as the hub
checkpoints set theirs: ``image_processor(config, min_pixels, max_pixels)`` -> the PIL (or torch-operation)
image processor, ``processor(config, tokenizer, image_processor)`` -> the stock processor class made ready for
conversations (:func:`~mpipe_hf.data.stock_classes.conversation_class`) over the tokenizer with the family's markers
named (:func:`~mpipe_hf.data.markers.named_tokenizer`). None takes videos here."""

from __future__ import annotations

from transformers import Cosmos3EdgeProcessor, HunYuanVLProcessor, Kimi_K25Processor
from transformers.processing_utils import ProcessorMixin

from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class, tower_patch
from .image_processor_kimi_k25 import KimiK25ImageProcessorNoTV
from .image_processor_minicpm_ocr import MiniCPMOcrImageProcessorNoTV


def image_only(base: type, model_type: str, video: bool = True):
    """``processor(config, tokenizer, image_processor)``: ``base`` (``video``: without its video processor,
    :func:`~mpipe_hf.data.stock_classes.conversation_class`) over the tokenizer with the family's markers named."""
    cls = conversation_class(base, model_type)

    def build(config, tokenizer, image_processor):
        kwargs = {"video_processor": None} if video else {}
        return cls(image_processor=image_processor, tokenizer=named_tokenizer(tokenizer, config), **kwargs)
    return build


class Cosmos3EdgeWithTypesProcessor(Cosmos3EdgeProcessor):
    """``Cosmos3EdgeProcessor`` returning ``mm_token_type_ids``, which ``Cosmos3EdgeModel`` requires with images
    (its ``get_rope_index`` reads them) and the stock class lists in ``model_input_names`` but does not return
    (it leaves ``return_mm_token_type_ids`` off, unlike Qwen-VL's and GLM's processors)."""

    return_mm_token_type_ids = True



def video_llama_3_images(config, min_pixels: int, max_pixels: int):
    """``VideoLlama3ImageProcessorPil`` in the tower's patches, merged 2 x 2 (what the projector takes)."""
    from transformers import VideoLlama3ImageProcessorPil
    return VideoLlama3ImageProcessorPil(patch_size=config.vision_config.patch_size, merge_size=2,
                                        size={"shortest_edge": min_pixels, "longest_edge": max_pixels})


def images_alone(base: type) -> type:
    """``base`` (``MiniCPMV4_6Processor``, its 4.7 subclass, or ``MiniCPMOcrProcessor``) for images alone: the stock
    ``__init__`` reads its video processor's slicing settings (and that processor needs torchvision); here the
    video settings are left unset and images are processed exactly as by the stock class. The markers come from the
    tokenizer's names (:func:`~mpipe_hf.data.markers.named_tokenizer`)."""
    def __init__(self, image_processor=None, tokenizer=None, video_processor=None, chat_template=None, **kwargs):
        ProcessorMixin.__init__(self, image_processor, tokenizer, None, chat_template=chat_template)
        self.slice_mode, self.video_slice_mode = image_processor.slice_mode, None
        self.default_use_image_id = image_processor.use_image_id
        self.image_token_divisor = 4 if image_processor.downsample_mode == "4x" else 16
        for name in ("image_token", "video_token", "image_start_token", "image_end_token", "slice_start_token",
                     "slice_end_token", "image_id_start_token", "image_id_end_token"):
            setattr(self, name, getattr(tokenizer, name))
        self.image_token_id, self.video_token_id = tokenizer.image_token_id, tokenizer.video_token_id
    return type(f"_Image{base.__name__}", (base,), {"__init__": __init__})


def minicpm_images(config, min_pixels: int, max_pixels: int):
    """``MiniCPMV4_6ImageProcessorPil`` at the tower's side (``config.image_size``) in its patches, up to 4
    slices."""
    from transformers import MiniCPMV4_6ImageProcessorPil
    return MiniCPMV4_6ImageProcessorPil(scale_resolution=config.image_size, max_slice_nums=4,
                                        patch_size=config.vision_config.patch_size)


def minicpm_ocr_images(config, min_pixels: int, max_pixels: int):
    """MiniCPM-OCR's torch-operation image processor: an overview of ``vision_config.image_size`` px in the
    tower's patches, up to 4 slices (as MiniCPM-V 4.6's), in the config's downsample mode."""
    return MiniCPMOcrImageProcessorNoTV(scale_resolution=config.vision_config.image_size, max_slice_nums=4,
                                        patch_size=tower_patch(config), downsample_mode=config.downsample_mode)


def hunyuan_processor(config, tokenizer, image_processor):
    """``HunYuanVLProcessor`` (no video processor) over the named tokenizer."""
    cls = conversation_class(HunYuanVLProcessor, "hunyuan_vl")
    return cls(image_processor=image_processor, tokenizer=named_tokenizer(tokenizer, config))


def hunyuan_images(config, min_pixels: int, max_pixels: int):
    """``HunYuanVLImageProcessorPil`` in the tower's patch and merge sizes, between ``min_pixels`` and
    ``max_pixels`` px."""
    from transformers import HunYuanVLImageProcessorPil
    vision = config.vision_config
    return HunYuanVLImageProcessorPil(patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
                                      size={"shortest_edge": min_pixels, "longest_edge": max_pixels})


def kimi_images(config, min_pixels: int, max_pixels: int):
    """Kimi K2.5's torch-operation image processor: the tower's patches merged by its kernel, at most
    ``max_pixels`` px of patches (Kimi shrinks a larger image and never grows a smaller one)."""
    patch = tower_patch(config)
    return KimiK25ImageProcessorNoTV(patch_size=patch, merge_size=config.vision_config.merge_kernel_size[0],
                                     max_patches=max(1, max_pixels // patch ** 2))


def kimi_processor(config, tokenizer, image_processor):
    """``Kimi_K25Processor`` without its video processor over the named tokenizer."""
    return conversation_class(Kimi_K25Processor, config.model_type)(
        image_processor=image_processor, tokenizer=named_tokenizer(tokenizer, config), video_processor=None)
