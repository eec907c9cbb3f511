"""Preemption's signal handling (``mpipe_hf.train.preempt``): a signal is recorded, not acted on, and every rank
agrees on it. The whole path (a signal mid-step and during a save, then a bit-exact resume) is in
``tests/test_faults.py`` (cases ``preempt`` and ``preempt-in-save``)."""

import os
import signal
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mpipe_hf.train.preempt import Preemption


@pytest.mark.parametrize("name", ["SIGTERM", "SIGUSR1"])
def test_a_signal_is_recorded_and_the_previous_action_comes_back(name):
    number = getattr(signal, name)
    before = signal.getsignal(number)
    preemption = Preemption().install()
    os.kill(os.getpid(), number)  # without the handler this would end pytest
    assert preemption.received == name
    assert preemption.agreed(torch.device("cpu")) == name  # no process group: this process's own
    preemption.uninstall()
    assert signal.getsignal(number) is before


def _agree(rank: int, world: int, store: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    preemption = Preemption().install().connect()
    first = preemption.agreed(torch.device("cpu"))  # nobody signalled yet
    if rank == world - 1:
        os.kill(os.getpid(), signal.SIGUSR1)
    second = preemption.agreed(torch.device("cpu"))
    results[rank] = (first, second)
    dist.destroy_process_group()


def test_a_signal_on_one_rank_stops_every_rank_at_the_same_step():
    world = 2
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_agree, args=(world, os.path.join(tmp, "store"), results), nprocs=world,
                           start_method="spawn", join=True)
        assert dict(results) == {r: (None, "SIGUSR1") for r in range(world)}
