"""Every wait of a step, bounded and abortable (SPEC.md, "Runtime rules": a failure on one rank makes the step
fail on every rank with the first error's text; nothing hangs).

A rank that fails writes its error under the step's key in the process group's store (the first writer wins).
Every wait watches its work and, every ``CHECK_S`` seconds, that key; a rank blocked on a peer that has failed
therefore raises the first error within ``CHECK_S`` instead of waiting for its timeout.

A job is a function that posts and waits for one or more works in turn, e.g. a receive: its header, then its
payload. NCCL works report completion through ``is_completed()``, so a job runs in the caller, which polls each
work. Gloo's point-to-point works do not (they complete only inside ``wait()``, and a ``wait`` with a timeout
breaks the connection), so on gloo jobs run in daemon threads, one per lane, and the caller watches for their
answers: one hand-over per job, not one per work. Lane ``"wait"`` runs the caller's waits (:meth:`Watchdog.run`);
lane ``"recv"`` runs the receives a step posted ahead (:meth:`Watchdog.submit`), in order, while the caller
computes. A wait abandoned after a failure is remembered in :attr:`Watchdog.abandoned`, with what a peer must post
to complete it, and the lanes post nothing more; the executor completes those waits (:func:`release_abandoned`)
and moves to a fresh group and a fresh watchdog.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

CHECK_S = 0.02          # how often a wait looks for another rank's error, seconds
_MAX_PAUSE_S = 1e-3     # longest sleep between two polls of a work, seconds
_TYPES = {"ValueError": ValueError, "TimeoutError": TimeoutError}
# gloo's own bound on a lane's wait. The caller's deadline (the watchdog's timeout, from when it asks) bounds
# every job; gloo's default, the group's timeout counted from when the work was posted, would end a receive
# posted at the start of a step longer than that, and a gloo wait that times out breaks the connection.
LANE_WAIT = timedelta(days=1)


class PeerFailed(RuntimeError):
    """Raised inside a wait when another rank reported an error; the executor re-raises that error."""


class _Lane:
    """A daemon thread that runs jobs in the order they come (gloo). Each job gets ``wait_for(post, pending)``;
    after :meth:`cancel`, ``wait_for`` posts nothing more and raises :class:`PeerFailed`."""

    def __init__(self, name: str):
        self.todo: queue.SimpleQueue = queue.SimpleQueue()
        self.lock, self.current, self.cancelled = threading.Lock(), None, False
        self.running: queue.SimpleQueue | None = None  # the answer box of the job in progress
        threading.Thread(target=self._serve, daemon=True, name=name).start()

    def submit(self, job: Callable[[Callable], Any]) -> queue.SimpleQueue:
        """Queue ``job``; its ``(value, error)`` arrives in the returned box."""
        box: queue.SimpleQueue = queue.SimpleQueue()
        self.todo.put((job, box))
        return box

    def _serve(self) -> None:
        while True:
            job, box = self.todo.get()
            if job is None:
                return
            self.running = box
            try:
                box.put((job(self._wait_for), None))
            except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
                box.put((None, err))

    def _wait_for(self, post: Callable[[], dist.Work], pending: dict | None) -> None:
        with self.lock:
            if self.cancelled:
                raise PeerFailed("abandoned after a failure")
            work, self.current = post(), pending
        try:
            work.wait(LANE_WAIT)  # the caller's deadline bounds the job; see LANE_WAIT
        finally:
            with self.lock:
                self.current = None

    def close(self) -> None:
        """End the thread once the jobs queued before this have run."""
        self.todo.put((None, None))

    def cancel(self) -> dict | None:
        """Post nothing more; return what the wait in progress (if any) needs from a peer."""
        with self.lock:
            self.cancelled = True
            return self.current


class Watchdog:
    """The failure channel and the bounded wait of one pipeline group.

    Args:
        store: a store every rank of the group reaches (the default process group's).
        namespace: unique to the group (its ``group_name``), so executors never read each other's errors.
        shared: the error key's namespace when several pipeline replicas (data parallelism) must fail a step
            together: the same on every rank of every replica.
        timeout: the longest any single wait may take.
        threaded: run jobs in helper threads (gloo) instead of polling ``is_completed()`` in the caller (NCCL).
        step: the step before the first one (a watchdog on groups an earlier one used goes on from its step, so
            the two never share an error key).

    Attributes:
        abandoned: after a failure, the ``pending`` descriptions (see :meth:`wait`) of the waits left unfinished.
    """

    def __init__(self, store: dist.Store, namespace: str, timeout: timedelta, threaded: bool, step: int = 0,
                 shared: str | None = None):
        self.store, self.namespace, self.timeout, self.step = store, namespace, timeout, step
        self.shared = shared
        self.abandoned: list[dict] = []
        self._lanes = {lane: _Lane(f"mpipe-{lane}-{namespace}") for lane in ("wait", "recv")} if threaded else None

    @property
    def key(self) -> str:
        """The step's error key: the group's own, or the one every pipeline replica shares (``shared``)."""
        return f"mpipe_hf/{self.shared or self.namespace}/step{self.step}/error"

    @property
    def local(self) -> str:
        """The step's keys of this group alone (what its ranks abandoned)."""
        return f"mpipe_hf/{self.namespace}/step{self.step}"

    def start_step(self) -> None:
        """Move to the next step's key; every rank calls this once per step, so the keys agree."""
        self.step += 1

    def report(self, err: BaseException) -> tuple[str, str]:
        """Publish ``err`` unless another rank published first; return the first error ``(type name, text)``."""
        mine = f"{type(err).__name__}\n{err}"
        first = self.store.compare_set(self.key, "", mine).decode()
        name, _, text = first.partition("\n")
        return name, text

    def mark_lost(self) -> None:
        """Record, before the error is published, that a peer's process is gone: :func:`release_abandoned` then
        returns at once on every rank instead of waiting for the lost rank."""
        self.store.set(f"{self.key}/lost", "1")

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
        """Wait for ``work`` (a send, receive or collective already posted), looking for other ranks' errors
        meanwhile.

        Args:
            pending: how a peer completes ``work`` if this wait is abandoned: ``{"kind": "recv", "src", "numel",
                "dtype"}``, ``{"kind": "send", "dst", ...}`` or ``{"kind": "broadcast" | "all_reduce", ...}``.

        Raises:
            PeerFailed: another rank failed this step.
            TimeoutError: ``work`` did not complete within the timeout; the text names ``what``.
        """
        self.run(lambda wait_for: wait_for(lambda: work, pending), what)

    def run(self, job: Callable[[Callable], Any], what: str) -> Any:
        """Run ``job(wait_for)`` now and return its result. The job calls ``wait_for(post, pending)`` for each
        work it needs, where ``post()`` posts the work and returns it, and ``pending`` is as in :meth:`wait`; the
        whole job shares one timeout. On gloo it runs in a helper thread, so it must touch nothing the caller
        uses meanwhile.

        Raises:
            PeerFailed: another rank failed this step.
            TimeoutError: the job did not finish within the timeout; the text names ``what``.
        """
        return self.answer(self.submit(job, "wait"), what)

    def submit(self, job: Callable[[Callable], Any], lane: str = "recv") -> Any:
        """Start ``job`` (as in :meth:`run`) behind the lane's earlier jobs without waiting for it; pass the
        returned ticket to :meth:`answer`. On NCCL the job runs in :meth:`answer`, so answer tickets in the
        order they were submitted."""
        return self._lanes[lane].submit(job) if self._lanes is not None else job

    def answer(self, ticket: Any, what: str) -> Any:
        """The result of a submitted job, waiting for it (bounded by the timeout; raises as :meth:`run`)."""
        deadline = time.monotonic() + self.timeout.total_seconds()
        if self._lanes is None:
            return ticket(lambda post, pending: self._poll(post(), pending, deadline, what))
        while True:
            try:
                value, err = ticket.get(timeout=CHECK_S)
            except queue.Empty:
                try:
                    self._check_or_expire(deadline, what)
                except (PeerFailed, TimeoutError):
                    self.abandon()
                    raise
                continue
            if err is not None:
                raise err
            return value

    def close(self) -> None:
        """End the helper threads (after the jobs already queued); the watchdog is not used afterwards."""
        for lane in (self._lanes or {}).values():
            lane.close()

    def abandon(self) -> None:
        """After a failure: the lanes post nothing more, and their waits in progress join :attr:`abandoned`."""
        if self._lanes is not None:
            self.abandoned += [p for p in (lane.cancel() for lane in self._lanes.values()) if p and
                               p not in self.abandoned]

    def _poll(self, work: dist.Work, pending: dict | None, deadline: float, what: str) -> None:
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
            if still_waiting() and pending:
                self.abandoned = [pending]
            raise

    def _check_or_expire(self, deadline: float, what: str) -> None:
        self.check()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not complete within {self.timeout.total_seconds():.0f}s")

    def settle(self, timeout_s: float) -> bool:
        """After :func:`release_abandoned`: wait until the helper threads finished their abandoned waits."""
        if self._lanes is None:
            return True
        deadline = time.monotonic() + timeout_s
        for lane in self._lanes.values():
            with lane.lock:
                box = lane.running if lane.current is not None else None
            if box is not None:
                try:
                    box.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    return False
        return True


LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "remote process exited")


def lost_peer(err: BaseException) -> bool:
    """Whether ``err`` says a peer's process is gone (gloo's and NCCL's words for a closed connection)."""
    return any(words in str(err) for words in LOST)


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
    watchdog.abandon()
    store, key = watchdog.store, watchdog.key
    if store.check([f"{key}/lost"]):  # a rank's process is gone: nothing can complete its half
        return []
    mine = watchdog.local
    store.set(f"{mine}/abandoned/{rank}", json.dumps(watchdog.abandoned))
    try:
        store.wait([f"{mine}/abandoned/{r}" for r in range(world)], watchdog.timeout)
    except RuntimeError:
        return []
    entries = [(peer, entry) for peer in range(world)
               for entry in json.loads(store.get(f"{mine}/abandoned/{peer}"))]
    works = []

    def dummy(entry):
        return torch.zeros(entry["numel"], dtype=getattr(torch, entry["dtype"]), device=device)
    for peer, entry in entries:
        if entry["kind"] == "recv" and entry["src"] == rank:
            works.append(dist.isend(dummy(entry), group=channel(rank, peer), group_dst=peer))
        if entry["kind"] == "send" and entry["dst"] == rank:
            works.append(dist.irecv(dummy(entry), group=channel(peer, rank), group_src=peer))
    collective = next((e for _, e in entries if e["kind"] in ("broadcast", "all_reduce")), None)
    if collective is not None and collective not in watchdog.abandoned:
        if collective["kind"] == "broadcast":
            works.append(dist.broadcast(dummy(collective), group=group, group_src=0, async_op=True))
        else:
            works.append(dist.all_reduce(dummy(collective), group=group, async_op=True))
    watchdog.settle(watchdog.timeout.total_seconds())
    return works
