"""Unlimited-OCR's image processor without torchvision: :class:`UnlimitedOcrImageProcessorNoTV` gives the outputs
of ``transformers``' ``UnlimitedOcrImageProcessor`` (``models/unlimited_ocr/image_processing_unlimited_ocr.py``,
5.25; a torchvision class with no PIL twin) with torch operations only.

The stock steps, per image: with ``crop_to_patches`` and a side over ``tile_size``, local tiles: the grid of
``min_patches`` to ``max_patches`` tiles nearest the image's aspect ratio (:func:`tile_grid`), the image resized
to it and cut row by row; then a global view of side ``max(size)``: resized to that square directly when
``crop_to_patches`` is off and the side is at most ``maximum_pad_value``, else resized at its aspect ratio (sides
rounded) and padded, centred, to a square with ``background_color``. Each view is rescaled and normalised in
``float32`` (the backend's fused step). The resize is torchvision's (``resize_frames`` of
:mod:`mpipe_hf.data.image_torch_ops`, bicubic on the ``uint8`` image). Outputs: ``pixel_values`` ``(images, 3, side, side)``, ``pixel_values_local``
``(tiles, 3, tile, tile)`` where an image has tiles, ``num_local_patches`` (tiles per image, 0 without) and
``patches_grid`` (``[columns, rows]`` per image, ``[1, 1]`` without tiles).
``tests/test_stock_recorded.py`` compares them with the stock class's recorded outputs.
"""

from __future__ import annotations

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling
from transformers.processing_utils import ImagesKwargs

from ...data.image_torch_ops import PilBackendAsStock, pad_to_square, rescale_and_normalize, resize_frames


class UnlimitedOcrNoTVKwargs(ImagesKwargs, total=False):
    """The stock class's own settings (its docstring): ``crop_to_patches``, ``min_patches``, ``max_patches``,
    ``tile_size``, ``background_color`` and ``maximum_pad_value``."""

    crop_to_patches: bool
    min_patches: int
    max_patches: int
    tile_size: int
    background_color: list[int]
    maximum_pad_value: int


def tile_grid(height: int, width: int, tile: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """``(columns, rows)`` of an image's tiles, the stock ``get_optimal_tiled_canvas``: of the grids of
    ``min_tiles`` to ``max_tiles`` tiles (by tile count), the one whose ``columns / rows`` is nearest the image's
    ``width / height``; on a tie the later (more tiles) while the image covers more than half of it."""
    grids = sorted([(c, r) for c in range(1, max_tiles + 1) for r in range(1, max_tiles + 1)
                    if min_tiles <= c * r <= max_tiles], key=lambda g: g[0] * g[1])
    ratio, area = width / height, width * height
    best, least = (1, 1), float("inf")
    for cols, rows in grids:
        diff = abs(ratio - cols / rows)
        if diff < least:
            best, least = (cols, rows), diff
        elif diff == least and area > 0.5 * tile * tile * cols * rows:
            best = (cols, rows)
    return best


class UnlimitedOcrImageProcessorNoTV(PilBackendAsStock):
    """``UnlimitedOcrImageProcessor``'s outputs without torchvision (module docstring); its settings and defaults
    are the stock class's, so a checkpoint's ``preprocessor_config.json`` applies unchanged."""

    stock_class_name = "UnlimitedOcrImageProcessor"
    valid_kwargs = UnlimitedOcrNoTVKwargs
    resample = PILImageResampling.BICUBIC
    image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
    size = {"height": 1024, "width": 1024}
    do_resize = do_rescale = do_normalize = do_convert_rgb = crop_to_patches = True
    min_patches, max_patches, tile_size, maximum_pad_value = 2, 32, 640, 640
    background_color = [127, 127, 127]
    model_input_names = ["pixel_values", "num_local_patches", "patches_grid"]

    def get_number_of_image_patches(self, height: int, width: int, images_kwargs: dict | None = None) -> int:
        """Views of an image of ``height`` x ``width`` px: the global one and its tiles."""
        o = self._merge_and_standardize_kwargs(**(images_kwargs or {}))
        if not (o["crop_to_patches"] and max(height, width) > o["tile_size"]):
            return 1
        cols, rows = tile_grid(height, width, o["tile_size"], o["min_patches"], o["max_patches"])
        return 1 + cols * rows

    def _tiles(self, image: torch.Tensor, o: dict) -> tuple[list[torch.Tensor], list[int]]:
        """One ``uint8`` ``(3, H, W)`` image -> its local tiles (none when it fits a tile or cropping is off) and
        ``[columns, rows]``."""
        height, width = image.shape[-2:]
        side = o["tile_size"]
        if not (o["crop_to_patches"] and max(height, width) > side):
            return [], [1, 1]
        cols, rows = tile_grid(height, width, side, o["min_patches"], o["max_patches"])
        grown = resize_frames(image, side * rows, side * cols, o["resample"])
        return [grown[:, r * side:(r + 1) * side, c * side:(c + 1) * side] for r in range(rows)
                for c in range(cols)], [cols, rows]

    def _global(self, image: torch.Tensor, o: dict) -> torch.Tensor:
        """One ``uint8`` ``(3, H, W)`` image -> its global view (module docstring)."""
        side = max(o["size"].height, o["size"].width)
        if not o["crop_to_patches"] and side <= o["maximum_pad_value"]:
            return resize_frames(image, side, side, o["resample"])
        height, width = image.shape[-2:]
        scale = side / max(height, width)
        resized = resize_frames(image, round(height * scale), round(width * scale), o["resample"])
        return pad_to_square(resized, self.background_color)

    def _preprocess(self, images: list, return_tensors=None, **o) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> ``pixel_values``,
        ``pixel_values_local`` (where an image has tiles), ``num_local_patches`` and ``patches_grid`` (module
        docstring)."""
        def normalized(view):
            return rescale_and_normalize(view, o["do_rescale"], o["rescale_factor"], o["do_normalize"],
                                         o["image_mean"], o["image_std"])
        views, local, counts, grids = [], [], [], []
        for array in images:
            image = torch.from_numpy(array)
            tiles, grid = self._tiles(image, o)
            local += [normalized(t) for t in tiles]
            counts.append(len(tiles))
            grids.append(grid)
            views.append(normalized(self._global(image, o)))
        data = {"pixel_values": views}
        if local:
            data["pixel_values_local"] = local
        data.update(num_local_patches=counts, patches_grid=grids)
        return BatchFeature(data=data, tensor_type=return_tensors,
                            skip_tensor_conversion=["num_local_patches", "patches_grid"])
