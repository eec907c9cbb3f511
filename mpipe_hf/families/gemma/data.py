"""The Gemma models' data path (:class:`~mpipe_hf.data.family_data.FamilyData` each): chat templates, image
processors and processors, all without torchvision.

- ``gemma3``, ``shieldgemma2`` (Gemma 3's model class under its own config): ``Gemma3Processor`` over
  ``Gemma3ImageProcessorPil`` at the tower's side, ``mm_tokens_per_image`` tokens an image; images
  ``<start_of_image>``, which the processor expands to its begin, soft tokens and end.
- ``paligemma``: PaliGemma's processor for conversations (:class:`~.processor_classes.ConversationPaliGemmaProcessor`:
  no token added, the BOS and newlines written by the chat template) over ``SiglipImageProcessorPil``, one token a
  tower patch; an image is its placeholder repeated.
- ``gemma4``: ``Gemma4Processor`` over ``Gemma4ImageProcessorPil`` (aspect-preserving resize to at most 70 soft
  tokens of the tower's patches and pooling), without its audio feature extractor and video processor; the stock
  class adds ``<|video|>`` to the tokenizer, so here the processor takes the video token the tokenizer names
  (:class:`~.processor_classes.NamedGemma4Processor`; no token added). Images ``<|image|>``.
- ``gemma4_unified``: ``Gemma4UnifiedProcessor`` over :class:`~.unified_image_processor.
  Gemma4UnifiedImageProcessorNoTV` (the tower's patch size and pooling, at most 70 merged patches an image, as
  Gemma 4's data path), Gemma 4's set-up (:class:`~.processor_classes.NamedGemma4UnifiedProcessor`). An image is
  ``<|image>``, one ``<|image|>`` per merged patch, ``<image|>``; the chat format is Gemma 4's.
- ``muse_glimmer`` / ``muse_spark``: ``MuseGlimmerProcessor`` / ``MuseSparkProcessor`` without video (and audio)
  over :class:`~.muse_image_processor.MuseGlimmerImageProcessorNoTV` (Spark's stock image processor is Glimmer's
  class): the tower's patches merged ``merge_size`` x ``merge_size``, at most ``max_pixels`` px of merged tokens
  (the stock class shrinks or grows an image to the grid nearest its aspect under that cap). An image is
  ``<|image_start|>``, one ``<|patch|>`` per merged token, ``<|image_end|>``; the stock Glimmer class writes those
  literal strings, here the ones the tokenizer names (:class:`~.processor_classes.NamedMuseGlimmerProcessor`;
  Spark's class reads them from the tokenizer itself).

The stock image processors of Gemma 4 Unified and Muse exist in ``transformers`` only with a torchvision backend:
ours (equal to the stock outputs bit for bit) are also what a checkpoint's settings load into without torchvision
(``no_torchvision_images``).
"""

from __future__ import annotations

from transformers import Gemma3Processor

from ...data.family_data import FamilyData
from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class, tower_patch, tower_side
from ...data.templates import BOS, GENERATION, IMAGES, TEXTS, roles
from .muse_image_processor import MuseGlimmerImageProcessorNoTV
from .processor_classes import (ConversationPaliGemmaProcessor, ImageMuseSparkProcessor, NamedGemma4Processor,
                                NamedGemma4UnifiedProcessor, NamedMuseGlimmerProcessor)
from .unified_image_processor import Gemma4UnifiedImageProcessorNoTV

# Gemma 3 (gemma-3-*-it): <bos>, turns <start_of_turn>user|model\n ... <end_of_turn>\n, the system text and a blank
# line before the first user text, text parts trimmed, images <start_of_image>. <start_of_turn> and <end_of_turn>
# are <|im_start|> and <|im_end|> where the vocabulary lacks them (templates.STAND_INS).
GEMMA3_TEMPLATE = (BOS +
                   "{%- if messages[0]['role'] == 'system' -%}"
                   "{%- set first = messages[0]['content'] if messages[0]['content'] is string "
                   "else messages[0]['content'][0]['text'] -%}"
                   "{%- set first_user_prefix = first + '\\n\\n' -%}{%- set loop_messages = messages[1:] -%}"
                   "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
                   "{%- for message in loop_messages -%}"
                   "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + "
                   "'\\n' -}}"
                   "{{- first_user_prefix if loop.first else '' -}}"
                   "{%- if message['content'] is string -%}{{- message['content'] | trim -}}{%- else -%}"
                   "{%- for part in message['content'] -%}"
                   "{%- if part['type'] == 'image' -%}{{- 'IMAGE_TOKEN' -}}"
                   "{%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
                   "{%- endfor -%}{%- endif -%}"
                   "{{- '<end_of_turn>\\n' -}}"
                   "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<start_of_turn>model\\n'"))

# PaliGemma (no hub template; its processor's layout "<image>... <bos>prefix\n" + "suffix<eos>", turn by turn): a
# user or system turn writes its images, the BOS after the first turn's images, its text and a newline; an
# assistant turn its text and the EOS. No generation prompt (the answer follows the newline).
PALIGEMMA_TEMPLATE = ("{%- for message in messages -%}"
                      "{%- if message['role'] == 'assistant' -%}" + TEXTS + "{{- eos_token -}}"
                      "{%- else -%}" + IMAGES.replace("IMAGE", "'IMAGE_TOKEN'") +
                      "{%- if loop.first -%}" + BOS + "{%- endif -%}" + TEXTS + "{{- '\\n' -}}"
                      "{%- endif -%}"
                      "{%- endfor -%}")

# Gemma 4 (gemma-4-*-it): <bos>, turns <|turn>system|user|model\n ... <turn|>\n, text parts trimmed, images <|image|>
# (the processor expands each to <|image> + soft tokens + <image|>); no thinking markup is written. The prompt
# <|turn>model\n. <|turn> and <turn|> are <|im_start|> and <|im_end|> where the vocabulary lacks them.
GEMMA4_TEMPLATE = (BOS +
                   "{%- for message in messages -%}"
                   "{{- '<|turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' -}}"
                   "{%- if message['content'] is string -%}{{- message['content'] | trim -}}{%- else -%}"
                   "{%- for part in message['content'] -%}"
                   "{%- if part['type'] == 'image' -%}{{- 'IMAGE_TOKEN' -}}"
                   "{%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
                   "{%- endfor -%}{%- endif -%}"
                   "{{- '<turn|>\\n' -}}"
                   "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<|turn>model\\n'"))

# Muse (Muse-Glimmer-30B's template): after the bos, <|start|>role<|message|>...<|eot|>, an answer
# <|start|>assistant to=user<|message|>...<|eot|> (addressed to the user, no reasoning turn; the recipient is part of
# the prompt). The hub template adds a default system turn (the dates and a reasoning strength); a checkpoint's own
# template is used where it has one (templates.chat_template_for). <|eot|> is <|im_end|> where the vocabulary lacks
# it (templates.STAND_INS), <|start|> and <|message|> plain text.
_MUSE_ANSWER = "'<|start|>assistant to=user<|message|>'"
MUSE_TEMPLATE = roles("'<|start|>user<|message|>'", _MUSE_ANSWER, "'<|start|>system<|message|>'", "'<|eot|>'",
                      "'<|eot|>'", "'IMAGE_TOKEN'", _MUSE_ANSWER, BOS)

_GEMMA3_CLASSES = {t: conversation_class(Gemma3Processor, t) for t in ("gemma3", "shieldgemma2")}
_PALIGEMMA_CLASS = conversation_class(ConversationPaliGemmaProcessor, "paligemma")


def _square(config) -> dict:
    return {"height": tower_side(config), "width": tower_side(config)}


def gemma3_images(config, min_pixels: int, max_pixels: int):
    """``Gemma3ImageProcessorPil`` resizing to the tower's side; ``min_pixels``/``max_pixels`` do not apply."""
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    return Gemma3ImageProcessorPil(size=_square(config))


def gemma3_processor(config, tokenizer, image_processor):
    """``Gemma3Processor`` (Gemma 3, ShieldGemma 2) over the named tokenizer, ``mm_tokens_per_image`` an image."""
    return _GEMMA3_CLASSES[config.model_type](image_processor, named_tokenizer(tokenizer, config),
                                              image_seq_length=config.mm_tokens_per_image)


def paligemma_images(config, min_pixels: int, max_pixels: int):
    """``SiglipImageProcessorPil`` resizing to the tower's side, with ``image_seq_length`` (one token a tower
    patch) as the hub's ``preprocessor_config.json`` holds it; ``min_pixels``/``max_pixels`` do not apply."""
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
    image = SiglipImageProcessorPil(size=_square(config))
    image.image_seq_length = (tower_side(config) // tower_patch(config)) ** 2
    return image


def paligemma_processor(config, tokenizer, image_processor):
    """PaliGemma's processor for conversations; an image processor without ``image_seq_length`` gets one token a
    tower patch."""
    if getattr(image_processor, "image_seq_length", None) is None:
        image_processor.image_seq_length = (tower_side(config) // tower_patch(config)) ** 2
    return _PALIGEMMA_CLASS(image_processor, named_tokenizer(tokenizer, config))


def gemma4_images(config, min_pixels: int, max_pixels: int):
    """``Gemma4ImageProcessorPil`` with the tower's patch size and pooling, at most 70 soft tokens an image (the
    smallest budget the class takes); ``min_pixels``/``max_pixels`` do not apply (the budget sets the size)."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    vision = config.vision_config
    return Gemma4ImageProcessorPil(patch_size=vision.patch_size, pooling_kernel_size=vision.pooling_kernel_size,
                                   max_soft_tokens=70)


def gemma4_processor(config, tokenizer, image_processor):
    """Gemma 4's processor for images over the named tokenizer (no feature extractor, no video processor)."""
    cls = conversation_class(NamedGemma4Processor, "gemma4")
    return cls(None, image_processor, named_tokenizer(tokenizer, config), None)


def unified_images(config, min_pixels: int, max_pixels: int):
    """The tower's patch size and pooling, at most 70 merged patches an image (the smallest budget the class
    takes, as Gemma 4's); ``min_pixels``/``max_pixels`` do not apply (the budget sets the size)."""
    vision = config.vision_config
    return Gemma4UnifiedImageProcessorNoTV(patch_size=vision.patch_size, pooling_kernel_size=vision.pooling_kernel_size,
                                           max_soft_tokens=70)


def unified_processor(config, tokenizer, image_processor):
    """Gemma 4 Unified's processor for images over the named tokenizer."""
    return conversation_class(NamedGemma4UnifiedProcessor, config.model_type)(
        None, image_processor, named_tokenizer(tokenizer, config), None)


def muse_images(config, min_pixels: int, max_pixels: int):
    """The tower's patches (``patch_temporal`` frames deep) merged ``merge_size`` x ``merge_size``, at most
    ``max_pixels`` px of merged tokens (at least one)."""
    vision = config.vision_config
    cell = tower_patch(config) * vision.merge_size
    return MuseGlimmerImageProcessorNoTV(patch_size=tower_patch(config), temporal_patch_size=vision.patch_temporal,
                                         merge_size=vision.merge_size, max_image_tokens=max(1, max_pixels // cell ** 2))


def muse_processor(config, tokenizer, image_processor):
    """Muse Glimmer's (Muse Spark's) processor for images over the named tokenizer."""
    named = named_tokenizer(tokenizer, config)
    if config.model_type == "muse_spark":
        return conversation_class(ImageMuseSparkProcessor, "muse_spark")(image_processor=image_processor,
                                                                         tokenizer=named)
    return conversation_class(NamedMuseGlimmerProcessor, "muse_glimmer")(image_processor=image_processor,
                                                                         tokenizer=named)


_GEMMA3_MARKERS = dict(tokens={"image_token": ("<image_soft_token>", "<|image_pad|>"),
                               "boi_token": ("<start_of_image>", "<|vision_start|>"),
                               "eoi_token": ("<end_of_image>", "<|vision_end|>")},
                       config_ids={"image_token": "image_token_index", "boi_token": "boi_token_index",
                                   "eoi_token": "eoi_token_index"})
_GEMMA4_MARKERS = dict(tokens={"image_token": ("<|image|>", "<|image_pad|>"),
                               "boi_token": ("<|image>", "<|vision_start|>"),
                               "eoi_token": ("<image|>", "<|vision_end|>"),
                               "video_token": ("<|video|>", "<|video_pad|>")},
                       config_ids={"image_token": "image_token_id", "boi_token": "boi_token_id",
                                   "eoi_token": "eoi_token_id", "video_token": "video_token_id"})
_MUSE = FamilyData(muse_images, muse_processor, MUSE_TEMPLATE, "<|patch|>", tokens={
    "image_token": ("<|patch|>", "<|image_pad|>"), "image_start_token": ("<|image_start|>", "<|vision_start|>"),
    "image_end_token": ("<|image_end|>", "<|vision_end|>"), "video_token": ("<|video|>", "<|video_pad|>")},
    config_ids={"image_token": "image_token_id", "video_token": "video_token_id"},
    no_torchvision_images=MuseGlimmerImageProcessorNoTV)

DATA: dict[str, FamilyData] = {
    # the stock Gemma 3 and PaliGemma classes add tokens or rewrite the text: a checkpoint's processor is ours
    "gemma3": FamilyData(gemma3_images, gemma3_processor, GEMMA3_TEMPLATE, "<start_of_image>", **_GEMMA3_MARKERS,
                         always_ours=True, template_owner=True),
    "paligemma": FamilyData(paligemma_images, paligemma_processor, PALIGEMMA_TEMPLATE, "<image>",
                            tokens={"image_token": ("<image>", "<|image_pad|>")},
                            config_ids={"image_token": "image_token_index"}, repeated=True, always_ours=True,
                            template_owner=True),
    "shieldgemma2": FamilyData(gemma3_images, gemma3_processor, GEMMA3_TEMPLATE, "<start_of_image>",
                               **_GEMMA3_MARKERS),
    "gemma4": FamilyData(gemma4_images, gemma4_processor, GEMMA4_TEMPLATE, "<|image|>", **_GEMMA4_MARKERS),
    "gemma4_unified": FamilyData(unified_images, unified_processor, GEMMA4_TEMPLATE, "<|image|>", **_GEMMA4_MARKERS,
                                 no_torchvision_images=Gemma4UnifiedImageProcessorNoTV),
    "muse_glimmer": _MUSE,
    "muse_spark": _MUSE,
}
