"""One rank's error, on every rank: the setup steps outside a pipeline step (loading, resuming, saving) run
through :func:`together` or :func:`gathered`, so a failure on one rank stops every rank with the same text instead
of leaving its peers waiting in the next collective (README, "Failures")."""

from __future__ import annotations

from typing import Callable

import torch.distributed as dist


def gathered(fn: Callable, what: str, rank: int, world: int, group: dist.ProcessGroup) -> list:
    """``fn()`` on every rank; return every rank's value, in rank order, on every rank.

    Raises:
        ValueError: ``"pipeline rank R, <what>: ..."`` where the first failing rank ``R`` raised a ``ValueError``.
        RuntimeError: ``"pipeline rank R, <what>: <Type>: ..."`` for any other exception (the executor's form).
            The failing rank's own exception is the cause.
    """
    try:
        value, error, cause = fn(), None, None
    except Exception as err:  # noqa: BLE001 - shared below, re-raised on every rank
        value, error, cause = None, (type(err) is ValueError, f"{type(err).__name__}: {err}"), err
    results = [None] * world
    dist.all_gather_object(results, (value, error), group=group)
    for r, (_, err) in enumerate(results):
        if err is not None:
            is_value, text = err
            text = text.removeprefix("ValueError: ") if is_value else text
            raise (ValueError if is_value else RuntimeError)(f"pipeline rank {r}, {what}: {text}") from (
                cause if r == rank else None)
    return [v for v, _ in results]


def together(fn: Callable, what: str, rank: int, world: int, group: dist.ProcessGroup):
    """``fn()`` on every rank; return this rank's value (only whether it failed travels). When it raises on any
    rank, every rank raises as :func:`gathered` does."""
    value = []
    gathered(lambda: value.append(fn()), what, rank, world, group)
    return value[0]


def raise_or(value):
    """``value``, or raise it when it is an exception (a result a rank hands to :func:`together`, whose ``fn``
    must raise on the rank that failed)."""
    if isinstance(value, Exception):
        raise value
    return value
