"""Every rank's liveness, watched by a thread of its own, so that a lost or stopped rank ends the whole run within
seconds on NCCL too (docs/failures.md, "A rank that dies or stops").

On gloo a killed peer closes its sockets and every rank's pending operation fails at once (the step's watchdog,
:mod:`.watchdog`, then names the lost rank). NCCL does not notice a closed socket: its kernels wait for the peer's
data forever, and a rank blocked in a collective inside a stage (expert parallelism's all-to-all), in the step's
host read or in ``synchronize()`` cannot look at the store at all. So a thread independent of the main thread
(:class:`Liveness`, one per process):

- writes this rank's heartbeat, a counter, under ``<namespace>/beat/<rank>`` in the world's store every ``beat_s``;
- reads every other rank's counter; a counter that has not moved for ``silence_s`` (measured on this rank's own
  clock, so the hosts' clocks need not agree, less one stall of this rank's own: :meth:`Liveness._discount_stall`)
  is a rank whose process ended or is stopped (``SIGSTOP``, a host that froze): the thread publishes one line
  naming it under ``<namespace>/ended`` (the first writer wins);
- reads ``<namespace>/ended`` every beat: a rank that ended the run for any other reason (a failed step on NCCL,
  :func:`~.groups.end_communicators`; an error of its own, :func:`announce_end`) has written its line there;
- as a backstop for what torch's NCCL watchdog did before (every rank alive, a collective no peer completes),
  looks where the main thread stands: one call that has not returned for twice ``parallel.timeout_s`` ends the
  run (the step's own waits poll, so they never stand still);
- on any of these, aborts this process's communicators (``abort``: NCCL's abort of every communicator releases the
  kernels and waits of the blocked main thread), prints the line and ends the process with :data:`EXIT_CODE`
  (torchrun's ``--max-restarts`` restarts the workers, which resume from the last checkpoint).

A rank that finishes cleanly writes ``done`` as its heartbeat (:func:`stop_beating`), which no peer takes for a
silence. Torch's own NCCL watchdog is left its timeout but not its error handling
(``TORCH_NCCL_ASYNC_ERROR_HANDLING=0``, as torch's abort documentation asks of a process that aborts its process
groups itself; :func:`nccl_error_handling`).
"""

from __future__ import annotations

import atexit
import os
import sys
import sysconfig
import threading
import time
from typing import Callable

import torch.distributed as dist

BEAT_S = 1.0            # how often a rank writes its heartbeat and reads the others', seconds
SILENCE_S = 20.0        # a heartbeat that has not moved this long: the rank is lost (dead or stopped), seconds
ABORT_S = 10.0          # longest wait for the communicators' abort before the process ends anyway, seconds
EXIT_CODE = 75          # the exit status of a process that the liveness thread ended
NAMESPACE = "mpipe_hf/liveness"
_STDLIB = sysconfig.get_paths()["stdlib"]  # frames of Python's own library: the line names their caller
_ACTIVE: list["Liveness"] = []  # this process's running liveness thread (at most one)


def silence_for(timeout_s: float) -> float:
    """How long a silent heartbeat is waited for: :data:`SILENCE_S`, or ``parallel.timeout_s`` + 5 s when that is
    shorter, so a dead rank is found within 30 s and a stopped one within ``timeout_s`` + 10 s."""
    return min(SILENCE_S, timeout_s + 5.0)


class Liveness:
    """The heartbeat and watch of rank ``rank`` of ``world`` ranks (see the module's text).

    Args:
        store: a store every rank reaches (the world's).
        rank, world: this process's global rank and the number of ranks.
        silence_s: how long a heartbeat may stay still before its rank is lost (:func:`silence_for`), seconds.
        abort: aborts this process's communicators (called once, in a thread of its own, bounded by ``ABORT_S``).
        end: ends the process with the line (default: print it to stderr, ``os._exit(EXIT_CODE)``).
        beat_s: the heartbeat's period, seconds.
        namespace: the keys' prefix (a restarted attempt or a test uses its own).
        stuck_s: end the run when thread ``main`` (default: the process's main thread) has stood at one
            instruction this long, seconds (None: never). The runs use ``2 * timeout_s``, the groups' timeout that
            torch's watchdog ended a stuck collective at before.
    """

    def __init__(self, store: dist.Store, rank: int, world: int, silence_s: float, abort: Callable[[], None],
                 end: Callable[[str], None] | None = None, beat_s: float = BEAT_S, namespace: str = NAMESPACE,
                 stuck_s: float | None = None, main: int | None = None):
        self.store, self.rank, self.world, self.silence_s = store, rank, world, silence_s
        self.stuck_s, self.main = stuck_s, main if main is not None else threading.main_thread().ident
        self._where: tuple = (None, 0.0, False)  # (the main thread's place, since when, stall discounted)
        self.abort, self.end, self.beat_s, self.namespace = abort, end or _exit_with, beat_s, namespace
        self.count, self.ended = 0, None  # heartbeats written; the line this rank ended with
        self.beat_at = None  # when this rank last wrote its heartbeat (time.monotonic(), seconds)
        self._judged = time.monotonic()  # when the peers' heartbeats were last read
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"mpipe-liveness-{rank}")

    def start(self) -> "Liveness":
        self._beat()
        self._thread.start()
        return self

    def stop(self, done: bool = True) -> None:
        """End the thread; ``done``: write ``done`` as the heartbeat, so no peer takes this rank for lost."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.beat_s + 1.0)
        if done:
            try:
                self.store.set(self._key(self.rank), "done")
            except RuntimeError:  # the store is gone (the job is ending)
                pass

    def _key(self, rank: int) -> str:
        return f"{self.namespace}/beat/{rank}"

    def _beat(self) -> None:
        self.count += 1
        self.beat_at = time.monotonic()  # before the write: no peer can see this beat earlier
        self.store.set(self._key(self.rank), str(self.count))

    def _run(self) -> None:
        """The thread: beat, read the others' beats and the ended key, until stopped or the run ends."""
        peers = [r for r in range(self.world) if r != self.rank]
        self._judged = time.monotonic()
        # rank: (its last counter, when it last moved, whether a stall of this rank's was discounted since)
        seen = {r: (None, self._judged, False) for r in peers}
        while not self._stop.wait(self.beat_s):
            try:
                self._beat()
                line = self._ended_line() or self._lost_line(peers, seen) or self._stuck_line()
            except RuntimeError:  # the store is gone (the job is ending): nothing to watch
                return
            if line is not None and not self._stop.is_set():
                return self._finish(line)

    def _ended_line(self) -> str | None:
        key = f"{self.namespace}/ended"
        return self.store.get(key).decode() if self.store.check([key]) else None

    def _lost_line(self, peers: list[int], seen: dict) -> str | None:
        """The line for the first peer whose heartbeat has been still for ``silence_s`` (published, the first
        writer's line winning), else None."""
        beats = self.store.multi_get([self._key(r) for r in peers]) if peers else []
        now = time.monotonic()  # after the read: a read that stalled is part of this round's lateness
        self._discount_stall(seen, now)
        for rank, beat in zip(peers, beats):
            if beat == b"done" or beat != seen[rank][0]:
                seen[rank] = (beat, now, False)
            elif now - seen[rank][1] >= self.silence_s:
                line = (f"mpipe-hf: error: rank {rank} is lost: its heartbeat stopped {now - seen[rank][1]:.0f}s "
                        f"ago (its process ended or is stopped; see its log); rank {self.rank} ends the run")
                return announce(self.store, line, self.namespace)
        return None

    def _discount_stall(self, seen: dict, now: float) -> None:
        """A round that comes more than a quarter of the silence late means this rank itself did not watch (its
        VM paused, its process was starved, or the store stalled): that time is no peer's silence and no wait of
        the main thread, so each of those clocks moves on by it, once per stretch in which it stands still (a
        rank whose every round runs late still finds a dead peer within one stall of the silence). Without this,
        the ranks of a host paused for longer than the silence would wake to a false loss of each other; ranks
        on other hosts, which kept running, still rightly take the paused ones for lost."""
        late = now - self._judged - self.beat_s
        self._judged = now
        if late <= self.silence_s / 4:
            return
        for rank, (beat, moved_at, discounted) in seen.items():
            seen[rank] = (beat, moved_at + (0.0 if discounted else late), True)
        where, since, discounted = self._where
        self._where = (where, since + (0.0 if discounted else late), True)

    def _stuck_line(self) -> str | None:
        """The backstop torch's own NCCL watchdog was (``TORCH_NCCL_ASYNC_ERROR_HANDLING`` is 0): the main thread
        has stood at the same instruction (one call that does not return: a host read or a synchronize behind a
        collective no peer completes, every rank alive) for ``stuck_s``; published as the run's end, else None."""
        frame = sys._current_frames().get(self.main) if self.stuck_s is not None else None
        if frame is None:
            return None
        where, now = (frame.f_code, frame.f_lasti, id(frame)), time.monotonic()
        if where != self._where[0]:
            self._where = (where, now, False)
            return None
        if now - self._where[1] < self.stuck_s:
            return None
        while frame.f_back is not None and frame.f_code.co_filename.startswith(_STDLIB):  # the caller's line
            frame = frame.f_back
        line = (f"mpipe-hf: error: rank {self.rank}: its main thread has waited {now - self._where[1]:.0f}s in "
                f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name}), a wait no peer completes; "
                f"it ends the run")
        return announce(self.store, line, self.namespace)

    def _finish(self, line: str) -> None:
        """Abort the communicators (bounded by ``ABORT_S``: an abort that hangs does not keep the process),
        then end the process with ``line``."""
        self.ended = line
        aborting = threading.Thread(target=self.abort, daemon=True, name="mpipe-liveness-abort")
        aborting.start()
        aborting.join(ABORT_S)
        self.end(line)


def announce(store: dist.Store, line: str, namespace: str = NAMESPACE) -> str:
    """Publish ``line`` as the reason the run ends unless a rank published first; return the published one."""
    return store.compare_set(f"{namespace}/ended", "", line).decode()


def _exit_with(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_CODE)


def _abort_world() -> None:
    """Abort every NCCL communicator of the process at once (nothing on gloo: ``os._exit`` closes its sockets)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        try:
            dist.distributed_c10d._abort_process_group()
        except (RuntimeError, ValueError):  # already aborted or destroyed
            pass


def wanted(backend: str) -> bool:
    """Whether the run watches liveness: on NCCL, and on gloo where ``MPIPE_HF_LIVENESS=1`` (tests)."""
    flag = os.environ.get("MPIPE_HF_LIVENESS")
    return flag == "1" or (backend == "nccl" and flag != "0")


def nccl_error_handling() -> None:
    """Before an NCCL process group is made: leave the communicators' abort to this process
    (``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` unless the user set it), as torch's ``_abort_process_group`` asks."""
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")


def start_beating(timeout_s: float) -> Liveness | None:
    """Start this process's liveness thread over the world's store (once; after ``init_process_group``) when
    :func:`wanted`; return it, else None."""
    if _ACTIVE or not wanted(dist.get_backend()):
        return _ACTIVE[0] if _ACTIVE else None
    store = dist.distributed_c10d._get_default_store()
    namespace = f"{NAMESPACE}/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    _ACTIVE.append(Liveness(store, dist.get_rank(), dist.get_world_size(), silence_for(timeout_s), _abort_world,
                            namespace=namespace, stuck_s=2 * timeout_s + BEAT_S).start())
    atexit.register(_at_exit)
    return _ACTIVE[0]


def stop_beating(done: bool = True) -> None:
    """Stop this process's liveness thread (before the process group is destroyed); ``done``: a clean end."""
    while _ACTIVE:
        _ACTIVE.pop().stop(done)


def announce_end(line: str) -> None:
    """Publish ``line`` as the run's end (every other rank's liveness thread ends its process with it within a
    beat): a failed step on NCCL, or an error of this rank's own, which this rank reports and exits with itself
    (its own thread stops first). Nothing without a liveness thread. When the liveness thread is already ending
    the process (its abort woke the main thread), the caller waits for it instead: the process prints one line."""
    if any(live.ended is not None for live in _ACTIVE):
        threading.Event().wait()  # the liveness thread calls os._exit with its line
    for live in list(_ACTIVE):
        live.stop(done=False)
        try:
            announce(live.store, line, live.namespace)
        except RuntimeError:  # the store is gone
            pass


def _at_exit() -> None:
    """At the interpreter's exit: an uncaught error is announced (the peers end at once), else the end is clean."""
    err = getattr(sys, "last_value", None)
    if err is not None and _ACTIVE:
        announce_end(f"mpipe-hf: error: rank {_ACTIVE[0].rank}: {type(err).__name__}: {err}".splitlines()[0])
    stop_beating()
