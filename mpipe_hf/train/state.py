"""The training state a run resumes from: each rank's optimizer, LR schedule, RNG states and step, beside the
weights of a ``checkpoint-<step>`` directory (written atomically by :func:`~.checkpoint.save_checkpoint`).

A run resumes bit-exactly because everything else is a function of the step: the rows of step ``k`` come from
the seeded :class:`~mpipe_hf.data.MicroBatchPlan`, and ``P``'s dropout from ``preprocess_seed(seed, k, m)``.
"""

from __future__ import annotations

import json
import os
import random
import re
import warnings

import numpy as np
import torch

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
RANK_STATE = re.compile(r"^rank(\d+)_state\.pt$")


def rank_state_name(rank: int) -> str:
    return f"rank{rank}_state.pt"


def rng_states() -> dict:
    """This process's torch (CPU and CUDA), Python and NumPy generator states."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def optimizer_names(optimizer, params: dict) -> list[str]:
    """The parameter names of ``optimizer``'s state indices: ``params`` is ``{name: parameter}``."""
    names = {id(p): n for n, p in params.items()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def rank_state(step: int, optimizer, scheduler, skips, params: dict) -> dict:
    """What rank-local state a checkpoint at ``step`` (steps done) holds; ``params`` (``{name: parameter}``,
    what the rank trains) names the optimizer's state, so that a run of another layout can find it."""
    return {"step": step, "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "param_names": optimizer_names(optimizer, params) if optimizer is not None else [],
            "scheduler": scheduler.state_dict() if scheduler is not None else None, "rng": rng_states(),
            "skips": {"in_row": skips.in_row, "total": skips.total, "last": skips.last,
                      "bad_rows": skips.bad_rows, "rows": dict(skips.rows)}}


def load_rank_state(directory: str, rank: int, optimizer, scheduler, skips, params: dict,
                    reset_optimizer: bool = False, map_location="cpu") -> int:
    """Restore this rank's state from ``directory``; return the steps done.

    Saved by the same layout (this rank's file names the same parameters in the same order), everything is
    restored as it was: the run continues bit-exactly. Saved by another ``pp_size``, ``vpp`` or layout, each
    parameter's AdamW state is found by its name in whichever rank's file holds it (read memory-mapped, one
    file at a time, keeping only this rank's entries); the LR schedule, skip counts and step come from rank 0's
    file, the RNG states from this rank's file where there is one. ``reset_optimizer`` keeps AdamW's fresh
    state instead. Every file is read onto ``map_location`` (the CPU: the RNG states must be CPU tensors, and the
    optimizer moves each moment to its parameter's device), never onto the device it was saved from.

    Raises:
        ValueError: the directory has no training state; a parameter this rank trains has no optimizer state in
            the checkpoint (it was frozen, or another model) and ``reset_optimizer`` is off.
    """
    files = sorted(f for f in os.listdir(directory) if RANK_STATE.match(f))
    if rank_state_name(0) not in files:
        raise ValueError(f"checkpoint {directory!r} has no training state ({rank_state_name(0)})")
    own, zero = os.path.join(directory, rank_state_name(rank)), os.path.join(directory, rank_state_name(0))
    mine = torch.load(own, map_location=map_location, weights_only=False) if os.path.isfile(own) else None
    names = optimizer_names(optimizer, params) if optimizer is not None else []
    same = mine is not None and mine["param_names"] == names and not reset_optimizer
    if same or own == zero:
        state = mine
    else:  # the step, the skips and the schedule's position are rank 0's; the RNG this rank's, if saved
        state = torch.load(zero, map_location=map_location, weights_only=False) | (
            {"rng": mine["rng"]} if mine is not None else {})
    if same:
        if optimizer is not None:
            optimizer.load_state_dict(_shard_like(state["optimizer"], optimizer))
        if state["scheduler"] is not None:  # None: saved by a rank without an optimizer before it had a schedule
            scheduler.load_state_dict(state["scheduler"])
    else:
        if optimizer is not None and not reset_optimizer:
            optimizer.load_state_dict(_shard_like(_by_name(directory, files, optimizer, names), optimizer))
        # the learning rate lives in the optimizer's groups: step a fresh schedule to where the saved one was
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
            for _ in range(state["scheduler"]["last_epoch"] if state["scheduler"] is not None else 0):
                scheduler.step()
    set_rng_states(state["rng"])
    saved = state["skips"]
    skips.in_row, skips.total, skips.last = saved["in_row"], saved["total"], saved["last"]
    skips.bad_rows = saved.get("bad_rows", 0)  # not in a checkpoint from before rows were dropped one by one
    skips.rows = dict(saved.get("rows", {}))  # {index: (where, digest)}: the plan leaves out those still there
    return int(state["step"])


def _shard_like(state_dict: dict, optimizer) -> dict:
    """``state_dict`` with each whole moment of a sharded (FSDP2, DTensor) parameter cut to this replica's shard,
    as the parameter is cut (``Shard(0)``: ``torch.chunk`` over the ``dp`` mesh); a checkpoint holds whole
    tensors, so it loads onto any ``dp_size``."""
    from torch.distributed.tensor import DTensor

    from ..runtime.data_parallel import is_sharded
    params = [p for group in optimizer.param_groups for p in group["params"]]
    out = {"state": {}, "param_groups": state_dict["param_groups"]}
    for index, values in state_dict["state"].items():
        p = params[index]
        if not is_sharded(p):
            out["state"][index] = values
            continue
        mesh, rank = p.device_mesh, p.device_mesh.get_local_rank()
        sharded = {}
        for key, v in values.items():
            if torch.is_tensor(v) and not is_sharded(v) and v.shape == p.shape:
                chunks = torch.chunk(v, mesh.size(), dim=0)
                piece = chunks[rank] if rank < len(chunks) else v.new_empty((0, *v.shape[1:]))
                piece = piece.to(p.to_local().device).contiguous()  # a state read onto the CPU
                v = DTensor.from_local(piece, mesh, p.placements, shape=p.shape, stride=p.stride())
            sharded[key] = v
        out["state"][index] = sharded
    return out


def _by_name(directory: str, files: list[str], optimizer, names: list[str]) -> dict:
    """An AdamW ``state_dict`` for ``optimizer`` (its own param groups) whose per-parameter state is read by
    name from the checkpoint's rank files."""
    wanted, found = set(names), {}
    for file in files:
        saved = torch.load(os.path.join(directory, file), map_location="cpu", weights_only=False, mmap=True)
        if saved["optimizer"] is None:
            continue
        for index, name in enumerate(saved["param_names"]):
            if name in wanted and name not in found and index in saved["optimizer"]["state"]:
                found[name] = {k: v.clone() if torch.is_tensor(v) else v
                               for k, v in saved["optimizer"]["state"][index].items()}
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"checkpoint {directory!r} has no optimizer state for {len(missing)} parameters this run "
                         f"trains ({missing[:3]}{' ...' if len(missing) > 3 else ''}): they were frozen or are "
                         f"not in that model; set train.reset_optimizer: true to start AdamW afresh")
    current = optimizer.state_dict()
    return {"state": {i: found[n] for i, n in enumerate(names)}, "param_groups": current["param_groups"]}


def checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """``[(step, path)]`` of the complete ``checkpoint-<step>`` directories in ``output_dir``, oldest first (a
    directory of that name is complete: it is renamed into place only when written)."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(m.group(1)), os.path.join(output_dir, name)) for name in os.listdir(output_dir)
             if (m := CHECKPOINT.match(name)) and os.path.isdir(os.path.join(output_dir, name))]
    return sorted(found)


def resolve_resume(resume: str | None, output_dir: str, run_id: str = "", restart: int = 0) -> str | None:
    """The checkpoint directory to resume from: ``None`` (a fresh start); ``"auto"``, the newest complete
    checkpoint of ``output_dir`` (``None`` when there is none); or a path. A worker group that torchrun's
    elastic agent restarted (``restart > 0``) after a failure resumes by itself, with ``resume`` unset, from the
    newest checkpoint this run wrote (``trainer_state.json`` holds the launcher's ``run_id``), or starts afresh.

    Raises:
        ValueError: a path that is not a checkpoint directory with training state.
    """
    if resume is None and restart > 0:
        mine = [path for _, path in checkpoints(output_dir) if _run_id(path) == run_id]
        return mine[-1] if mine else None
    if resume is None:
        return None
    if resume == "auto":
        found = checkpoints(output_dir)
        return found[-1][1] if found else None
    if not os.path.isdir(resume) or not os.path.isfile(os.path.join(resume, rank_state_name(0))):
        raise ValueError(f"train.resume {resume!r} is not a checkpoint-<step> directory with training state "
                         f"({rank_state_name(0)}); give one, or 'auto'")
    return resume


def _run_id(path: str) -> str | None:
    try:
        with open(os.path.join(path, "trainer_state.json")) as f:
            return json.load(f).get("run_id")
    except (OSError, ValueError):
        return None
