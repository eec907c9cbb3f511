"""A rank that dies or stops ends every rank within seconds, also where NCCL would leave them blocked
(:mod:`mpipe_hf.runtime.liveness`).

Each rank here is a :class:`~mpipe_hf.runtime.liveness.Liveness` over one shared store, with its main thread
blocked in :class:`device_model.NcclLikeComm` (a wait that only the communicator's abort ends, as NCCL's kernels on
a lost peer): in an all-to-all inside a stage, in the step's host read, or in ``synchronize()``. The layouts are
those of the runs: pp (2 ranks), dp x pp and ep x pp (4 ranks; the liveness is the world's, so what differs is
where each rank is blocked). A killed rank stops beating without writing ``done``; a stopped one (``SIGSTOP``) is
the same to its peers. Periods are scaled down (beats of 20 ms, a silence of 0.3 s); the real ones are checked
against the targets by :func:`test_silence_meets_the_targets`, and real processes by ``scripts/check/fault_suite.py``'s
``nccl-kill`` and ``nccl-stop`` cases.
"""

import threading
import time

import pytest
import torch.distributed as dist

from device_model import NcclLikeComm
from mpipe_hf.runtime.liveness import Liveness, announce, silence_for

BEAT, SILENCE = 0.02, 0.3
LAYOUTS = {"pp": 2, "dp x pp": 4, "ep x pp": 4}
WAITS = ("all-to-all", "host read", "synchronize")


class Rank:
    """One rank: its liveness thread and its main thread, blocked in ``what`` on a communicator of its own."""

    def __init__(self, store, rank: int, world: int, what: str, watch: bool = True, stuck_s: float | None = None):
        self.comm, self.line, self.error, self.ended_at = NcclLikeComm(), None, None, None
        self.done = threading.Event()  # the liveness thread ended the rank
        self.main = threading.Thread(target=self._block, args=(what,), daemon=True)
        self.main.start()
        self.live = Liveness(store, rank, world, SILENCE, self.comm.abort, end=self._end, beat_s=BEAT,
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
    killed_at = time.monotonic()
    others = [r for i, r in enumerate(ranks) if i != lost]
    for rank in others:
        rank.join(10 * SILENCE)
    for rank in others:
        assert rank.line is not None, "a rank blocked where NCCL would keep it did not end"
        assert f"rank {lost} is lost" in rank.line
        assert SILENCE - 2 * BEAT <= rank.ended_at - killed_at < SILENCE + 50 * BEAT  # the silence, and beats to see it
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
    time.sleep(3 * SILENCE)
    assert [r.line for r in ranks] == [None] * 4
    for rank in ranks:
        rank.live.stop()
        rank.comm.abort()


def test_without_the_liveness_thread_the_ranks_stay_blocked():
    """The negative control: no heartbeat thread, and the peers of a killed rank wait on (NCCL's case before)."""
    ranks = world("dp x pp", watch=False)
    time.sleep(3 * SILENCE)
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
    ranks = world("ep x pp", stuck={2: 4 * SILENCE} if watch_main else None)
    time.sleep(8 * SILENCE)
    if not watch_main:
        assert [r.line for r in ranks] == [None] * 4 and all(r.main.is_alive() for r in ranks)
        for rank in ranks:
            rank.live.stop()
            rank.comm.abort()
        return
    for rank in ranks:
        rank.join(8 * SILENCE)
        assert rank.line is not None and "rank 2: its main thread has waited" in rank.line, rank.line
        assert "device_model.py" in rank.line and "aborted" in str(rank.error)
