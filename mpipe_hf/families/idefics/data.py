"""The data path of the Idefics group (:class:`~mpipe_hf.data.family_data.FamilyData` each): the PIL image
processors (Idefics3 / SmolVLM: up to 4 x 4 tower-side tiles and a global image; Idefics2: the aspect ratio kept,
padded with a pixel mask), the processors of :mod:`.processors` over the tokenizer with the family's markers
named, and the chat template ``User:<image>...<end_of_utterance>\\nAssistant: ...<end_of_utterance>\\n`` (its
start: Idefics3's BOS, SmolVLM's ``<|im_start|>``, none for Idefics2, whose Mistral tokenizer writes it).
SmolVLM's processor takes no video processor here (``video_processor`` is ignored).
"""

from __future__ import annotations

from ...data.family_data import FamilyData
from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class, tower_patch, tower_side
from ...data.templates import BOS, GENERATION, image_part
from .processors import _ConversationIdefics2Processor, _NamedIdefics3Processor, _SmolVLMProcessor


def tiled_images(config, min_pixels: int, max_pixels: int):
    """Idefics3's / SmolVLM's PIL image processor: up to 4 x 4 tower-side tiles and a global image
    (``min_pixels``/``max_pixels`` unused: not pixel-bounded)."""
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil
    cls = Idefics3ImageProcessorPil if config.model_type == "idefics3" else SmolVLMImageProcessorPil
    side = tower_side(config)
    return cls(size={"longest_edge": 4 * side}, max_image_size={"longest_edge": side})


def _tile_tokens(config) -> int:
    """Tokens a tile: the tower's patch grid over the connector's pixel shuffle (``scale_factor`` each side)."""
    return int((tower_side(config) // tower_patch(config)) ** 2 / config.scale_factor ** 2)


def idefics3_processor(config, tokenizer, image_processor):
    """Idefics3's processor over the named tokenizer, ``image_seq_len`` tokens a tile."""
    return conversation_class(_NamedIdefics3Processor, "idefics3")(
        image_processor, named_tokenizer(tokenizer, config), image_seq_len=_tile_tokens(config))


def smolvlm_processor(config, tokenizer, image_processor, video_processor=None):
    """SmolVLM's processor over the named tokenizer, ``image_seq_len`` tokens a tile; no video processor
    (``video_processor`` ignored)."""
    return conversation_class(_SmolVLMProcessor, "smolvlm")(
        image_processor, named_tokenizer(tokenizer, config), None, image_seq_len=_tile_tokens(config))


def idefics2_images(config, min_pixels: int, max_pixels: int):
    """Idefics2's resize (aspect ratio kept, longest edge the tower's side, shortest at least half of it; the hub's
    378 to 980 px), padded to the micro-batch's largest image with a pixel mask."""
    from transformers.models.idefics2.image_processing_pil_idefics2 import Idefics2ImageProcessorPil
    return Idefics2ImageProcessorPil(size={"shortest_edge": tower_side(config) // 2,
                                           "longest_edge": tower_side(config)})


def idefics2_processor(config, tokenizer, image_processor):
    """Idefics2's processor over the named tokenizer, ``resampler_n_latents`` tokens an image."""
    return conversation_class(_ConversationIdefics2Processor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config),
        image_seq_len=config.perceiver_config.resampler_n_latents)


def idefics_template(start: str) -> str:
    """Idefics2/3 / SmolVLM: ``start``, then ``Role:`` (``Role: `` when the content does not open with an image),
    the content, ``<end_of_utterance>\\n`` per turn; the prompt ``Assistant:``."""
    return (start +
            "{%- for message in messages -%}"
            "{{- message['role'] | capitalize -}}"
            "{%- if message['content'] is not string and message['content'][0]['type'] == 'image' -%}{{- ':' -}}"
            "{%- else -%}{{- ': ' -}}{%- endif -%}" + image_part("'IMAGE_TOKEN'") +
            "{{- '<end_of_utterance>\\n' -}}"
            "{%- endfor -%}" + GENERATION.replace("PROMPT", "'Assistant:'"))


IMAGE = {"image_token": ("<image>", "<|image_pad|>")}
END_OF_UTTERANCE = {"end_of_utterance_token": ("<end_of_utterance>", "<|im_end|>")}
IDEFICS3_TOKENS = {**IMAGE, "fake_image_token": ("<fake_token_around_image>", "<|vision_start|>"),
                   "global_image_token": ("<global-img>", "<|vision_end|>"), **END_OF_UTTERANCE}
CONFIG_IDS = {"image_token": "image_token_id"}

DATA: dict[str, FamilyData] = {
    "idefics3": FamilyData(tiled_images, idefics3_processor, idefics_template(BOS), tokens=IDEFICS3_TOKENS,
                           config_ids=CONFIG_IDS, always_ours=True, template_owner=True),  # the hub's BOS: Llama 3's
    "smolvlm": FamilyData(tiled_images, smolvlm_processor, idefics_template("{{- '<|im_start|>' -}}"),
                          tokens={**IDEFICS3_TOKENS, "video_token": ("<video>", "<|video_pad|>")},
                          config_ids=CONFIG_IDS, videos=True, always_ours=True, template_owner=True),
    "idefics2": FamilyData(idefics2_images, idefics2_processor, idefics_template(""), tokens={
        **IMAGE, "image_boundary_token": ("<fake_token_around_image>", "<|vision_start|>"), **END_OF_UTTERANCE},
        config_ids=CONFIG_IDS),
}
"""``model_type`` -> its data path."""
