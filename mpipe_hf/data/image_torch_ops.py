"""Steps shared by the torch-operation image processors (the stand-ins for stock classes that exist only with a
torchvision backend): their base class, which saves its settings under the stock class's name, the backend's fused
rescale and normalisation, and zero or colour padding of ``uint8`` images."""

from __future__ import annotations

import torch
from transformers.image_processing_backends import PilBackend


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
