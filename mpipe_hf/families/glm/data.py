"""The data path of the GLM group: each type's :class:`~mpipe_hf.data.family_data.FamilyData`.

Every type here resizes images to between ``min_pixels`` and ``max_pixels`` in multiples of ``patch * merge`` px
and writes an image as ``<|begin_of_image|><|image|><|end_of_image|>``, the image token repeated once per merged
patch (``image_grid_thw``), the Qwen2 vision tokens standing in for the markers a Qwen2 vocabulary lacks:

- ``glm4v``, ``glm4v_moe``: ``Glm4vProcessor`` over ``Glm4vImageProcessorPil``, with the torchvision-free video
  processor (:mod:`.processor`, docs/video.md), GLM-4.1V's turns;
- ``glm46v``: ``Glm46VProcessor`` over ``Glm46VImageProcessorPil`` with GLM-4.6V's video processor, GLM-4.6V's
  turns (an empty reasoning block before each answer);
- ``glmga``, ``glm_ocr``: ``Glm46VProcessor`` (the class their hub snapshots name) without a video processor,
  over ``GlmgaImageProcessorPil`` / ``Glm46VImageProcessorPil``; Glmga's turns are GLM-4.6V's, GLM-OCR's
  GLM-4.1V's.
"""

from __future__ import annotations

from transformers import Glm46VProcessor, Glm4vProcessor

from ...data.family_data import FamilyData
from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class
from ...data.templates import GENERATION, image_part, with_video
from ..qwen.data import grid_image_processor
from .processor import GLM_VIDEO_IDS, GLM_VIDEO_TOKENS, glm_processor, with_video_markers
from .video_processor import glm_video_processor_from_image

# A message's content: images <|begin_of_image|><|image|><|end_of_image|>, videos
# <|begin_of_video|><|video|><|end_of_video|> (the hub templates'), which the processor expands to a
# <|begin_of_image|>...<|end_of_image|> and a time per temporal patch (docs/video.md).
GLM_CONTENT = with_video(image_part("'<|begin_of_image|>IMAGE_TOKEN<|end_of_image|>'"),
                         "'<|begin_of_video|>VIDEO_TOKEN<|end_of_video|>'")
# GLM-4.1V / GLM-4.5V: [gMASK]<sop>, turns <|system|>\n / <|user|>\n / <|assistant|>\n; no thinking markup is
# added. The hub format has no end-of-turn token (generation stops at the next <|user|> or at <|endoftext|>, the
# eos), so nothing after an answer would be labelled and a model fine-tuned on it would never learn to stop. As GLM
# fine-tuning recipes do (LLaMA-Factory's glm4v template, efficient_eos), each assistant turn ends with the
# tokenizer's eos token, which the encoder labels as the turn's end token (a special token right after the answer,
# ConversationEncoder.encode).
GLM4V_TEMPLATE = ("{{- '[gMASK]<sop>' -}}"
                  "{%- for message in messages -%}"
                  "{{- '<|' + message['role'] + '|>\\n' -}}" + GLM_CONTENT +
                  "{%- if message['role'] == 'assistant' -%}{{- eos_token -}}{%- endif -%}"
                  "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<|assistant|>\\n'"))
# GLM-4.5V / GLM-4.6V (non-thinking): as GLM-4.1V's, an answer <|assistant|>\n<think></think>\n + text (the hub
# template's empty reasoning block, which it also writes after the generation prompt with enable_thinking false).
GLM46V_TEMPLATE = ("{{- '[gMASK]<sop>' -}}"
                   "{%- for message in messages -%}"
                   "{%- if message['role'] == 'assistant' -%}{{- '<|assistant|>\\n<think></think>\\n' -}}"
                   "{%- else -%}{{- '<|' + message['role'] + '|>\\n' -}}{%- endif -%}"
                   + GLM_CONTENT +
                   "{%- if message['role'] == 'assistant' -%}{{- eos_token -}}{%- endif -%}"
                   "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<|assistant|>\\n<think></think>\\n'"))

# tokenizer attribute -> (the hub checkpoints' token, the Qwen2 special token standing in); the config attributes
# holding their ids
GLM_TOKENS = {"image_token": ("<|image|>", "<|image_pad|>"), "video_token": ("<|video|>", "<|video_pad|>")}
GLM_IDS = {"image_token": "image_token_id", "video_token": "video_token_id"}


def _video_processor(model_type: str):
    """``processor(config, tokenizer, image_processor, video_processor=None)``: ``Glm4vProcessor``
    (``glm46v``: ``Glm46VProcessor``) with its video markers (:func:`~.processor.with_video_markers`) over the
    named tokenizer, with ``video_processor`` (``None``: the one the image processor implies,
    :func:`~.processor.glm_processor`)."""
    base = Glm46VProcessor if model_type == "glm46v" else Glm4vProcessor
    cls = conversation_class(with_video_markers(base), model_type)

    def build(config, tokenizer, image_processor, video_processor=None):
        return glm_processor(cls, config, named_tokenizer(tokenizer, config), image_processor, video_processor)
    return build


def _image_only(model_type: str):
    """``processor(config, tokenizer, image_processor)``: ``Glm46VProcessor`` without a video processor over the
    named tokenizer."""
    cls = conversation_class(Glm46VProcessor, model_type)

    def build(config, tokenizer, image_processor):
        return cls(image_processor=image_processor, tokenizer=named_tokenizer(tokenizer, config),
                   video_processor=None)
    return build


def _glm4v(model_type: str) -> FamilyData:
    """GLM-4.1V's or GLM-4.5V's: videos, a snapshot's video settings read back, always ours."""
    return FamilyData(
        grid_image_processor("Glm4vImageProcessorPil"), _video_processor(model_type), GLM4V_TEMPLATE,
        hub_image_token="<|image|>", tokens={**GLM_TOKENS, **GLM_VIDEO_TOKENS},
        config_ids={**GLM_IDS, **GLM_VIDEO_IDS}, repeated=True, pixel_bounded=True, videos=True,
        video_from_snapshot=lambda image, config, settings: glm_video_processor_from_image(
            image, config.model_type, settings),
        always_ours=True, template_owner=True)


def _glm_image_only(model_type: str, image_cls: str, template: str) -> FamilyData:
    return FamilyData(grid_image_processor(image_cls), _image_only(model_type), template, hub_image_token="<|image|>",
                      tokens=GLM_TOKENS, config_ids=GLM_IDS, repeated=True, pixel_bounded=True)


DATA: dict[str, FamilyData] = {
    "glm4v": _glm4v("glm4v"), "glm4v_moe": _glm4v("glm4v_moe"),
    # GLM-4.6V's: its video processor always the one its image processor implies (``videos`` off)
    "glm46v": FamilyData(grid_image_processor("Glm46VImageProcessorPil"), _video_processor("glm46v"),
                         GLM46V_TEMPLATE, hub_image_token="<|image|>", tokens={**GLM_TOKENS, **GLM_VIDEO_TOKENS},
                         config_ids={**GLM_IDS, **GLM_VIDEO_IDS}, repeated=True, pixel_bounded=True),
    "glmga": _glm_image_only("glmga", "GlmgaImageProcessorPil", GLM46V_TEMPLATE),
    "glm_ocr": _glm_image_only("glm_ocr", "Glm46VImageProcessorPil", GLM4V_TEMPLATE),  # GLM-4.1V's turns
}
