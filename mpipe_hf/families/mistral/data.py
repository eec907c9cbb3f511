"""The data path of the Mistral group (:class:`~mpipe_hf.data.family_data.FamilyData` each): Pixtral's PIL image
processor (aspect ratio kept, the longest edge the tower's side), the processor over the tokenizer with the
family's markers named, and the chat template.

Mistral 3's processor is Pixtral's, whose module imports torchvision: where torchvision is installed it is the
stock ``PixtralProcessor``, else :class:`~.pixtral_processor.PilPixtralProcessor`, which expands images as it
does. LightOnOCR's is the stock ``LightOnOcrProcessor``. ``mistral4`` is a decoder-only LM: no data path here.

The templates: Mistral-Small-3.1's ``<s>[INST]...[/INST]answer</s>`` for Mistral 3 (no generation prompt: the
answer follows ``[/INST]``); ChatML for LightOnOCR, each image its placeholder alone.
"""

from __future__ import annotations

from transformers import LightOnOcrProcessor
from transformers.utils import is_torchvision_available

from ...data.family_data import FamilyData
from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class, tower_patch, tower_side
from ...data.templates import BOS, chatml, image_part
from .pixtral_processor import PilPixtralProcessor


def pixtral_images(config, min_pixels: int, max_pixels: int):
    """Pixtral's PIL image processor: the aspect ratio kept, the longest edge the tower's side, in multiples of
    its patch (``min_pixels``/``max_pixels`` unused: not pixel-bounded)."""
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil
    patch = tower_patch(config)
    return PixtralImageProcessorPil(size={"longest_edge": tower_side(config)},
                                    patch_size={"height": patch, "width": patch})


def mistral3_class() -> type:
    """Mistral 3's processor class: the stock ``PixtralProcessor`` where torchvision is installed (its module
    imports it), else :class:`~.pixtral_processor.PilPixtralProcessor`."""
    if is_torchvision_available():
        from transformers import PixtralProcessor
        return conversation_class(PixtralProcessor, "mistral3")
    return conversation_class(PilPixtralProcessor, "mistral3")


def mistral3_processor(config, tokenizer, image_processor):
    """Mistral 3's processor (:func:`mistral3_class`) over :func:`~mpipe_hf.data.markers.named_tokenizer`'s copy
    of ``tokenizer``, with the config's patch and merge sizes and the named ``[IMG]``/``[IMG_BREAK]``/``[IMG_END]``.

    Raises:
        ValueError: a marker has no token in the vocabulary.
    """
    tok = named_tokenizer(tokenizer, config)
    return mistral3_class()(image_processor, tok, patch_size=tower_patch(config),
                            spatial_merge_size=config.spatial_merge_size, image_token=tok.image_token,
                            image_break_token=tok.image_break_token, image_end_token=tok.image_end_token)


def lighton_processor(config, tokenizer, image_processor):
    """LightOnOCR's stock processor over the named tokenizer, with the config's patch and merge sizes."""
    return conversation_class(LightOnOcrProcessor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), patch_size=tower_patch(config),
        spatial_merge_size=config.spatial_merge_size)


# Mistral 3 (Mistral-Small-3.1 v7 format, no default system prompt here): <s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT]
# [INST]...[/INST]answer</s>, images [IMG]. [INST] and the others are control tokens of Mistral's tokenizer and
# plain text in a vocabulary without them (the Qwen2 one).
MISTRAL3_TEMPLATE = (BOS +
                     "{%- for message in messages -%}"
                     "{%- if message['role'] == 'system' -%}{{- '[SYSTEM_PROMPT]' -}}" + image_part("'IMAGE_TOKEN'") +
                     "{{- '[/SYSTEM_PROMPT]' -}}"
                     "{%- elif message['role'] == 'user' -%}{{- '[INST]' -}}" + image_part("'IMAGE_TOKEN'") +
                     "{{- '[/INST]' -}}"
                     "{%- else -%}" + image_part("'IMAGE_TOKEN'") + "{{- eos_token -}}{%- endif -%}"
                     "{%- endfor -%}")

DATA: dict[str, FamilyData] = {
    "mistral3": FamilyData(pixtral_images, mistral3_processor, MISTRAL3_TEMPLATE, "[IMG]", tokens={
        "image_token": ("[IMG]", "<|image_pad|>"), "image_break_token": ("[IMG_BREAK]", "<|vision_pad|>"),
        "image_end_token": ("[IMG_END]", "<|vision_end|>")}, config_ids={"image_token": "image_token_index"},
        always_ours=True, template_owner=True),
    "lighton_ocr": FamilyData(pixtral_images, lighton_processor, chatml(None, "'IMAGE_TOKEN'"), "<|image_pad|>",
                              tokens={"image_token": ("<|image_pad|>", "<|image_pad|>"),
                                      "image_break_token": ("<|vision_pad|>", "<|vision_pad|>"),
                                      "image_end_token": ("<|vision_end|>", "<|vision_end|>")},
                              config_ids={"image_token": "image_token_id"}),
}
"""``model_type`` -> its data path."""
