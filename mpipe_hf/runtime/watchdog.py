"""Every wait of a step, bounded and abortable (SPEC.md, "Runtime rules": a failure on one rank makes the step
fail on every rank with the first error's text; nothing hangs).

A rank that fails writes its error under the step's key in the process group's store (the first writer wins).
A wait looks at that key every ``CHECK_S`` seconds, so a rank blocked on a peer that has failed raises the first
error within ``CHECK_S`` instead of waiting for its timeout.

Works that report completion through ``is_completed()`` (NCCL's, and gloo's collectives) are polled by the
caller (:meth:`Watchdog.wait`). Gloo's point-to-point works do not: they complete only inside ``wait()``. The
caller then blocks in that ``wait()`` itself (:meth:`Watchdog.block`: no hand-over to another thread), and one
monitor thread per watchdog, while the caller is blocked, looks at the key and the deadline every ``CHECK_S``.
To end the wait it *breaks* the step's groups: it waits a millisecond on a receive nobody sends, and gloo's
answer to that timeout is to close every connection of the group and fail every operation pending on it, the
caller's included. A step that fails breaks its groups on every rank (:meth:`Watchdog.break_groups`), so nothing
of it stays pending anywhere: no dummy message has to complete it, and its buffers can go. The executor then moves
to fresh groups.

A peer's connection that closes is therefore either a peer that broke its groups, which it does only after its
error is in the store (or, for a timeout, after it marked one as coming: ``KEY/pending``), or a peer whose process
is gone; :meth:`Watchdog.failure` tells the two apart.

Expert parallelism adds collectives that no wait of the watchdog posts: the all-to-alls of the MoE
layers, inside a stage's forward and backward, on the EP group (a :class:`WatchedGroup`). While a step runs, the
monitor also looks at the key when the caller is not blocked, and on a peer's error breaks every watched group, so
an EP peer waiting in an all-to-all for a rank that failed gets gloo's error at once (the executor then raises the
first error) instead of waiting for the group's timeout; :meth:`Watchdog.break_groups` breaks them too, on every
rank of a failed step, and each is made anew before the next step (:meth:`WatchedGroup.renew`).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Iterable

import torch
import torch.distributed as dist

from .group_names import member_group

CHECK_S = 0.02          # how often a wait looks for another rank's error, seconds
BACKSTOP_S = 5.0        # gloo's own bound on a blocked wait, past the watchdog's timeout, seconds
_MAX_PAUSE_S = 1e-3     # longest sleep between two polls of a work, seconds
_BREAK_TAG = 987_654_321  # the tag of the receive that breaks a group: no message ever carries it
_TYPES = {"ValueError": ValueError, "TimeoutError": TimeoutError}


class WatchedGroup:
    """A process group that collectives inside a stage's compute use (the EP group's all-to-alls), which the
    watchdogs break when a step fails; it looks like the 1-D ``DeviceMesh`` it was made from (``get_group``,
    ``size``, ``get_local_rank``), which is how transformers' ``AllToAllEP`` reads it, and hands out the current
    group. Registered in :data:`WATCHED` while the run lives (:func:`watched` makes one).

    Args:
        mesh: a 1-D ``DeviceMesh`` (``expert_mesh(...)["ep"]``).
        timeout: the group's timeout, for the groups made anew.
    """

    def __init__(self, mesh, timeout: timedelta | None = None):
        self.mesh, self.timeout = mesh, timeout
        self.group, self.broken = mesh.get_group(), False
        self.ranks = dist.get_process_group_ranks(self.group)
        WATCHED.append(self)

    def get_group(self, *_):
        return self.group if self.group is not None else self.mesh.get_group()

    def size(self, *_) -> int:
        return self.mesh.size()

    def get_local_rank(self, *_) -> int:
        return self.mesh.get_local_rank()

    def breaks(self) -> None:
        """Fail what is pending on the group and close it (once); :meth:`renew` replaces it."""
        if not self.broken:
            self.broken = True
            break_group(self.group)

    def renew(self) -> None:
        """A fresh group over the same ranks after a break, made by its members alone under a name they agree on
        (:func:`~.group_names.member_group`; the members renew at the same point of their steps). Only gloo breaks
        a group (:func:`break_group`), and a gloo group's creation is its members' rendezvous alone.

        Raises:
            RuntimeError: the group is not gloo's. On NCCL with a bound device torch would split the new group's
                communicator from the world's, a call the ranks outside the group never make (a hang); a failed
                step there ends the run instead (:func:`~.groups.end_communicators`).
        """
        if not self.broken:
            return
        if dist.get_backend(self.group) != "gloo":
            raise RuntimeError(f"the EP group of ranks {self.ranks} cannot be made anew on "
                               f"{dist.get_backend(self.group)}: a failed step ends the run there")
        self.group = member_group(self.ranks, "watched/" + "-".join(map(str, self.ranks)), self.timeout)
        self.broken = False


WATCHED: list[WatchedGroup] = []  # this process's watched groups (one per EP group)
# the monitor polls the store between its waits too, for the watched groups: off (a run so polling aborted at exit,
# "terminate called without an active exception", not yet understood); a failing rank breaks them in break_groups
WATCH_BETWEEN_WAITS = False


def release_watched() -> None:
    """Forget the watched groups (before the process group is destroyed: a gloo group a Python object still holds
    is torn down during interpreter finalisation, which can abort a finished run)."""
    for holder in WATCHED:
        holder.group = None
    WATCHED.clear()


def watched(mesh, timeout: timedelta | None = None) -> WatchedGroup:
    """The :class:`WatchedGroup` of the 1-D ``mesh`` (made on first use; the same object for the same group)."""
    group = mesh.get_group()
    for holder in WATCHED:
        if holder.mesh.get_group() is group:
            return holder
    return WatchedGroup(mesh, timeout)


def break_group(group) -> None:
    """Fail every operation pending on gloo ``group`` and close its connections: a receive nobody sends, waited on
    for a millisecond (a group already broken raises at once). Nothing on other backends."""
    if dist.get_backend(group) != "gloo" or group.size() < 2:
        return
    peer = (group.rank() + 1) % group.size()
    try:
        dist.irecv(torch.empty(1, dtype=torch.uint8), group=group, group_src=peer,
                   tag=_BREAK_TAG).wait(timedelta(milliseconds=1))
    except RuntimeError:
        pass


class PeerFailed(RuntimeError):
    """Raised inside a wait when another rank reported an error; the executor re-raises that error."""


class Watchdog:
    """The failure channel and the bounded waits of one pipeline group.

    Args:
        store: a store every rank of the group reaches (the default process group's).
        namespace: unique to the group (its ``group_name``), so executors never read each other's errors.
        timeout: the longest any single wait may take.
        threaded: gloo: point-to-point waits block in the caller while a monitor thread watches them
            (:meth:`block`); else (NCCL) every wait is polled.
        step: the step before the first one (a watchdog on groups an earlier one used goes on from its step, so
            the two never share an error key).
        shared: the error key's namespace when several pipeline replicas (data parallelism) must fail a step
            together: the same on every rank of every replica.
        groups: the gloo groups of the step's operations, which :meth:`break_groups` breaks.
    """

    def __init__(self, store: dist.Store, namespace: str, timeout: timedelta, threaded: bool, step: int = 0,
                 shared: str | None = None, groups: Iterable[dist.ProcessGroup] = ()):
        self.store, self.namespace, self.timeout, self.step = store, namespace, timeout, step
        self.shared, self.threaded, self.groups = shared, threaded, list(groups)
        self._blocked: tuple | None = None  # (what, deadline) of the caller's blocking wait
        self._reason: BaseException | None = None       # why the monitor broke the groups
        self._closed = threading.Event()
        self._monitor: threading.Thread | None = None
        self._backstop = timedelta(seconds=timeout.total_seconds() + BACKSTOP_S)

    @property
    def key(self) -> str:
        """The step's error key: the group's own, or the one every pipeline replica shares (``shared``)."""
        return f"mpipe_hf/{self.shared or self.namespace}/step{self.step}/error"

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
        ``RuntimeError``) and the same text (waits for it up to the store's timeout)."""
        name, _, text = self.store.get(self.key).decode().partition("\n")
        return _TYPES.get(name, RuntimeError)(text)

    def check(self) -> None:
        """Raise :class:`PeerFailed` if some rank has published an error this step."""
        if self.store.check([self.key]):
            raise PeerFailed(self.key)

    def wait(self, work: dist.Work, what) -> None:
        """Wait for ``work`` (already posted; one that reports completion: NCCL's, or a gloo collective),
        polling it and looking for other ranks' errors every ``CHECK_S``.

        Raises:
            PeerFailed: another rank failed this step.
            TimeoutError: ``work`` did not complete within the timeout; the text names ``what`` (text, or anything
                that formats as text, such as an action: formatted only then).
        """
        deadline = time.monotonic() + self.timeout.total_seconds()
        next_check, pause = time.monotonic() + CHECK_S, 1e-5
        while not work.is_completed():
            now = time.monotonic()
            if now >= next_check:
                self.check()
                if now >= deadline:
                    raise self._expired(what)
                next_check = now + CHECK_S
            time.sleep(pause)
            pause = min(2 * pause, _MAX_PAUSE_S)
        try:
            work.wait()
        except RuntimeError as err:
            raise self.failure(err, what) from err

    def block(self, work: dist.Work, what) -> None:
        """Wait for a gloo point-to-point ``work`` in the caller. The monitor thread ends the wait, by breaking
        the groups, when another rank publishes an error or the timeout passes (gloo's own bound, ``BACKSTOP_S``
        later, is a last resort). Without ``threaded`` this is :meth:`wait`.

        Raises:
            PeerFailed: another rank failed this step.
            TimeoutError: ``work`` did not complete within the timeout; the text names ``what``.
            RuntimeError: gloo's error, when no other rank failed (a peer's process is gone).
        """
        if not self.threaded:
            return self.wait(work, what)
        if self._monitor is None:
            self._monitor = threading.Thread(target=self._watch, daemon=True, name=f"mpipe-{self.namespace}")
            self._monitor.start()
        self._blocked = (what, time.monotonic() + self.timeout.total_seconds())
        try:
            work.wait(self._backstop)
        except RuntimeError as err:
            raise self.failure(err, what) from err
        finally:
            self._blocked = None

    def _watch(self) -> None:
        """The monitor thread: while the caller is blocked, look at the key and the deadline."""
        while not self._closed.wait(CHECK_S):
            blocked = self._blocked
            if self._reason is not None:
                continue
            if blocked is None:
                if WATCH_BETWEEN_WAITS:
                    self._watch_collectives()
                continue
            what, deadline = blocked
            try:
                if self.store.check([self.key]):
                    self._reason = PeerFailed(self.key)
                elif time.monotonic() >= deadline and self._blocked is blocked:
                    self.store.set(f"{self.key}/pending", "timeout")  # peers: an error is on its way
                    self._reason = self._expired(what)
                else:
                    continue
            except RuntimeError:  # the store is gone (the job is ending): nothing to watch
                return
            self.break_groups()

    def _watch_collectives(self) -> None:
        """The caller is not blocked in a wait of ours: it may be in a watched group's collective. A peer's error
        breaks the watched groups (the caller's collective fails; the executor raises the first error)."""
        watched = [g for g in WATCHED if not g.broken]
        try:
            if watched and self.store.check([self.key]):
                for group in watched:
                    group.breaks()
        except RuntimeError:  # the store is gone (the job is ending)
            pass

    def _expired(self, what) -> TimeoutError:
        return TimeoutError(f"{what} did not complete within {self.timeout.total_seconds():.0f}s")

    def failure(self, err: BaseException, what) -> BaseException:
        """What a gloo or NCCL error ``err`` in ``what`` means: the reason the monitor broke the groups, a
        :class:`PeerFailed` when another rank published an error (its broken groups closed our connections),
        a ``TimeoutError`` for gloo's own timeout, else ``err`` itself (a peer's process is gone, or a genuine
        error of this rank)."""
        if self._reason is not None:
            return self._reason
        try:
            if self.store.check([self.key]):
                return PeerFailed(self.key)
            if self.store.check([f"{self.key}/pending"]):  # a peer timed out and is about to publish
                self.store.wait([self.key], self.timeout)
                return PeerFailed(self.key)
        except RuntimeError:
            pass
        if "Timed out waiting" in str(err):
            return self._expired(what)
        return err

    def break_groups(self) -> None:
        """Fail every operation pending on this rank's :attr:`groups` and close their connections (gloo: a
        receive nobody sends, waited on for a millisecond; a group already broken raises at once). Called on
        every rank when a step fails; the groups are not used again. Nothing to do on NCCL, whose groups the
        executor aborts. The :data:`WATCHED` groups (expert parallelism's) are broken too."""
        for group in self.groups:
            break_group(group)
        for group in WATCHED:
            group.breaks()

    def close(self) -> None:
        """End the monitor thread (waiting for it: with watched groups it polls the store between waits too, and
        must not be inside a store call when the process group is destroyed); the watchdog is not used
        afterwards."""
        self._closed.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=10 * CHECK_S)


LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "remote process exited")


def lost_peer(err: BaseException) -> bool:
    """Whether ``err`` says a peer's process is gone (gloo's and NCCL's words for a closed connection)."""
    return any(words in str(err) for words in LOST)

