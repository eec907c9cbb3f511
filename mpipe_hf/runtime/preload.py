"""A step's data, loaded before its first transfer, and one vote on whether the step runs (SPEC.md
"Runtime rules": a failure on one rank ends the step on every rank with that error).

Every owner calls ``load(m)`` (which decodes and validates the micro-batch's rows and raises ``ValueError`` on a bad
one) for each ``DATA_LOAD`` of its action list, the next step's look-ahead micros included, before the step sends
or receives anything. Then one all-reduce of ``int64`` (``SUM``) over a gloo group of every rank of the
pipeline and its replicas says whether any rank failed, and how many rows the loads dropped (a bad row costs that
row, not the step: :meth:`~mpipe_hf.data.owner.MicroBatchPlan.load_rows`), and whether the replicas of each
pipeline rank are about to run the same schedule (:func:`body_signature`: an expert-parallel group's all-to-alls
pair its members' actions one for one, so one replica with a micro-batch fewer would leave the others waiting). The failing ranks publish their error
first (the watchdog's key, the first writer wins), so every rank raises the same text, and the step is skipped
without one transfer posted: no communicator is left with half a step, and nothing has to be aborted or rebuilt.
The vote runs on the host (gloo, CPU tensors), so on NCCL it costs no device synchronisation.
"""

from __future__ import annotations

import zlib
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


class ScheduleMismatch(RuntimeError):
    """The ranks of a step were about to run different schedules (e.g. an expert-parallel replica with fewer
    micro-batches than its peers, whose all-to-alls would then pair different micro-batches and wait for ever):
    raised on every rank by the step's vote, before any transfer or all-to-all."""


def body_signature(order: Sequence) -> tuple[int, int]:
    """``(micro-batches, digest)`` of a rank's action list: how many forwards its first stage runs, and a 20-bit
    digest of the kinds and stages of its forwards and backwards in order, micros left out. Two replicas of one
    pipeline rank whose signatures agree run their stages' layers (and so an expert layer's all-to-alls, which pair
    the EP replicas' actions one for one) in the same order; which micro-batch each carries does not matter, since
    an expert computes each token alone. Zero-bubble ``W`` is left out: it runs no all-to-all (the expert shards'
    gradients come from the tokens ``B`` kept), and with owner-backward a step's owners move it."""
    body = [(a.kind.value, a.stage) for a in order if a.kind in (Kind.F, Kind.B)]
    first = min((stage for _, stage in body), default=None)
    micros = sum(kind == "F" and stage == first for kind, stage in body)
    return micros, zlib.crc32(repr(body).encode()) & 0xFFFFF


def agreement_slots(slot: int, slots: int, values: Sequence[int]) -> list[int]:
    """The vote's agreement part: ``slots`` slots of ``(ranks, sum, sum of squares)`` per value, this rank's
    ``values`` in slot ``slot`` and zeros elsewhere. Summed over the ranks, a slot's values all agree exactly when
    ``ranks * sum of squares == sum ** 2`` (values below 2^20: no ``int64`` overflow up to 2^20 ranks)."""
    out = [0] * (slots * 3 * len(values))
    for k, v in enumerate(values):
        out[(slot * len(values) + k) * 3:(slot * len(values) + k + 1) * 3] = [1, v, v * v]
    return out


def check_agreement(sums: Sequence[int], per_slot: int) -> None:
    """Raise :class:`ScheduleMismatch` naming the first slot (pipeline rank) whose summed values
    (:func:`agreement_slots`, ``per_slot`` values a slot: the micro-batch count, then the order's digest) disagree
    between the ranks that gave them."""
    for i in range(0, len(sums), 3):
        ranks, total, squares = sums[i:i + 3]
        if ranks and ranks * squares != total * total:
            slot, what = divmod(i // 3, per_slot)
            differs = (f"num_micro, the step's micro-batches, differs: {total / ranks:.3g} on average" if what == 0
                       else "the order of their stages' forwards and backwards differs")
            raise ScheduleMismatch(
                f"pipeline rank {slot}'s replicas would run different schedules ({differs}); every replica (every "
                f"member of an expert-parallel group) must run as many micro-batches in the same order, or the "
                f"expert all-to-alls and FSDP2 collectives pair different actions and wait for ever: the step is "
                f"refused on every rank before any transfer")


def vote(group: dist.ProcessGroup, watchdog: Watchdog, error: BaseException | None,
         dropped: Sequence[str] = (), order: Sequence | None = None, slot: int = 0,
         slots: int = 1) -> tuple[int, str | None]:
    """Every rank of ``group`` learns whether any failed to load, and how many rows the ranks' loads dropped (a
    bad row costs that row, :meth:`~mpipe_hf.data.owner.MicroBatchPlan.load_rows`): one all-reduce (``SUM``) of
    ``int64``, ``[failed, rows dropped]`` and, with ``order``, the agreement of the replicas' schedules. A failing
    rank publishes ``error`` first; then every rank raises the first published error. A rank that dropped rows
    publishes the last one's text (the first such rank wins).

    Args:
        dropped: the rows this rank's loads of the step dropped, each ``"WHERE (WHY)"``.
        order: this rank's action list: its :func:`body_signature` goes into slot ``slot`` (its pipeline rank) of
            ``slots`` (the pipeline's ranks), six more ``int64`` per slot (:func:`agreement_slots`).

    Returns:
        ``(rows dropped on every rank together, one of their texts or None)``: the same on every rank.

    Raises:
        ValueError, TimeoutError, RuntimeError: the first rank's load error (the same text on every rank).
        ScheduleMismatch: the replicas of a pipeline rank gave different signatures (a different ``num_micro``
            or order), on every rank, before any transfer.
    """
    if error is not None:
        watchdog.report(error)
    key = f"{watchdog.key}/dropped"
    if dropped:
        watchdog.store.compare_set(key, "", dropped[-1])
    agree = agreement_slots(slot, slots, body_signature(order)) if order is not None else []
    flag = torch.tensor([int(error is not None), len(dropped), *agree], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.SUM, group=group)
    if int(flag[0]):
        raise watchdog.first_error()
    check_agreement(flag[2:].tolist(), 2)
    count = int(flag[1])
    return count, (watchdog.store.get(key).decode() if count else None)
