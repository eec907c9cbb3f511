"""Cohere2-Vision's image processor without torchvision: :class:`Cohere2VisionImageProcessorNoTV` gives the
outputs of ``transformers``' ``Cohere2VisionImageProcessor`` (``models/cohere2_vision/
image_processing_cohere2_vision.py``, 5.25; a torchvision class with no PIL twin) with torch operations only.

The stock steps, per image (``crop_to_patches`` on, the checkpoints' setting): the grid of ``size`` tiles (at most
``max_patches``) that needs the least upscale, else the least downscale (:func:`tile_grid`); the image resized to
it and cut into tiles row by row, plus a thumbnail (the whole image at one tile) when there is more than one
tile; each tile resized to ``size`` (a no-op) and rescaled and normalised in ``float32`` (the backend's fused
step). The resize is torchvision's (``resize_frames`` of :mod:`mpipe_hf.data.image_torch_ops`, bicubic on the ``uint8``
image). Outputs: ``pixel_values`` ``(tiles, 3, H, W)`` and ``num_patches`` ``(images,)``.
``tests/test_stock_recorded.py`` compares them with the stock class's recorded outputs.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling
from transformers.processing_utils import ImagesKwargs

from ...data.image_torch_ops import PilBackendAsStock, resize_frames


class Cohere2VisionNoTVKwargs(ImagesKwargs, total=False):
    """The stock class's own settings: ``crop_to_patches``, ``min_patches`` (unused by the stock grid choice) and
    ``max_patches``."""

    crop_to_patches: bool
    min_patches: int
    max_patches: int


def tile_grid(height: int, width: int, tile: int, max_tiles: int) -> tuple[int, int]:
    """``(columns, rows)`` of ``tile``-px tiles for an image of ``height`` x ``width`` px, as the stock
    ``get_optimal_tiled_canvas``: grids ordered by tile count, the smallest scale at or above 1, else the largest
    below."""
    grids = sorted([(w, h) for w in range(1, max_tiles + 1) for h in range(1, max_tiles + 1) if w * h <= max_tiles],
                   key=lambda x: x[0] * x[1])
    scales = (np.array(grids) * tile / np.stack([width, height])).min(axis=-1)
    if np.all(scales < 1):
        return grids[int(np.argmax(scales))]
    return grids[int(np.argmin(np.where(scales < 1.0, 10e9, scales)))]


class Cohere2VisionImageProcessorNoTV(PilBackendAsStock):
    """``Cohere2VisionImageProcessor``'s outputs without torchvision (module docstring); its settings and defaults
    are the stock class's, so a checkpoint's ``preprocessor_config.json`` applies unchanged."""

    stock_class_name = "Cohere2VisionImageProcessor"
    valid_kwargs = Cohere2VisionNoTVKwargs
    resample = PILImageResampling.BICUBIC
    image_mean, image_std = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
    size = {"height": 512, "width": 512}
    do_resize = do_rescale = do_normalize = do_convert_rgb = crop_to_patches = True
    min_patches, max_patches, patch_size = 1, 12, 16

    def _tiles(self, image: torch.Tensor, side: int, max_patches: int, resample) -> list[torch.Tensor]:
        """One ``uint8`` ``(3, H, W)`` image -> its tiles (and thumbnail), ``(3, side, side)`` each."""
        cols, rows = tile_grid(image.shape[-2], image.shape[-1], side, max_patches)
        grown = resize_frames(image, side * rows, side * cols, resample)
        tiles = [grown[:, r * side:(r + 1) * side, c * side:(c + 1) * side] for r in range(rows) for c in range(cols)]
        if len(tiles) != 1:
            tiles.append(resize_frames(image, side, side, resample))
        return tiles

    def _preprocess(self, images: list, do_resize: bool, size, resample, do_rescale: bool, rescale_factor: float,
                    do_normalize: bool, image_mean, image_std, return_tensors=None, crop_to_patches: bool = False,
                    min_patches: int = 1, max_patches: int = 12, **kwargs) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> ``pixel_values`` and
        ``num_patches`` (module docstring).

        Raises:
            ValueError: ``size`` is not square with ``crop_to_patches``.
        """
        tiles, counts = [], []
        for array in images:
            image = torch.from_numpy(array)
            if crop_to_patches:
                if size.height != size.width:
                    raise ValueError("crop_to_patches needs a square size")
                got = self._tiles(image, size.height, max_patches, resample)
            else:
                got = [image]
            counts.append(len(got))
            tiles += [resize_frames(t, size.height, size.width, resample) if do_resize else t for t in got]
        out = []
        for tile in tiles:
            x = tile.to(torch.float32)
            if do_normalize:
                scale = 1.0 / rescale_factor if do_rescale else 1.0
                x = x.sub((torch.tensor(image_mean) * scale).view(-1, 1, 1)).div_(
                    (torch.tensor(image_std) * scale).view(-1, 1, 1))
            elif do_rescale:
                x = x * rescale_factor
            out.append(x)
        pixel_values = torch.stack(out) if return_tensors else out
        return BatchFeature(data={"pixel_values": pixel_values, "num_patches": counts}, tensor_type=return_tensors)
