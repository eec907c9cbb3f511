"""The llava_like families added in issue 38: declarations (:class:`~.family.Family`) and refusals
(their tiny configs: :mod:`.tiny_llava_like`, gathered in :mod:`.tiny_all`).

Each declaration is read from transformers' own surface, as :mod:`.families` does: where the model keeps its
tower and projector, the keys its ``get_image_features`` takes, and what its ``forward`` adds around the decoder
layers. ShieldGemma 2 is Gemma 3's model class under its own config, so it takes Gemma 3's declaration.
LLaVA-NeXT-Video and Video-LLaVA are split on their image path; their video inputs are refused at load
(:func:`refuse_modalities`), and Video-LLaVA's video tower, like Janus's image-generation head (VQ-VAE,
generation embeddings, aligner and head), is a part the split never runs (``Family.unused``: frozen, saved with
stage 0). Aya Vision's conditional model scales its logits by the text config's ``logit_scale``
(``Family.logit_scale``). PP-Chart2Table is GOT-OCR2's model class under its own config. Idefics2 is Idefics3's
layout (``model.vision_model``, ``model.connector``, ``model.text_model``) with a Perceiver resampler in the
connector: a fixed ``resampler_n_latents`` tokens per real image. DeepSeek-OCR-2's features of an image are its
local tiles', its global view's and the learned ``model.view_separator`` (a bare parameter of ``P``); its
DeepSeek-V2 MoE text model adds no load-balancing term to the loss (``DeepseekOcr2ForConditionalGeneration``), so
none is added here (``output_router_logits`` stays off, as for ``mistral4``).

LLaVA-OneVision (declared in :mod:`.families` for its images) takes videos here: its ``get_video_features`` (the
tower per frame, the projector, ``apply_pooling`` 2 x 2 and ``image_newline`` after each video) is ``P``'s second
vision call, as its ``forward`` makes it, and the load-time check counts its image tokens (``get_image_features``'
anyres packing) and video tokens (docs/video.md).

FastVLM and Perception-LM (:data:`TIMM_FAMILIES`) are LLaVA's layout around a timm tower (``TimmWrapperModel``):
FastVLM's FastViT-HD gives one token per cell of its 64 x downsampled feature map; Perception-LM's ViT gives each
tile's patches (CLS dropped), average-pooled ``projector_pooling_ratio`` x on each side; its video inputs (the same
tower over frames, at ``video_token_id``) are refused at load. Gemma 3n (:mod:`.families_gemma3n`, a timm
MobileNet-V5 tower and a text model with AltUp streams) is registered beside them. Their model needs timm and
torchvision, which CI's CPU torch cannot import: ``scripts/check/check_timm_families.py`` checks them where both import.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from .families import (FAMILIES as _BASE, TOWER, _pixtral_tokens, anyres_tokens, patch_grid, pixel_shuffled_tokens,
                       real_tiles, tower_tokens, validate_counted_micro)
from .families_gemma3n import GEMMA3N
from .families_llava_like_tv import FAMILIES as _TV
from .family import Family

Tensors = dict


def _tile_tokens(model) -> int:
    """Tokens per tile of a tower pixel-shuffled by ``downsample_factor`` (Aya Vision)."""
    config = model.config
    side = config.vision_config.image_size // config.vision_config.patch_size
    return (side // config.downsample_factor) ** 2


def _sam_conv_tokens(model):
    """GOT-OCR2, PP-Chart2Table: each tile's SAM patch grid (:func:`~.families.patch_grid`) halved, rounding up,
    on each side by each of the projector's two stride-2 convolutions (kernel 3, padding 1), over the tiles."""
    patch = model.config.vision_config.patch_size

    def count(raw) -> int:
        rows, cols = (-(-(-(-side // 2)) // 2) for side in patch_grid(raw["pixel_values"], patch))
        return raw["pixel_values"].shape[0] * rows * cols
    return count


def _resampled_tokens(model):
    """Idefics2: real images (:func:`~.families.real_tiles`) x the Perceiver's ``resampler_n_latents``."""
    latents = model.config.perceiver_config.resampler_n_latents
    return lambda raw: real_tiles(raw) * latents


def _ocr2_tokens(model):
    """DeepSeek-OCR-2, as ``DeepseekOcr2Processor._get_num_image_tokens`` counts them: per image its global view's
    queries, each local tile's queries, and one view separator. A view's queries are what the tower takes for its
    size (``DeepseekOcr2VisionModel.forward``): the 144 of ``query_768_resolution`` when the SAM grid, downsampled
    4 x by two stride-2 convolutions, has at most 144 patches, else the 256 of ``query_1024_resolution``."""
    tower, patch = model.model.vision_tower, model.config.vision_config.sam_config.patch_size
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    small, large = tower.query_768_resolution.num_embeddings, tower.query_1024_resolution.num_embeddings

    def queries(pixels) -> int:
        h, w = (-(-(side // patch) // 4) for side in pixels.shape[-2:])
        return small if h * w <= small else large

    def count(raw) -> int:
        local = raw.get("pixel_values_local")
        tiles = local.shape[0] * queries(local) if local is not None and local.numel() else 0
        return raw["pixel_values"].shape[0] * (queries(raw["pixel_values"]) + 1) + tiles
    return count


def _aria_tokens(model):
    """Aria: each crop (``pixel_values`` ``(crops, C, H, W)``) pooled by the projector's cross-attention to
    ``projector_patch_to_query_dict[patches]`` queries, ``patches`` the crop's ``(H // patch) * (W // patch)``.

    Raises:
        ValueError: (from the count) a crop size whose patches the table lacks (the projector raises then).
    """
    table, patch = model.config.projector_patch_to_query_dict, model.config.vision_config.patch_size

    def count(raw) -> int:
        height, width = raw["pixel_values"].shape[-2:]
        patches = (height // patch) * (width // patch)
        if patches not in table:
            raise ValueError(f"aria: a {height} x {width} crop has {patches} patches, which the projector's "
                             f"projector_patch_to_query_dict ({sorted(table)}) does not pool")
        return raw["pixel_values"].shape[0] * table[patches]
    return count


def _onevision_images(model):
    """LLaVA-OneVision's image tokens, as ``get_image_features`` packs each image (``image_sizes``): the base
    tile's patches, then, for an image alone in its row (``batch_num_images``), its anyres grid unpadded to the
    image's aspect (transformers' ``get_anyres_image_grid_shape`` and ``unpad_image``, on the meta device), shrunk
    where it holds more than ``anyres_max_N`` tiles' patches, a newline a line; an image among several, one
    newline."""
    from transformers.models.llava_onevision.modeling_llava_onevision import get_anyres_image_grid_shape, unpad_image
    config = model.config
    tile = config.vision_config.image_size
    side = tile // config.vision_config.patch_size
    most = int(config.vision_aspect_ratio.strip("anyres_max_"))

    def image(height: int, width: int) -> int:
        rows, cols = get_anyres_image_grid_shape((height, width), config.image_grid_pinpoints, tile)
        grid = unpad_image(torch.empty(1, rows * side, cols * side, device="meta"), [height, width])
        h, w = grid.shape[1:]
        ratio = math.sqrt(h * w / (most * side ** 2))
        if ratio > 1.1:
            h, w = int(h // ratio), int(w // ratio)
        return side * side + h * (w + 1)

    def count(raw) -> int:
        sizes = raw["image_sizes"].tolist()
        per_row = raw.get("batch_num_images")
        alone = [True] * len(sizes) if per_row is None else [n == 1 for n in per_row.tolist() for _ in range(n)]
        return sum(image(h, w) if one else side * side + 1 for (h, w), one in zip(sizes, alone))
    return count


def _onevision_videos(model):
    """LLaVA-OneVision's video tokens: per video (``pixel_values_videos`` ``(videos, frames, C, H, W)``) each
    frame's patches pooled to ``ceil(side / 2) ** 2`` (``apply_pooling``), and one ``image_newline``."""
    vision = model.config.vision_config
    per_frame = math.ceil(vision.image_size // vision.patch_size / 2) ** 2
    return lambda raw: raw["pixel_values_videos"].shape[0] * (raw["pixel_values_videos"].shape[1] * per_frame + 1)


def _fastvit_tokens(model):
    """FastVLM: per image (``pixel_values`` ``(images, C, H, W)``) the timm FastViT's last feature map, ``H`` and
    ``W`` each halved (rounding up: stride-2 convolutions with padding) ``log2`` of the tower's total reduction
    (``feature_info``: 64 for FastViT-HD) times, one token a position."""
    steps = int(math.log2(model.model.vision_tower.timm_model.feature_info[-1]["reduction"]))

    def side(n: int) -> int:
        for _ in range(steps):
            n = -(-n // 2)
        return n
    return lambda raw: raw["pixel_values"].shape[0] * side(raw["pixel_values"].shape[-2]) * side(
        raw["pixel_values"].shape[-1])


def _pe_tokens(model):
    """Perception-LM: per tile (``pixel_values`` ``(images, tiles, C, H, W)``) the timm ViT's patch grid (its
    ``patch_embed.patch_size``; the CLS token dropped, ``vision_use_cls_token``), a square of side ``s``, pooled
    to ``(s // projector_pooling_ratio) ** 2`` tokens (the projector's adaptive average pooling)."""
    patch = model.model.vision_tower.timm_model.patch_embed.patch_size
    ratio = model.config.projector_pooling_ratio

    def count(raw) -> int:
        pixels = raw["pixel_values"]
        patches = (pixels.shape[-2] // patch[0]) * (pixels.shape[-1] // patch[1])
        per_tile = (math.isqrt(patches) // ratio) ** 2 if ratio > 1 else patches
        return math.prod(pixels.shape[:-3]) * per_tile
    return count


def refuse_modalities(keys: dict[str, str], inner=None):
    """``Family.validate`` that refuses a micro-batch carrying any of ``keys`` (``{raw key: modality}``, e.g.
    ``{"pixel_values_videos": "video"}``) with a ``ValueError`` naming the modality, then runs ``inner`` (another
    ``validate``) when given: the family's image path is what is split."""
    def build(model):
        check = inner(model) if inner is not None else None
        model_type = model.config.model_type

        def validate_micro(raw: Tensors) -> None:
            for key, modality in keys.items():
                if key in raw:
                    raise ValueError(f"{model_type}: {modality} inputs ({key!r}) are not supported; only its image "
                                     f"path is split (send images as 'pixel_values')")
            if check is not None:
                check(raw)
        return validate_micro
    return build


_SAM = validate_counted_micro(_sam_conv_tokens)
_IMAGE_TOWER = validate_counted_micro(tower_tokens("model.image_tower"))
_PATCHES = validate_counted_micro(tower_tokens("model.vision_model", drop_cls=False))
VIDEOS = {"pixel_values_videos": "video"}

FAMILIES: dict[str, Family] = {
    "vipllava": Family(vision=TOWER, validate=validate_counted_micro(tower_tokens(drop_cls=True))),
    "shieldgemma2": replace(_BASE["gemma3"], checkpoint=("ShieldGemma2ForImageClassification", "model")),
    "aya_vision": Family(vision=TOWER, logit_scale=True,
                         validate=validate_counted_micro(lambda m: (lambda raw, n=_tile_tokens(m):
                                                                    raw["pixel_values"].shape[0] * n))),
    "qianfan_ocr": Family(vision=TOWER, validate=validate_counted_micro(pixel_shuffled_tokens)),
    "got_ocr2": Family(vision=TOWER, validate=_SAM),
    "pp_chart2table": Family(vision=TOWER, validate=_SAM),
    "llava_next_video": Family(vision=TOWER + ("model.image_newline",), image_inputs=("pixel_values", "image_sizes"),
                               validate=refuse_modalities(VIDEOS, validate_counted_micro(anyres_tokens))),
    "video_llava": Family(vision=("model.image_tower", "model.multi_modal_projector"),
                          unused=("model.video_tower",), validate=refuse_modalities(VIDEOS, _IMAGE_TOWER)),
    "janus": Family(vision=("model.vision_model", "model.aligner"),
                    unused=("model.vqmodel", "model.generation_embeddings", "model.generation_aligner",
                            "model.generation_head"),
                    validate=validate_counted_micro(tower_tokens("model.vision_model", drop_cls=False))),
    "deepseek_vl": Family(vision=("model.vision_model", "model.aligner"), validate=_PATCHES),
    "deepseek_vl_hybrid": Family(vision=("model.high_res_vision_model", "model.high_res_vision_neck",
                                         "model.high_res_vision_proj", "model.high_res_vision_alpha",
                                         "model.vision_model", "model.aligner"),
                                 image_inputs=("pixel_values", "high_res_pixel_values"), validate=_PATCHES),
    "aria": Family(vision=TOWER, image_inputs=("pixel_values", "pixel_mask"),
                   validate=validate_counted_micro(_aria_tokens)),
    "idefics2": replace(_BASE["idefics3"], validate=validate_counted_micro(_resampled_tokens)),
    "deepseek_ocr2": Family(vision=TOWER + ("model.view_separator",),
                            image_inputs=("pixel_values", "pixel_values_local", "num_local_patches"),
                            validate=validate_counted_micro(_ocr2_tokens)),
    "lighton_ocr": Family(vision=("model.vision_encoder", "model.vision_projection"),
                          image_inputs=("pixel_values", "image_sizes"),
                          validate=validate_counted_micro(_pixtral_tokens)),
}
FAMILIES["llava_onevision"] = replace(_BASE["llava_onevision"], video_inputs=("pixel_values_videos",),
                                      validate=validate_counted_micro(_onevision_images, _onevision_videos))
FAMILIES.update(_TV)  # the families whose processors need torchvision (their own module)
# the families whose vision tower is a timm model (TimmWrapperModel), kept apart from FAMILIES (whose tiny models
# every test builds): declared without importing timm, registered beside them; building their model needs timm and
# torchvision (materialize.require_timm); scripts/check/check_timm_families.py checks their split where both import
TIMM_FAMILIES: dict[str, Family] = {
    "fast_vlm": Family(vision=TOWER, validate=validate_counted_micro(_fastvit_tokens)),
    "perception_lm": Family(vision=TOWER, validate=refuse_modalities(VIDEOS, validate_counted_micro(_pe_tokens))),
    "gemma3n": GEMMA3N,  # a timm MobileNet-V5 tower; its text model's AltUp streams: .gemma3n_altup
}
# model_type -> why it cannot be split, in the user's terms
REFUSED: dict[str, str] = {
    "ovis2": "its front puts the visual embedding table's indicator embeddings at the visual indicator tokens besides "
             "the image features at the image tokens; the split's stage-0 front places image features only",
    "fuyu": "it has no vision tower: image patches are embedded by a linear layer and gathered into each row at "
            "'image_patches_indices', and its Persimmon text model ends in 'final_layernorm', not 'norm'",
}
