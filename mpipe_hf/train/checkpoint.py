"""Sharded safetensors checkpoints that ``from_pretrained(dir)`` loads, written atomically.

Every pipeline rank writes its own share of the model into a temporary directory beside the target; rank 0 adds
the index, config and processor files, fsyncs them, then renames the directory into place. A crash leaves the
previous checkpoint untouched, and a write that fails on one rank fails the save on every rank. The shards must
land on one file system (one node, or a shared one).

:func:`save_hub_files` adds what a hub snapshot holds beside the weights (:mod:`mpipe_hf.data.hub`).
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from ..models.adapters import ADAPTER_WEIGHTS
from .collective import gathered, together


def save_checkpoint(out_dir: str, state: dict, rank: int, world: int, group: dist.ProcessGroup,
                    save_extras=None, merge: bool = False, rank_files: dict | None = None,
                    single_file: str | None = None) -> None:
    """Write ``state`` (this rank's ``{name: tensor}``) as shard ``rank`` of ``out_dir``.

    Args:
        out_dir: the final checkpoint directory; replaced atomically.
        state: this rank's share, in ``state_dict`` names.
        rank, world: this rank and the number of ranks in ``group``.
        group: the process group whose ranks each hold a share.
        save_extras: called by rank 0 with the temporary directory to save config/tokenizer/processor files.
        merge: ``out_dir`` holds other files that must stay (a Trainer's ``output_dir`` with its
            ``checkpoint-*`` directories): each written file is renamed into it (each file atomically), and the
            weight files of an earlier save that this one does not rewrite are removed.
        rank_files: ``{file name: object}`` this rank also writes into the checkpoint (``torch.save``), before
            it is renamed into place: its training state (:mod:`.state`).
        single_file: the weights are one file of this name, written by rank 0 from its ``state`` (the other
            ranks pass ``{}``), with no index: a PEFT adapter's ``adapter_model.safetensors``, gathered first.

    Raises:
        RuntimeError, ValueError: a write that failed on any rank (a full disk, a directory that is not
            writable), on every rank as ``"pipeline rank R, saving DIR: OSError: ..."``
            (:func:`~.collective.gathered`); the temporary directory is removed and ``out_dir`` is as it was.
    """
    out_dir = os.path.abspath(out_dir)
    tmp = out_dir + ".tmp"
    what = f"saving {out_dir}"
    try:  # each phase's failure on any rank is raised on every rank, so none waits in the next collective
        together(lambda: _fresh(tmp) if rank == 0 else None, what, rank, world, group)
        names = gathered(lambda: _write_own(tmp, state, rank, world, rank_files, single_file), what, rank, world,
                         group)
        together(lambda: _finish(tmp, out_dir, names, save_extras, merge, single_file) if rank == 0 else None,
                 what, rank, world, group)
    except Exception:
        if rank == 0:  # a failed save leaves nothing half-written; the checkpoints before it stay as they were
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fresh(tmp: str) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)


def _write_own(tmp: str, state: dict, rank: int, world: int, rank_files: dict | None, single_file: str | None):
    """This rank's shard (and ``rank_files``) into ``tmp``; returns ``(file, tensor names, bytes)``."""
    shard = single_file or f"model-{rank + 1:05d}-of-{world:05d}.safetensors"
    tensors = {name: t.detach().cpu().contiguous() for name, t in state.items()}
    if single_file is None or rank == 0:
        save_file(tensors, os.path.join(tmp, shard), metadata={"format": "pt"})
        _fsync(os.path.join(tmp, shard))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(os.path.join(tmp, shard), 0o666 & ~umask)  # safetensors writes 0600; share like the rest
    for name, obj in (rank_files or {}).items():
        torch.save(obj, os.path.join(tmp, name))
        _fsync(os.path.join(tmp, name))
    return shard, sorted(tensors), sum(t.numel() * t.element_size() for t in tensors.values())


def _finish(tmp: str, out_dir: str, names: list, save_extras, merge: bool, single_file: str | None) -> None:
    """Rank 0: the index and the extras into ``tmp``, everything flushed, then ``tmp`` renamed to ``out_dir``
    (or, with ``merge``, its files renamed into it one by one, the stale weight files of an earlier save
    removed)."""
    if single_file is None:
        weight_map = {name: file for file, keys, _ in names for name in keys}
        index = {"metadata": {"total_size": sum(size for _, _, size in names)}, "weight_map": weight_map}
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
    if save_extras is not None:
        save_extras(tmp)
    sync_tree(tmp)  # everything on disk before the directory appears under its name
    if merge:
        written = set(os.listdir(tmp))
        other_format = {"config.json"} if single_file else {"adapter_config.json", ADAPTER_WEIGHTS}
        for name in os.listdir(out_dir):
            stale = name in other_format or (
                name.startswith("model") and name.endswith((".safetensors", ".safetensors.index.json")))
            if stale and name not in written:  # weights of an earlier save (another world size, one file)
                os.remove(os.path.join(out_dir, name))
        for name in written:
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
        os.rmdir(tmp)
    else:
        _swap_in(tmp, out_dir)
    _fsync(os.path.dirname(out_dir))


def save_adapter(out_dir: str, peft_model, state: dict, rank: int, world: int, group: dist.ProcessGroup,
                 base_model: str | None = None, save_extras=None, rank_files: dict | None = None,
                 merge: bool = False) -> None:
    """Write the adapter of a LoRA run as PEFT's own checkpoint, which ``PeftModel.from_pretrained(base,
    out_dir)`` loads: ``adapter_config.json`` and one ``adapter_model.safetensors``, gathered on rank 0 from
    every rank's share (adapters are small: ``r * (in + out)`` per adapted layer), atomically as
    :func:`save_checkpoint`.

    Args:
        peft_model: this rank's ``PeftModel`` (``SplitModel.peft``): its config and key translation.
        state: this rank's share in HF model names (whole tensors); only its adapter tensors are saved.
        base_model: the base checkpoint, recorded as ``base_model_name_or_path`` (``None`` for a model
            initialised from a config).
        save_extras, rank_files, merge: as :func:`save_checkpoint`.

    Raises:
        RuntimeError, ValueError: as :func:`save_checkpoint`, on every rank.
    """
    from ..models.adapters import ADAPTER, adapter_state
    what = f"saving {os.path.abspath(out_dir)}"
    mine = together(lambda: {k: t.detach().cpu() for k, t in adapter_state(peft_model, state).items()}, what,
                    rank, world, group)
    parts = [None] * world if rank == 0 else None
    dist.gather_object(mine, parts, group=group, group_dst=0)
    whole = {k: t for part in parts for k, t in part.items()} if rank == 0 else {}

    def extras(directory):
        config = copy.deepcopy(peft_model.peft_config[ADAPTER])
        config.inference_mode = True
        # a local base as an absolute path (a hub id stays as it is)
        config.base_model_name_or_path = (os.path.abspath(base_model) if base_model is not None and
                                          os.path.isdir(base_model) else base_model)
        config.save_pretrained(directory)
        if save_extras is not None:
            save_extras(directory)
    save_checkpoint(out_dir, whole, rank, world, group, extras, merge, rank_files, ADAPTER_WEIGHTS)


def _fsync(path: str) -> None:
    """Flush a file's or a directory's data and metadata to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: str, b: str) -> bool:
    """Swap two directories in one step (Linux ``renameat2(RENAME_EXCHANGE)``); ``False`` where the call is not
    there."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        errno = ctypes.get_errno()
        if errno in (38, 22, 95):  # ENOSYS, EINVAL (file system without it), EOPNOTSUPP
            return False
        raise OSError(errno, os.strerror(errno), b)
    return True


def _swap_in(tmp: str, out_dir: str) -> None:
    """Put the complete directory ``tmp`` at ``out_dir`` with no moment at which ``out_dir`` is missing or
    partial: a rename for a new name, else an atomic exchange with the old one (which is then removed). Where
    the exchange is not available, the old directory is moved aside first (a short window)."""
    if not os.path.exists(out_dir):
        os.rename(tmp, out_dir)
        return
    if _exchange(tmp, out_dir):
        shutil.rmtree(tmp)
        return
    old = out_dir + ".old"
    os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def sync_tree(directory: str) -> None:
    """Flush every file and directory under ``directory`` (itself included, deepest first) to the disk. Each
    process that wrote into it calls this (on a shared file system only the writer's flush is sure to reach the
    disk).

    Raises:
        OSError: ``directory`` or an entry under it that cannot be listed, opened or flushed (one removed
            meanwhile, a broken link).
    """
    def fail(err: OSError):
        raise err
    for root, _, files in os.walk(directory, topdown=False, onerror=fail):
        for name in files:
            _fsync(os.path.join(root, name))
        _fsync(root)


def publish(tmp: str, out_dir: str) -> None:
    """Put the complete directory ``tmp`` at ``out_dir``: :func:`sync_tree`, then a rename (or, over an existing
    ``out_dir``, an atomic exchange, as :func:`save_checkpoint` does), then a flush of the parent, so that
    ``out_dir`` is either what it was or all of ``tmp``, also after a crash. Both must be on one file system.

    Raises:
        OSError: a flush or the rename failed (a failure before the rename leaves ``out_dir`` as it was).
    """
    sync_tree(tmp)
    _swap_in(tmp, out_dir)
    _fsync(os.path.dirname(os.path.abspath(out_dir)))


def save_hub_files(directory: str, config, processor, source: str | None = None, with_config: bool = True) -> None:
    """What a hub snapshot holds besides the weights, into ``directory``: the config (unless ``with_config`` is
    false: an adapter directory, which names its base model instead), and for a vision-language model the
    processor files, chat template and generation config (:func:`save_processor_files`; the source checkpoint's
    ``generation_config.json`` and video processor settings carried over when ``source`` has them), for a
    decoder-only LM the tokenizer (``processor``) and its generation config."""
    from transformers import GenerationConfig

    from ..data import chat_template_for
    from ..data.hub import save_processor_files, video_processor_config
    if with_config:
        config.save_pretrained(directory)
    generation = (GenerationConfig.from_pretrained(source) if source is not None and os.path.isfile(
        os.path.join(source, "generation_config.json")) else None)
    if not hasattr(config, "vision_config"):
        if processor is not None:
            processor.save_pretrained(directory)
        (generation or GenerationConfig.from_model_config(config)).save_pretrained(directory)
        return
    save_processor_files(directory, config, processor, chat_template_for(processor, config.model_type), generation,
                         video_processor_config(source) if source is not None and os.path.isdir(source) else None)
