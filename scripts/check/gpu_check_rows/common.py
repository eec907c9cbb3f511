"""What every row of ``scripts/check/gpu_check.py`` shares: the table's :class:`Row`, the settings a row reads
(:class:`Setup`), the executor over a split model, and the wrappers that run each action under CUDA's sync-debug
mode."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

MIB = 2 ** 20
NA = "n/a on cpu"
SYNC = "synchroniz"  # the text of torch's warning: "called a synchronizing CUDA operation"


@dataclass
class Row:
    """One line of the table: ``result`` is PASS, FAIL, INFO or n/a; ``values`` the raw figures (bytes, s)."""

    check: str
    result: str
    figures: str
    values: dict = field(default_factory=dict)


@dataclass
class Setup:
    """What the rows read: the device, the command line, and the rows to break on purpose (``--break``)."""

    device: torch.device
    args: object
    breaks: frozenset = frozenset()

    @property
    def cuda(self) -> bool:
        """Whether the rows run on a GPU."""
        return self.device.type == "cuda"

    def broken(self, check: str) -> bool:
        """Whether ``--break`` named the row ``check``."""
        return check in self.breaks


def mib(n: float) -> str:
    """``n`` bytes in MiB, two decimals."""
    return f"{n / MIB:.2f} MiB"


def first_line(err: BaseException) -> str:
    """``type: message``'s first line of ``err``."""
    text = f"{type(err).__name__}: {err}".strip()
    return text.splitlines()[0] if text else type(err).__name__


def offending_frame(err: BaseException) -> str:
    """``file:line in function: error`` of the innermost frame outside torch itself in the deepest cause of
    ``err`` (the code that made the synchronising call)."""
    while err.__cause__ is not None or err.__context__ is not None:
        err = err.__cause__ or err.__context__
    frames = traceback.extract_tb(err.__traceback__)
    torch_dir = os.path.dirname(torch.__file__)
    outside = [f for f in frames if not f.filename.startswith(torch_dir)] or frames
    if not outside:
        return first_line(err)
    f = outside[-1]
    return f"{os.path.relpath(f.filename)}:{f.lineno} in {f.name}: {first_line(err)}"


def pinned(micro: dict, device: torch.device) -> dict:
    """``micro`` in pinned host memory on CUDA (as a DataLoader with ``pin_memory=True`` hands it over)."""
    if device.type != "cuda":
        return micro
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v
            for k, v in micro.items()}


@contextlib.contextmanager
def around_actions(before, after):
    """Call ``before(action)`` and ``after(action)`` around every action an executor runs (the handler table's
    ``run_action``, wherever the runtime imported it)."""
    from mpipe_hf.runtime import handlers
    original = handlers.run_action

    def wrapped(ctx, action):
        before(action)
        try:
            return original(ctx, action)
        finally:
            after(action)
    users = [m for name, m in list(sys.modules.items())
             if name.startswith("mpipe_hf.runtime") and getattr(m, "run_action", None) is original]
    for module in users:
        module.run_action = wrapped
    try:
        yield
    finally:
        for module in users:
            module.run_action = original


def sync_errors():
    """Every action under ``torch.cuda.set_sync_debug_mode("error")`` (a synchronising call inside one raises)."""
    return around_actions(lambda a: torch.cuda.set_sync_debug_mode("error"),
                          lambda a: torch.cuda.set_sync_debug_mode(0))


def executor_for(split, cfg, device: torch.device, bf16: bool = False, **kwargs):
    """A :class:`~mpipe_hf.runtime.PipelineExecutor` for rank 0 of ``cfg`` over ``split`` on the world group,
    strict device mode on (``bf16``: stages and ``P`` under bf16 autocast, as ``train.bf16``); ``kwargs`` go to
    the executor. Returns ``(executor, the parameters it trains)``."""
    from mpipe_hf.runtime import PipelineExecutor
    from mpipe_hf.train.precision import autocast_modules
    stages, pre = split.stages, split.preprocess
    if bf16:
        stages, pre = autocast_modules(stages, pre, device)
    params = split.trainable_parameters(cfg, 0)
    kwargs.setdefault("strict", True)
    ex = PipelineExecutor(cfg, 0, stages, pre, dist.group.WORLD, device, params.values(), timedelta(seconds=120),
                          split.tied_parameters(cfg, 0), seed=0, **kwargs)
    return ex, params


@contextlib.contextmanager
def closing(ex):
    """``ex``, closed on the way out (a close that fails after a failed step is not the row's result)."""
    try:
        yield ex
    finally:
        with contextlib.suppress(Exception):
            ex.close()


def drop_grads(params) -> None:
    """Forget the gradients of ``params`` (a dict or a list)."""
    for p in (params.values() if isinstance(params, dict) else params):
        p.grad = None


def sync_debug_step(ex, load) -> tuple[str | None, object]:
    """One step of ``ex`` with every action under sync-debug mode ``"error"``: ``(None, stats)``, or the first
    synchronising line and ``None``."""
    with sync_errors():
        try:
            return None, ex.step(load)
        except Exception as err:  # noqa: BLE001 - the failure is the result
            return offending_frame(err), None
