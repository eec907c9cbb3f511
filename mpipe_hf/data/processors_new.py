"""The data path of the new families added in issue 38 (:class:`~.family_data.FamilyData` each).

- ``gemma4``: ``Gemma4Processor`` over ``Gemma4ImageProcessorPil`` (aspect-preserving resize to at most 70 soft
  tokens of the tower's patches and pooling), without its audio feature extractor and video processor; the stock
  class adds ``<|video|>`` to the tokenizer, so here the processor takes the video token the tokenizer names
  (:class:`_NamedGemma4Processor`; no token added). The Gemma 4 chat format: ``<|turn>user\\n...<turn|>\\n
  <|turn>model\\n...<turn|>\\n`` (``<|turn>``/``<turn|>`` written as ``<|im_start|>``/``<|im_end|>`` where the
  vocabulary lacks them), images ``<|image|>``.
"""

from __future__ import annotations

from transformers import Gemma4Processor
from transformers.processing_utils import ProcessorMixin

from .family_data import FamilyData
from .processors_vlm import conversation_class, named_tokenizer

# Gemma 4 (gemma-4-*-it): <bos>, turns <|turn>system|user|model\n ... <turn|>\n, text parts trimmed, images <|image|>
# (the processor expands each to <|image> + soft tokens + <image|>); no thinking markup is written. The prompt
# <|turn>model\n.
_GEMMA4 = ("{%- if bos_token -%}{{- bos_token -}}{%- endif -%}"
           "{%- for message in messages -%}"
           "{{- '<|turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' -}}"
           "{%- if message['content'] is string -%}{{- message['content'] | trim -}}{%- else -%}"
           "{%- for part in message['content'] -%}"
           "{%- if part['type'] == 'image' -%}{{- 'IMAGE_TOKEN' -}}"
           "{%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
           "{%- endfor -%}{%- endif -%}"
           "{{- '<turn|>\\n' -}}"
           "{%- endfor -%}"
           "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- endif -%}")


class _NamedGemma4Processor(Gemma4Processor):
    """Gemma 4's processor for images over the markers the tokenizer names (:func:`~.processors_vlm.
    named_tokenizer`): the stock ``__init__`` adds ``<|video|>`` to the tokenizer; here the video token is the one
    the tokenizer names, and the audio feature extractor may be ``None`` (no audio markers)."""

    def __init__(self, feature_extractor=None, image_processor=None, tokenizer=None, video_processor=None,
                 chat_template=None, image_seq_length: int = 280, audio_seq_length: int = 750,
                 audio_ms_per_token: int = 40, **kwargs):
        self.image_seq_length, self.audio_seq_length = image_seq_length, audio_seq_length
        self.audio_ms_per_token = audio_ms_per_token
        self.image_token, self.image_token_id = tokenizer.image_token, tokenizer.image_token_id
        self.boi_token, self.eoi_token = tokenizer.boi_token, tokenizer.eoi_token
        self.video_token, self.video_token_id = tokenizer.video_token, tokenizer.video_token_id
        self.audio_token = self.audio_token_id = None
        # the stock validate_inputs refuses every call when these are None (an operator-precedence slip in
        # transformers 5.25); the hub's markers, never written here (audio is refused)
        self.boa_token, self.eoa_token = "<|audio>", "<audio|>"
        ProcessorMixin.__init__(self, feature_extractor, image_processor, tokenizer, video_processor,
                                chat_template=chat_template, **kwargs)

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "feature_extractor" and argument is None:
            return type(None)
        return super().check_argument_for_proper_class(argument_name, argument)


def _gemma4_image_processor(config, min_pixels: int, max_pixels: int):
    """``Gemma4ImageProcessorPil`` with the tower's patch size and pooling, at most 70 soft tokens an image (the
    smallest budget the class takes); ``min_pixels``/``max_pixels`` do not apply (the budget sets the size)."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    vision = config.vision_config
    return Gemma4ImageProcessorPil(patch_size=vision.patch_size, pooling_kernel_size=vision.pooling_kernel_size,
                                   max_soft_tokens=70)


def _gemma4_processor(config, tokenizer, image_processor):
    cls = conversation_class(_NamedGemma4Processor, "gemma4")
    return cls(None, image_processor, named_tokenizer(tokenizer, config), None)


DATA: dict[str, FamilyData] = {
    "gemma4": FamilyData(
        image_processor=_gemma4_image_processor, processor=_gemma4_processor, template=_GEMMA4,
        hub_image_token="<|image|>",
        tokens={"image_token": ("<|image|>", "<|image_pad|>"), "boi_token": ("<|image>", "<|vision_start|>"),
                "eoi_token": ("<image|>", "<|vision_end|>"), "video_token": ("<|video|>", "<|video_pad|>")},
        config_ids={"image_token": "image_token_id", "boi_token": "boi_token_id", "eoi_token": "eoi_token_id",
                    "video_token": "video_token_id"}),
}
