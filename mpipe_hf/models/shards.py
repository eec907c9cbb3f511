"""Reading a rank's tensors from a safetensors checkpoint (used by :mod:`.load`): which shard holds each
on-disk name (:func:`checkpoint_files`), the model's name of each through transformers' conversion mapping
(:func:`disk_names`), and each tensor copied into place in blocks of at most :data:`READ_BLOCK_BYTES`
(:func:`read_into`), so a rank never holds a whole checkpoint tensor beside its target. A conversion that only
transposes a tensor under its own name (Qwen3-VL-MoE's hub experts, ``(E, H, 2I)`` for the model's
``(E, 2I, H)``: transformers' ``Transpose(1, 2, check_dims=True)``) is read block by block too, each block
transposed into place.
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

from .lm_head import output_head
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


def disk_names(model: nn.Module, disk_names: list[str], holder: tuple[str, str] | None = None,
               layouts: dict[str, tuple[int, int]] | None = None) -> dict[str, str]:
    """``{model tensor name: on-disk name}`` through transformers' conversion mapping of ``model``, or with
    ``holder`` (``(class name, attribute)``, :attr:`.family.Family.checkpoint`) through that of transformers' class
    which holds ``model`` at ``attribute``, whose checkpoints they are. A converter that transposes one tensor
    under its own name (:func:`transpose_of`) is a renaming here; ``layouts``, when given, receives
    ``{model tensor name: (dim0, dim1)}`` of the tensors it maps, for :func:`read_into`'s ``transpose``.

    Raises:
        ValueError: the mapping merges or splits tensors (not a plain renaming or transposition).
    """
    from transformers.conversion_mapping import get_model_conversion_mapping
    prefix = ""
    if holder is not None:
        import transformers
        with torch.device("meta"):
            model = getattr(transformers, holder[0])(model.config)
        prefix = holder[1] + "."
    transforms = get_model_conversion_mapping(model)
    converters = [t for t in transforms if isinstance(t, WeightConverter) and transpose_of(t) is None]
    if converters:
        raise ValueError(f"{type(model).__name__}'s checkpoint conversion merges or splits tensors "
                         f"({converters[0]!r}); per-rank loading supports renamings only")
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    transposes = [t for t in transforms if isinstance(t, WeightConverter)]
    meta_state = model.state_dict()
    out = {}
    for disk in disk_names:
        name, pattern = rename_source_key(disk, renamings, transposes, model.base_model_prefix, meta_state)
        name = name.removeprefix(prefix) if name.startswith(prefix) else name
        out[name] = disk
        if pattern is not None and layouts is not None:
            layouts[name] = next(transpose_of(t) for t in transposes if pattern in t.source_patterns)
    return out


def transpose_of(converter) -> tuple[int, int] | None:
    """``(dim0, dim1)`` of a converter that only transposes one tensor under its own name (one source, one target
    pattern, equal; one ``Transpose`` operation), else ``None``."""
    from transformers.core_model_loading import Transpose
    ops = getattr(converter, "operations", [])
    same = len(converter.source_patterns) == 1 and converter.source_patterns == converter.target_patterns
    if not same or len(ops) != 1 or not isinstance(ops[0], Transpose):
        return None
    return ops[0].dim0, ops[0].dim1


def _swap(shape: tuple, want: tuple, transpose, key: str, path: str, what: str) -> tuple[int, int] | None:
    """``None`` when the checkpoint's ``shape`` of ``key`` is ``want``; ``transpose`` when ``shape`` with those two
    dimensions swapped is (as ``Transpose(check_dims=True)`` decides).

    Raises:
        ValueError: neither (``what``: the model's tensor, named in the message).
    """
    if shape == want:
        return None
    if transpose is not None and len(shape) > max(transpose):
        swapped = list(shape)
        swapped[transpose[0]], swapped[transpose[1]] = shape[transpose[1]], shape[transpose[0]]
        if tuple(swapped) == want:
            return tuple(transpose)
    raise ValueError(f"checkpoint {path!r}: {key} has shape {shape}, {what} {want}")


def read_into(file: str, key: str, target: torch.Tensor, report: LoadReport, path: str,
              transpose: tuple[int, int] | None = None) -> None:
    """Copy tensor ``key`` of shard ``file`` into ``target``, in blocks of rows of at most
    :data:`READ_BLOCK_BYTES`. The shard is opened afresh for each block, so neither the block nor the memory
    map (whose file pages count as resident while mapped) ever covers more than one block. ``transpose``
    (:func:`disk_names`' ``layouts``): a checkpoint tensor stored with these two dimensions swapped is
    transposed into place, block by block.

    Raises:
        ValueError: the checkpoint's shape differs from the model's (and from its transposition).
    """
    with safe_open(file, "pt", device="cpu") as f:
        shape = tuple(f.get_slice(key).get_shape())
    swap = _swap(shape, tuple(target.shape), transpose, key, path, "the model's tensor")
    rows = shape[0] if shape else 1
    step = max(1, READ_BLOCK_BYTES * rows // max(1, nbytes(target)))
    into = 0 if swap is None or 0 not in swap else sum(swap)  # the model's dimension of the disk's rows
    for start in range(0, rows, step):
        with safe_open(file, "pt", device="cpu") as f:
            piece = f.get_slice(key)[start:start + step] if shape else f.get_tensor(key)
            block = target.narrow(into, start, piece.shape[0]) if shape else target
            block.copy_(piece if swap is None else piece.transpose(*swap))
            report.read_bytes += nbytes(piece)
            report.largest_temporary_bytes = max(report.largest_temporary_bytes, nbytes(piece))
            del piece
    target._is_hf_initialized = True


def read_experts_into(file: str, key: str, target: torch.Tensor, cut, report: LoadReport, path: str,
                      transpose: tuple[int, int] | None = None) -> None:
    """Copy this rank's experts of the fused tensor ``key`` of shard ``file`` into the expert shard ``target``, as
    ``cut`` (an :class:`~.expert_shards.ExpertCut`) places them: an expert-major cut reads only its rows, at
    most :data:`READ_BLOCK_BYTES` (or one expert) at a time; another reads the whole tensor. ``transpose``: as
    :func:`read_into`.

    Raises:
        ValueError: the checkpoint's shape is not ``cut.fused`` (nor its transposition).
    """
    with safe_open(file, "pt", device="cpu") as f:
        shape = tuple(f.get_slice(key).get_shape())
    swap = _swap(shape, tuple(cut.fused), transpose, key, path, "the fused tensor of this rank's experts")
    if not (cut.dim == 0 and cut.outer == 1 and cut.inner == 1 and (swap is None or 0 not in swap)):
        with safe_open(file, "pt", device="cpu") as f:
            whole = f.get_tensor(key)
        piece = cut.cut(whole if swap is None else whole.transpose(*swap))
        target.copy_(piece)
        report.read_bytes += nbytes(whole)
        report.largest_temporary_bytes = max(report.largest_temporary_bytes, nbytes(whole))
    else:
        rows = cut.rows
        step = max(1, READ_BLOCK_BYTES * target.shape[0] // max(1, nbytes(target)))
        for start in range(rows.start, rows.stop, step):
            with safe_open(file, "pt", device="cpu") as f:
                piece = f.get_slice(key)[start:min(start + step, rows.stop)]
                target[start - rows.start:start - rows.start + piece.shape[0]].copy_(
                    piece if swap is None else piece.transpose(*swap))
                report.read_bytes += nbytes(piece)
                report.largest_temporary_bytes = max(report.largest_temporary_bytes, nbytes(piece))
                del piece
    target._is_hf_initialized = True  # as read_into: read, not to be initialised again


def untie_if_saved_apart(model: nn.Module, source: dict[str, str]) -> None:
    """A config that ties the LM head (:func:`~.lm_head.output_head`: ``lm_head``, Llama 4's
    ``language_model.lm_head``) to the input embedding, with a checkpoint that stores a head of its own: keep the
    two apart, as ``from_pretrained`` does (and warn), so that neither overwrites the other and their gradients
    are not summed. ``source``: ``{model tensor name: checkpoint key}``."""
    found = output_head(model)
    embed = model.get_input_embeddings()
    if found is None or found[1].weight is not embed.weight or f"{found[0]}.weight" not in source:
        return
    name, head = found[0] + ".weight", found[1]
    embed_name = next(n for n, p in model.named_parameters() if p is embed.weight)
    if source.get(embed_name) == source[name]:
        return
    warnings.warn(f"the config ties {name} to {embed_name}, but the checkpoint stores {name} apart "
                  f"({source[name]}); loading both, untied")
    head.weight = nn.Parameter(torch.empty_like(embed.weight), requires_grad=embed.weight.requires_grad)
    for cfg in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        cfg.tie_word_embeddings = False
