"""The data path of the qwen_like families added in issue 38 (:class:`~.family_data.FamilyData` each).

Every family here resizes images to between ``min_pixels`` and ``max_pixels`` in multiples of ``patch * merge``
px and writes an image as its placeholder repeated once per merged patch (``image_grid_thw``), as Qwen-VL does:

- ``glm46v``, ``glmga``, ``glm_ocr``: ``Glm46VProcessor`` (the class the GLM-4.6V, Glmga and GLM-OCR hub
  snapshots name) over ``Glm46VImageProcessorPil`` (Glmga: ``GlmgaImageProcessorPil``), images
  ``<|begin_of_image|><|image|><|end_of_image|>`` with the Qwen2 vision tokens standing in; GLM-4.6V's with
  videos (:mod:`mpipe_hf.families.glm.processor`, docs/video.md);
- ``cosmos3_omni``: ``Qwen3VLProcessor`` (Cosmos3-Omni's model is Qwen3-VL's) over ``Qwen2VLImageProcessorPil`` in
  16-px patches, ChatML;
- ``cosmos3_edge``: ``Cosmos3EdgeProcessor`` over ``Cosmos3EdgeImageProcessorPil`` (16-px patches, no temporal
  patch), ChatML with the Qwen2 vision markers its processor names by default;
- ``paddleocr_vl``: ``PaddleOCRVLProcessor`` over ``PaddleOCRVLImageProcessorPil``, PaddleOCR-VL's
  ``User: ...\nAssistant: ...`` turns;
- ``exaone4_5``: ``Exaone4_5_Processor`` over ``Qwen2VLImageProcessorPil`` (as transformers' auto classes pair
  them), EXAONE 4.0's ``[|user|]...[|endofturn|]`` turns; ``llava_onevision1_5``: the same classes (the pair
  transformers' auto classes name for it) in 14-px patches without a temporal patch, ChatML;
- ``ernie4_5_vl_moe``: ``Ernie4_5_VLMoeProcessor`` (``moe_mm_token_type_ids`` besides ``mm_token_type_ids``) over
  ``Ernie4_5_VLMoeImageProcessorPil``, PaddleOCR-VL's turns (ERNIE 4.5's, less its ``Picture n:`` labels and
  thinking block);
- ``qwen2_5_omni_thinker``, ``qwen3_omni_moe_thinker``: ``Qwen2_5OmniProcessor`` / ``Qwen3OmniMoeProcessor`` over
  ``Qwen2VLImageProcessorPil`` and a ``WhisperFeatureExtractor`` (the processor requires one; audio is refused at
  load), no video processor, ChatML (Qwen2.5-Omni with its default system message, images between
  ``<|vision_bos|>``/``<|vision_eos|>``);
- ``lfm3_vl``, ``hyperclovax_vision_v2``: ``Lfm3VlProcessor`` / ``HyperCLOVAXVisionV2Processor`` over
  ``Qwen2VLImageProcessorPil`` (the pairs transformers' auto classes name), ChatML with the Qwen2 vision markers
  their processors name by default;
- ``minicpmv4_6``, ``minicpmv4_7``: ``MiniCPMV4_6Processor`` / ``MiniCPMV4_7Processor`` without a video processor
  (:func:`_image_minicpm`) over ``MiniCPMV4_6ImageProcessorPil`` (a ``scale_resolution``-px overview and up to 4
  slices, each image's local id), ChatML;
- ``hunyuan_vl``: ``HunYuanVLProcessor`` over ``HunYuanVLImageProcessorPil``, HunYuan's ``<｜hy_User｜>`` /
  ``<｜hy_Assistant｜>`` turns, each image wrapped in its start and end markers (which the processor requires);
- ``video_llama_3``: ``VideoLlama3Processor`` over ``VideoLlama3ImageProcessorPil`` (``image_merge_sizes``), ChatML
  with an image as its placeholder and a newline.
"""

from __future__ import annotations

from transformers import (Cosmos3EdgeProcessor, Ernie4_5_VLMoeProcessor, Exaone4_5_Processor, Glm46VProcessor,
                          HunYuanVLProcessor, HyperCLOVAXVisionV2Processor, Lfm3VlProcessor, MiniCPMV4_6Processor,
                          MiniCPMV4_7Processor, PaddleOCRVLProcessor, Qwen3VLProcessor, VideoLlama3Processor)
from transformers.processing_utils import ProcessorMixin

from .family_data import FamilyData
from ..families.glm.processor import GLM_VIDEO_IDS, GLM_VIDEO_TOKENS, glm_processor, with_video_markers
from .processors_vlm import conversation_class, named_tokenizer
from .templates import CONTENT, GENERATION, _GLM4V, _GLM_CONTENT, IMAGES, TEXTS, chatml

DATA: dict[str, FamilyData] = {}

GLM_TOKENS = {"image_token": ("<|image|>", "<|image_pad|>"), "video_token": ("<|video|>", "<|video_pad|>")}
GLM_IDS = {"image_token": "image_token_id", "video_token": "video_token_id"}

# GLM-4.5V / GLM-4.6V (non-thinking): [gMASK]<sop>, turns <|system|>\n / <|user|>\n, an answer
# <|assistant|>\n<think></think>\n + text (the hub template's empty reasoning block, which it also writes after the
# generation prompt with enable_thinking false), images <|begin_of_image|><|image|><|end_of_image|>. As GLM-4.1V's
# (templates._GLM4V), each answer ends with the tokenizer's eos token, the turn's labelled end (the hub format has
# no end-of-turn token).
_GLM46V = ("{{- '[gMASK]<sop>' -}}"
           "{%- for message in messages -%}"
           "{%- if message['role'] == 'assistant' -%}{{- '<|assistant|>\\n<think></think>\\n' -}}"
           "{%- else -%}{{- '<|' + message['role'] + '|>\\n' -}}{%- endif -%}"
           + _GLM_CONTENT +
           "{%- if message['role'] == 'assistant' -%}{{- eos_token -}}{%- endif -%}"
           "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<|assistant|>\\n<think></think>\\n'"))


def _glm_image_processor(cls_name: str):
    """``image_processor(config, min_pixels, max_pixels)`` of the PIL class ``cls_name`` of :mod:`transformers`,
    in the tower's patch, temporal patch and merge sizes."""
    def build(config, min_pixels: int, max_pixels: int):
        import transformers
        vision = config.vision_config
        return getattr(transformers, cls_name)(
            patch_size=vision.patch_size, temporal_patch_size=getattr(vision, "temporal_patch_size", 1),
            merge_size=vision.spatial_merge_size, size={"shortest_edge": min_pixels, "longest_edge": max_pixels})
    return build


def _image_only(base: type, model_type: str, video: bool = True):
    """``processor(config, tokenizer, image_processor)``: ``base`` (``video``: without its video processor,
    :func:`~.processors_vlm.conversation_class`) over the tokenizer with the family's markers named."""
    cls = conversation_class(base, model_type)

    def build(config, tokenizer, image_processor):
        kwargs = {"video_processor": None} if video else {}
        return cls(image_processor=image_processor, tokenizer=named_tokenizer(tokenizer, config), **kwargs)
    return build


def _glm(model_type: str, image_cls: str, template: str) -> FamilyData:
    return FamilyData(_glm_image_processor(image_cls), _image_only(Glm46VProcessor, model_type), template,
                      hub_image_token="<|image|>", tokens=GLM_TOKENS, config_ids=GLM_IDS, repeated=True,
                      pixel_bounded=True)


_GLM46V_CLASS = conversation_class(with_video_markers(Glm46VProcessor), "glm46v")


def _glm46v_processor(config, tokenizer, image_processor):
    """GLM-4.6V's processor with its torchvision-free video processor (families.glm.processor)."""
    return glm_processor(_GLM46V_CLASS, config, named_tokenizer(tokenizer, config), image_processor)


DATA["glm46v"] = FamilyData(_glm_image_processor("Glm46VImageProcessorPil"), _glm46v_processor, _GLM46V,
                            hub_image_token="<|image|>", tokens={**GLM_TOKENS, **GLM_VIDEO_TOKENS},
                            config_ids={**GLM_IDS, **GLM_VIDEO_IDS}, repeated=True, pixel_bounded=True)
DATA["glmga"] = _glm("glmga", "GlmgaImageProcessorPil", _GLM46V)
DATA["glm_ocr"] = _glm("glm_ocr", "Glm46VImageProcessorPil", _GLM4V)  # GLM-4.1V's turns, no reasoning block
DATA["cosmos3_omni"] = FamilyData(_glm_image_processor("Qwen2VLImageProcessorPil"),
                                  _image_only(Qwen3VLProcessor, "cosmos3_omni"), chatml(None),
                                  hub_image_token="<|image_pad|>", repeated=True, pixel_bounded=True)
class _Cosmos3EdgeProcessor(Cosmos3EdgeProcessor):
    """``Cosmos3EdgeProcessor`` returning ``mm_token_type_ids``, which ``Cosmos3EdgeModel`` requires with images
    (its ``get_rope_index`` reads them) and the stock class lists in ``model_input_names`` but does not return
    (it leaves ``return_mm_token_type_ids`` off, unlike Qwen-VL's and GLM's processors)."""

    return_mm_token_type_ids = True


DATA["cosmos3_edge"] = FamilyData(_glm_image_processor("Cosmos3EdgeImageProcessorPil"),
                                  _image_only(_Cosmos3EdgeProcessor, "cosmos3_edge"), chatml(None),
                                  hub_image_token="<|image_pad|>", repeated=True, pixel_bounded=True)

# PaddleOCR-VL: <|begin_of_sentence|> (the tokenizer's BOS, where it has one), a user turn "User: " + its images
# <|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|> + its text + "\n", a system turn its text + "\n", an answer
# "Assistant: " + text + the eos token (the hub writes its </s> separator there), the prompt "Assistant: ".
# <|IMAGE_START|>/<|IMAGE_END|> are plain text in a vocabulary without them (the Qwen2 one).
_PADDLEOCR_VL = ("{%- if bos_token -%}{{- bos_token -}}{%- endif -%}"
                 "{%- for message in messages -%}"
                 "{%- if message['role'] == 'assistant' -%}{{- 'Assistant: ' -}}" + TEXTS + "{{- eos_token -}}"
                 "{%- else -%}{%- if message['role'] == 'user' -%}{{- 'User: ' -}}{%- endif -%}" +
                 IMAGES.replace("IMAGE", "'<|IMAGE_START|>IMAGE_TOKEN<|IMAGE_END|>'") + TEXTS + "{{- '\\n' -}}"
                 "{%- endif -%}"
                 "{%- endfor -%}" + GENERATION.replace("PROMPT", "'Assistant: '"))
DATA["paddleocr_vl"] = FamilyData(_glm_image_processor("PaddleOCRVLImageProcessorPil"),
                                  _image_only(PaddleOCRVLProcessor, "paddleocr_vl", video=False), _PADDLEOCR_VL,
                                  hub_image_token="<|IMAGE_PLACEHOLDER|>",
                                  tokens={"image_token": ("<|IMAGE_PLACEHOLDER|>", "<|image_pad|>")},
                                  config_ids={"image_token": "image_token_id"}, repeated=True, pixel_bounded=True)

# EXAONE 4.0 / 4.5 (non-reasoning): turns [|system|] / [|user|] / [|assistant|] + content + [|endofturn|] + "\n",
# the prompt [|assistant|]; an image as <|vision_start|><|image_pad|><|vision_end|> (the placeholder its processor
# names by default, with the Qwen2 vision markers). [|endofturn|] is written as <|im_end|> in a vocabulary without
# it (templates.STAND_INS), so that the end of each answer is one special token and labelled.
_EXAONE = ("{%- for message in messages -%}"
           "{{- '[|' + message['role'] + '|]' -}}" +
           CONTENT.replace("IMAGE", "'<|vision_start|>IMAGE_TOKEN<|vision_end|>'") +
           "{{- '[|endofturn|]\\n' -}}"
           "{%- endfor -%}" + GENERATION.replace("PROMPT", "'[|assistant|]'"))
DATA["exaone4_5"] = FamilyData(_glm_image_processor("Qwen2VLImageProcessorPil"),
                               _image_only(Exaone4_5_Processor, "exaone4_5"), _EXAONE,
                               hub_image_token="<|image_pad|>", repeated=True, pixel_bounded=True)
DATA["llava_onevision1_5"] = FamilyData(_glm_image_processor("Qwen2VLImageProcessorPil"),
                                        _image_only(Exaone4_5_Processor, "llava_onevision1_5"), chatml(None),
                                        hub_image_token="<|image_pad|>", repeated=True, pixel_bounded=True)


def _video_llama_3_images(config, min_pixels: int, max_pixels: int):
    """``VideoLlama3ImageProcessorPil`` in the tower's patches, merged 2 x 2 (what the projector takes)."""
    from transformers import VideoLlama3ImageProcessorPil
    return VideoLlama3ImageProcessorPil(patch_size=config.vision_config.patch_size, merge_size=2,
                                        size={"shortest_edge": min_pixels, "longest_edge": max_pixels})


DATA["video_llama_3"] = FamilyData(_video_llama_3_images, _image_only(VideoLlama3Processor, "video_llama_3"),
                                   chatml(None, "'IMAGE_TOKEN\\n'"), hub_image_token="<|image_pad|>",
                                   repeated=True, pixel_bounded=True)

_ERNIE_TOKENS = {"image_token": ("<|IMAGE_PLACEHOLDER|>", "<|image_pad|>"),
                 "image_start_token": ("<|IMAGE_START|>", "<|vision_start|>"),
                 "image_end_token": ("<|IMAGE_END|>", "<|vision_end|>"),
                 "video_token": ("<|VIDEO_PLACEHOLDER|>", "<|video_pad|>"),
                 "video_start_token": ("<|VIDEO_START|>", "<|box_start|>"),
                 "video_end_token": ("<|VIDEO_END|>", "<|box_end|>")}
DATA["ernie4_5_vl_moe"] = FamilyData(_glm_image_processor("Ernie4_5_VLMoeImageProcessorPil"),
                                     _image_only(Ernie4_5_VLMoeProcessor, "ernie4_5_vl_moe"), _PADDLEOCR_VL,
                                     hub_image_token="<|IMAGE_PLACEHOLDER|>", tokens=_ERNIE_TOKENS,
                                     config_ids={name: f"{name}_id" for name in _ERNIE_TOKENS}, repeated=True,
                                     pixel_bounded=True)


def _omni_processor(class_name: str, model_type: str):
    """``processor(config, tokenizer, image_processor)`` for a Qwen Omni thinker: the stock class without a video
    processor, with a 128-bin ``WhisperFeatureExtractor`` (its check requires one), over the named tokenizer."""
    def build(config, tokenizer, image_processor):
        import transformers
        cls = conversation_class(getattr(transformers, class_name), model_type)
        return cls(image_processor=image_processor, video_processor=None,
                   feature_extractor=transformers.WhisperFeatureExtractor(feature_size=128),
                   tokenizer=named_tokenizer(tokenizer, config))
    return build


_OMNI_IDS = {"image_token": "image_token_id", "video_token": "video_token_id", "audio_token": "audio_token_id",
             "vision_bos_token": "vision_start_token_id", "vision_eos_token": "vision_end_token_id",
             "audio_bos_token": "audio_start_token_id", "audio_eos_token": "audio_end_token_id"}


def _omni_tokens(image: str, video: str, audio: str, vision: tuple[str, str], audio_marks: tuple[str, str]) -> dict:
    """The thinker's markers (hub token, Qwen2 token in the same slot of the vocabulary)."""
    return {"image_token": (image, "<|image_pad|>"), "video_token": (video, "<|video_pad|>"),
            "audio_token": (audio, "<|object_ref_start|>"), "vision_bos_token": (vision[0], "<|vision_start|>"),
            "vision_eos_token": (vision[1], "<|vision_end|>"),
            "audio_bos_token": (audio_marks[0], "<|object_ref_end|>"),
            "audio_eos_token": (audio_marks[1], "<|box_start|>")}


_OMNI_SYSTEM = ("You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
                "auditory and visual inputs, as well as generating text and speech.")
DATA["qwen2_5_omni_thinker"] = FamilyData(
    _glm_image_processor("Qwen2VLImageProcessorPil"), _omni_processor("Qwen2_5OmniProcessor", "qwen2_5_omni_thinker"),
    chatml(_OMNI_SYSTEM, "'<|vision_bos|>IMAGE_TOKEN<|vision_eos|>'"), hub_image_token="<|IMAGE|>",
    tokens=_omni_tokens("<|IMAGE|>", "<|VIDEO|>", "<|AUDIO|>", ("<|vision_bos|>", "<|vision_eos|>"),
                        ("<|audio_bos|>", "<|audio_eos|>")),
    config_ids=_OMNI_IDS, repeated=True, pixel_bounded=True)
DATA["qwen3_omni_moe_thinker"] = FamilyData(
    _glm_image_processor("Qwen2VLImageProcessorPil"),
    _omni_processor("Qwen3OmniMoeProcessor", "qwen3_omni_moe_thinker"), chatml(None),
    hub_image_token="<|image_pad|>",
    tokens=_omni_tokens("<|image_pad|>", "<|video_pad|>", "<|audio_pad|>", ("<|vision_start|>", "<|vision_end|>"),
                        ("<|audio_start|>", "<|audio_end|>")),
    config_ids=_OMNI_IDS, repeated=True, pixel_bounded=True)
DATA["lfm3_vl"] = FamilyData(_glm_image_processor("Qwen2VLImageProcessorPil"), _image_only(Lfm3VlProcessor, "lfm3_vl"),
                             chatml(None), hub_image_token="<|image_pad|>", repeated=True, pixel_bounded=True)
DATA["hyperclovax_vision_v2"] = FamilyData(_glm_image_processor("Qwen2VLImageProcessorPil"),
                                           _image_only(HyperCLOVAXVisionV2Processor, "hyperclovax_vision_v2"),
                                           chatml(None), hub_image_token="<|image_pad|>", repeated=True,
                                           pixel_bounded=True)


def _image_minicpm(base: type) -> type:
    """``base`` (``MiniCPMV4_6Processor`` or its 4.7 subclass) for images alone: the stock ``__init__`` reads its
    video processor's slicing settings (and that processor needs torchvision); here the video settings are left
    unset and images are processed exactly as by the stock class. The markers come from the tokenizer's names
    (:func:`~.processors_vlm.named_tokenizer`)."""
    def __init__(self, image_processor=None, tokenizer=None, video_processor=None, chat_template=None, **kwargs):
        ProcessorMixin.__init__(self, image_processor, tokenizer, None, chat_template=chat_template)
        self.slice_mode, self.video_slice_mode = image_processor.slice_mode, None
        self.default_use_image_id = image_processor.use_image_id
        self.image_token_divisor = 4 if image_processor.downsample_mode == "4x" else 16
        for name in ("image_token", "video_token", "image_start_token", "image_end_token", "slice_start_token",
                     "slice_end_token", "image_id_start_token", "image_id_end_token"):
            setattr(self, name, getattr(tokenizer, name))
        self.image_token_id, self.video_token_id = tokenizer.image_token_id, tokenizer.video_token_id
    return type(f"_Image{base.__name__}", (base,), {"__init__": __init__})


def _minicpm_images(config, min_pixels: int, max_pixels: int):
    """``MiniCPMV4_6ImageProcessorPil`` at the tower's side (``config.image_size``) in its patches, up to 4
    slices."""
    from transformers import MiniCPMV4_6ImageProcessorPil
    return MiniCPMV4_6ImageProcessorPil(scale_resolution=config.image_size, max_slice_nums=4,
                                        patch_size=config.vision_config.patch_size)


_MINICPM_TOKENS = {"image_token": ("<unk>", "<|image_pad|>"), "video_token": ("<video>", "<|video_pad|>"),
                   "image_start_token": ("<image>", "<|vision_start|>"),
                   "image_end_token": ("</image>", "<|vision_end|>"),
                   "slice_start_token": ("<slice>", "<|quad_start|>"),
                   "slice_end_token": ("</slice>", "<|quad_end|>"),
                   "image_id_start_token": ("<image_id>", "<|box_start|>"),
                   "image_id_end_token": ("</image_id>", "<|box_end|>")}
_MINICPM_IDS = {"image_token": "image_token_id", "video_token": "video_token_id"}
DATA["minicpmv4_6"] = FamilyData(_minicpm_images, _image_only(_image_minicpm(MiniCPMV4_6Processor), "minicpmv4_6"),
                                 chatml(None, "'IMAGE_TOKEN\\n'"), hub_image_token="<unk>", tokens=_MINICPM_TOKENS,
                                 config_ids=_MINICPM_IDS)
DATA["minicpmv4_7"] = FamilyData(_minicpm_images, _image_only(_image_minicpm(MiniCPMV4_7Processor), "minicpmv4_7"),
                                 chatml(None, "'IMAGE_TOKEN\\n'"), hub_image_token="<unk>", tokens=_MINICPM_TOKENS,
                                 config_ids={**_MINICPM_IDS, "image_start_token": "image_start_id",
                                             "image_end_token": "image_end_id", "slice_start_token": "slice_start_id",
                                             "slice_end_token": "slice_end_id"})

# HunYuan-VL: <｜hy_begin▁of▁sentence｜>, a user turn <｜hy_User｜> + content, an answer <｜hy_Assistant｜> + text + the
# eos token, a system turn its text + <｜hy_place▁holder▁no▁3｜>; an image as the tokenizer's image start, image and
# image end tokens, which HunYuanVLProcessor requires around each placeholder (here the Qwen2 vision markers stand in
# for the hub's, so the template names them directly). The <｜hy_...｜> markers are plain text in the Qwen2 vocabulary.
_HUNYUAN = ("{{- '<｜hy_begin▁of▁sentence｜>' -}}"
            "{%- for message in messages -%}"
            "{%- if message['role'] == 'user' -%}{{- '<｜hy_User｜>' -}}"
            "{%- elif message['role'] == 'assistant' -%}{{- '<｜hy_Assistant｜>' -}}{%- endif -%}" +
            CONTENT.replace("IMAGE", "'<|vision_start|>IMAGE_TOKEN<|vision_end|>'") +
            "{%- if message['role'] == 'assistant' -%}{{- eos_token -}}"
            "{%- elif message['role'] == 'system' -%}{{- '<｜hy_place▁holder▁no▁3｜>' -}}{%- endif -%}"
            "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<｜hy_Assistant｜>'"))


def _hunyuan_processor(config, tokenizer, image_processor):
    """``HunYuanVLProcessor`` (no video processor) over the named tokenizer."""
    cls = conversation_class(HunYuanVLProcessor, "hunyuan_vl")
    return cls(image_processor=image_processor, tokenizer=named_tokenizer(tokenizer, config))


def _hunyuan_images(config, min_pixels: int, max_pixels: int):
    from transformers import HunYuanVLImageProcessorPil
    vision = config.vision_config
    return HunYuanVLImageProcessorPil(patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
                                      size={"shortest_edge": min_pixels, "longest_edge": max_pixels})


DATA["hunyuan_vl"] = FamilyData(
    _hunyuan_images, _hunyuan_processor, _HUNYUAN, hub_image_token="<｜hy_place▁holder▁no▁102｜>",
    tokens={"image_token": ("<｜hy_place▁holder▁no▁102｜>", "<|image_pad|>"),
            "image_start_token": ("<｜hy_place▁holder▁no▁100｜>", "<|vision_start|>"),
            "image_end_token": ("<｜hy_place▁holder▁no▁101｜>", "<|vision_end|>")},
    config_ids={"image_token": "image_token_id", "image_start_token": "im_start_id", "image_end_token": "im_end_id"},
    repeated=True, pixel_bounded=True)
