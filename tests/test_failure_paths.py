"""Residual failure paths of the NCCL runtime (a failed step's abort, host pinning), on CPU in one process, with
counting fakes:

- a step that fails mid-transfer on NCCL aborts every communicator of the process at once (torch's abort of the
  world), so the process ends without waiting for NCCL's watchdog to time its stuck transfers out; on gloo, which
  recovers in-process, nothing is aborted;
- ``pin_memory`` stays off the actions: the owner pins a micro-batch's device-bound tensors when it loads it
  (:func:`~mpipe_hf.runtime.placement.host_prepare`, through :func:`~mpipe_hf.runtime.preload.load_owned`), and
  ``DATA_LOAD`` then only issues the copies.
"""

import types
from functools import partial

import torch
import torch.distributed as dist

from mpipe_hf.runtime import groups as groups_module
from mpipe_hf.runtime.handlers import data_load
from mpipe_hf.runtime.step_context import Preprocess
from mpipe_hf.runtime.placement import host_prepare
from mpipe_hf.runtime.preload import load_owned
from mpipe_hf.schedule import Action, Kind


class FakeWatchdog:
    def __init__(self):
        self.reported, self.broken = [], 0

    def report(self, err):
        self.reported.append(err)

    def break_groups(self):
        self.broken += 1

    def first_error(self):
        return self.reported[0]


def failed_step(monkeypatch, backend: str, recover: bool) -> tuple[BaseException, list]:
    aborted = []
    monkeypatch.setattr(dist, "get_backend", lambda group: backend)
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", lambda group=None: aborted.append(group))
    ex = types.SimpleNamespace(p2p=types.SimpleNamespace(discard=lambda: []), _stale=[], broken=False, rank=1,
                               watchdog=FakeWatchdog(), recover=recover, group=object(), ended=None)
    err = groups_module.abandon(ex, RuntimeError("image tokens and features differ"), None)
    return err, aborted


def test_a_failed_step_on_nccl_aborts_every_communicator_at_once(monkeypatch):
    err, aborted = failed_step(monkeypatch, "nccl", recover=False)
    assert aborted == [None], "one abort of the world (every group, in one NCCL group call)"
    assert "cannot be recovered in-process" in str(err) and "image tokens" in str(err)


def test_a_failed_step_on_nccl_ends_the_ranks_blocked_elsewhere(monkeypatch):
    """The failed step's line goes to every rank's liveness thread (ranks blocked in a collective, a host read or a
    synchronize end within a beat: :mod:`mpipe_hf.runtime.liveness`), and this rank's own thread stops."""
    from mpipe_hf.runtime import liveness
    store = dist.HashStore()
    live = liveness.Liveness(store, 1, 2, 20.0, lambda: None, end=lambda line: None, namespace="t")
    monkeypatch.setattr(liveness, "_ACTIVE", [live])
    failed_step(monkeypatch, "nccl", recover=False)
    assert store.check(["t/ended"]), "no line for the liveness threads"
    assert "image tokens and features differ" in store.get("t/ended").decode()
    assert live._stop.is_set()


def test_a_failed_step_on_gloo_aborts_nothing(monkeypatch):
    for recover in (True, False):  # False: NCCL's policy emulated on gloo (tests/test_numerics.py)
        _, aborted = failed_step(monkeypatch, "gloo", recover)
        assert aborted == []


def test_data_load_allocates_no_pinned_memory(monkeypatch):
    """The owner's load pins each device-bound tensor once (the host metadata ``P``'s ``host`` adds included,
    the host keys not); ``DATA_LOAD`` on a CUDA rank then pins nothing and copies each tensor ``non_blocking``."""
    pinned, calls, copies = set(), [], []

    def pin(self):
        out = self.clone()
        pinned.add(id(out))
        calls.append(("pin", phase[0]))
        return out

    def to(self, device, non_blocking=False):
        copies.append(non_blocking)
        return self
    phase = ["load"]
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: id(self) in pinned)
    monkeypatch.setattr(torch.Tensor, "to", to)
    preprocess = Preprocess(None, ("input_ids",), ("input_ids", "position_ids", "grid"),
                            host=lambda raw: {"position_ids": torch.arange(4)[None], "grid": torch.ones(1, 3)},
                            host_keys=frozenset({"grid"}))
    order = [Action(Kind.DATA_LOAD, m, 0) for m in range(3)]
    raw = {"input_ids": torch.ones(1, 4, dtype=torch.long), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    loaded, error = load_owned(order, lambda m: dict(raw), 0, partial(host_prepare, preprocess, pin=True))
    assert error is None and calls == [("pin", "load")] * 6, calls  # input_ids and position_ids, per micro
    assert all("attention_mask" not in mb for mb in loaded.values()), "an all-ones mask is dropped at load"
    phase[0] = "action"
    ctx = types.SimpleNamespace(load=loaded.pop, preprocess=preprocess, data={}, pin={},
                                p2p=types.SimpleNamespace(device=torch.device("cuda")),
                                cfg=types.SimpleNamespace(transposed=False))
    for a in order:
        data_load(ctx, a)
    assert [c for c in calls if c[1] == "action"] == [], "DATA_LOAD pinned memory"
    assert copies == [True] * 6
    assert all(ctx.data[m]["grid"] is not None for m in range(3))
