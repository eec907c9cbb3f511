"""A rank that dies or stops ends every rank within seconds, also where NCCL would leave them blocked
(:mod:`mpipe_hf.runtime.liveness`).

Each rank here is a :class:`~mpipe_hf.runtime.liveness.Liveness` over one shared store, with its main thread
blocked in :class:`device_model.NcclLikeComm` (a wait that only the communicator's abort ends, as NCCL's kernels on
a lost peer): in an all-to-all inside a stage, in the step's host read, or in ``synchronize()``. The layouts are
those of the runs: pp (2 ranks), dp x pp and ep x pp (4 ranks; the liveness is the world's, so what differs is
where each rank is blocked). A killed rank stops beating without writing ``done``; a stopped one (``SIGSTOP``) is
the same to its peers. Periods are scaled down (beats of 50 ms, a silence of 1 s: long enough that a thread
starved by a loaded 2-core machine is not taken for lost); the real ones are checked
against the targets by :func:`test_silence_meets_the_targets`, and real processes by ``scripts/check/fault_suite.py``'s
``nccl-kill`` and ``nccl-stop`` cases.
"""

import threading
import time

import pytest
import torch.distributed as dist

from device_model import NcclLikeComm
from mpipe_hf.runtime.liveness import Liveness, announce, silence_for

BEAT, SILENCE = 0.05, 1.0
LAYOUTS = {"pp": 2, "dp x pp": 4, "ep x pp": 4}
WAITS = ("all-to-all", "host read", "synchronize")


class Rank:
    """One rank: its liveness thread and its main thread, blocked in ``what`` on a communicator of its own."""

    def __init__(self, store, rank: int, world: int, what: str, watch: bool = True, stuck_s: float | None = None,
                 kind: type = Liveness):
        self.comm, self.line, self.error, self.ended_at = NcclLikeComm(), None, None, None
        self.done = threading.Event()  # the liveness thread ended the rank
        self.main = threading.Thread(target=self._block, args=(what,), daemon=True)
        self.main.start()
        self.live = kind(store, rank, world, SILENCE, self.comm.abort, end=self._end, beat_s=BEAT,
                         namespace="test", stuck_s=stuck_s, main=self.main.ident)
        if watch:
            self.live.start()

    def _block(self, what: str) -> None:
        try:
            self.comm.wait(what, timeout=20 * SILENCE)
        except (RuntimeError, TimeoutError) as err:
            self.error = err

    def _end(self, line: str) -> None:
        self.line, self.ended_at = line, time.monotonic()
        self.done.set()

    def join(self, timeout: float) -> None:
        """Wait for the liveness thread to end the rank and for the main thread to leave its wait."""
        self.done.wait(timeout)
        self.main.join(timeout)

    def kill(self) -> None:
        """``kill -9`` (or ``SIGSTOP``) as its peers see it: no more heartbeats, no ``done``."""
        self.live.stop(done=False)


def world(layout: str, watch: bool = True, stuck: dict | None = None) -> list[Rank]:
    """The ranks of ``layout``; ``stuck``: ``{rank: stuck_s}`` for the ranks that watch their main thread."""
    store, size = dist.HashStore(), LAYOUTS[layout]
    return [Rank(store, r, size, WAITS[r % len(WAITS)], watch, (stuck or {}).get(r)) for r in range(size)]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("lost", [0, 1])
def test_a_lost_rank_ends_every_blocked_rank(layout, lost):
    ranks = world(layout)
    time.sleep(3 * BEAT)
    ranks[lost].kill()
    killed_at, last_beat = time.monotonic(), ranks[lost].live.beat_at
    others = [r for i, r in enumerate(ranks) if i != lost]
    for rank in others:
        rank.join(10 * SILENCE)
    for rank in others:
        assert rank.line is not None, "a rank blocked where NCCL would keep it did not end"
        assert f"rank {lost} is lost" in rank.line
        assert rank.ended_at - last_beat >= SILENCE  # silent for the whole silence ...
        assert rank.ended_at - killed_at < SILENCE + 50 * BEAT  # ... and seen within a few beats of it
        assert "aborted" in str(rank.error)  # the abort released the blocked wait
    assert len({r.line for r in others}) == 1  # one line, the same on every rank


def test_an_ended_run_ends_the_blocked_ranks_within_a_beat():
    """A rank that ends the run for a reason of its own (a failed step on NCCL) publishes its line; every rank,
    the one that hangs included, ends with it."""
    ranks = world("ep x pp")
    time.sleep(3 * BEAT)
    announced_at = time.monotonic()
    line = announce(ranks[0].live.store, "mpipe-hf: error: pipeline rank 1, SEND_B3 did not complete", "test")
    for rank in ranks:
        rank.join(10 * SILENCE)
        assert rank.line == line and "aborted" in str(rank.error)
        assert rank.ended_at - announced_at < 50 * BEAT


def test_a_rank_done_is_not_lost():
    ranks = world("dp x pp")
    time.sleep(3 * BEAT)
    ranks[3].live.stop(done=True)
    time.sleep(1.5 * SILENCE)
    assert [r.line for r in ranks] == [None] * 4
    for rank in ranks:
        rank.live.stop()
        rank.comm.abort()


def test_without_the_liveness_thread_the_ranks_stay_blocked():
    """The negative control: no heartbeat thread, and the peers of a killed rank wait on (NCCL's case before)."""
    ranks = world("dp x pp", watch=False)
    time.sleep(1.5 * SILENCE)
    assert [r.line for r in ranks] == [None] * 4 and all(r.main.is_alive() for r in ranks)
    for rank in ranks:
        rank.comm.abort()


@pytest.mark.parametrize("timeout_s", [5, 15, 60, 600])
def test_silence_meets_the_targets(timeout_s):
    """At the real period (a beat a second), a dead rank is found within 30 s and a stopped one within
    ``parallel.timeout_s`` + 10 s (the silence and two beats: one to miss, one to read)."""
    found = silence_for(timeout_s) + 2.0
    assert found <= 30.0 and found <= timeout_s + 10.0


@pytest.mark.parametrize("watch_main", [True, False])
def test_a_main_thread_stuck_with_every_rank_alive_ends_the_run(watch_main):
    """Torch's NCCL watchdog no longer ends a collective that no peer completes (its error handling is left to
    the process): every rank alive and beating, every main thread blocked; the rank that watches its main thread
    (the runs: for ``2 * timeout_s``) ends the run, naming itself and where it waits. Without that watch (the
    negative control) every rank stays blocked."""
    ranks = world("ep x pp", stuck={2: 1.5 * SILENCE} if watch_main else None)
    if not watch_main:
        time.sleep(2 * SILENCE)  # longer than the watching rank's 1.5 silences
        assert [r.line for r in ranks] == [None] * 4 and all(r.main.is_alive() for r in ranks)
        for rank in ranks:
            rank.live.stop()
            rank.comm.abort()
        return
    for rank in ranks:
        rank.join(10 * SILENCE)
        assert rank.line is not None and "rank 2: its main thread has waited" in rank.line, rank.line
        assert "device_model.py" in rank.line and "aborted" in str(rank.error)


class PausableStore:
    """The world's store, which can stand still: a liveness thread waits in its next store call until
    :meth:`resume`, as a thread of a VM that paused (migrated, snapshotted) or of a starved process."""

    def __init__(self):
        self.inner, self.running, self.reads = dist.HashStore(), threading.Event(), 0
        self.running.set()

    def __getattr__(self, name):
        call = getattr(self.inner, name)

        def waiting(*args):
            self.running.wait()
            out = call(*args)
            self.reads += name == "multi_get"  # the peers' heartbeats read
            return out
        return waiting

    def pause(self) -> None:
        self.running.clear()

    def resume(self) -> None:
        self.running.set()


class WithoutStallDiscount(Liveness):
    """The negative control: a liveness thread that counts its own stall as its peers' silence."""

    def _discount_stall(self, seen, now):
        self._judged = now


class PeerBeats:
    """The heartbeats of ranks 1 to 3, written by the test itself, so that it decides when they move."""

    def __init__(self, store):
        self.store, self.count = store, 0

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.count += 1
            for rank in (1, 2, 3):
                self.store.set(f"test/beat/{rank}", str(self.count))
            time.sleep(BEAT)


@pytest.mark.parametrize("kind", [Liveness, WithoutStallDiscount])
def test_a_pause_of_the_whole_host_is_no_peers_silence(kind):
    """Rank 0 watches ranks 1 to 3, whose heartbeats the test writes. Their host (a VM) pauses for 1.5 silences:
    rank 0's thread stands in its next store call and no heartbeat moves. Then rank 0 runs on first and reads its
    peers before they beat again (any order may follow a pause). Nobody is lost, since rank 0 did not watch while
    it stood. Without the discount (the control) rank 0 wakes to its peers' still heartbeats and ends the run."""
    store = PausableStore()
    rank, peers = Rank(store, 0, 4, "all-to-all", kind=kind), PeerBeats(store.inner)
    peers.run(3 * BEAT)
    store.pause()
    time.sleep(1.5 * SILENCE)
    reads = store.reads
    store.resume()
    deadline = time.monotonic() + 10 * SILENCE
    while store.reads == reads:  # rank 0 reads its peers' heartbeats before they beat again
        assert time.monotonic() < deadline, "rank 0 did not read after the pause"
        time.sleep(BEAT / 10)
    peers.run(SILENCE / 2)
    if kind is WithoutStallDiscount:
        rank.done.wait(10 * SILENCE)  # its loss is found right after that read; ending takes a moment
    line = rank.line
    rank.live.stop()
    rank.comm.abort()
    if kind is Liveness:
        assert line is None, line
    else:
        assert line is not None and "is lost" in line, line
