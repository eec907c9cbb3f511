"""Where a step's tensors live: moving a micro-batch's inputs to the device without a host wait, and the strict
device mode's check (issue 27)."""

from __future__ import annotations

import torch

Tensors = dict[str, torch.Tensor]


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` without a host wait: from pinned memory on CUDA (a copy from pageable memory would be
    staged by the host), ``non_blocking`` everywhere."""
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def on_device(tensors: Tensors, device: torch.device, what) -> None:
    """Raise ``RuntimeError`` naming the first of ``tensors`` not on ``device`` (strict device mode)."""
    for key, t in tensors.items():
        if t.device != device:
            raise RuntimeError(f"{what}: {key!r} is on {t.device}, not on this rank's device {device} (strict "
                               f"device mode: every tensor a transfer or collective is handed is on the device)")
