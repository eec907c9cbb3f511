"""The data path of Gemma 4 Unified, Muse Glimmer and Muse Spark (:class:`~.family_data.FamilyData` each), whose
stock image processors exist in ``transformers`` only with a torchvision backend: here their torchvision-free
versions (:mod:`.image_processor_gemma4_unified`, :mod:`.image_processor_muse_glimmer`, equal to the stock outputs
bit for bit) under the stock processor classes.

- ``gemma4_unified``: ``Gemma4UnifiedProcessor`` over :class:`~.image_processor_gemma4_unified.
  Gemma4UnifiedImageProcessorNoTV` (the tower's patch size and pooling, at most 70 merged patches an image, the
  smallest budget the class takes, as Gemma 4's data path), without its feature extractor and video processor;
  the stock ``__init__`` adds ``<|video|>`` to the tokenizer, so it is Gemma 4's (:class:`~.processors_new.
  _NamedGemma4Processor`: the markers the tokenizer names, nothing added). An image is ``<|image>``, one
  ``<|image|>`` per merged patch, ``<image|>``; the chat format is Gemma 4's (the same tokenizer and turns).
- ``muse_glimmer`` / ``muse_spark``: ``MuseGlimmerProcessor`` / ``MuseSparkProcessor`` without video (and audio)
  over :class:`~.image_processor_muse_glimmer.MuseGlimmerImageProcessorNoTV` (Spark's stock image processor is
  Glimmer's class): the tower's patches merged ``merge_size`` x ``merge_size``, at most ``max_pixels`` px of merged
  tokens (the stock class shrinks or grows an image to the grid nearest its aspect under that cap). An image is
  ``<|image_start|>``, one ``<|patch|>`` per merged token, ``<|image_end|>``; the stock Glimmer class writes those
  literal strings, here the ones the tokenizer names (:class:`_NamedMuseGlimmerProcessor`; Spark's class reads
  them from the tokenizer itself). Turns as Muse-Glimmer-30B's template writes them:
  ``<|start|>role<|message|>...<|eot|>``, an answer ``<|start|>assistant to=user<|message|>...<|eot|>`` (addressed
  to the user, no reasoning turn; the recipient is part of the prompt), after the bos. The hub template adds a
  default system turn (the dates and a reasoning strength); a checkpoint's own template is used where it has one
  (:func:`~.templates.chat_template_for`). ``<|eot|>`` is ``<|im_end|>`` where the vocabulary lacks it
  (:data:`~.templates.STAND_INS`), ``<|start|>`` and ``<|message|>`` plain text.
"""

from __future__ import annotations

from transformers import Gemma4UnifiedProcessor, MuseGlimmerProcessor, MuseSparkProcessor
from transformers.processing_utils import ProcessorMixin

from .family_data import FamilyData
from .image_processor_gemma4_unified import Gemma4UnifiedImageProcessorNoTV
from .image_processor_muse_glimmer import MuseGlimmerImageProcessorNoTV
from .processors_llava_like import _roles
from .processors_new import _GEMMA4, DATA as _GEMMA4_DATA, _NamedGemma4Processor
from .processors_vlm import _patch, conversation_class, named_tokenizer
from .templates import BOS

_MUSE_ANSWER = "'<|start|>assistant to=user<|message|>'"
_MUSE = _roles("'<|start|>user<|message|>'", _MUSE_ANSWER, "'<|start|>system<|message|>'", "'<|eot|>'", "'<|eot|>'",
               "'IMAGE_TOKEN'", _MUSE_ANSWER, BOS)


class _NamedGemma4UnifiedProcessor(Gemma4UnifiedProcessor):
    """Gemma 4 Unified's processor over the markers the tokenizer names, no token added, the feature extractor
    optional (Gemma 4's :class:`~.processors_new._NamedGemma4Processor` set-up; the image text is the stock
    class's)."""

    __init__ = _NamedGemma4Processor.__init__

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "feature_extractor" and argument is None:
            return type(None)
        return super().check_argument_for_proper_class(argument_name, argument)


class _NamedMuseGlimmerProcessor(MuseGlimmerProcessor):
    """``MuseGlimmerProcessor`` writing each image with the markers the tokenizer names (the stock ``__init__``
    sets the hub's literal strings, which a vocabulary without them would split into text)."""

    def __init__(self, image_processor=None, video_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.image_token_id = tokenizer.image_token, tokenizer.image_token_id
        self.image_start_token, self.image_start_token_id = tokenizer.image_start_token, tokenizer.image_start_token_id
        self.image_end_token, self.image_end_token_id = tokenizer.image_end_token, tokenizer.image_end_token_id
        self.video_token, self.video_token_id = tokenizer.video_token, tokenizer.video_token_id
        ProcessorMixin.__init__(self, image_processor=image_processor, video_processor=video_processor,
                                tokenizer=tokenizer, chat_template=chat_template, **kwargs)


class _ImageMuseSparkProcessor(MuseSparkProcessor):
    """``MuseSparkProcessor`` for images: the audio feature extractor may be ``None`` (audio rows are refused)."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "feature_extractor" and argument is None:
            return type(None)
        return super().check_argument_for_proper_class(argument_name, argument)


def _unified_images(config, min_pixels: int, max_pixels: int):
    """The tower's patch size and pooling, at most 70 merged patches an image (the smallest budget the class
    takes, as Gemma 4's); ``min_pixels``/``max_pixels`` do not apply (the budget sets the size)."""
    vision = config.vision_config
    return Gemma4UnifiedImageProcessorNoTV(patch_size=vision.patch_size, pooling_kernel_size=vision.pooling_kernel_size,
                                           max_soft_tokens=70)


def _unified(config, tokenizer, image_processor):
    return conversation_class(_NamedGemma4UnifiedProcessor, config.model_type)(
        None, image_processor, named_tokenizer(tokenizer, config), None)


def _muse_images(config, min_pixels: int, max_pixels: int):
    """The tower's patches (``patch_temporal`` frames deep) merged ``merge_size`` x ``merge_size``, at most
    ``max_pixels`` px of merged tokens (at least one)."""
    vision = config.vision_config
    cell = _patch(config) * vision.merge_size
    return MuseGlimmerImageProcessorNoTV(patch_size=_patch(config), temporal_patch_size=vision.patch_temporal,
                                         merge_size=vision.merge_size, max_image_tokens=max(1, max_pixels // cell ** 2))


def _muse(config, tokenizer, image_processor):
    named = named_tokenizer(tokenizer, config)
    if config.model_type == "muse_spark":
        return conversation_class(_ImageMuseSparkProcessor, "muse_spark")(image_processor=image_processor,
                                                                          tokenizer=named)
    return conversation_class(_NamedMuseGlimmerProcessor, "muse_glimmer")(image_processor=image_processor,
                                                                          tokenizer=named)


# the families here whose stock image processor needs torchvision -> ours (what a snapshot loads without it)
TORCH_OP_IMAGES = {"gemma4_unified": Gemma4UnifiedImageProcessorNoTV, "muse_glimmer": MuseGlimmerImageProcessorNoTV,
                   "muse_spark": MuseGlimmerImageProcessorNoTV}

_MUSE_DATA = FamilyData(_muse_images, _muse, _MUSE, "<|patch|>", tokens={
    "image_token": ("<|patch|>", "<|image_pad|>"), "image_start_token": ("<|image_start|>", "<|vision_start|>"),
    "image_end_token": ("<|image_end|>", "<|vision_end|>"), "video_token": ("<|video|>", "<|video_pad|>")},
    config_ids={"image_token": "image_token_id", "video_token": "video_token_id"})
DATA: dict[str, FamilyData] = {
    "gemma4_unified": FamilyData(_unified_images, _unified, _GEMMA4, "<|image|>", tokens=_GEMMA4_DATA["gemma4"].tokens,
                                 config_ids=_GEMMA4_DATA["gemma4"].config_ids),
    "muse_glimmer": _MUSE_DATA,
    "muse_spark": _MUSE_DATA,
}
