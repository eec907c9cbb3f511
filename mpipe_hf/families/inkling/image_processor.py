"""Inkling's image processor without torchvision: :class:`InklingImageProcessorNoTV` gives the outputs of
``transformers``' ``InklingImageProcessor`` (``models/inkling/image_processing_inkling.py``, 5.25; a torchvision
class with no PIL twin) with torch operations only.

The stock steps, per image: where ``rescale_image_frac`` is set, the image resized (Lanczos, the class's default
filter: torchvision resizes a CPU ``uint8`` tensor with ``interpolate``'s antialiased ``lanczos`` mode, as
``resize_frames`` of :mod:`mpipe_hf.data.image_torch_ops` does) to its long edge times that fraction, the growth
capped at ``rescale_image_max_upscaled_long_edge`` px (a larger image kept as it is), each side rounded half up
(:func:`rescaled_size`); then cut into ``size`` px squares in raster order, ``ceil(H / p)`` rows but always
``W // p + 1`` columns (the stock ``divide_to_patches``: a width that divides evenly gets a last column of no
pixels), each square cast to ``float32`` and padded at the bottom and right to ``p`` x ``p`` with ``-1.0`` (before
rescaling, so the padding normalises to ``(-1 / 255 - mean) / std``), rescaled and normalised (the backend's fused
step), repeated over 2 frames (fixed in the stock class, whatever the tower's ``temporal_patch_size``) and laid out
``(frame, row, column, channel)``. Outputs: ``pixel_values`` ``(patches, 2, p, p, 3)`` and ``num_patches``
``(images,)`` (one image token a patch). ``tests/test_stock_recorded.py`` compares them with the stock class's
recorded outputs.
"""

from __future__ import annotations

import math

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import PILImageResampling
from transformers.processing_utils import ImagesKwargs
from transformers.utils.constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from ...data.image_torch_ops import PilBackendAsStock, rescale_and_normalize, resize_frames

PAD_VALUE = -1.0  # what the stock class pads a part square with, before rescaling
FRAMES = 2  # frames each square is repeated over (the stock class's constant)


class InklingNoTVKwargs(ImagesKwargs, total=False):
    """The stock class's own settings: ``rescale_image_frac`` (the long edge's factor before cutting; ``None``: no
    resize) and ``rescale_image_max_upscaled_long_edge`` (px; a cap on growth only)."""

    rescale_image_frac: float | None
    rescale_image_max_upscaled_long_edge: int | None


def rescaled_size(height: int, width: int, frac: float | None, max_long_edge: int | None) -> tuple[int, int]:
    """``(height, width)`` in px an image of ``height`` x ``width`` px is resized to before cutting, as the stock
    ``get_rescaled_size``: the long edge times ``frac``, at most ``max(max_long_edge, long edge)``, each side
    scaled by the same ratio and rounded half up; unchanged where ``frac`` is ``None`` or the ratio is 1."""
    if frac is None:
        return height, width
    long_edge = max(height, width)
    target = long_edge * frac
    if max_long_edge is not None:
        target = min(target, max(max_long_edge, long_edge))
    ratio = target / long_edge
    if ratio == 1.0:
        return height, width
    return math.floor(height * ratio + 0.5), math.floor(width * ratio + 0.5)


def square_grid(height: int, width: int, side: int) -> tuple[int, int]:
    """``(rows, columns)`` of ``side`` px squares the stock ``divide_to_patches`` cuts an image into:
    ``ceil(height / side)`` rows, ``width // side + 1`` columns (module docstring)."""
    return -(-height // side), width // side + 1


def cut_squares(image: torch.Tensor, side: int) -> torch.Tensor:
    """``image`` ``(C, H, W)`` -> ``float32`` ``(rows * columns, C, side, side)`` (:func:`square_grid`, raster
    order), the part of a square past the image filled with :data:`PAD_VALUE`."""
    channels, height, width = image.shape
    rows, cols = square_grid(height, width, side)
    full_h, full_w = rows * side, cols * side
    canvas = torch.full((channels, full_h, full_w), PAD_VALUE, dtype=torch.float32)
    canvas[:, :height, :width] = image
    return canvas.view(channels, rows, side, cols, side).permute(1, 3, 0, 2, 4).reshape(rows * cols, channels,
                                                                                         side, side)


class InklingImageProcessorNoTV(PilBackendAsStock):
    """``InklingImageProcessor``'s outputs without torchvision (module docstring); its settings and defaults are the
    stock class's, so a checkpoint's ``preprocessor_config.json`` applies unchanged."""

    stock_class_name = "InklingImageProcessor"
    valid_kwargs = InklingNoTVKwargs
    resample = PILImageResampling.LANCZOS
    image_mean, image_std = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
    default_to_square = False
    do_convert_rgb = do_rescale = do_normalize = True
    size = {"height": 40, "width": 40}
    rescale_image_frac = None
    rescale_image_max_upscaled_long_edge = 2048
    model_input_names = ["pixel_values", "num_patches"]

    def _validate_preprocess_kwargs(self, do_resize=None, size=None, **kwargs):
        """The stock class's checks: ``do_resize`` may not be ``False`` and ``size`` must be square.

        Raises:
            ValueError: either does not hold.
        """
        if do_resize is False:
            raise ValueError("`do_resize` cannot be set to `False` for this model!")
        if size.height != size.width:
            raise ValueError(f"Can resize only to square size but got {size}")
        super()._validate_preprocess_kwargs(size=size, **kwargs)

    def _preprocess(self, images: list, size, resample, do_rescale: bool, rescale_factor: float, do_normalize: bool,
                    image_mean, image_std, rescale_image_frac=None, rescale_image_max_upscaled_long_edge=None,
                    return_tensors=None, **kwargs) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> ``pixel_values`` and ``num_patches``
        (module docstring)."""
        per_image, counts = [], []
        for array in images:
            image = torch.from_numpy(array)
            height, width = rescaled_size(*image.shape[-2:], rescale_image_frac, rescale_image_max_upscaled_long_edge)
            image = resize_frames(image, height, width, resample)
            squares = rescale_and_normalize(cut_squares(image, size.height), do_rescale, rescale_factor, do_normalize,
                                            image_mean, image_std)
            per_image.append(squares)
            counts.append(squares.shape[0])
        pixel_values = torch.cat(per_image)[..., None].expand(-1, -1, -1, -1, FRAMES).permute(0, 4, 2, 3, 1)
        return BatchFeature(data={"pixel_values": pixel_values.contiguous(), "num_patches": torch.tensor(counts)},
                            tensor_type=return_tensors)

    def get_number_of_image_patches(self, height: int, width: int, images_kwargs: dict | None = None) -> int:
        """Squares (image tokens) an image of ``height`` x ``width`` px gives, as the stock class counts them."""
        kwargs = self._merge_and_standardize_kwargs(**(images_kwargs or {}))
        height, width = rescaled_size(height, width, kwargs["rescale_image_frac"],
                                      kwargs["rescale_image_max_upscaled_long_edge"])
        rows, cols = square_grid(height, width, kwargs["size"]["height"])
        return rows * cols
