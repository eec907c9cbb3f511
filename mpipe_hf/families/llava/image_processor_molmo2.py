"""Molmo2's image processor without torchvision: :class:`Molmo2ImageProcessorNoTV` gives the outputs of
``transformers``' ``Molmo2ImageProcessor`` (``models/molmo2/image_processing_molmo2.py``, 5.25; a torchvision class
with no PIL twin) with torch operations only.

The stock steps, per image: the grid of overlapping crops (``size`` px each, neighbours sharing
``overlap_margins`` patches, at most ``max_crops`` of them) that needs the least upscale, else the least downscale
(``compute_crop_geometry``); the image resized to that canvas and, apart, to one crop (the low-resolution view),
each through ``float32`` **without** antialiasing (``interpolate``, bilinear, ``align_corners=False``), rounded
and clamped back to ``uint8``; rescaled and normalised in ``float32`` (the backend's fused step); the canvas cut
into its crops; every view's patches flattened row by row (``(p, p, 3)`` each); and each output token's pooling
window of patch indices (-1 where a window passes the edge, the margins a crop shares left out). The geometry and
index helpers are the stock module's own (it imports without torchvision). Outputs: ``pixel_values``
``(views, patches, p * p * 3)``, ``image_token_pooling`` ``(tokens, pool_h * pool_w)`` ``int32``, ``image_grids``
``(images, 4)`` (the low- and high-resolution token grids) and ``image_num_crops`` ``(images,)``.
``tests/test_stock_recorded.py`` compares them with the stock class's recorded outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling, SizeDict
from transformers.models.molmo2.image_processing_molmo2 import (Molmo2ImageProcessor, Molmo2ImageProcessorKwargs,
                                                                arange_for_pooling, batch_pixels_to_patches,
                                                                compute_crop_geometry)

from ...data.image_torch_ops import MODES, PilBackendAsStock, rescale_and_normalize


def resize_through_float(image: torch.Tensor, height: int, width: int, resample) -> torch.Tensor:
    """``uint8`` ``(..., 3, H, W)`` -> ``(..., 3, height, width)``: the stock ``resize_and_normalize_image``'s
    resize, in ``float32`` without antialiasing, rounded and clamped back to ``uint8``.

    Raises:
        ValueError: ``resample`` is neither bilinear nor bicubic.
    """
    mode = MODES.get(PILImageResampling(int(resample)))
    if mode is None:
        raise ValueError(f"resample {resample!r}: only bilinear and bicubic resizes are reproduced here")
    if tuple(image.shape[-2:]) == (height, width):
        return image
    flat = image.reshape(-1, *image.shape[-3:]).to(torch.float32)
    out = F.interpolate(flat, size=[height, width], mode=mode, align_corners=False, antialias=False)
    return out.round().clamp(0, 255).to(image.dtype).reshape(*image.shape[:-2], height, width)


class Molmo2ImageProcessorNoTV(PilBackendAsStock):
    """``Molmo2ImageProcessor``'s outputs without torchvision (module docstring); its settings and defaults are
    the stock class's, so a checkpoint's ``preprocessor_config.json`` applies unchanged."""

    stock_class_name = "Molmo2ImageProcessor"
    valid_kwargs = Molmo2ImageProcessorKwargs
    model_input_names = ["pixel_values", "image_token_pooling", "image_grids", "image_num_crops"]
    resample = PILImageResampling.BILINEAR
    image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
    size = {"height": 378, "width": 378}
    do_resize = do_rescale = do_normalize = do_convert_rgb = True
    max_crops, overlap_margins, patch_size, pooling_size = 8, [4, 4], 14, [2, 2]
    get_number_of_image_patches = Molmo2ImageProcessor.get_number_of_image_patches
    get_image_grid_and_crops = Molmo2ImageProcessor.get_image_grid_and_crops

    def _views(self, image: torch.Tensor, crop: int, patch: int, margins, max_crops: int, resample,
               normalize) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """One ``uint8`` ``(3, H, W)`` image -> its views ``(1 + crops, 3, crop, crop)`` (normalised; the
        low-resolution one first), the canvas's patch-index grid (shared margins dropped) and the tiling."""
        tiling_h, tiling_w, canvas_h, canvas_w = compute_crop_geometry(
            image.shape[-2], image.shape[-1], max_crops=max_crops, overlap_margins=margins, crop_size=crop,
            patch_size=patch)
        per_crop = crop // patch
        window = (per_crop - sum(margins)) * patch
        canvas = normalize(resize_through_float(image, canvas_h, canvas_w, resample))
        crops = canvas.unfold(1, crop, window).unfold(2, crop, window)  # (3, tiling_h, tiling_w, crop, crop)
        crops = crops.permute(1, 2, 0, 3, 4).reshape(tiling_h * tiling_w, 3, crop, crop)
        low = normalize(resize_through_float(image, crop, crop, resample))[None]
        grid = torch.arange(tiling_h * tiling_w * per_crop * per_crop, dtype=torch.int32).reshape(
            tiling_h, tiling_w, per_crop, per_crop)
        left, right = margins
        if left:
            grid[1:, :, :left, :] = -1
            grid[:, 1:, :, :left] = -1
        if right:
            grid[:-1, :, -right:, :] = -1
            grid[:, :-1, :, -right:] = -1
        grid = grid.permute(0, 2, 1, 3).reshape(-1)
        grid = grid[grid >= 0].reshape(canvas_h // patch, canvas_w // patch)
        return torch.cat([low, crops]), grid, tiling_h, tiling_w

    def _one(self, image: torch.Tensor, size: SizeDict, resample, patch: int, margins, max_crops: int, pooling,
             normalize) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One image -> ``(patches (views, n, p * p * 3), pooling indices, grid (4,))``."""
        crop = size.height
        views, grid, _, _ = self._views(image, crop, patch, margins, max_crops, resample, normalize)
        pool_h, pool_w = pooling
        high, rows, cols = arange_for_pooling(grid, pool_h, pool_w)
        per_crop = crop // patch
        low_grid = torch.arange(per_crop ** 2, dtype=torch.int32).reshape(per_crop, per_crop)
        low, low_h, low_w = arange_for_pooling(low_grid, pool_h, pool_w)
        pooled = torch.cat([low, torch.where(high >= 0, high + per_crop ** 2, -1)])
        patches = batch_pixels_to_patches(views.permute(0, 2, 3, 1), patch)
        return patches, pooled, torch.tensor([low_h, low_w, rows, cols], dtype=torch.int64)

    def _preprocess(self, images: list, do_resize: bool, size: SizeDict, resample, do_rescale: bool,
                    rescale_factor: float, do_normalize: bool, image_mean, image_std, max_crops: int = 8,
                    overlap_margins=(4, 4), patch_size: int = 14, pooling_size=(2, 2), return_tensors=None,
                    **kwargs) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> the four outputs of the module
        docstring (every image is resized, as the stock class does whatever ``do_resize`` says).

        Raises:
            ValueError: ``size`` is not square (as the stock class).
        """
        if size.height != size.width:
            raise ValueError(f"Molmo2 only supports a square `size`, got height={size.height}, width={size.width}.")

        def normalize(x):
            return rescale_and_normalize(x, do_rescale, rescale_factor, do_normalize, image_mean, image_std)
        patches, pooled, grids = [], [], []
        for array in images:
            got = self._one(torch.from_numpy(array), size, resample, patch_size, list(overlap_margins), max_crops,
                            list(pooling_size), normalize)
            patches.append(got[0])
            pooled.append(got[1])
            grids.append(got[2])
        data = {"pixel_values": torch.cat(patches), "image_token_pooling": torch.cat(pooled),
                "image_grids": torch.stack(grids),
                "image_num_crops": torch.tensor([len(p) for p in patches], dtype=torch.int64)}
        return BatchFeature(data=data, tensor_type=return_tensors)
