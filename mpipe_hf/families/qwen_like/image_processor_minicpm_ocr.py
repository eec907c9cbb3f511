"""MiniCPM-OCR's image processor without torchvision: :class:`MiniCPMOcrImageProcessorNoTV` gives the outputs of
``transformers``' ``MiniCPMOcrImageProcessor`` (``models/minicpm_ocr/image_processing_minicpm_ocr.py``, 5.25; a
torchvision class with no PIL twin) with torch operations only.

The stock steps, per image: the slice grid (:func:`slice_grid`: none when the image is within
``scale_resolution ** 2`` px or has 1 slice's worth, else rows x columns of 1 fewer to 1 more slices than its area
asks, at most ``max_slice_nums``, nearest its aspect ratio); the overview, the image resized (grown to
``scale_resolution ** 2`` px with ``small_image_upsize="always"`` when unsliced, shrunk to it when larger) to
whole ``patch_size * merge`` blocks (:func:`best_resize`); with a grid, the image resized to the grid's refined
size and cut into its slices, row by row. Each is rescaled and normalised in ``float32`` (the backend's fused
step) and laid out as NaViT patches ``(3, patch, h * w / patch)``. The resize is torchvision's (``resize_frames``
of :mod:`mpipe_hf.data.image_torch_ops`, bicubic on the ``uint8`` image). Outputs: ``pixel_values`` ``(1, 3,
patch, sum of h * w / patch)`` and ``target_sizes`` ``(views, 2)`` (patch rows, patch columns of the overview
and each slice). With ``small_image_upsize="adaptive"`` the unsliced image and each slice take the resolution
the stock glyph classifier picks (its own function, which needs OpenCV as the stock class does;
:meth:`~MiniCPMOcrImageProcessorNoTV._adaptive_slice`).
``tests/test_stock_recorded.py`` compares them with the stock class's recorded outputs.
"""

from __future__ import annotations

import math

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling
from transformers.processing_utils import ImagesKwargs

from ...data.image_torch_ops import PilBackendAsStock, rescale_and_normalize, resize_frames


class MiniCPMOcrNoTVKwargs(ImagesKwargs, total=False):
    """The stock class's own settings (its docstring): ``max_slice_nums``, ``scale_resolution``, ``patch_size``,
    ``slice_mode``, ``downsample_mode`` (``"4x"`` or ``"16x"``), ``use_image_id`` (read by the processor) and
    ``small_image_upsize`` (``"always"``, ``"never"`` or ``"adaptive"``)."""

    max_slice_nums: int
    scale_resolution: int
    patch_size: int
    slice_mode: bool
    downsample_mode: str
    use_image_id: bool
    small_image_upsize: str


def _whole(length: float, divisor: int) -> int:
    """``length`` rounded to a multiple of ``divisor`` (at least ``divisor``), the stock ``ensure_divide``."""
    return max(round(length / divisor) * divisor, divisor)


def best_resize(height: float, width: float, resolution: int, patch: int, downsample_mode: str,
                allow_upscale: bool) -> tuple[int, int]:
    """``(height, width)`` in px a view of ``height`` x ``width`` is resized to, the stock ``find_best_resize``:
    to ``resolution ** 2`` px at its aspect ratio when larger (or ``allow_upscale``), then to whole blocks of
    ``patch * 2`` (``"4x"``) or ``patch * 4`` px."""
    if height * width > resolution * resolution or allow_upscale:
        ratio = width / height
        height = int(resolution / math.sqrt(ratio))
        width = int(height * ratio)
    block = patch * (2 if downsample_mode == "4x" else 4)
    return _whole(height, block), _whole(width, block)


def slice_grid(height: int, width: int, max_slices: int, resolution: int) -> list[int] | None:
    """``[rows, columns]`` of an image's slices or ``None`` (module docstring; the stock ``get_sliced_grid``, ties
    to the grid of more rows)."""
    log_ratio = math.log(width / height)
    wanted = min(math.ceil(width * height / (resolution * resolution)), max_slices)
    if wanted <= 1:
        return None
    best, least = [1, 1], float("inf")
    for count in (wanted - 1, wanted, wanted + 1):
        if count == 1 or count > max_slices:
            continue
        for rows in (r for r in range(1, count + 1) if count % r == 0):
            error = abs(log_ratio - math.log((count // rows) / rows))
            if error < least or (error == least and rows > best[0]):
                best, least = [rows, count // rows], error
    return best


def _adaptive_resolution():
    """The stock ``adaptive_upsize_resolution`` (OpenCV's Otsu threshold and connected components; its module
    imports without torchvision): the resolution a view no larger than ``scale_resolution ** 2`` px is grown to,
    or ``None`` to keep it.

    Raises:
        ImportError: OpenCV is not installed (as the stock class, when the helper is called).
    """
    from transformers.models.minicpm_ocr.image_processing_minicpm_ocr import adaptive_upsize_resolution
    return adaptive_upsize_resolution


def navit_patches(view: torch.Tensor, patch: int) -> torch.Tensor:
    """``(C, H, W)`` -> ``(C, patch, H * W / patch)``: the patches row by row, each patch's rows side by side (the
    stock ``reshape_by_patch``)."""
    channels, height, width = view.shape
    x = view.reshape(channels, height // patch, patch, width // patch, patch).permute(0, 2, 1, 3, 4)
    return x.reshape(channels, patch, -1)


class MiniCPMOcrImageProcessorNoTV(PilBackendAsStock):
    """``MiniCPMOcrImageProcessor``'s outputs without torchvision (module docstring); its settings and defaults are
    the stock class's, so a checkpoint's ``preprocessor_config.json`` applies unchanged."""

    stock_class_name = "MiniCPMOcrImageProcessor"
    valid_kwargs = MiniCPMOcrNoTVKwargs
    resample = PILImageResampling.BICUBIC
    do_resize = do_rescale = do_normalize = do_convert_rgb = slice_mode = use_image_id = True
    image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
    max_slice_nums, scale_resolution, patch_size = 9, 448, 14
    downsample_mode, small_image_upsize = "4x", "always"
    model_input_names = ["pixel_values", "target_sizes"]

    def _validate_preprocess_kwargs(self, **kwargs):
        """The base checks less ``do_resize``'s need of a ``size`` (the sizes come from ``scale_resolution``), as
        the stock class."""
        kwargs.pop("do_resize", None)
        super()._validate_preprocess_kwargs(**kwargs)

    def _views(self, image: torch.Tensor, o: dict) -> tuple[list[torch.Tensor], list[int]]:
        """One ``uint8`` ``(3, H, W)`` image -> its overview and slices (resized) and its grid (``[0, 0]`` when
        unsliced)."""
        height, width = image.shape[-2:]
        resolution, patch, mode = o["scale_resolution"], o["patch_size"], o["downsample_mode"]
        grid = slice_grid(height, width, o["max_slice_nums"], resolution) if o["slice_mode"] else None
        source, grow = resolution, grid is None and o["small_image_upsize"] == "always"
        if grid is None and o["small_image_upsize"] == "adaptive":
            chosen = _adaptive_resolution()(image.numpy(), resolution)
            source, grow = chosen or resolution, chosen is not None
        views = [resize_frames(image, *best_resize(height, width, source, patch, mode, grow), o["resample"])]
        if grid is None:
            return views, [0, 0]
        rows, cols = grid
        part = best_resize(_whole(height, rows) / rows, _whole(width, cols) / cols, resolution, patch, mode, True)
        refined = resize_frames(image, part[0] * rows, part[1] * cols, o["resample"])
        slices = [refined[:, r * part[0]:(r + 1) * part[0], c * part[1]:(c + 1) * part[1]]
                  for r in range(rows) for c in range(cols)]
        if o["small_image_upsize"] == "adaptive":
            slices = [self._adaptive_slice(image, grid, i, tile, o) for i, tile in enumerate(slices)]
        return views + slices, grid

    @staticmethod
    def _adaptive_slice(image: torch.Tensor, grid: list[int], index: int, tile: torch.Tensor, o: dict):
        """Slice ``index`` of ``grid`` at its adaptive resolution (the stock ``_resolve_tile_size``): the cell of
        the original image at the resolution OpenCV's glyph classifier picks, where that costs fewer tokens than
        ``tile`` (the slice as resized with the others), else ``tile``."""
        height, width = image.shape[-2:]
        rows, cols = grid
        row, col = divmod(index, cols)
        cell = image[..., round(height * row / rows):round(height * (row + 1) / rows),
                     round(width * col / cols):round(width * (col + 1) / cols)]
        cell_h, cell_w = cell.shape[-2:]
        resolution = o["scale_resolution"]
        if cell_h < 1 or cell_w < 1 or cell_h * cell_w > resolution ** 2:
            return tile
        chosen = _adaptive_resolution()(cell.numpy(), resolution)
        if chosen == resolution:
            return tile
        target = best_resize(cell_h, cell_w, chosen or resolution, o["patch_size"], o["downsample_mode"],
                             chosen is not None)
        if target[0] * target[1] >= tile.shape[-2] * tile.shape[-1]:
            return tile
        return cell if target == (cell_h, cell_w) else resize_frames(cell, *target, PILImageResampling.BICUBIC)

    def _preprocess(self, images: list, return_tensors=None, **o) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> ``pixel_values``, ``target_sizes``,
        ``grids`` and ``num_patches_per_image`` (module docstring).

        Raises:
            ValueError: ``do_resize`` off (as the stock class) or ``small_image_upsize`` none of ``"always"``,
                ``"never"``, ``"adaptive"``.
            ImportError: ``"adaptive"`` without OpenCV (as the stock class).
        """
        if not o["do_resize"]:
            raise ValueError("do_resize=False is not supported: MiniCPM-OCR always resizes images to the patch grid")
        if o["small_image_upsize"] not in ("always", "never", "adaptive"):
            raise ValueError(f"small_image_upsize={o['small_image_upsize']!r}: 'always', 'never' or 'adaptive'")
        values, sizes, grids, counts = [], [], [], []
        for array in images:
            views, grid = self._views(torch.from_numpy(array), o)
            for view in views:
                x = rescale_and_normalize(view, o["do_rescale"], o["rescale_factor"], o["do_normalize"],
                                          o["image_mean"], o["image_std"])
                values.append(navit_patches(x, o["patch_size"]))
                sizes.append([view.shape[-2] // o["patch_size"], view.shape[-1] // o["patch_size"]])
            grids.append(grid)
            counts.append(len(views))
        return BatchFeature(data={"pixel_values": torch.cat(values, dim=-1).unsqueeze(0),
                                  "target_sizes": torch.tensor(sizes, dtype=torch.int32), "grids": grids,
                                  "num_patches_per_image": counts},
                            tensor_type=return_tensors, skip_tensor_conversion=["grids", "num_patches_per_image"])
