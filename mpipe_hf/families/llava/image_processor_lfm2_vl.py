"""LFM2-VL's image processor without torchvision: :class:`Lfm2VlImageProcessorNoTV` gives the outputs of
``transformers``' ``Lfm2VlImageProcessor`` (``models/lfm2_vl/image_processing_lfm2_vl.py``, 5.25; a torchvision
class with no PIL twin) with torch operations only.

The stock steps, per image: the size that keeps the image between ``min_image_tokens`` and ``max_image_tokens``
(after the ``downsample_factor`` pixel-unshuffle) in multiples of ``encoder_patch_size * downsample_factor``
(:func:`token_bounded_size`); an image over ``max_pixels_tolerance`` times that budget is cut into a grid of
``tile_size`` tiles (the aspect ratio nearest the image's among ``min_tiles``..``max_tiles`` tiles) plus a
thumbnail at that size, others are resized to it alone. Each tile or image is rescaled and normalised (the fused
``float32`` step of torchvision's backend), cut into ``encoder_patch_size`` patches flattened ``(p, p, C)``, and
padded with zeros to the processor's patch budget. The resize is torchvision's (``resize_frames`` of
:mod:`mpipe_hf.data.image_torch_ops`). Outputs: ``pixel_values`` ``(tiles, budget, p * p * 3)`` ``float32``,
``pixel_attention_mask`` ``(tiles, budget)`` ``int32`` and ``spatial_shapes`` ``(tiles, 2)`` (patch rows,
columns). ``tests/test_stock_recorded.py`` compares them with the stock class's recorded outputs.
"""

from __future__ import annotations

import math

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_transforms import split_to_tiles
from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling
from transformers.processing_utils import ImagesKwargs

from ...data.image_torch_ops import PilBackendAsStock, resize_frames


class Lfm2VlNoTVKwargs(ImagesKwargs, total=False):
    """The stock class's own settings (its ``Lfm2VlImageProcessorKwargs``)."""

    downsample_factor: int
    do_image_splitting: bool
    min_tiles: int
    max_tiles: int
    use_thumbnail: bool
    min_image_tokens: int
    max_image_tokens: int
    encoder_patch_size: int
    tile_size: int
    max_pixels_tolerance: float
    do_pad: bool
    return_row_col_info: bool


def token_bounded_size(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """``(height, width)`` in multiples of ``factor`` px near the image's, scaled into ``[min_pixels,
    max_pixels]`` (the stock ``smart_resize``; Python's ``round``, halves to even)."""
    h_bar, w_bar = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def tile_grid(height: int, width: int, min_tiles: int, max_tiles: int, tile: int) -> tuple[int, int]:
    """``(columns, rows)`` of tiles whose aspect ratio is nearest the image's (ties: the later grid when the image
    covers over half of its area), as the stock ``find_closest_aspect_ratio``."""
    grids = sorted({(w, h) for n in range(min_tiles, max_tiles + 1) for w in range(1, n + 1) for h in range(1, n + 1)
                    if min_tiles <= w * h <= max_tiles}, key=lambda x: x[0] * x[1])
    best, best_diff, aspect = (1, 1), float("inf"), width / height
    for grid in grids:
        diff = abs(aspect - grid[0] / grid[1])
        if diff < best_diff:
            best, best_diff = grid, diff
        elif diff == best_diff and width * height > 0.5 * tile * tile * grid[0] * grid[1]:
            best = grid
    return best


class Lfm2VlImageProcessorNoTV(PilBackendAsStock):
    """``Lfm2VlImageProcessor``'s outputs without torchvision (module docstring); its settings and defaults are the
    stock class's, so a checkpoint's ``preprocessor_config.json`` applies unchanged."""

    stock_class_name = "Lfm2VlImageProcessor"
    downsample_factor, do_image_splitting, min_tiles, max_tiles, use_thumbnail = 2, True, 2, 10, True
    min_image_tokens, max_image_tokens, encoder_patch_size, tile_size = 64, 256, 16, 512
    max_pixels_tolerance = 2.0
    do_resize, do_rescale, do_normalize, do_pad, return_row_col_info = True, True, True, True, False
    size = {"height": 512, "width": 512}
    resample = PILImageResampling.BILINEAR
    rescale_factor = 1 / 255
    image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
    valid_kwargs = Lfm2VlNoTVKwargs
    model_input_names = ["pixel_values", "pixel_attention_mask", "spatial_shapes"]

    def _tiles(self, image: torch.Tensor, o: dict) -> tuple[list[torch.Tensor], list[int], list[int]]:
        """One ``uint8`` ``(3, H, W)`` image -> its resized tiles (``(3, h, w)`` each), ``[rows, columns]`` and
        its single-tile (or thumbnail) size."""
        height, width = image.shape[-2:]
        patch, down, resample = o["encoder_patch_size"], o["downsample_factor"], o["resample"]
        factor, per_token = patch * down, (patch * down) ** 2
        new_h, new_w = token_bounded_size(height, width, factor, o["min_image_tokens"] * per_token,
                                          o["max_image_tokens"] * per_token)
        rounded = max(patch, round(height / factor) * factor) * max(patch, round(width / factor) * factor)
        large = rounded > o["max_image_tokens"] * per_token * o["max_pixels_tolerance"]
        if not (large and not o["min_tiles"] == o["max_tiles"] == 1):
            return [resize_frames(image, new_h, new_w, resample)], [1, 1], [new_h, new_w]
        cols, rows = tile_grid(height, width, o["min_tiles"], o["max_tiles"], o["tile_size"])
        grown = resize_frames(image[None], o["tile_size"] * rows, o["tile_size"] * cols, resample)
        tiles = list(split_to_tiles(grown, rows, cols)[0])
        if o["use_thumbnail"] and rows * cols != 1:
            tiles.append(resize_frames(image, new_h, new_w, resample))
        return tiles, [rows, cols], [new_h, new_w]

    def _patches(self, tile: torch.Tensor, o: dict, budget: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """One tile -> its normalised patches ``(budget or n, p * p * 3)``, the mask and ``[rows, columns]``."""
        x = tile.to(torch.float32)
        if o["do_normalize"]:
            scale = 1.0 / o["rescale_factor"] if o["do_rescale"] else 1.0
            mean = (torch.tensor(o["image_mean"]) * scale).view(-1, 1, 1)
            std = (torch.tensor(o["image_std"]) * scale).view(-1, 1, 1)
            x = x.sub(mean).div_(std)
        elif o["do_rescale"]:
            x = x * o["rescale_factor"]
        p = o["encoder_patch_size"]
        channels, h, w = x.shape
        flat = x.reshape(channels, h // p, p, w // p, p).permute(1, 3, 2, 4, 0).reshape((h // p) * (w // p), -1)
        mask = torch.ones(budget if o["do_pad"] else flat.shape[0], dtype=torch.int32)
        if o["do_pad"] and budget > flat.shape[0]:
            mask[flat.shape[0]:] = 0
            flat = torch.nn.functional.pad(flat, (0, 0, 0, budget - flat.shape[0]))
        return flat, mask, [h // p, w // p]

    def _preprocess(self, images: list, return_tensors=None, **o) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> ``pixel_values``,
        ``pixel_attention_mask`` and ``spatial_shapes`` (and ``image_rows`` / ``image_cols`` / ``image_sizes``
        with ``return_row_col_info``), module docstring.

        Raises:
            ValueError: ``min_tiles`` over ``max_tiles`` with splitting on.
        """
        if not o["do_image_splitting"]:
            o["min_tiles"] = o["max_tiles"] = 1
        elif o["min_tiles"] > o["max_tiles"]:
            raise ValueError("min_tiles must be less than or equal to max_tiles")
        budget = max(o["max_image_tokens"] * o["downsample_factor"] ** 2,
                     (o["tile_size"] // o["encoder_patch_size"]) ** 2 if o["do_image_splitting"] else 0)
        values, masks, shapes, rows, cols, sizes = [], [], [], [], [], []
        for image in images:
            tiles, grid, size = self._tiles(torch.from_numpy(image), o)
            rows.append(grid[0])
            cols.append(grid[1])
            sizes.append(size)
            for tile in tiles:
                flat, mask, shape = self._patches(tile, o, budget)
                values.append(flat)
                masks.append(mask)
                shapes.append(shape)
        data = {"pixel_values": torch.stack(values)}
        if o["do_pad"]:
            data.update(pixel_attention_mask=torch.stack(masks), spatial_shapes=torch.tensor(shapes))
        if o["return_row_col_info"]:
            data.update(image_rows=rows, image_cols=cols, image_sizes=sizes)
        return BatchFeature(data=data, tensor_type=return_tensors)
