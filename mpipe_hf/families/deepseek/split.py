"""The split declarations of the DeepSeek group.

DeepSeek-VL, its hybrid and Janus keep their towers and aligner as ``P``'s vision part; the load-time check counts
the low-resolution tower's patches per image. Janus's image-generation head (VQ-VAE, generation embeddings,
aligner and head) is a part the split never runs (``Family.unused``: frozen, saved with stage 0).
DeepSeek-OCR-2's features of an image are its local tiles', its global view's and the learned
``model.view_separator`` (a bare parameter of ``P``; :func:`ocr2_tokens`); its DeepSeek-V2 MoE text model adds no
load-balancing term to the loss (``DeepseekOcr2ForConditionalGeneration``), so none is added here
(``output_router_logits`` stays off).
"""

from __future__ import annotations

from torch import nn

from ...models.family import Family
from ...models.image_tokens import tower_tokens, validate_counted_micro

TOWER = ("model.vision_tower", "model.multi_modal_projector")
SIGLIP = ("model.vision_model", "model.aligner")
PATCHES = validate_counted_micro(tower_tokens("model.vision_model", drop_cls=False))


def ocr2_tokens(model: nn.Module):
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


FAMILIES: dict[str, Family] = {
    "deepseek_vl": Family(vision=SIGLIP, validate=PATCHES),
    "deepseek_vl_hybrid": Family(vision=("model.high_res_vision_model", "model.high_res_vision_neck",
                                         "model.high_res_vision_proj", "model.high_res_vision_alpha") + SIGLIP,
                                 image_inputs=("pixel_values", "high_res_pixel_values"), validate=PATCHES),
    "janus": Family(vision=SIGLIP, unused=("model.vqmodel", "model.generation_embeddings",
                                           "model.generation_aligner", "model.generation_head"),
                    validate=PATCHES),
    "deepseek_ocr2": Family(vision=TOWER + ("model.view_separator",),
                            image_inputs=("pixel_values", "pixel_values_local", "num_local_patches"),
                            validate=validate_counted_micro(ocr2_tokens)),
}

REFUSED: dict[str, str] = {}
