"""The data path of the InternVL group (:class:`~mpipe_hf.data.family_data.FamilyData` each): GOT-OCR2's PIL image
processor tiling an image into up to 12 (InternVL) or 4 (Qianfan-OCR) tower-side tiles and a thumbnail, the stock
processor over the tokenizer with ``<IMG_CONTEXT>``, ``<img>`` and ``</img>`` named, and ChatML with an image as
``<IMG_CONTEXT>\\n`` (InternVL3-hf), which the processor expands to ``<img><IMG_CONTEXT>...</img>``. InternVL's
stock processor holds a video processor; none is given here (``video_processor`` is ignored).
"""

from __future__ import annotations

from transformers import InternVLProcessor, QianfanOCRProcessor

from ...data.family_data import FamilyData
from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class, tower_side
from ...data.templates import chatml


def _got_tiles(config, max_patches: int):
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
    side = tower_side(config)
    return GotOcr2ImageProcessorPil(size={"height": side, "width": side}, crop_to_patches=True, min_patches=1,
                                    max_patches=max_patches)


def internvl_images(config, min_pixels: int, max_pixels: int):
    """InternVL's tiling: up to 12 tower-side tiles and a thumbnail (``min_pixels``/``max_pixels`` unused)."""
    return _got_tiles(config, 12)


def qianfan_images(config, min_pixels: int, max_pixels: int):
    """Qianfan-OCR's tiling: up to 4 tower-side tiles and a thumbnail (``min_pixels``/``max_pixels`` unused)."""
    return _got_tiles(config, 4)


def internvl_processor(config, tokenizer, image_processor, video_processor=None):
    """InternVL's stock processor over the named tokenizer, ``image_seq_length`` tokens a tile; no video
    processor (``video_processor`` ignored).

    Raises:
        ValueError: a marker has no token in the vocabulary.
    """
    return conversation_class(InternVLProcessor, "internvl")(
        image_processor, named_tokenizer(tokenizer, config), None, image_seq_length=config.image_seq_length)


def qianfan_processor(config, tokenizer, image_processor):
    """Qianfan-OCR's stock processor over the named tokenizer, ``image_seq_length`` tokens a tile."""
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(QianfanOCRProcessor, config.model_type)(
        image_processor, tok, image_seq_length=config.image_seq_length,
        image_placeholder_token=tok.context_image_token)


TEMPLATE = chatml(None, "'IMAGE_TOKEN\\n'")
TOKENS = {"context_image_token": ("<IMG_CONTEXT>", "<|image_pad|>"), "start_image_token": ("<img>", "<|vision_start|>"),
          "end_image_token": ("</img>", "<|vision_end|>")}
CONFIG_IDS = {"context_image_token": "image_token_id"}

DATA: dict[str, FamilyData] = {
    "internvl": FamilyData(internvl_images, internvl_processor, TEMPLATE, "<IMG_CONTEXT>",
                           tokens={**TOKENS, "video_token": ("<video>", "<|video_pad|>")}, config_ids=CONFIG_IDS,
                           videos=True, always_ours=True, template_owner=True),
    "qianfan_ocr": FamilyData(qianfan_images, qianfan_processor, TEMPLATE, "<IMG_CONTEXT>", tokens=TOKENS,
                              config_ids=CONFIG_IDS),
}
"""``model_type`` -> its data path."""
