"""Where a step's tensors live: moving a micro-batch's inputs to the device without a host wait, keeping the host
integers a stage reads in Python on the host through every transfer, and the strict device mode's check
(docs/gpus.md: a host wait per transfer stalls the GPU's stream)."""

from __future__ import annotations

import torch

from .wire import HEADER_KEYS, in_header

Tensors = dict[str, torch.Tensor]


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` without a host wait: from pinned memory on CUDA (a copy from pageable memory would be
    staged by the host), ``non_blocking`` everywhere."""
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def host_side(tensors: Tensors, device: torch.device) -> Tensors:
    """``tensors`` as a transfer hands them on: the host integers of :data:`~.wire.HEADER_KEYS` where they are
    (on the host they travel in the header, and arrive on the receiver's host), every other tensor on
    ``device`` (:func:`to_device`)."""
    return {k: v if k in HEADER_KEYS else to_device(v, device) for k, v in tensors.items()}


def on_device(tensors: Tensors, device: torch.device, what) -> None:
    """Raise ``RuntimeError`` naming the first of ``tensors`` not on ``device`` (strict device mode), the host
    integers that travel in a transfer's header (:func:`~.wire.in_header`) aside."""
    for key, t in tensors.items():
        if t.device != device and not in_header(key, t):
            raise RuntimeError(f"{what}: {key!r} is on {t.device}, not on this rank's device {device} (strict "
                               f"device mode: every tensor a transfer or collective is handed is on the device)")


def host_prepare(preprocess, raw: Tensors, pin: bool) -> Tensors:
    """The host half of ``DATA_LOAD`` for ``preprocess`` (a :class:`~.step_context.Preprocess`), done when the micro
    is loaded, before the step's first action (:func:`~.preload.load_owned`): a padding mask of all ones dropped
    (to transformers' mask builders an absent ``attention_mask`` means no padding, the same masks, and they would
    otherwise read the mask back from the device once per stage and micro-batch), the host metadata
    ``preprocess.host`` computes added, and (``pin``, on CUDA) every tensor bound for the device copied to pinned
    memory, so that ``DATA_LOAD`` itself allocates no pinned memory and only issues ``non_blocking`` copies."""
    if "attention_mask" in raw and bool(raw["attention_mask"].all()):  # read on the host, where the loader made it
        raw = {k: v for k, v in raw.items() if k != "attention_mask"}  # HF's "no padding": nothing to read back
    raw = preprocess.with_host(raw)
    if pin:
        keep = preprocess.host_keys
        raw = {k: v if k in keep or v.is_pinned() else v.pin_memory() for k, v in raw.items()}
    return raw
