"""The split declarations of the Qwen-like group (:class:`~mpipe_hf.models.family.Family` each) and its refusals.

- Cosmos3-Omni: ``Qwen3VLModel`` with DeepStack under another name (the Qwen group's :data:`~..qwen.split.DEEPSTACK`);
- M-RoPE families with towers of their own, positions from their ``get_rope_index`` on the host
  (:func:`rope_family`): PaddleOCR-VL, Cosmos3-Edge, ERNIE 4.5 VL (:class:`~.stages.TokenTypeStage`), MiniCPM-V 4.7
  (:func:`~.rope.canvas_host_inputs`), HunYuan-VL (XD-RoPE, :func:`~.rope.xdrope_host_inputs`);
- 1-D positions: EXAONE 4.5, LLaVA-OneVision-1.5, VideoLLaMA3, MiniCPM-V 4.6, MiniCPM-OCR (MiniCPM-V 4.6's model
  code), LFM3-VL (:class:`~.stages.Lfm3Stage`), HyperCLOVAX-Vision (:class:`~.stages.MupStage`) and Kimi K2.5 (a
  MoonViT tower before a DeepSeek-V3 text model).

Each ``validate`` counts a micro's image tokens on the host from its vision inputs, as the family's tower and
projector size their output (:func:`~mpipe_hf.models.image_tokens.validate_counted_micro`).
"""

from __future__ import annotations

from torch import nn

from ...models.family import Family
from ...models.image_tokens import grid_tokens, validate_counted_micro
from ..qwen.split import DEEPSTACK
from .rope import canvas_host_inputs, rope_host_inputs, xdrope_host_inputs, xdrope_stage
from .stages import MOE_TYPES, Lfm3Stage, MupStage, TokenTypeStage


def rope_family(vision: tuple[str, ...], **extra) -> Family:
    """An M-RoPE family (positions from ``get_rope_index`` on the host, :func:`~.rope.rope_host_inputs`) whose
    ``get_image_features(pixel_values, image_grid_thw)`` runs ``vision``; the grid goes to the device with the
    pixels (the tower builds its positions from it there, as in the unsplit model)."""
    return Family(vision=vision, image_inputs=("pixel_values", "image_grid_thw"), stage0_inputs=("position_ids",),
                  positions="host", host=rope_host_inputs, validate=validate_counted_micro(grid_tokens), **extra)


def merged_tokens(model: nn.Module):
    """VideoLLaMA3: each image's patches over its own ``image_merge_sizes ** 2``."""
    return lambda raw: int((raw["image_grid_thw"].prod(-1) // raw["image_merge_sizes"] ** 2).sum())


def minicpm_tokens(model: nn.Module):
    """MiniCPM-V 4.6 / 4.7, MiniCPM-OCR: each image's patch grid (``target_sizes``, in patches) halved on each side
    by the tower's window merger (not with ``downsample_mode`` ``"4x"``, as ``get_image_features`` skips it), then
    divided by ``merge_kernel_size`` ``merger_times`` times by the merger (each round's floor, as its views)."""
    config = model.config
    halve, (merge_h, merge_w) = config.downsample_mode != "4x", config.merge_kernel_size

    def image(height: int, width: int) -> int:
        if halve:
            height, width = height // 2, width // 2
        for _ in range(config.merger_times):
            height, width = height // merge_h, width // merge_w
        return height * width
    return lambda raw: sum(image(h, w) for h, w in raw["target_sizes"].tolist())


def separated_rows_tokens(model: nn.Module):
    """HunYuan-VL: each image's features hold a separator after every row of merged patches and the image's begin
    and end embeddings, all at image tokens: ``h * (w + 1) + 2`` for the ``h x w`` merged patches of
    ``image_grid_thw``."""
    merge = model.config.vision_config.spatial_merge_size

    def count(raw):
        merged = raw["image_grid_thw"][:, 1:] // merge
        return int((merged[:, 0] * (merged[:, 1] + 1) + 2).sum())
    return count


def kernel_merged_tokens(model: nn.Module):
    """Kimi K2.5: each image's patches (``image_grid_thw``'s ``h * w``) over the merge kernel's area."""
    kernel = model.config.vision_config.merge_kernel_size
    return lambda raw: int(raw["image_grid_thw"][:, 1:].prod(-1).sum()) // (kernel[0] * kernel[1])


GRID_1D = dict(image_inputs=("pixel_values", "image_grid_thw"), validate=validate_counted_micro(grid_tokens))
"""A 1-D-position family whose tower takes ``image_grid_thw`` beside the pixels (its own 2-D rotary only)."""
MINICPM = dict(vision=("model.vision_tower", "model.merger"), image_inputs=("pixel_values", "target_sizes"),
               validate=validate_counted_micro(minicpm_tokens))
"""MiniCPM-V's tower and merger over ``target_sizes`` (each view's patch grid)."""

FAMILIES: dict[str, Family] = {
    "cosmos3_omni": Family(**DEEPSTACK),
    "paddleocr_vl": rope_family(("model.visual", "model.projector")),
    "cosmos3_edge": rope_family(("model.visual", "model.projector")),
    "exaone4_5": Family(vision=("model.visual",), **GRID_1D),
    "llava_onevision1_5": Family(vision=("model.visual",), **GRID_1D),
    "video_llama_3": Family(vision=("model.vision_model", "model.projector"),
                            image_inputs=("pixel_values", "image_grid_thw", "image_merge_sizes"),
                            validate=validate_counted_micro(merged_tokens)),
    "ernie4_5_vl_moe": rope_family(("model.vision_tower", "model.resampler_model"), mask_inputs=(MOE_TYPES,),
                                   stage=lambda model: TokenTypeStage),
    "lfm3_vl": Family(vision=("model.vision_tower", "model.multi_modal_projector"), norm="embedding_norm",
                      stage=lambda model: Lfm3Stage, **GRID_1D),
    "hyperclovax_vision_v2": Family(vision=("model.vision_model", "model.projector"),
                                    stage=lambda model: MupStage, **GRID_1D),
    "minicpmv4_6": Family(**MINICPM),
    "minicpm_ocr": Family(**MINICPM),  # MiniCPM-V 4.6's model code under another name
    "minicpmv4_7": Family(**MINICPM, stage0_inputs=("position_ids",), positions="host", host=canvas_host_inputs),
    "hunyuan_vl": Family(vision=("model.vision_tower",), image_inputs=("pixel_values", "image_grid_thw"),
                         stage0_inputs=("position_ids",), positions="host", host=xdrope_host_inputs,
                         stage=xdrope_stage, validate=validate_counted_micro(separated_rows_tokens)),
    "kimi_k25": Family(vision=("model.vision_tower", "model.mm_projector"),
                       image_inputs=("pixel_values", "image_grid_thw"),
                       validate=validate_counted_micro(kernel_merged_tokens)),
}

REFUSED: dict[str, str] = {
    "ovis2_5": "Ovis2.5 puts learned indicator embeddings from its projector's visual vocabulary at each image's "
               "start and end tokens besides the image features at the image tokens (Ovis2_5Model."
               "_merge_visual_features); the split's stage-0 front places features at image tokens only, so those "
               "two embeddings (and their gradient to the projector) have no path across the preprocess boundary",
    "hy_v4_vl": "not declared yet: multi-stream hyper-connections (hc_head collapses the streams before the norm) "
                "and DSA indexed attention",
}
