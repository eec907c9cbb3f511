"""Reading a rank's tensors from a safetensors checkpoint (used by :mod:`.load`): which shard holds each
on-disk name (:func:`checkpoint_files`), the model's name of each through transformers' conversion mapping
(:func:`disk_names`), and each tensor copied into place in blocks of at most :data:`READ_BLOCK_BYTES`
(:func:`read_into`), so a rank never holds a whole checkpoint tensor beside its target.
"""

from __future__ import annotations

import json
import os
import warnings

import torch
from safetensors import safe_open
from torch import nn
from transformers.core_model_loading import WeightConverter, rename_source_key
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from .materialize import LoadReport, nbytes

READ_BLOCK_BYTES = 64 * 2**20  # the most of one checkpoint tensor held beside its target while it is read


def checkpoint_files(path: str) -> dict[str, str]:
    """``{on-disk tensor name: shard file}`` of a safetensors checkpoint directory.

    Raises:
        ValueError: the directory has no safetensors weights.
    """
    index = os.path.join(path, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {k: os.path.join(path, v) for k, v in weight_map.items()}
    single = os.path.join(path, SAFE_WEIGHTS_NAME)
    if not os.path.isfile(single):
        raise ValueError(f"model.name_or_path {path!r} has no safetensors weights ({SAFE_WEIGHTS_NAME} or "
                         f"{SAFE_WEIGHTS_INDEX_NAME}); convert it with save_pretrained(safe_serialization=True)")
    with safe_open(single, "pt", device="cpu") as f:
        return {k: single for k in f.keys()}


def disk_names(model: nn.Module, disk_names: list[str], holder: tuple[str, str] | None = None) -> dict[str, str]:
    """``{model tensor name: on-disk name}`` through transformers' conversion mapping of ``model``, or with
    ``holder`` (``(class name, attribute)``, :attr:`.family.Family.checkpoint`) through that of transformers' class
    which holds ``model`` at ``attribute``, whose checkpoints they are.

    Raises:
        ValueError: the mapping merges or splits tensors (not a plain renaming).
    """
    from transformers.conversion_mapping import get_model_conversion_mapping
    prefix = ""
    if holder is not None:
        import transformers
        with torch.device("meta"):
            model = getattr(transformers, holder[0])(model.config)
        prefix = holder[1] + "."
    transforms = get_model_conversion_mapping(model)
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    if converters:
        raise ValueError(f"{type(model).__name__}'s checkpoint conversion merges or splits tensors "
                         f"({converters[0]!r}); per-rank loading supports renamings only")
    meta_state = model.state_dict()
    out = {}
    for disk in disk_names:
        name, _ = rename_source_key(disk, transforms, [], model.base_model_prefix, meta_state)
        out[name.removeprefix(prefix) if name.startswith(prefix) else name] = disk
    return out


def read_into(file: str, key: str, target: torch.Tensor, report: LoadReport, path: str) -> None:
    """Copy tensor ``key`` of shard ``file`` into ``target``, in blocks of rows of at most
    :data:`READ_BLOCK_BYTES`. The shard is opened afresh for each block, so neither the block nor the memory
    map (whose file pages count as resident while mapped) ever covers more than one block.

    Raises:
        ValueError: the checkpoint's shape differs from the model's.
    """
    with safe_open(file, "pt", device="cpu") as f:
        shape = tuple(f.get_slice(key).get_shape())
    if shape != tuple(target.shape):
        raise ValueError(f"checkpoint {path!r}: {key} has shape {shape}, the model's tensor {tuple(target.shape)}")
    rows = shape[0] if shape else 1
    step = max(1, READ_BLOCK_BYTES * rows // max(1, nbytes(target)))
    for start in range(0, rows, step):
        with safe_open(file, "pt", device="cpu") as f:
            piece = f.get_slice(key)[start:start + step] if shape else f.get_tensor(key)
            (target[start:start + step] if shape else target).copy_(piece)
            report.read_bytes += nbytes(piece)
            report.largest_temporary_bytes = max(report.largest_temporary_bytes, nbytes(piece))
            del piece
    target._is_hf_initialized = True


def untie_if_saved_apart(model: nn.Module, source: dict[str, str]) -> None:
    """A config that ties ``lm_head`` to the input embedding, with a checkpoint that stores an ``lm_head`` of its
    own: keep the two apart, as ``from_pretrained`` does (and warn), so that neither overwrites the other and
    their gradients are not summed."""
    head = getattr(model, "lm_head", None)
    embed = model.get_input_embeddings()
    if head is None or head.weight is not embed.weight or "lm_head.weight" not in source:
        return
    embed_name = next(n for n, p in model.named_parameters() if p is embed.weight)
    if source.get(embed_name) == source["lm_head.weight"]:
        return
    warnings.warn(f"the config ties lm_head to {embed_name}, but the checkpoint stores lm_head.weight apart "
                  f"({source['lm_head.weight']}); loading both, untied")
    head.weight = nn.Parameter(torch.empty_like(embed.weight), requires_grad=embed.weight.requires_grad)
    for cfg in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        cfg.tie_word_embeddings = False
