"""How many image (video) tokens a micro-batch's vision inputs give, counted on the host as a family's tower and
projector size their output, and :func:`validate_counted_micro`, the ``family.validate`` that compares that count
with the tokens in ``input_ids`` before the step (what stage 0 would otherwise find on the device, where it ends the
run). The counters shared by several family groups live here; one family's own counter lives in its package."""

from __future__ import annotations

import torch
from torch import nn

Tensors = dict[str, torch.Tensor]


def validate_counted_micro(counter, videos=None):
    """``family.validate`` for a family whose image-token count the host computes from a micro's vision inputs:
    ``counter(model) -> count(raw)`` (``None`` when the model does not say: no check); ``videos``: the same for
    its video tokens (``pixel_values_videos``, the model's ``video_token_id``). ``validate_micro(raw)`` raises
    ``ValueError`` when ``input_ids`` holds another count (what stage 0's :func:`~.family.check_count` would
    otherwise find on the device, where it ends the run)."""
    def build(model: nn.Module):
        checks = [("image", model.config.image_token_id, counter(model), "pixel_values")]
        if videos is not None:
            checks.append(("video", model.config.video_token_id, videos(model), "pixel_values_videos"))

        def validate_micro(raw: Tensors) -> None:
            for kind, token_id, count, pixels in checks:
                if count is None:
                    continue
                n_tokens = int((raw["input_ids"] == token_id).sum())
                n_feats = count(raw) if pixels in raw else 0
                if n_tokens != n_feats:
                    raise ValueError(f"{kind}-token count {n_tokens} (id {token_id} in input_ids) differs from "
                                     f"the {n_feats} {kind} features the micro-batch's {kind}s give")
        return validate_micro
    return build


def grid_tokens(model: nn.Module):
    """Qwen-style towers (Qwen-VL, GLM-4V and the towers built like theirs): the patches of ``image_grid_thw`` over ``spatial_merge_size ** 2``."""
    merge = model.config.vision_config.spatial_merge_size
    return lambda raw: int(raw["image_grid_thw"].prod(-1).sum()) // merge ** 2


def grid_video_tokens(model: nn.Module):
    """Qwen-VL videos: the patches of ``video_grid_thw`` over ``spatial_merge_size ** 2``."""
    merge = model.config.vision_config.spatial_merge_size
    return lambda raw: int(raw["video_grid_thw"].prod(-1).sum()) // merge ** 2


def tokens_per_image(config, vision_tower: nn.Module, drop_cls: bool | None = None) -> int | None:
    """Image tokens one LLaVA image expands to (``num_positions`` of the tower's embeddings, less the CLS token
    with strategy ``"default"``, or where ``drop_cls`` says so: Vip-LLaVA drops it always); ``None`` when the
    tower does not say."""
    embeddings = getattr(getattr(vision_tower, "vision_model", vision_tower), "embeddings", None)
    positions = getattr(embeddings, "num_positions", None)
    if positions is None:
        return None
    if drop_cls is None:
        drop_cls = config.vision_feature_select_strategy == "default"
    return positions - (1 if drop_cls else 0)


def tower_tokens(path: str = "model.vision_tower", drop_cls: bool | None = None):
    """``counter`` for :func:`validate_counted_micro`: images (``pixel_values.shape[0]``) x
    :func:`tokens_per_image` of the tower at ``path`` (LLaVA, Vip-LLaVA, Video-LLaVA's image tower); ``None`` when
    the tower does not say."""
    def counter(model: nn.Module):
        per_image = tokens_per_image(model.config, model.get_submodule(path), drop_cls)
        return None if per_image is None else (lambda raw: raw["pixel_values"].shape[0] * per_image)
    return counter


def patch_grid(pixels: torch.Tensor, patch_size) -> tuple[int, int]:
    """The patches ``(rows, cols)`` of a tile of ``pixels`` ``(..., H, W)`` in ``patch_size`` (an int, or a
    ``[h, w]`` pair) patches, as a stride-``patch_size`` convolution cuts it."""
    patch_h, patch_w = patch_size if isinstance(patch_size, (list, tuple)) else (patch_size, patch_size)
    return pixels.shape[-2] // patch_h, pixels.shape[-1] // patch_w


def pixel_shuffled_tokens(model: nn.Module):
    """InternVL, Qianfan-OCR: each tile's patch grid (:func:`patch_grid`) pixel-shuffled by ``downsample_ratio``
    on each side, as ``get_image_features``' ``pixel_shuffle`` does, over the tiles of ``pixel_values``."""
    config = model.config
    ratio, patch = config.downsample_ratio, config.vision_config.patch_size

    def count(raw: Tensors) -> int:
        rows, cols = patch_grid(raw["pixel_values"], patch)
        return raw["pixel_values"].shape[0] * int(rows * ratio) * int(cols * ratio)
    return count


def real_tiles(raw: Tensors) -> int:
    """The tiles (images) of ``pixel_values`` ``(B, tiles, C, h, w)`` that are not all zero: those Idefics2/3's
    ``get_image_features`` keeps (the processor pads each row's tiles with zeros)."""
    return int((raw["pixel_values"].flatten(0, 1) != 0).flatten(1).any(1).sum())

