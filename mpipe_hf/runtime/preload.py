"""A step's data, loaded before its first transfer, and one vote on whether the step runs (issue 27, SPEC.md
"Runtime rules": a failure on one rank ends the step on every rank with that error).

Every owner calls ``load(m)`` (which decodes and validates the micro-batch's rows and raises ``ValueError`` on a bad
one) for each ``DATA_LOAD`` of its action list, the next step's look-ahead micros included, before the step sends
or receives anything. Then one all-reduce of two ``int64`` (``SUM``) over a gloo group of every rank of the
pipeline and its replicas says whether any rank failed, and how many rows the loads dropped (a bad row costs that
row, not the step: :meth:`~mpipe_hf.data.owner.MicroBatchPlan.load_rows`). The failing ranks publish their error
first (the watchdog's key, the first writer wins), so every rank raises the same text, and the step is skipped
without one transfer posted: no communicator is left with half a step, and nothing has to be aborted or rebuilt.
The vote runs on the host (gloo, CPU tensors), so on NCCL it costs no device synchronisation.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from ..schedule.actions import Action, Kind
from .group_names import member_group
from .watchdog import Watchdog

Tensors = dict[str, torch.Tensor]

_CONTROL: dict[tuple[tuple[int, ...], timedelta], dist.ProcessGroup] = {}  # one vote group per rank set


def alive(group: dist.ProcessGroup) -> bool:
    """Whether ``group`` belongs to the current default process group (not one destroyed since it was made): the
    check before a cached group (:func:`control_group`'s, :mod:`.groups`' idle ones) is used again."""
    return group in dist.distributed_c10d._world.pg_map


def control_group(ranks: Sequence[int], timeout: timedelta) -> dist.ProcessGroup:
    """The gloo group the vote runs on, over global ``ranks`` (made once per rank set and reused by every
    executor over it; every rank in ``ranks`` must call this at the same point the first time; named by
    :func:`~.group_names.member_group`, as the ranks may hold different numbers of groups by then)."""
    key = (tuple(ranks), timeout)
    if key not in _CONTROL or not alive(_CONTROL[key]):  # not a destroyed world's
        _CONTROL[key] = member_group(list(ranks), "control/" + "-".join(map(str, ranks)), timeout, backend="gloo")
    return _CONTROL[key]


def shared_error(err: BaseException, where: str) -> BaseException:
    """``err`` as every rank will raise it, prefixed by ``where`` (``"pipeline rank R, ACTION"``): a
    ``ValueError`` (a bad sample: the trainer may skip the step) or a ``TimeoutError`` keeps its kind; anything
    else becomes a ``RuntimeError`` naming the original type."""
    if type(err) in (ValueError, TimeoutError):
        return type(err)(f"{where}: {err}")
    return RuntimeError(f"{where}: {type(err).__name__}: {err}")


def load_owned(order: Sequence[Action], load: Callable[[int], Tensors], rank: int,
               prepare: Callable[[Tensors], Tensors] | None = None
               ) -> tuple[dict[int, Tensors], BaseException | None]:
    """``({micro: raw inputs}, None)`` for every ``DATA_LOAD`` of ``order``, in order, each through ``prepare``
    (the host's part of ``DATA_LOAD``, :func:`~.placement.host_prepare`); on the first load that raises, ``(what
    loaded so far, the error as every rank will raise it)`` (:func:`shared_error`)."""
    loaded: dict[int, Tensors] = {}
    for action in order:
        if action.kind is not Kind.DATA_LOAD:
            continue
        try:
            raw = load(action.micro)
            loaded[action.micro] = prepare(raw) if prepare is not None else raw
        except Exception as err:  # noqa: BLE001 - any failure of a load skips or ends the step on every rank
            return loaded, shared_error(err, f"pipeline rank {rank}, {action}")
    return loaded, None


def vote(group: dist.ProcessGroup, watchdog: Watchdog, error: BaseException | None,
         dropped: Sequence[str] = ()) -> tuple[int, str | None]:
    """Every rank of ``group`` learns whether any failed to load, and how many rows the ranks' loads dropped (a
    bad row costs that row, :meth:`~mpipe_hf.data.owner.MicroBatchPlan.load_rows`): one all-reduce (``SUM``) of
    two ``int64``, ``[failed, rows dropped]``. A failing rank publishes ``error`` first; then every rank raises the
    first published error. A rank that dropped rows publishes the last one's text (the first such rank wins).

    Args:
        dropped: the rows this rank's loads of the step dropped, each ``"WHERE (WHY)"``.

    Returns:
        ``(rows dropped on every rank together, one of their texts or None)``: the same on every rank.

    Raises:
        ValueError, TimeoutError, RuntimeError: the first rank's load error (the same text on every rank).
    """
    if error is not None:
        watchdog.report(error)
    key = f"{watchdog.key}/dropped"
    if dropped:
        watchdog.store.compare_set(key, "", dropped[-1])
    flag = torch.tensor([int(error is not None), len(dropped)], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.SUM, group=group)
    if int(flag[0]):
        raise watchdog.first_error()
    count = int(flag[1])
    return count, (watchdog.store.get(key).decode() if count else None)
