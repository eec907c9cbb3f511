"""Llama 4's image processor without torchvision: :class:`Llama4ImageProcessorNoTV` gives the outputs of
``transformers``' ``Llama4ImageProcessor`` (``models/llama4/image_processing_llama4.py``, 5.25; a torchvision
class with no PIL twin) with torch operations only.

The stock steps, per image: pick the canvas of whole tiles (``size``, at most ``max_patches`` of them) that needs
the least resizing (:func:`best_canvas`), resize without distortion to fit it (never growing past one tile's side
unless ``resize_to_max_canvas``), pad right and bottom with zeros, rescale and normalise in ``bfloat16`` (the
stock override of ``rescale_and_normalize``), cut into tiles, and append a global tile (the whole image resized to
one tile) when there is more than one tile. The resize is torchvision's (``resize_frames`` of
:mod:`mpipe_hf.data.image_torch_ops`: antialiased ``interpolate`` on the ``uint8`` image). Outputs: ``pixel_values``
``(sum of tiles, 3, tile, tile)`` ``bfloat16`` and ``aspect_ratios`` ``(images, 2)`` (tile rows, tile columns).
``tests/test_stock_recorded.py`` compares them with the stock class's recorded outputs.
"""

from __future__ import annotations

import math

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_transforms import split_to_tiles
from transformers.image_utils import PILImageResampling, SizeDict
from transformers.processing_utils import ImagesKwargs

from ...data.image_torch_ops import PilBackendAsStock, resize_frames


class Llama4NoTVKwargs(ImagesKwargs, total=False):
    """The stock class's own settings: ``max_patches`` (tiles an image may take, the global one not counted) and
    ``resize_to_max_canvas`` (grow to the largest canvas rather than the least resize)."""

    max_patches: int
    resize_to_max_canvas: bool


def supported_canvases(max_tiles: int, tile: int) -> torch.Tensor:
    """Every ``(height, width)`` in px made of at most ``max_tiles`` square tiles of ``tile`` px, in the stock
    order (grouped by aspect ratio, each ratio first met at the largest tile count): ``(n, 2)`` ``int64``."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for count in range(max_tiles, 0, -1):
        factors = sorted({d for d in range(1, count + 1) if count % d == 0})
        for rows in factors:
            by_ratio.setdefault(rows / (count // rows), []).append((rows, count // rows))
    return torch.tensor([(r * tile, c * tile) for grids in by_ratio.values() for r, c in grids])


def best_canvas(height: int, width: int, canvases: torch.Tensor, to_max: bool) -> tuple[int, int]:
    """The canvas an image of ``height`` x ``width`` px goes on: the smallest upscale at or above 1 (the largest
    with ``to_max``), else the smallest downscale; ties to the smallest area (the first of equal areas)."""
    scale_h, scale_w = canvases[:, 0] / height, canvases[:, 1] / width  # float32, as the stock tensors
    scales = torch.where(scale_h > scale_w, scale_w, scale_h)
    up = scales[scales >= 1]
    chosen = (up.max() if to_max else up.min()) if len(up) else scales[scales < 1].max()
    fits = canvases[scales == chosen]
    best = fits[torch.argmin(fits[:, 0] * fits[:, 1])] if len(fits) > 1 else fits[0]
    return int(best[0]), int(best[1])


def fit_without_distortion(height: int, width: int, target_h: int, target_w: int) -> tuple[int, int]:
    """The largest ``(height, width)`` within ``target_h`` x ``target_w`` keeping the aspect ratio (floored)."""
    scale_w, scale_h = target_w / width, target_h / height
    if scale_w < scale_h:
        return min(math.floor(height * scale_w), target_h), target_w
    return target_h, min(math.floor(width * scale_h), target_w)


class Llama4ImageProcessorNoTV(PilBackendAsStock):
    """``Llama4ImageProcessor``'s outputs without torchvision (module docstring); its settings and defaults are the
    stock class's, so a checkpoint's ``preprocessor_config.json`` applies unchanged."""

    stock_class_name = "Llama4ImageProcessor"
    resample = PILImageResampling.BILINEAR
    image_mean = [0.5, 0.5, 0.5]
    image_std = [0.5, 0.5, 0.5]
    size = {"height": 336, "width": 336}
    do_resize = do_rescale = do_normalize = do_convert_rgb = True
    max_patches = 16
    resize_to_max_canvas = False
    valid_kwargs = Llama4NoTVKwargs
    model_input_names = ["pixel_values"]

    def get_number_of_image_patches(self, height: int, width: int, images_kwargs: dict | None = None) -> int:
        """Tiles of an image of ``height`` x ``width`` px, the global tile included when there is more than one
        (what ``Llama4Processor`` expands an image's placeholder by)."""
        kwargs = self._merge_and_standardize_kwargs(**(images_kwargs or {}))
        size = kwargs["size"]
        canvas = best_canvas(height, width, supported_canvases(kwargs["max_patches"], size.height),
                             kwargs["resize_to_max_canvas"])
        tiles = (canvas[0] // size.height) * (canvas[1] // size.width)
        return tiles + 1 if tiles > 1 else 1

    @staticmethod
    def _bf16_normalize(image: torch.Tensor, rescale: float, mean, std) -> torch.Tensor:
        """The stock override: ``x * rescale`` in ``bfloat16``, then ``(x - mean) / std`` with ``bfloat16`` mean
        and std."""
        out = image.to(torch.bfloat16) * rescale
        mean = torch.as_tensor(mean, dtype=out.dtype).view(-1, 1, 1)
        std = torch.as_tensor(std, dtype=out.dtype).view(-1, 1, 1)
        return out.sub_(mean).div_(std)

    def _one(self, image: torch.Tensor, size: SizeDict, resample, rescale: float, mean, std, max_patches: int,
             to_max: bool) -> tuple[torch.Tensor, list[int]]:
        """One ``uint8`` ``(3, H, W)`` image -> ``(tiles, 3, tile, tile)`` and ``[rows, columns]``."""
        if size.height != size.width:
            raise ValueError("`size` must be square.")
        height, width = image.shape[-2:]
        canvas = best_canvas(height, width, supported_canvases(max_patches, size.height), to_max)
        bound = canvas if to_max else (min(max(height, size.height), canvas[0]),
                                       min(max(width, size.height), canvas[1]))
        new_h, new_w = fit_without_distortion(height, width, *bound)
        resized = resize_frames(image[None], max(new_h, 1), max(new_w, 1), resample)
        padded = torch.nn.functional.pad(resized, [0, canvas[1] - resized.shape[-1], 0, canvas[0] - resized.shape[-2]])
        rows, cols = canvas[0] // size.height, canvas[1] // size.width
        tiles = split_to_tiles(self._bf16_normalize(padded, rescale, mean, std), rows, cols)[0]
        if rows * cols > 1:
            whole = resize_frames(image[None], size.height, size.width, resample)
            tiles = torch.cat([tiles, self._bf16_normalize(whole, rescale, mean, std)])
        return tiles, [rows, cols]

    def _preprocess(self, images: list, do_resize: bool, size: SizeDict, resample, do_rescale: bool,
                    rescale_factor: float, do_normalize: bool, image_mean, image_std, max_patches: int,
                    resize_to_max_canvas: bool, return_tensors=None, **kwargs) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> ``pixel_values`` and
        ``aspect_ratios`` (module docstring).

        Raises:
            ValueError: ``do_resize`` is off, or rescale and normalisation are not both on (the only setting
                the Llama 4 checkpoints use and the one reproduced here), or ``size`` is not square.
        """
        if not do_resize:
            raise ValueError("Llama 4 always resizes images to one of its supported resolutions")
        if not (do_rescale and do_normalize):
            raise ValueError("only do_rescale and do_normalize both on (the Llama 4 checkpoints') is reproduced")
        tiles, ratios = [], []
        for image in images:
            got, ratio = self._one(torch.from_numpy(image), size, resample, rescale_factor, image_mean, image_std,
                                   max_patches, resize_to_max_canvas)
            tiles.append(got)
            ratios.append(torch.tensor(ratio))
        pixel_values = torch.cat(tiles) if return_tensors else tiles
        return BatchFeature(data={"pixel_values": pixel_values, "aspect_ratios": ratios}, tensor_type=return_tensors)
