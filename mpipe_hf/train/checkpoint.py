"""Sharded safetensors checkpoints that ``from_pretrained(dir)`` loads, written atomically.

Every pipeline rank writes its own share of the model into a temporary directory beside the target; rank 0 adds
the index, config and processor files, then renames the directory into place. A crash leaves the previous
checkpoint untouched. The shards must land on one file system (one node, or a shared one).
"""

from __future__ import annotations

import json
import os
import shutil

import torch.distributed as dist
from safetensors.torch import save_file


def save_checkpoint(out_dir: str, state: dict, rank: int, world: int, group: dist.ProcessGroup,
                    save_extras=None) -> None:
    """Write ``state`` (this rank's ``{name: tensor}``) as shard ``rank`` of ``out_dir``.

    Args:
        out_dir: the final checkpoint directory; replaced atomically.
        state: this rank's share, in ``state_dict`` names.
        rank, world: this rank and the number of ranks in ``group``.
        group: the process group whose ranks each hold a share.
        save_extras: called by rank 0 with the temporary directory to save config/tokenizer/processor files.
    """
    out_dir = os.path.abspath(out_dir)
    tmp = out_dir + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    dist.barrier(group=group)
    shard = f"model-{rank + 1:05d}-of-{world:05d}.safetensors"
    tensors = {name: t.detach().cpu().contiguous() for name, t in state.items()}
    save_file(tensors, os.path.join(tmp, shard), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(os.path.join(tmp, shard), 0o666 & ~umask)  # safetensors writes 0600; share like the other files
    names = [None] * world
    dist.all_gather_object(names, (shard, sorted(tensors), sum(t.numel() * t.element_size()
                                                                for t in tensors.values())), group=group)
    if rank == 0:
        weight_map = {name: file for file, keys, _ in names for name in keys}
        index = {"metadata": {"total_size": sum(size for _, _, size in names)}, "weight_map": weight_map}
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
        if save_extras is not None:
            save_extras(tmp)
        old = out_dir + ".old"
        if os.path.exists(out_dir):
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier(group=group)
