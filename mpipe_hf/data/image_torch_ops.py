"""Steps shared by the torch-operation image processors (the stand-ins for stock classes that exist only with a
torchvision backend): their base class, which saves its settings under the stock class's name, the backend's fused
rescale and normalisation, zero or colour padding of ``uint8`` images, and torchvision's resize (which the video
processors and :func:`~.video.load_video` share with them).

The resize: ``torchvision.transforms.v2.functional.resize`` (``resize_image``, torchvision 0.28, the release paired
with torch 2.13) calls ``torch.nn.functional.interpolate`` (``align_corners=False``, ``antialias=True``) on the
``uint8`` frames for bicubic and Lanczos (and for bilinear on AVX2/AVX512 or ARM CPUs), else on ``float32`` frames
then clamped (bicubic), rounded and cast back (:func:`resize_frames`)."""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F
from transformers.image_processing_backends import PilBackend
from transformers.image_utils import PILImageResampling

MODES = {PILImageResampling.BICUBIC: "bicubic", PILImageResampling.BILINEAR: "bilinear",
         PILImageResampling.LANCZOS: "lanczos"}  # Lanczos: the Muse image processor's (torchvision 0.27 and later)


class PilBackendAsStock(PilBackend):
    """The base of the torch-operation image processors: a subclass names the stock class it stands in for
    (``stock_class_name``), and its settings are saved as that class saves them, under its name."""

    stock_class_name: str

    def to_dict(self) -> dict:
        """The settings as the stock class saves them, named as it (``image_processor_type``), so that a saved
        snapshot loads as the stock class where torchvision is installed."""
        out = super().to_dict()
        out["image_processor_type"] = self.stock_class_name
        return out


def rescale_and_normalize(images: torch.Tensor, do_rescale: bool, rescale_factor: float, do_normalize: bool,
                          image_mean, image_std) -> torch.Tensor:
    """``images`` ``(..., C, H, W)`` (any dtype) as the torchvision backend's ``rescale_and_normalize`` gives
    them: with both steps ``(x - mean / f) / (std / f)`` in ``float32`` (``f`` the rescale factor, the mean and std
    scaled in ``float32``), with normalisation alone ``(x - mean) / std``, with rescale alone ``x * f``."""
    if do_rescale and do_normalize:
        image_mean = torch.tensor(image_mean) * (1.0 / rescale_factor)
        image_std = torch.tensor(image_std) * (1.0 / rescale_factor)
    if do_normalize:
        x = images.to(torch.float32)
        mean = torch.as_tensor(image_mean, dtype=x.dtype).view(-1, 1, 1)
        std = torch.as_tensor(image_std, dtype=x.dtype).view(-1, 1, 1)
        return x.sub(mean).div_(std)
    return images * rescale_factor if do_rescale else images


def pad_bottom_right(images: torch.Tensor, height: int, width: int, fill: int = 0) -> torch.Tensor:
    """``images`` ``(..., C, h, w)`` padded at the bottom and right to ``height`` x ``width`` with ``fill``
    (torchvision's constant ``pad``, the dtype kept).

    Raises:
        ValueError: the image is larger than ``height`` x ``width``.
    """
    h, w = images.shape[-2:]
    if h > height or w > width:
        raise ValueError(f"cannot pad a {h} x {w} image to {height} x {width}")
    return torch.nn.functional.pad(images, [0, width - w, 0, height - h], value=fill)


def pad_to_square(images: torch.Tensor, fill) -> torch.Tensor:
    """``images`` ``(..., C, h, w)`` padded to a square of the longer side, centred (the extra row or column at the
    bottom or right), channel ``c`` filled with ``fill[c]`` (an int fills the first channel, 0 the others, as the
    stock ``pad_to_square``s do).

    Raises:
        ValueError: ``fill`` has not one value per channel.
    """
    h, w = images.shape[-2:]
    if h == w:
        return images
    side, channels = max(h, w), images.shape[-3]
    fill = [fill] + [0] * (channels - 1) if isinstance(fill, int) else list(fill)
    if len(fill) != channels:
        raise ValueError(f"fill has {len(fill)} values for {channels} channels")
    out = torch.empty(images.shape[:-2] + (side, side), dtype=images.dtype)
    out[...] = torch.tensor(fill, dtype=images.dtype).view(-1, 1, 1)
    top, left = (side - h) // 2, (side - w) // 2
    out[..., top:top + h, left:left + w] = images
    return out


def _native_uint8(mode: str) -> bool:
    """Whether torchvision resizes a CPU ``uint8`` tensor without casting it (``_do_native_uint8_resize_on_cpu``)."""
    if mode in ("bicubic", "lanczos"):
        return True
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or platform.machine() in ("aarch64",
                                                                                                  "arm64")


def resize_frames(frames: torch.Tensor, height: int, width: int, resample=PILImageResampling.BICUBIC) -> torch.Tensor:
    """``frames`` ``(..., C, H, W)`` resized to ``(..., C, height, width)`` as torchvision 0.28's ``resize`` does
    (module docstring): antialiased, ``align_corners=False``, the dtype kept (integers rounded; a ``uint8`` tensor
    off the CPU goes through float32, as torchvision sends it).

    Raises:
        ValueError: ``resample`` is not bicubic, bilinear or Lanczos (:data:`MODES`).
    """
    mode = MODES.get(PILImageResampling(int(resample)))
    if mode is None:
        raise ValueError(f"resample {resample!r}: only bicubic, bilinear and Lanczos resizes are reproduced here")
    shape = frames.shape
    channels, old_h, old_w = shape[-3:]
    if (height, width) == (old_h, old_w) or frames.numel() == 0:
        return frames
    dtype = frames.dtype
    keep = dtype in (torch.float32, torch.float64) or (dtype == torch.uint8 and frames.device.type == "cpu"
                                                       and _native_uint8(mode))
    flat = frames.reshape(-1, channels, old_h, old_w)
    if not keep:
        flat = flat.to(torch.float32)
    out = F.interpolate(flat, size=[height, width], mode=mode, align_corners=False, antialias=True)
    if not keep:
        if mode in ("bicubic", "lanczos") and dtype == torch.uint8:
            out = out.clamp_(min=0, max=255)
        if not dtype.is_floating_point:
            out = out.round_()
        out = out.to(dtype=dtype)
    return out.reshape(shape[:-3] + (channels, height, width))
