"""Every wait of a step, bounded and abortable (SPEC.md, "Runtime rules": a failure on one rank makes the step
fail on every rank with the first error's text; nothing hangs).

A rank that fails writes its error under the step's key in the process group's store (the first writer wins).
Every wait watches its work and, every ``CHECK_S`` seconds, that key; a rank blocked on a peer that has failed
therefore raises the first error within ``CHECK_S`` instead of waiting for its timeout.

NCCL works report completion through ``is_completed()``, so the wait polls them. Gloo's point-to-point works do
not (they complete only inside ``wait()``, and a ``wait`` with a timeout breaks the connection), so on gloo a
daemon thread calls ``wait()`` and the caller watches for its answer. A wait abandoned after a failure is
remembered in :attr:`Watchdog.abandoned`, with what a peer must post to complete it; the executor completes it
(:func:`release_abandoned`) and moves to a fresh group and a fresh watchdog.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

CHECK_S = 0.02          # how often a wait looks for another rank's error, seconds
_MAX_PAUSE_S = 1e-3     # longest sleep between two polls of a work, seconds
_TYPES = {"ValueError": ValueError, "TimeoutError": TimeoutError}


class PeerFailed(RuntimeError):
    """Raised inside a wait when another rank reported an error; the executor re-raises that error."""


class Watchdog:
    """The failure channel and the bounded wait of one pipeline group.

    Args:
        store: a store every rank of the group reaches (the default process group's).
        namespace: unique to the group (its ``group_name``), so executors never read each other's errors.
        timeout: the longest any single wait may take.
        threaded: wait through a helper thread (gloo) instead of polling ``is_completed()`` (NCCL).
    """

    def __init__(self, store: dist.Store, namespace: str, timeout: timedelta, threaded: bool):
        self.store, self.namespace, self.timeout = store, namespace, timeout
        self.step = 0
        self.abandoned: dict | None = None
        self._todo: queue.SimpleQueue | None = None
        if threaded:
            self._todo, self._done = queue.SimpleQueue(), queue.SimpleQueue()
            threading.Thread(target=self._serve, daemon=True, name=f"mpipe-wait-{namespace}").start()

    def _serve(self) -> None:
        while True:
            work = self._todo.get()
            try:
                work.wait()
                self._done.put(None)
            except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
                self._done.put(err)

    @property
    def key(self) -> str:
        return f"mpipe_hf/{self.namespace}/step{self.step}/error"

    def start_step(self) -> None:
        """Move to the next step's key; every rank calls this once per step, so the keys agree."""
        self.step += 1

    def report(self, err: BaseException) -> tuple[str, str]:
        """Publish ``err`` unless another rank published first; return the first error ``(type name, text)``."""
        mine = f"{type(err).__name__}\n{err}"
        first = self.store.compare_set(self.key, "", mine).decode()
        name, _, text = first.partition("\n")
        return name, text

    def first_error(self) -> BaseException:
        """The published error as an exception of the same kind (``ValueError``, ``TimeoutError``, else
        ``RuntimeError``) and the same text."""
        name, _, text = self.store.get(self.key).decode().partition("\n")
        return _TYPES.get(name, RuntimeError)(text)

    def check(self) -> None:
        """Raise :class:`PeerFailed` if some rank has published an error this step."""
        if self.store.check([self.key]):
            raise PeerFailed(self.key)

    def wait(self, work: dist.Work, what: str, pending: dict | None = None) -> None:
        """Wait for ``work`` (a send, receive or collective), looking for other ranks' errors meanwhile.

        Args:
            pending: how a peer completes ``work`` if this wait is abandoned: ``{"kind": "recv", "src", "numel",
                "dtype"}``, ``{"kind": "send", "dst", ...}`` or ``{"kind": "broadcast" | "all_reduce", ...}``.

        Raises:
            PeerFailed: another rank failed this step.
            TimeoutError: ``work`` did not complete within the timeout; the text names ``what``.
        """
        deadline = time.monotonic() + self.timeout.total_seconds()
        if self._todo is not None:
            self._todo.put(work)
            while True:
                try:
                    err = self._done.get(timeout=CHECK_S)
                except queue.Empty:
                    self._give_up_unless_done(deadline, what, pending, self._done.empty)
                    continue
                if err is not None:
                    raise err
                return
        next_check, pause = time.monotonic() + CHECK_S, 1e-5
        while not work.is_completed():
            if time.monotonic() >= next_check:
                self._give_up_unless_done(deadline, what, pending, lambda: not work.is_completed())
                next_check = time.monotonic() + CHECK_S
            time.sleep(pause)
            pause = min(2 * pause, _MAX_PAUSE_S)
        work.wait()

    def _give_up_unless_done(self, deadline: float, what: str, pending: dict | None, still_waiting) -> None:
        """Raise if another rank failed or the deadline passed; remember the work as abandoned only if it is
        still unfinished at that moment (a work that just completed needs no peer to complete it)."""
        try:
            self._check_or_expire(deadline, what)
        except (PeerFailed, TimeoutError):
            if still_waiting():
                self.abandoned = pending
            raise

    def _check_or_expire(self, deadline: float, what: str) -> None:
        self.check()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not complete within {self.timeout.total_seconds():.0f}s")

    def settle(self, timeout_s: float) -> bool:
        """After :func:`release_abandoned`: wait until the helper thread finished the abandoned wait."""
        if self._todo is None or self.abandoned is None:
            return True
        try:
            self._done.get(timeout=timeout_s)
            return True
        except queue.Empty:
            return False


def describe(kind: str, tensor: torch.Tensor, **extra) -> dict:
    """A ``pending`` description (see :meth:`Watchdog.wait`) of an operation on ``tensor``."""
    return {"kind": kind, "numel": tensor.numel(), "dtype": str(tensor.dtype).removeprefix("torch."), **extra}


def release_abandoned(watchdog: Watchdog, group: dist.ProcessGroup, channel, rank: int, world: int,
                      device: torch.device) -> list[dist.Work]:
    """Complete, on the failed step's group, every operation some rank abandoned, so no process stays blocked in
    it (a gloo receive left waiting aborts the process at exit). Every rank of the group calls this after the
    step failed, with the failed step's sends still alive (a send dropped before completion is cancelled).

    Ranks publish what they abandoned; each rank then sends a dummy of what a peer's abandoned receive expects
    from it, receives into a dummy what a peer's abandoned send carries to it, and joins with a dummy the
    collective other ranks were left in. Per pair and direction, sends and receives follow one order, so an
    abandoned receive is the next message on its channel (either a message already sent, or the dummy), and an
    abandoned send is the first unreceived one. A dummy send nobody receives stays pending, harmlessly.

    Args:
        group: the group of the collectives; ``channel(src, dst)``: the group of transfers from ``src`` to ``dst``.

    Returns the works it posted; the caller keeps them alive. Returns early when some rank did not arrive within
    the timeout (it died); nothing more can be done then.
    """
    store, key = watchdog.store, watchdog.key
    store.set(f"{key}/abandoned/{rank}", json.dumps(watchdog.abandoned))
    try:
        store.wait([f"{key}/abandoned/{r}" for r in range(world)], watchdog.timeout)
    except RuntimeError:
        return []
    entries = [json.loads(store.get(f"{key}/abandoned/{r}")) for r in range(world)]
    works = []

    def dummy(entry):
        return torch.zeros(entry["numel"], dtype=getattr(torch, entry["dtype"]), device=device)
    for peer, entry in enumerate(entries):
        if entry and entry["kind"] == "recv" and entry["src"] == rank:
            works.append(dist.isend(dummy(entry), group=channel(rank, peer), group_dst=peer))
        if entry and entry["kind"] == "send" and entry["dst"] == rank:
            works.append(dist.irecv(dummy(entry), group=channel(peer, rank), group_src=peer))
    collective = next((e for e in entries if e and e["kind"] in ("broadcast", "all_reduce")), None)
    if collective is not None and watchdog.abandoned != collective:
        if collective["kind"] == "broadcast":
            works.append(dist.broadcast(dummy(collective), group=group, group_src=0, async_op=True))
        else:
            works.append(dist.all_reduce(dummy(collective), group=group, async_op=True))
    watchdog.settle(watchdog.timeout.total_seconds())
    return works
