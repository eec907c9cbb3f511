"""Process groups made by their members alone, under names every member agrees on.

``torch.distributed.new_group(ranks, use_local_synchronization=True)`` lets only the group's members call it, but
torch 2.13 names such a group by its ranks and by how many groups the calling process holds
(``distributed_c10d._hash_ranks_to_str``), and the name is the prefix of the group's rendezvous keys in the store.
Ranks that hold different numbers of groups (rank 0 of a pipeline talks to every rank, the others to three) would
give one group different names, and its rendezvous would wait for ever. :func:`member_group` therefore names each
group itself, from what every member knows alike: a base name that states the group's purpose and global ranks,
and how many groups of that base name this process made before (every member makes the same ones, in the same
order). Nothing else depends on the count of groups a process holds, so groups made this way leave every later
group's name alone only when that later group is named here too: every group the runtime makes after start-up is.

With a device bound to the default group (eager set-up), torch 2.13 makes every new group's NCCL communicator by
``ncclCommSplit`` of the world's, a call every rank of the world must make: a group made by some ranks alone would
hang there. ``split=False`` makes the communicator from the members alone instead (``ncclCommInitRank`` over the
group's store keys, still eagerly, at creation), which is what a pair group needs (docs/gpus.md, "Communicators").
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

_MADE: Counter = Counter()  # groups made per base name by this process (the name's generation)
_LOCK = threading.Lock()     # the naming hook is module state: one group at a time


@contextlib.contextmanager
def _pinned(name: str, split: bool):
    """Within the block, torch names the group it makes ``name`` and, unless ``split``, makes its communicator
    without splitting the world's."""
    saved = c10d._process_group_name, c10d._get_split_source
    c10d._process_group_name = lambda ranks, use_hashed_name: c10d.GroupName(name)
    if not split:
        c10d._get_split_source = lambda pg: None
    try:
        yield
    finally:
        c10d._process_group_name, c10d._get_split_source = saved


def member_group(ranks: list[int], base: str, timeout: timedelta, backend: str | None = None,
                 split: bool = True):
    """A process group over global ``ranks``, made by its members alone (the caller must be one; the others call
    this with the same arguments at their own pace), named ``mpipe_hf/<base>/<n>``, ``n`` the groups of ``base``
    this process made before. A rank's group rank is its index in ``ranks`` (not sorted).

    Args:
        ranks: the members' global ranks, in group-rank order.
        base: unique to the group's purpose and members (e.g. ``"pair/3-4"``), the same on every member.
        timeout: the group's timeout.
        backend: as ``dist.new_group``'s (``None``: the default group's).
        split: whether a communicator may be split from the world's (eager set-up); ``False`` for groups that
            only their members make while the other ranks do something else.

    Raises:
        ValueError: this process is not one of ``ranks``.
    """
    if dist.get_rank() not in ranks:
        raise ValueError(f"global rank {dist.get_rank()} makes group {base!r} of ranks {ranks} without being in it")
    with _LOCK:
        name = f"mpipe_hf/{base}/{_MADE[base]}"
        _MADE[base] += 1
        with _pinned(name, split):
            group = dist.new_group(list(ranks), timeout=timeout, backend=backend, use_local_synchronization=True,
                                   sort_ranks=False)
    return group
