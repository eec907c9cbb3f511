"""The data path of the LLaVA group (:class:`~mpipe_hf.data.family_data.FamilyData` each): the image processor, the
processor (:mod:`.processors`, :mod:`.processors_torch_ops`), the chat template (:mod:`.templates`) and the image
markers, each ``tokens`` entry ``{tokenizer attribute: (hub token, Qwen2 special token standing in)}``. FastVLM and
Perception-LM (timm towers) have none here: a checkpoint's stock processor serves them."""

from __future__ import annotations

from ...data.family_data import FamilyData
from . import processors as P
from . import processors_torch_ops as O
from . import templates as T
from .image_processor_cohere2_vision import Cohere2VisionImageProcessorNoTV
from .image_processor_lfm2_vl import Lfm2VlImageProcessorNoTV
from .image_processor_llama4 import Llama4ImageProcessorNoTV
from .image_processor_minimax_m3_vl import MiniMaxM3VLImageProcessorNoTV
from .image_processor_molmo2 import Molmo2ImageProcessorNoTV
from .image_processor_step3p7 import Step3p7ImageProcessorNoTV

IMAGE = {"image_token": ("<image>", "<|image_pad|>")}
VIDEO = {"video_token": ("<video>", "<|video_pad|>")}
IMAGE_ID = {"image_token": "image_token_id"}

DATA: dict[str, FamilyData] = {
    "llava": FamilyData(P.clip_images, P.llava, T.LLAVA, repeated=True, stock_classes=("LlavaProcessor",),
                        template_owner=True),
    "llava_next": FamilyData(P.anyres_images, P.llava_next, T.LLAVA_NEXT, tokens=IMAGE,
                             config_ids={"image_token": "image_token_index"}, repeated=True, always_ours=True,
                             template_owner=True),
    "llava_onevision": FamilyData(P.onevision_images, P.llava_onevision, T.LLAVA_ONEVISION, tokens={**IMAGE, **VIDEO},
                                  config_ids={"image_token": "image_token_index", "video_token": "video_token_index"},
                                  hub_video_token="<video>", videos=True, always_ours=True, template_owner=True),
    "vipllava": FamilyData(P.clip_images, P.vipllava, T.VIPLLAVA, tokens=IMAGE, config_ids=IMAGE_ID, repeated=True),
    "llava_next_video": FamilyData(P.anyres_images, P.llava_next_video, T.VICUNA, tokens={**IMAGE, **VIDEO},
                                   config_ids={**IMAGE_ID, "video_token": "video_token_id"}, repeated=True),
    "video_llava": FamilyData(P.video_llava_images, P.video_llava, T.VICUNA, tokens={**IMAGE, **VIDEO},
                              config_ids={**IMAGE_ID, "video_token": "video_token_id"}, repeated=True),
    "aya_vision": FamilyData(P.tiles, P.aya_vision, T.AYA, tokens={
        "image_token": ("<|IMG_PATCH|>", "<|image_pad|>"),
        "start_of_img_token": ("<|START_OF_IMG|>", "<|vision_start|>"),
        "end_of_img_token": ("<|END_OF_IMG|>", "<|vision_end|>"),
        "img_line_break_token": ("<|IMG_LINE_BREAK|>", "<|vision_pad|>")}, config_ids=IMAGE_ID),
    "aria": FamilyData(P.aria_images, P.aria, T.ARIA, "<|img|>", tokens=IMAGE, config_ids=IMAGE_ID, repeated=True),
    "cohere2_vision": FamilyData(O.cohere2_images, O.cohere2_vision, T.AYA, "<|IMG_PATCH|>", tokens={
        "image_token": ("<|IMG_PATCH|>", "<|image_pad|>"), "boi_token": ("<|START_OF_IMG|>", "<|vision_start|>"),
        "eoi_token": ("<|END_OF_IMG|>", "<|vision_end|>"),
        "img_line_break_token": ("<|IMG_LINE_BREAK|>", "<|vision_pad|>")}, config_ids=IMAGE_ID,
        no_torchvision_images=Cohere2VisionImageProcessorNoTV),
    "llama4": FamilyData(O.llama4_images, O.llama4, T.LLAMA4, "<|image|>", tokens={
        "image_token": ("<|image|>", "<|vision_pad|>"), "patch_token": ("<|patch|>", "<|image_pad|>"),
        "start_of_image_token": ("<|image_start|>", "<|vision_start|>"),
        "end_of_image_token": ("<|image_end|>", "<|vision_end|>"),
        "tile_x_separator_token": ("<|tile_x_separator|>", "<|box_start|>"),
        "tile_y_separator_token": ("<|tile_y_separator|>", "<|box_end|>")},
        config_ids={"patch_token": "image_token_index", "start_of_image_token": "boi_token_index",
                    "end_of_image_token": "eoi_token_index"}, no_torchvision_images=Llama4ImageProcessorNoTV),
    "lfm2_vl": FamilyData(O.lfm2_images, O.lfm2_vl, T.LFM2_VL, "<image>", tokens={
        "image_token": ("<image>", "<|image_pad|>"), "image_start_token": ("<|image_start|>", "<|vision_start|>"),
        "image_end_token": ("<|image_end|>", "<|vision_end|>"),
        "image_thumbnail_token": ("<|img_thumbnail|>", "<|vision_pad|>")}, config_ids=IMAGE_ID,
        no_torchvision_images=Lfm2VlImageProcessorNoTV),
    "molmo2": FamilyData(O.molmo2_images, O.molmo2, T.MOLMO2, "<|image|>", tokens={
        "image_token": ("<|image|>", "<|vision_pad|>"), "video_token": ("<|video|>", "<|video_pad|>"),
        "patch_token": ("<im_patch>", "<|image_pad|>"), "col_token": ("<im_col>", "<|quad_end|>"),
        "start_token": ("<im_start>", "<|vision_start|>"),
        "low_res_start_token": ("<low_res_im_start>", "<|quad_start|>"),
        "end_token": ("<im_end>", "<|vision_end|>"), "frame_start_token": ("<frame_start>", "<|box_start|>"),
        "frame_end_token": ("<frame_end>", "<|box_end|>"), "low_token": ("<im_low>", "<|object_ref_start|>")},
        config_ids={"patch_token": "image_patch_id", "start_token": "image_start_token_id",
                    "low_res_start_token": "low_res_image_start_token_id", "end_token": "image_end_token_id",
                    "frame_start_token": "frame_start_token_id", "frame_end_token": "frame_end_token_id"},
        no_torchvision_images=Molmo2ImageProcessorNoTV),
    "step3p7": FamilyData(O.step3p7_images, O.step3p7, T.STEP3P7, "<im_patch>", tokens={
        "image_token": ("<im_patch>", "<|image_pad|>"), "patch_start_token": ("<patch_start>", "<|quad_start|>"),
        "patch_end_token": ("<patch_end>", "<|quad_end|>"),
        "patch_newline_token": ("<patch_newline>", "<|vision_pad|>"),
        "im_start_token": ("<im_start>", "<|vision_start|>"), "im_end_token": ("<im_end>", "<|vision_end|>")},
        config_ids=IMAGE_ID, no_torchvision_images=Step3p7ImageProcessorNoTV),
    "minimax_m3_vl": FamilyData(O.minimax_images, O.minimax_m3_vl, T.MINIMAX, "]<]image[>[", tokens={
        "image_token": ("]<]image[>[", "<|image_pad|>"), "video_token": ("]<]video[>[", "<|video_pad|>"),
        "vision_start_token": ("]<]start of image[>[", "<|vision_start|>"),
        "vision_end_token": ("]<]end of image[>[", "<|vision_end|>")},
        config_ids={"image_token": "image_token_index", "video_token": "video_token_index"}, pixel_bounded=True,
        no_torchvision_images=MiniMaxM3VLImageProcessorNoTV),
}
