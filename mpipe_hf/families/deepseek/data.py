"""The data path of the DeepSeek group (:class:`~mpipe_hf.data.family_data.FamilyData` each): each family's PIL
image processor (tower-side squares; the hybrid's high-resolution copy; DeepSeek-OCR-2's global view and tiles),
its stock processor over the tokenizer with the family's markers named, and the chat template.

The templates follow the hub formats: DeepSeek-VL's and Janus's ``User: <image_placeholder>...\\n\\nAssistant:
...``; DeepSeek-OCR-2 has no hub template (its examples prompt ``<image>\\nFree OCR.``), so the format of its
DeepSeek-VL2 lineage serves: ``<|User|>: <image>\\n...\\n\\n<|Assistant|>: answer`` and the eos, written where
the hub writes nothing after an answer so that the encoder labels the turn's end.
"""

from __future__ import annotations

from transformers import DeepseekOcr2Processor, DeepseekVLHybridProcessor, DeepseekVLProcessor, JanusProcessor

from ...data.family_data import FamilyData
from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class, tower_patch, tower_side
from ...data.templates import BOS, roles


def _square(config) -> dict:
    return {"height": tower_side(config), "width": tower_side(config)}


def deepseek_images(config, min_pixels: int, max_pixels: int):
    """DeepSeek-VL's PIL image processor: a tower-side square (``min_pixels``/``max_pixels`` unused)."""
    from transformers.models.deepseek_vl.image_processing_pil_deepseek_vl import DeepseekVLImageProcessorPil
    return DeepseekVLImageProcessorPil(size=_square(config))


def deepseek_processor(config, tokenizer, image_processor):
    """DeepSeek-VL's stock processor over the named tokenizer, the tower's patches an image (one token each)."""
    return conversation_class(DeepseekVLProcessor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config),
        num_image_tokens=(tower_side(config) // tower_patch(config)) ** 2)


def hybrid_images(config, min_pixels: int, max_pixels: int):
    """The hybrid's PIL image processor: a tower-side square and a copy at the high-resolution tower's side."""
    from transformers.models.deepseek_vl_hybrid.image_processing_pil_deepseek_vl_hybrid import \
        DeepseekVLHybridImageProcessorPil
    side = config.high_res_vision_config.image_size
    return DeepseekVLHybridImageProcessorPil(size=_square(config), high_res_size={"height": side, "width": side})


def hybrid_processor(config, tokenizer, image_processor):
    """The hybrid's stock processor over the named tokenizer, the low-resolution tower's patches an image."""
    return conversation_class(DeepseekVLHybridProcessor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config),
        num_image_tokens=(tower_side(config) // tower_patch(config)) ** 2)


def janus_images(config, min_pixels: int, max_pixels: int):
    """Janus's PIL image processor: a tower-side square (``min_pixels``/``max_pixels`` unused)."""
    from transformers.models.janus.image_processing_pil_janus import JanusImageProcessorPil
    return JanusImageProcessorPil(size=_square(config))


class _JanusProcessor(JanusProcessor):
    """Janus's processor with ``image_token_id`` (the id of its image token, which the stock one does not set)."""

    def __init__(self, image_processor, tokenizer, **kwargs):
        super().__init__(image_processor, tokenizer, **kwargs)
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)


def janus_processor(config, tokenizer, image_processor):
    """Janus's processor over the named tokenizer, the tower's ``num_image_tokens`` an image."""
    return conversation_class(_JanusProcessor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), num_image_tokens=config.vision_config.num_image_tokens)


def ocr2_images(config, min_pixels: int, max_pixels: int):
    """DeepSeek-OCR-2's global view (padded square, the SAM tower's side) and, for an image larger than a tile, its
    2 to 6 tiles of 3/4 of that side (the hub's 768 px of 1,024)."""
    from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import DeepseekOcr2ImageProcessorPil
    side = config.vision_config.sam_config.image_size
    return DeepseekOcr2ImageProcessorPil(size={"height": side, "width": side}, tile_size=side * 3 // 4)


def ocr2_processor(config, tokenizer, image_processor):
    """DeepSeek-OCR-2's stock processor over the named tokenizer, with the SAM patch and the tower's 4 x
    downsampling (its two stride-2 convolutions)."""
    return conversation_class(DeepseekOcr2Processor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), patch_size=config.vision_config.sam_config.patch_size,
        downsample_ratio=4)


# DeepSeek-VL (deepseek-vl-*-chat-hf), Janus: "User: <image_placeholder>...\n\nAssistant: answer<｜end▁of▁sentence｜>".
DEEPSEEK_VL_TEMPLATE = roles("'User: '", "'Assistant: '", "''", "'\\n\\n'", "eos_token + '\\n\\n'", "'IMAGE_TOKEN'",
                             "'Assistant:'", BOS)
# DeepSeek-OCR-2 (DeepSeek-VL2's "deepseek" format): "<|User|>: <image>\n...\n\n<|Assistant|>: answer<eos>";
# <|User|> and <|Assistant|> plain text in the Qwen2 vocabulary.
DEEPSEEK_VL2_TEMPLATE = roles("'<|User|>: '", "'<|Assistant|>: '", "''", "'\\n\\n'", "eos_token", "'IMAGE_TOKEN\\n'",
                              "'<|Assistant|>:'", BOS)

PLACEHOLDER = {"image_token": ("<image_placeholder>", "<|image_pad|>")}
CONFIG_IDS = {"image_token": "image_token_id"}

DATA: dict[str, FamilyData] = {
    "deepseek_vl": FamilyData(deepseek_images, deepseek_processor, DEEPSEEK_VL_TEMPLATE, "<image_placeholder>",
                              tokens=PLACEHOLDER, config_ids=CONFIG_IDS, repeated=True),
    "deepseek_vl_hybrid": FamilyData(hybrid_images, hybrid_processor, DEEPSEEK_VL_TEMPLATE, "<image_placeholder>",
                                     tokens=PLACEHOLDER, config_ids=CONFIG_IDS, repeated=True),
    "janus": FamilyData(janus_images, janus_processor, DEEPSEEK_VL_TEMPLATE, "<image_placeholder>", tokens={
        **PLACEHOLDER, "boi_token": ("<begin_of_image>", "<|vision_start|>"),
        "eoi_token": ("<end_of_image>", "<|vision_end|>")}, config_ids=CONFIG_IDS),
    "deepseek_ocr2": FamilyData(ocr2_images, ocr2_processor, DEEPSEEK_VL2_TEMPLATE,
                                tokens={"image_token": ("<image>", "<|image_pad|>")}, config_ids=CONFIG_IDS,
                                repeated=True),
}
"""``model_type`` -> its data path."""
