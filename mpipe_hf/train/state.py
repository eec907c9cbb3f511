"""The training state a run resumes from: each rank's optimizer, LR schedule, RNG states and step, beside the
weights of a ``checkpoint-<step>`` directory (written atomically by :func:`~.checkpoint.save_checkpoint`).

A run resumes bit-exactly because everything else is a function of the step: the rows of step ``k`` come from
the seeded :class:`~mpipe_hf.data.MicroBatchPlan`, and ``P``'s dropout from ``preprocess_seed(seed, k, m)``.
"""

from __future__ import annotations

import os
import random
import re

import numpy as np
import torch

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


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


def rank_state(step: int, optimizer, scheduler, skips) -> dict:
    """What rank-local state a checkpoint at ``step`` (steps done) holds."""
    return {"step": step, "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None, "rng": rng_states(),
            "skips": {"in_row": skips.in_row, "total": skips.total, "last": skips.last}}


def load_rank_state(directory: str, rank: int, optimizer, scheduler, skips) -> int:
    """Restore this rank's state from ``directory``; return the steps done.

    Raises:
        ValueError: the checkpoint has no state for ``rank`` (saved with another ``pp_size``) or its optimizer
            state does not fit this rank's parameters.
    """
    path = os.path.join(directory, rank_state_name(rank))
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint {directory!r} has no training state for pipeline rank {rank} "
                         f"({rank_state_name(rank)}): was it saved with another pp_size?")
    state = torch.load(path, weights_only=False)
    try:
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"checkpoint {directory!r}: the optimizer state of rank {rank} does not fit this run's "
                         f"parameters ({err}); resume with the layout it was saved with") from err
    set_rng_states(state["rng"])
    skips.in_row, skips.total, skips.last = state["skips"]["in_row"], state["skips"]["total"], state["skips"]["last"]
    return int(state["step"])


def checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """``[(step, path)]`` of the complete ``checkpoint-<step>`` directories in ``output_dir``, oldest first (a
    directory of that name is complete: it is renamed into place only when written)."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(m.group(1)), os.path.join(output_dir, name)) for name in os.listdir(output_dir)
             if (m := CHECKPOINT.match(name)) and os.path.isdir(os.path.join(output_dir, name))]
    return sorted(found)


def resolve_resume(resume: str | None, output_dir: str) -> str | None:
    """The checkpoint directory to resume from: ``None``; ``"auto"``, the newest complete checkpoint of
    ``output_dir`` (``None`` when there is none: a fresh start); or a path.

    Raises:
        ValueError: a path that is not a checkpoint directory with training state.
    """
    if resume is None:
        return None
    if resume == "auto":
        found = checkpoints(output_dir)
        return found[-1][1] if found else None
    if not os.path.isfile(os.path.join(resume, rank_state_name(0))):
        raise ValueError(f"train.resume {resume!r} is not a checkpoint-<step> directory with training state "
                         f"({rank_state_name(0)}); give one, or 'auto'")
    return resume
