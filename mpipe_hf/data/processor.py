"""The Qwen2.5-VL processor, built from a tokenizer and the PIL image processor (no torchvision needed)."""

from __future__ import annotations

from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil


class ImageOnlyQwen2_5_VLProcessor(Qwen2_5_VLProcessor):
    """``Qwen2_5_VLProcessor`` without a video processor. The stock class check rejects ``video_processor=None``
    when torchvision is absent; images and text are processed exactly as by the stock class."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and argument is None:
            return type(None)
        return super().check_argument_for_proper_class(argument_name, argument)


def qwen2_5_vl_processor(tokenizer, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112,
                         image_processor=None) -> ImageOnlyQwen2_5_VLProcessor:
    """A processor whose images are resized to between ``min_pixels`` and ``max_pixels`` (keeping aspect ratio,
    multiples of 28 px), so image-token counts vary with the photo."""
    if image_processor is None:
        image_processor = Qwen2VLImageProcessorPil(size={"shortest_edge": min_pixels, "longest_edge": max_pixels})
    return ImageOnlyQwen2_5_VLProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=None)
