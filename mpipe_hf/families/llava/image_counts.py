"""How many image (video) tokens a micro-batch's vision inputs give in each LLaVA-group family, counted on the host
as its tower and projector size their output: ``counter(model) -> count(raw)``, the argument of
:func:`~mpipe_hf.models.image_tokens.validate_counted_micro` (the counters several groups share live there)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ...models.image_tokens import tokens_per_image


def anyres_tokens(model: nn.Module):
    """LLaVA-NeXT(-Video)'s image tokens, as ``get_image_features`` packs each image (``image_sizes``): the base
    tile's :func:`~mpipe_hf.models.image_tokens.tokens_per_image`, then its anyres grid of tiles (transformers'
    ``get_anyres_image_grid_shape``) unpadded to the image's aspect (``unpad_image``, on the meta device), with
    ``image_newline`` after each line of it; ``None`` when the tower does not say."""
    from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image
    config = model.config
    per_tile, tile = tokens_per_image(config, model.model.vision_tower), config.vision_config.image_size
    side = tile // config.vision_config.patch_size
    newline = int(getattr(model.model, "image_newline", None) is not None)

    def image(height: int, width: int) -> int:
        rows, cols = get_anyres_image_grid_shape((height, width), config.image_grid_pinpoints, tile)
        h, w = unpad_image(torch.empty(1, rows * side, cols * side, device="meta"), [height, width]).shape[1:]
        return per_tile + h * (w + newline)
    return None if per_tile is None else (lambda raw: sum(image(h, w) for h, w in raw["image_sizes"].tolist()))


def onevision_images(model: nn.Module):
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


def onevision_videos(model: nn.Module):
    """LLaVA-OneVision's video tokens: per video (``pixel_values_videos`` ``(videos, frames, C, H, W)``) each
    frame's patches pooled to ``ceil(side / 2) ** 2`` (``apply_pooling``), and one ``image_newline``."""
    vision = model.config.vision_config
    per_frame = math.ceil(vision.image_size // vision.patch_size / 2) ** 2
    return lambda raw: raw["pixel_values_videos"].shape[0] * (raw["pixel_values_videos"].shape[1] * per_frame + 1)


def shuffled_tile_tokens(model: nn.Module):
    """Aya Vision: tiles (``pixel_values`` ``(tiles, C, H, W)``) x the tower's patch grid pixel-shuffled by
    ``downsample_factor`` (``(image_size / patch / factor) ** 2`` tokens a tile)."""
    config = model.config
    side = config.vision_config.image_size // config.vision_config.patch_size
    per_tile = (side // config.downsample_factor) ** 2
    return lambda raw: raw["pixel_values"].shape[0] * per_tile


def shuffled_tiles(model: nn.Module):
    """Cohere2-Vision: per tile (``pixel_values`` ``(tiles, C, H, W)``) the tower's ``(H / patch) x (W / patch)``
    patches pixel-shuffled by ``downsample_factor``."""
    patch, factor = model.config.vision_config.patch_size, model.config.downsample_factor

    def count(raw) -> int:
        tiles, _, height, width = raw["pixel_values"].shape
        return tiles * (height // patch // factor) * (width // patch // factor)
    return count


def aria_tokens(model: nn.Module):
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


def fastvit_tokens(model: nn.Module):
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


def pe_tokens(model: nn.Module):
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


def llama4_tokens(model: nn.Module):
    """Llama 4: each tile's patches (its pixels over ``patch_size``, both sides) times ``pixel_shuffle_ratio **
    2``, over the tiles of ``pixel_values`` ``(tiles, 3, H, W)``."""
    vision = model.config.vision_config
    return lambda raw: int(raw["pixel_values"].shape[0] * (raw["pixel_values"].shape[-2] // vision.patch_size)
                           * (raw["pixel_values"].shape[-1] // vision.patch_size) * vision.pixel_shuffle_ratio ** 2)


def unshuffled_grids(model: nn.Module):
    """LFM2-VL: per image its ``spatial_shapes`` patch grid ``(rows, cols)`` unshuffled by ``downsample_factor``
    to ``(rows / f) * (cols / f)`` tokens."""
    factor = model.config.downsample_factor
    return lambda raw: int((raw["spatial_shapes"] // factor).prod(-1).sum())


def _downsampled(side: int, patch: int) -> int:
    """A view's token grid side in Step3p7's tower: ``side / patch`` patches, then two stride-2, padding-1
    convolutions (each ``ceil(n / 2)``)."""
    return -(-(-(-(side // patch) // 2)) // 2)


def step3p7_tokens(model: nn.Module):
    """Step3p7: per image its global view's tokens (``pixel_values`` ``(images, C, S, S)``) and its crops'
    (``pixel_values_local`` ``(crops, C, s, s)``), each view ``_downsampled(side) ** 2``."""
    patch = model.config.vision_config.patch_size

    def count(raw) -> int:
        views = [raw["pixel_values"]] + ([raw["pixel_values_local"]] if "pixel_values_local" in raw else [])
        return sum(v.shape[0] * _downsampled(v.shape[-2], patch) * _downsampled(v.shape[-1], patch) for v in views)
    return count


def pooled_patch_tokens(model: nn.Module):
    """Molmo2: one token per row of ``image_token_pooling`` ``(tokens, pool)`` with a patch to pool (the adapter
    drops a row of -1 only)."""
    return lambda raw: int((raw["image_token_pooling"] >= 0).any(-1).sum())
