"""The Hugging Face processor of each vision-language family without torchvision: PIL image processors
(``*ImageProcessorPil``), the stock processor classes, and the family's image markers named on the tokenizer.

Every processor built here is a thin subclass of the stock ``transformers`` class (:func:`conversation_class`):

- families whose stock class holds a video processor (Qwen, GLM-4V, InternVL, LLaVA-OneVision, SmolVLM) take
  ``video_processor=None`` (the stock class check refuses ``None``, and their video processors need torchvision)
  or a torchvision-free one (Qwen3-VL's, GLM-4.xV's: :mod:`..families.glm.processor`); images and text are processed
  exactly as by the stock class;
- ``save_pretrained`` writes what a hub snapshot holds (:func:`mpipe_hf.data.hub.save_processor`: the stock class's
  name, the chat template);
- three classes change what their stock ``__init__``/``__call__`` would do to a shared tokenizer or a conversation:
  PaliGemma and Idefics3 add tokens to the tokenizer (PaliGemma 1,152 ``<loc>``/``<seg>`` tokens, Idefics3 its
  image markers) and here take the markers the tokenizer names instead (no token added); PaliGemma's also writes a
  BOS after the last image and a newline at the end of each text and refuses text-only rows, which the chat
  template (:mod:`.templates`) does here instead; SmolVLM's refuses to start without ``num2words``, which only its
  video prompts use.

Mistral 3's processor is Pixtral's, whose module imports torchvision (``processing_pixtral`` imports
``image_processing_pixtral``): where torchvision is installed it is the stock ``PixtralProcessor``, else
:class:`_PilPixtralProcessor`, which expands images as it does over the PIL image processor.

The image markers a family's processor reads from the tokenizer (``tokenizer.image_token``, Gemma 3's
``boi_token``...) are named on a copy of the tokenizer (:func:`named_tokenizer`): from the config's token ids where
the config has them, else the hub token where the vocabulary has it, else the Qwen2 special token that stands in
(:data:`FAMILY_TOKENS`; the tiny configs of :mod:`mpipe_hf.models.tiny_vlms` use the same ones).
"""

from __future__ import annotations

import copy

from transformers import (Gemma3Processor, Glm4vProcessor, Idefics3Processor, InternVLProcessor, LlavaNextProcessor,
                          LlavaOnevisionProcessor, PaliGemmaProcessor, Qwen3VLProcessor, SmolVLMProcessor)
from transformers.processing_utils import ProcessorMixin
from transformers.utils import is_torchvision_available
from transformers.video_processing_utils import VideoProcessorMixin

from .markers import named_tokenizer
from .stock_classes import conversation_class, tower_patch as _patch, tower_side as _side
from ..families.glm.processor import GLM_VIDEO_IDS, GLM_VIDEO_TOKENS, glm_processor, with_video_markers

# model_type -> {tokenizer attribute: (the hub checkpoints' token, the Qwen2 special token standing in)}
FAMILY_TOKENS = {
    "glm4v": {"image_token": ("<|image|>", "<|image_pad|>"), "video_token": ("<|video|>", "<|video_pad|>"),
              **GLM_VIDEO_TOKENS},
    "gemma3": {"image_token": ("<image_soft_token>", "<|image_pad|>"),
               "boi_token": ("<start_of_image>", "<|vision_start|>"),
               "eoi_token": ("<end_of_image>", "<|vision_end|>")},
    "paligemma": {"image_token": ("<image>", "<|image_pad|>")},
    "internvl": {"context_image_token": ("<IMG_CONTEXT>", "<|image_pad|>"),
                 "start_image_token": ("<img>", "<|vision_start|>"), "end_image_token": ("</img>", "<|vision_end|>"),
                 "video_token": ("<video>", "<|video_pad|>")},
    "mistral3": {"image_token": ("[IMG]", "<|image_pad|>"), "image_break_token": ("[IMG_BREAK]", "<|vision_pad|>"),
                 "image_end_token": ("[IMG_END]", "<|vision_end|>")},
    "llava_next": {"image_token": ("<image>", "<|image_pad|>")},
    "llava_onevision": {"image_token": ("<image>", "<|image_pad|>"), "video_token": ("<video>", "<|video_pad|>")},
    "idefics3": {"image_token": ("<image>", "<|image_pad|>"),
                 "fake_image_token": ("<fake_token_around_image>", "<|vision_start|>"),
                 "global_image_token": ("<global-img>", "<|vision_end|>"),
                 "end_of_utterance_token": ("<end_of_utterance>", "<|im_end|>")},
}
FAMILY_TOKENS["glm4v_moe"] = FAMILY_TOKENS["glm4v"]
FAMILY_TOKENS["smolvlm"] = {**FAMILY_TOKENS["idefics3"], "video_token": ("<video>", "<|video_pad|>")}

# model_type -> {tokenizer attribute: the config attribute holding its id}
CONFIG_TOKEN_IDS = {
    "glm4v": {"image_token": "image_token_id", "video_token": "video_token_id", **GLM_VIDEO_IDS},
    "gemma3": {"image_token": "image_token_index", "boi_token": "boi_token_index", "eoi_token": "eoi_token_index"},
    "paligemma": {"image_token": "image_token_index"},
    "internvl": {"context_image_token": "image_token_id"},
    "mistral3": {"image_token": "image_token_index"},
    "llava_next": {"image_token": "image_token_index"},
    "llava_onevision": {"image_token": "image_token_index", "video_token": "video_token_index"},
    "idefics3": {"image_token": "image_token_id"},
    "smolvlm": {"image_token": "image_token_id"},
}
CONFIG_TOKEN_IDS["glm4v_moe"] = CONFIG_TOKEN_IDS["glm4v"]

QWEN3_LIKE = ("qwen3_vl", "qwen3_5", "qwen3_5_moe", "qwen3_vl_moe")  # the Qwen3-VL processor and image grid
GLM_LIKE = ("glm4v", "glm4v_moe")
VIDEO_FREE = {"gemma3", "paligemma", "mistral3", "llava_next", "idefics3"}  # stock classes without a video processor


class _ConversationPaliGemmaProcessor(PaliGemmaProcessor):
    """PaliGemma's processor for conversations: the image marker the tokenizer names (no ``<image>``, ``<loc>``
    or ``<seg>`` token added), the text as the chat template renders it (no BOS or newline written here), rows
    without images accepted, and no ``labels``/``token_type_ids`` (the collator writes both from the assistant
    turns, :class:`~.conversation_collator.ConversationCollator`). ``image_processor.image_seq_length``: the
    tokens an image takes (as the hub's ``preprocessor_config.json`` holds it)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_seq_length = image_processor.image_seq_length
        self.image_token, self.image_token_id = tokenizer.image_token, tokenizer.image_token_id
        tokenizer.add_bos_token = tokenizer.add_eos_token = False  # as the stock one: the template writes them
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    def __call__(self, images=None, text=None, **kwargs):
        return ProcessorMixin.__call__(self, images=images, text=text, **kwargs)

    def prepare_inputs_layout(self, images=None, text=None, **kwargs):
        return ProcessorMixin.prepare_inputs_layout(self, images=images, text=text, **kwargs)

    def validate_inputs(self, images=None, text=None, **kwargs):
        return ProcessorMixin.validate_inputs(self, images=images, text=text, **kwargs)


def _idefics_markers(self, tokenizer, image_seq_len: int) -> None:
    """Idefics3/SmolVLM's image markers from the names on ``tokenizer`` (:func:`named_tokenizer`)."""
    self.fake_image_token, self.image_token = tokenizer.fake_image_token, tokenizer.image_token
    self.end_of_utterance_token = tokenizer.end_of_utterance_token
    self.global_image_token = self.global_image_tag = tokenizer.global_image_token
    self.image_token_id, self.fake_image_token_id = tokenizer.image_token_id, tokenizer.fake_image_token_id
    self.global_image_token_id = tokenizer.global_image_token_id
    self.image_seq_len = image_seq_len


class _NamedIdefics3Processor(Idefics3Processor):
    """Idefics3's processor over the markers the tokenizer names (the stock one adds ``<fake_token_around_image>``,
    ``<image>`` and ``<end_of_utterance>`` to it). Tiles are tagged ``<row_i_col_j>`` in plain text, as the stock
    processor writes them (tokens of their own only where the vocabulary has them)."""

    def __init__(self, image_processor, tokenizer=None, image_seq_len: int = 169, chat_template=None, **kwargs):
        _idefics_markers(self, tokenizer, image_seq_len)
        self.row_col_ids = [tokenizer.convert_tokens_to_ids(f"<row_{i + 1}_col_{j + 1}>") for i in range(6)
                            for j in range(6)]
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


class _SmolVLMProcessor(SmolVLMProcessor):
    """SmolVLM's processor for images: the stock one refuses to start without ``num2words`` and renders chats with
    its video processor's frame settings, both for videos only."""

    def __init__(self, image_processor, tokenizer, video_processor, image_seq_len: int = 169, chat_template=None,
                 **kwargs):
        _idefics_markers(self, tokenizer, image_seq_len)
        self.video_token = tokenizer.video_token
        ProcessorMixin.__init__(self, image_processor, tokenizer, video_processor, chat_template=chat_template)

    def apply_chat_template(self, conversation, chat_template=None, **kwargs):
        """``ProcessorMixin.apply_chat_template`` (the stock one reads the video processor's frame settings)."""
        return ProcessorMixin.apply_chat_template(self, conversation, chat_template, **kwargs)


CLASSES = {
    **{t: conversation_class(Qwen3VLProcessor, t) for t in QWEN3_LIKE[1:]},
    **{t: conversation_class(with_video_markers(Glm4vProcessor), t) for t in GLM_LIKE},
    "gemma3": conversation_class(Gemma3Processor, "gemma3"),
    "paligemma": conversation_class(_ConversationPaliGemmaProcessor, "paligemma"),
    "internvl": conversation_class(InternVLProcessor, "internvl"),
    "llava_next": conversation_class(LlavaNextProcessor, "llava_next"),
    "llava_onevision": conversation_class(LlavaOnevisionProcessor, "llava_onevision"),
    "idefics3": conversation_class(_NamedIdefics3Processor, "idefics3"),
    "smolvlm": conversation_class(_SmolVLMProcessor, "smolvlm"),
}


class _PilPixtralProcessor(ProcessorMixin):
    """Mistral 3's processor without torchvision: what ``PixtralProcessor`` (``transformers.models.pixtral.
    processing_pixtral``, whose module imports torchvision) does, over ``PixtralImageProcessorPil``: the same
    ``__init__`` arguments, ``_process_images`` and ``replace_image_token`` (mirrored from it), and
    ``ProcessorMixin.__call__`` as the stock class has it. An image the image processor resizes to ``(h, w)`` px
    becomes ``h // s`` rows of ``w // s`` image tokens, each row followed by ``image_break_token`` and the last by
    ``image_end_token`` instead (``s = patch_size * spatial_merge_size``); the call returns ``input_ids``,
    ``attention_mask``, ``pixel_values`` ``(images, C, H, W)`` (zero-padded to the largest) and ``image_sizes``
    ``(images, 2)`` (each image's ``(h, w)``). ``stock_class_name``: what a saved snapshot names (loaded as the
    stock class where torchvision is installed). Not mirrored: ``_get_num_multimodal_tokens`` (the encoder takes
    Mistral 3's expansions from the call: ``ConversationEncoder.image_replacements_for_sizes``).
    """

    stock_class_name = "PixtralProcessor"
    text_kwargs = {"return_tensors": "pt"}
    images_kwargs = {"return_tensors": "pt"}

    def __init__(self, image_processor=None, tokenizer=None, patch_size: int = 16, spatial_merge_size: int = 1,
                 chat_template=None, image_token="[IMG]", image_break_token="[IMG_BREAK]",
                 image_end_token="[IMG_END]", **kwargs):
        super().__init__(image_processor, tokenizer, chat_template=chat_template)
        self.patch_size, self.spatial_merge_size = patch_size, spatial_merge_size
        self.image_token, self.image_break_token, self.image_end_token = image_token, image_break_token, image_end_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.image_break_token_id = tokenizer.convert_tokens_to_ids(image_break_token)
        self.image_end_token_id = tokenizer.convert_tokens_to_ids(image_end_token)

    @property
    def image_token_ids(self) -> list[int]:
        return [self.image_token_id, self.image_break_token_id, self.image_end_token_id]

    def _process_images(self, images, **images_kwargs):
        images_kwargs["patch_size"] = self.patch_size * self.spatial_merge_size
        return super()._process_images(images, **images_kwargs)

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
        side = self.patch_size * self.spatial_merge_size
        height, width = image_inputs["image_sizes"][image_idx]
        rows = (self.image_token * (width // side) + self.image_break_token) * (height // side)
        return rows[:len(rows) - len(self.image_break_token)] + self.image_end_token


FAMILY_TYPES = sorted([*CLASSES, "mistral3"])


def _mistral3_class() -> type:
    """Mistral 3's processor class: the stock ``PixtralProcessor`` where torchvision is installed (its module
    imports it), else :class:`_PilPixtralProcessor`."""
    if is_torchvision_available():
        from transformers import PixtralProcessor
        return conversation_class(PixtralProcessor, "mistral3")
    return conversation_class(_PilPixtralProcessor, "mistral3")


def family_image_processor(config, min_pixels: int, max_pixels: int):
    """The PIL image processor of ``config.model_type`` (one of :data:`FAMILY_TYPES`), set from the config as the hub
    checkpoints set theirs: Qwen3.5 / Qwen3-VL-MoE / GLM-4V resize to between ``min_pixels`` and ``max_pixels``
    in multiples of ``patch * merge`` px; Gemma 3, PaliGemma resize to the tower's side; InternVL tiles into up to
    12 tower-side tiles and a thumbnail; Pixtral keeps the aspect ratio, longest edge the tower's side;
    LLaVA-NeXT / OneVision "anyres" grids of ``config.image_grid_pinpoints``; Idefics3 / SmolVLM split into up to
    4 x 4 tower-side tiles and a global image.

    Raises:
        ValueError: ``config.model_type`` is not one of :data:`FAMILY_TYPES`.
    """
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import \
        LlavaOnevisionImageProcessorPil
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    model_type, vision = config.model_type, config.vision_config
    if model_type in QWEN3_LIKE or model_type in GLM_LIKE:
        cls = Glm4vImageProcessorPil if model_type in GLM_LIKE else Qwen2VLImageProcessorPil
        return cls(patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
                   merge_size=vision.spatial_merge_size, size={"shortest_edge": min_pixels, "longest_edge": max_pixels})
    side = _side(config)
    square = {"height": side, "width": side}
    if model_type == "gemma3":
        return Gemma3ImageProcessorPil(size=square)
    if model_type == "paligemma":
        image = SiglipImageProcessorPil(size=square)
        image.image_seq_length = (side // _patch(config)) ** 2  # as the hub's preprocessor_config.json holds it
        return image
    if model_type == "internvl":
        return GotOcr2ImageProcessorPil(size=square, crop_to_patches=True, min_patches=1, max_patches=12)
    if model_type == "mistral3":
        return PixtralImageProcessorPil(size={"longest_edge": side},
                                        patch_size={"height": _patch(config), "width": _patch(config)})
    if model_type == "llava_next":
        return LlavaNextImageProcessorPil(size={"shortest_edge": side}, crop_size=square,
                                          image_grid_pinpoints=config.image_grid_pinpoints)
    if model_type == "llava_onevision":
        return LlavaOnevisionImageProcessorPil(size=square, image_grid_pinpoints=config.image_grid_pinpoints)
    if model_type in ("idefics3", "smolvlm"):
        cls = Idefics3ImageProcessorPil if model_type == "idefics3" else SmolVLMImageProcessorPil
        return cls(size={"longest_edge": 4 * side}, max_image_size={"longest_edge": side})
    raise ValueError(f"model_type {model_type!r} has no image processor here; supported: {FAMILY_TYPES}")


def family_processor(config, tokenizer, image_processor, video_processor=None):
    """The processor of ``config.model_type`` (:data:`FAMILY_TYPES`) over :func:`named_tokenizer` of ``tokenizer`` and
    ``image_processor``, with the family's arguments from ``config`` (tokens per image or tile, patch sizes, feature
    strategy), as the hub checkpoints' ``processor_config.json`` holds them; ``video_processor``: GLM-4.1V /
    GLM-4.5V's (``None``: built from the image processor, :func:`~mpipe_hf.families.glm.processor.glm_processor`).

    Raises:
        ValueError: ``config.model_type`` is not one of :data:`FAMILY_TYPES`; a marker has no token in the
            vocabulary.
    """
    model_type = config.model_type
    if model_type not in FAMILY_TYPES:
        raise ValueError(f"model_type {model_type!r} has no processor here; supported: {FAMILY_TYPES}")
    cls = CLASSES[model_type] if model_type in CLASSES else _mistral3_class()
    tok = named_tokenizer(tokenizer, config)
    if model_type in QWEN3_LIKE:  # videos through the torchvision-free Qwen3-VL video processor (docs/video.md)
        from ..families.qwen.qwen3_video_processor import qwen3_video_processor_from_image
        return cls(image_processor=image_processor, tokenizer=tok,
                   video_processor=qwen3_video_processor_from_image(image_processor))
    if model_type in GLM_LIKE:  # videos through the torchvision-free GLM-4.1V video processor (docs/video.md)
        return glm_processor(cls, config, tok, image_processor, video_processor)
    tiles = (_side(config) // _patch(config)) ** 2  # patches per tile (or image) of the tower
    if model_type == "gemma3":
        return cls(image_processor, tok, image_seq_length=config.mm_tokens_per_image)
    if model_type == "paligemma":
        if getattr(image_processor, "image_seq_length", None) is None:
            image_processor.image_seq_length = tiles
        return cls(image_processor, tok)
    if model_type == "internvl":
        return cls(image_processor, tok, None, image_seq_length=config.image_seq_length)
    if model_type == "mistral3":
        return cls(image_processor, tok, patch_size=_patch(config), spatial_merge_size=config.spatial_merge_size,
                   image_token=tok.image_token, image_break_token=tok.image_break_token,
                   image_end_token=tok.image_end_token)
    if model_type == "llava_next":
        cls_token = config.vision_config.model_type == "clip_vision_model"
        return cls(image_processor, tok, patch_size=_patch(config), image_token=tok.image_token,
                   vision_feature_select_strategy=config.vision_feature_select_strategy,
                   num_additional_image_tokens=1 if cls_token else 0)
    if model_type == "llava_onevision":  # videos through the torchvision-free video processor (docs/video.md)
        from ..families.llava.video_processor_onevision import onevision_video_processor
        return cls(image_processor, tok, onevision_video_processor(config), num_image_tokens=tiles, image_token=tok.image_token,
                   video_token=tok.video_token, vision_aspect_ratio=config.vision_aspect_ratio,
                   vision_feature_select_strategy=config.vision_feature_select_strategy)
    image_seq_len = int(tiles / config.scale_factor ** 2)  # idefics3, smolvlm
    if model_type == "idefics3":
        return cls(image_processor, tok, image_seq_len=image_seq_len)
    return cls(image_processor, tok, None, image_seq_len=image_seq_len)
