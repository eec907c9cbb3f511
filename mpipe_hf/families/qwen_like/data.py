"""The Qwen-like group's data paths (:class:`~mpipe_hf.data.family_data.FamilyData` each): the stock processor
class of each family over its PIL image processor (Kimi K2.5's and MiniCPM-OCR's torch-operation ones, whose stock
classes need torchvision), the hub's chat template, and the family's markers on the Qwen2 special tokens that stand
in for them in the tiny vocabulary. Every family but MiniCPM's resizes images to between ``min_pixels`` and
``max_pixels`` in multiples of ``patch * merge`` px and writes an image as its placeholder repeated once per merged
patch (``image_grid_thw``), as Qwen-VL does:

- ``cosmos3_omni``: ``Qwen3VLProcessor`` (Cosmos3-Omni's model is Qwen3-VL's) over ``Qwen2VLImageProcessorPil`` in
  16-px patches, ChatML;
- ``cosmos3_edge``: ``Cosmos3EdgeProcessor`` (returning ``mm_token_type_ids``) over
  ``Cosmos3EdgeImageProcessorPil`` (16-px patches, no temporal patch), ChatML with the Qwen2 vision markers its
  processor names by default;
- ``paddleocr_vl``: ``PaddleOCRVLProcessor`` over ``PaddleOCRVLImageProcessorPil``, PaddleOCR-VL's
  ``User: ...\\nAssistant: ...`` turns;
- ``exaone4_5``: ``Exaone4_5_Processor`` over ``Qwen2VLImageProcessorPil`` (as transformers' auto classes pair
  them), EXAONE 4.0's ``[|user|]...[|endofturn|]`` turns; ``llava_onevision1_5``: the same classes (the pair
  transformers' auto classes name for it) in 14-px patches without a temporal patch, ChatML;
- ``ernie4_5_vl_moe``: ``Ernie4_5_VLMoeProcessor`` (``moe_mm_token_type_ids`` besides ``mm_token_type_ids``) over
  ``Ernie4_5_VLMoeImageProcessorPil``, PaddleOCR-VL's turns;
- ``lfm3_vl``, ``hyperclovax_vision_v2``: ``Lfm3VlProcessor`` / ``HyperCLOVAXVisionV2Processor`` over
  ``Qwen2VLImageProcessorPil`` (the pairs transformers' auto classes name), ChatML with the Qwen2 vision markers
  their processors name by default;
- ``minicpmv4_6``, ``minicpmv4_7``, ``minicpm_ocr``: ``MiniCPMV4_6Processor`` / ``MiniCPMV4_7Processor`` /
  ``MiniCPMOcrProcessor`` for images alone (:func:`~.processors.images_alone`) over ``MiniCPMV4_6ImageProcessorPil``
  (MiniCPM-OCR: :class:`~.image_processor_minicpm_ocr.MiniCPMOcrImageProcessorNoTV`, in the config's downsample
  mode): a ``scale_resolution``-px overview and up to 4 slices, each image's local id; ChatML with each image
  ``<unk>\\n``;
- ``hunyuan_vl``: ``HunYuanVLProcessor`` over ``HunYuanVLImageProcessorPil``, HunYuan's ``<｜hy_User｜>`` /
  ``<｜hy_Assistant｜>`` turns, each image wrapped in its start and end markers (which the processor requires);
- ``video_llama_3``: ``VideoLlama3Processor`` over ``VideoLlama3ImageProcessorPil`` (``image_merge_sizes``), ChatML
  with an image as its placeholder and a newline;
- ``kimi_k25``: ``Kimi_K25Processor`` without its video processor over
  :class:`~.image_processor_kimi_k25.KimiK25ImageProcessorNoTV` (the tower's patches, at most ``max_pixels`` px of
  them, never grown); an image is ``<|media_begin|>image<|media_content|>`` + ``<|media_pad|>`` x (patches / merge
  area) + ``<|media_end|>``, Kimi K2.5's turns (:data:`~.chat_templates.KIMI`); ``<|media_pad|>`` is the Qwen2
  vocabulary's ``<|image_pad|>``.
"""

from __future__ import annotations

from transformers import (Ernie4_5_VLMoeProcessor, Exaone4_5_Processor, HyperCLOVAXVisionV2Processor,
                          Lfm3VlProcessor, MiniCPMOcrProcessor, MiniCPMV4_6Processor, MiniCPMV4_7Processor,
                          PaddleOCRVLProcessor, Qwen3VLProcessor, VideoLlama3Processor)

from ...data.family_data import FamilyData
from ...data.templates import chatml
from ..qwen.data import grid_image_processor
from .chat_templates import EXAONE, HUNYUAN, KIMI, PADDLEOCR_VL
from .image_processor_kimi_k25 import KimiK25ImageProcessorNoTV
from .image_processor_minicpm_ocr import MiniCPMOcrImageProcessorNoTV
from .processors import (Cosmos3EdgeWithTypesProcessor, hunyuan_images, hunyuan_processor, image_only, images_alone,
                         kimi_images, kimi_processor, minicpm_images, minicpm_ocr_images, video_llama_3_images)

QWEN2_IMAGES = grid_image_processor("Qwen2VLImageProcessorPil")
"""The PIL image processor transformers' auto classes pair with several of these processors."""
PLAIN_CHATML = chatml(None)
"""ChatML with no default system turn, each image in the Qwen2 vision markers."""


def _repeated(image_processor, processor, template: str, hub_image_token: str = "<|image_pad|>",
              **extra) -> FamilyData:
    """A family writing each image as its placeholder repeated, its images resized between the pixel bounds."""
    return FamilyData(image_processor, processor, template, hub_image_token=hub_image_token, repeated=True,
                      pixel_bounded=True, **extra)


_ERNIE_TOKENS = {"image_token": ("<|IMAGE_PLACEHOLDER|>", "<|image_pad|>"),
                 "image_start_token": ("<|IMAGE_START|>", "<|vision_start|>"),
                 "image_end_token": ("<|IMAGE_END|>", "<|vision_end|>"),
                 "video_token": ("<|VIDEO_PLACEHOLDER|>", "<|video_pad|>"),
                 "video_start_token": ("<|VIDEO_START|>", "<|box_start|>"),
                 "video_end_token": ("<|VIDEO_END|>", "<|box_end|>")}
MINICPM_TOKENS = {"image_token": ("<unk>", "<|image_pad|>"), "video_token": ("<video>", "<|video_pad|>"),
                  "image_start_token": ("<image>", "<|vision_start|>"),
                  "image_end_token": ("</image>", "<|vision_end|>"),
                  "slice_start_token": ("<slice>", "<|quad_start|>"),
                  "slice_end_token": ("</slice>", "<|quad_end|>"),
                  "image_id_start_token": ("<image_id>", "<|box_start|>"),
                  "image_id_end_token": ("</image_id>", "<|box_end|>")}
"""MiniCPM-V's markers: (hub token, Qwen2 special token standing in)."""
IMAGE_VIDEO_IDS = {"image_token": "image_token_id", "video_token": "video_token_id"}
"""The image and video placeholders' ids where the config names them ``image_token_id`` and ``video_token_id``."""
_MINICPM_TEMPLATE = chatml(None, "'IMAGE_TOKEN\\n'")
_HUNYUAN_TOKENS = {"image_token": ("<｜hy_place▁holder▁no▁102｜>", "<|image_pad|>"),
                   "image_start_token": ("<｜hy_place▁holder▁no▁100｜>", "<|vision_start|>"),
                   "image_end_token": ("<｜hy_place▁holder▁no▁101｜>", "<|vision_end|>")}
_KIMI_TOKENS = {"image_token": ("<|media_pad|>", "<|image_pad|>"),
                "video_token": ("<|kimi_k25_video_placeholder|>", "<|video_pad|>")}

DATA: dict[str, FamilyData] = {
    "cosmos3_omni": _repeated(QWEN2_IMAGES, image_only(Qwen3VLProcessor, "cosmos3_omni"), PLAIN_CHATML),
    "cosmos3_edge": _repeated(grid_image_processor("Cosmos3EdgeImageProcessorPil"),
                              image_only(Cosmos3EdgeWithTypesProcessor, "cosmos3_edge"), PLAIN_CHATML),
    "paddleocr_vl": _repeated(grid_image_processor("PaddleOCRVLImageProcessorPil"),
                              image_only(PaddleOCRVLProcessor, "paddleocr_vl", video=False), PADDLEOCR_VL,
                              "<|IMAGE_PLACEHOLDER|>", tokens={"image_token": _ERNIE_TOKENS["image_token"]},
                              config_ids={"image_token": "image_token_id"}),
    "exaone4_5": _repeated(QWEN2_IMAGES, image_only(Exaone4_5_Processor, "exaone4_5"), EXAONE),
    "llava_onevision1_5": _repeated(QWEN2_IMAGES, image_only(Exaone4_5_Processor, "llava_onevision1_5"),
                                    PLAIN_CHATML),
    "video_llama_3": _repeated(video_llama_3_images, image_only(VideoLlama3Processor, "video_llama_3"),
                               chatml(None, "'IMAGE_TOKEN\\n'")),
    "ernie4_5_vl_moe": _repeated(grid_image_processor("Ernie4_5_VLMoeImageProcessorPil"),
                                 image_only(Ernie4_5_VLMoeProcessor, "ernie4_5_vl_moe"), PADDLEOCR_VL,
                                 "<|IMAGE_PLACEHOLDER|>", tokens=_ERNIE_TOKENS,
                                 config_ids={name: f"{name}_id" for name in _ERNIE_TOKENS}),
    "lfm3_vl": _repeated(QWEN2_IMAGES, image_only(Lfm3VlProcessor, "lfm3_vl"), PLAIN_CHATML),
    "hyperclovax_vision_v2": _repeated(QWEN2_IMAGES, image_only(HyperCLOVAXVisionV2Processor,
                                                                "hyperclovax_vision_v2"), PLAIN_CHATML),
    "minicpmv4_6": FamilyData(minicpm_images, image_only(images_alone(MiniCPMV4_6Processor), "minicpmv4_6"),
                              _MINICPM_TEMPLATE, hub_image_token="<unk>", tokens=MINICPM_TOKENS,
                              config_ids=IMAGE_VIDEO_IDS),
    "minicpmv4_7": FamilyData(minicpm_images, image_only(images_alone(MiniCPMV4_7Processor), "minicpmv4_7"),
                              _MINICPM_TEMPLATE, hub_image_token="<unk>", tokens=MINICPM_TOKENS,
                              config_ids={**IMAGE_VIDEO_IDS, "image_start_token": "image_start_id",
                                          "image_end_token": "image_end_id", "slice_start_token": "slice_start_id",
                                          "slice_end_token": "slice_end_id"}),
    "minicpm_ocr": FamilyData(minicpm_ocr_images, image_only(images_alone(MiniCPMOcrProcessor), "minicpm_ocr"),
                              _MINICPM_TEMPLATE, hub_image_token="<unk>", tokens=MINICPM_TOKENS,
                              config_ids=IMAGE_VIDEO_IDS, no_torchvision_images=MiniCPMOcrImageProcessorNoTV),
    "hunyuan_vl": _repeated(hunyuan_images, hunyuan_processor, HUNYUAN, "<｜hy_place▁holder▁no▁102｜>",
                            tokens=_HUNYUAN_TOKENS,
                            config_ids={"image_token": "image_token_id", "image_start_token": "im_start_id",
                                        "image_end_token": "im_end_id"}),
    "kimi_k25": FamilyData(kimi_images, kimi_processor, KIMI, "<|media_pad|>", tokens=_KIMI_TOKENS,
                           config_ids=IMAGE_VIDEO_IDS, repeated=True, no_torchvision_images=KimiK25ImageProcessorNoTV),
}
"""``model_type`` -> its data path."""
