"""The process groups a pipeline rank makes and joins, counted with torch's fake process-group backend (one process
plays each rank in turn; nothing is sent): a rank makes only the groups it is in, their names agree between
members, and at ``pp = 16`` a rank other than 0 joins at most 12 groups, rank 0 at most 36 (before: every rank
made all 58 pair groups over the whole pipeline, 63 groups in all). Single process, about a second."""

import contextlib
import types
from collections import Counter
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.testing._internal.distributed.fake_pg import FakeStore

from mpipe_hf.runtime import group_names, groups
from mpipe_hf.schedule.eager import pipeline_pairs


def everyone_makes_every_pair(global_ranks, timeout, rank):
    """The pair groups as they were made before: every pair, by every rank, over the whole pipeline."""
    return {pair: dist.new_group(global_ranks, timeout=timeout, use_local_synchronization=True)
            for pair in pipeline_pairs(len(global_ranks))}


def count_groups(R: int, monkeypatch) -> dict[int, dict]:
    """Per rank of a pipeline of ``R`` (the whole world): the groups it joined (the world's included), the
    creations it called as a non-member, and its pair groups' names."""
    real, out = dist.new_group, {}

    def fake_new_group(ranks=None, *args, backend=None, **kwargs):  # the header groups are gloo's: fake them too
        calls.append(dist.get_rank() in ranks)
        return real(ranks, *args, backend=None, **kwargs)

    monkeypatch.setattr(dist, "new_group", fake_new_group)
    for rank in range(R):
        calls = []
        monkeypatch.setattr(group_names, "_MADE", Counter())  # each rank is a process of its own
        dist.init_process_group("fake", rank=rank, world_size=R, store=FakeStore())
        try:
            ex = types.SimpleNamespace(global_ranks=list(range(R)), timeout=timedelta(seconds=5), rank=rank,
                                       store=FakeStore(), _shared=None, device=torch.device("cpu"))
            groups.fresh_groups(ex)
            ex.watchdog.close()
            out[rank] = {"joined": len(c10d._world.pg_names), "outside": calls.count(False),
                         "pairs": {pair: g.group_name for pair, g in ex.p2p.pairs.items()}}
        finally:
            dist.destroy_process_group()
    return out


@pytest.mark.parametrize("R", [2, 4, 16])
def test_a_rank_makes_only_its_own_groups(R, monkeypatch):
    counts = count_groups(R, monkeypatch)
    for rank, seen in counts.items():
        assert seen["outside"] == 0, (rank, seen)
        assert set(seen["pairs"]) == {p for p in pipeline_pairs(R) if rank in p}
        for pair, name in seen["pairs"].items():  # both members name the pair's group alike
            assert counts[pair[1] if pair[0] == rank else pair[0]]["pairs"][pair] == name
    if R == 16:  # world + collectives + headers (2) + votes + pairs: 1 + 4 + 6 at most; rank 0: 1 + 4 + 30
        assert max(c["joined"] for r, c in counts.items() if r != 0) == 11 <= 12
        assert counts[0]["joined"] == 35 <= 36


def test_the_count_catches_every_rank_making_every_pair(monkeypatch):
    """Negative control: the pair groups made as before give every rank 63 groups at ``pp = 16``."""
    monkeypatch.setattr(groups, "pair_groups", everyone_makes_every_pair)
    counts = count_groups(16, monkeypatch)
    assert {c["joined"] for c in counts.values()} == {63}
    assert counts[5]["outside"] == 0  # (each call had the rank in it: the cost is joining, not calling)


def test_members_alone_need_the_pinned_names(monkeypatch):
    """Negative control: with torch's own hashed names (ranks and the count of groups the process holds), the two
    members of a pair would name its group differently (rank 0 holds more groups) and wait for ever."""
    monkeypatch.setattr(group_names, "_pinned", lambda name, split: contextlib.nullcontext())
    counts = count_groups(4, monkeypatch)
    assert counts[0]["pairs"][(0, 2)] != counts[2]["pairs"][(0, 2)]


def test_an_ep_group_is_renewed_by_its_members_on_gloo_only(monkeypatch):
    """A broken EP group (a :class:`WatchedGroup`) is made anew by its members alone, under the name both give
    it; on any backend but gloo renewing refuses by name (on NCCL torch would split the new communicator from the
    world's, a call the ranks outside the group never make: a hang)."""
    from mpipe_hf.runtime.watchdog import WatchedGroup
    dist.init_process_group("fake", rank=2, world_size=4, store=FakeStore())
    try:
        monkeypatch.setattr(group_names, "_MADE", Counter())
        holder = WatchedGroup.__new__(WatchedGroup)
        holder.mesh, holder.timeout, holder.ranks, holder.broken = None, timedelta(seconds=5), [0, 2], True
        holder.group = dist.new_group([0, 2])
        with pytest.raises(RuntimeError, match="cannot be made anew on fake"):
            holder.renew()
        monkeypatch.setattr(dist, "get_backend", lambda group: "gloo")
        holder.renew()
        assert not holder.broken and holder.group.group_name == "mpipe_hf/watched/0-2/0"
        assert dist.get_process_group_ranks(holder.group) == [0, 2]
    finally:
        dist.destroy_process_group()
