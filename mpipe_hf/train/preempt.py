"""Preemption: SIGTERM or SIGUSR1 ends the run after the current step, with a checkpoint to resume from.

Shared clusters stop a job with a signal and a grace period: SLURM sends SIGTERM at the time limit and, with
``--signal=USR1@SECONDS``, SIGUSR1 that many seconds before it; Kubernetes sends SIGTERM and waits
``terminationGracePeriodSeconds``. Each rank's handler only records the signal (a step, and a checkpoint write,
are never cut in the middle). After each step, and after any checkpoint saved at that step, every rank of the
world takes the same decision from one small all-reduce (:meth:`Preemption.agreed`): a signal seen by any rank
stops every rank at the same step, so the checkpoint it saves is the one the uninterrupted run passes through,
and a resume from it is bit-exact (:mod:`.state`).

The launcher forwards the signal: ``mpipe-hf train`` starts torchrun with ``--signals-to-handle`` including
SIGUSR1 and a ``--shutdown-timeout`` of ``train.preempt_grace_s`` (docs/failures.md). Under a torchrun or
``accelerate launch`` of your own, pass the same two settings (``PET_SIGNALS_TO_HANDLE``,
``PET_SHUTDOWN_TIMEOUT`` for accelerate), or signal the workers directly.
"""

from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist

SIGNALS = ("SIGTERM", "SIGUSR1")  # SIGINT stays an interrupt: Ctrl-C stops at once, as it always did
MARKER = "preempted.json"  # rank 0 writes it into output_dir after the preemption checkpoint is on disk


class Preemption:
    """Records SIGTERM and SIGUSR1 in this process, and lets every rank agree to stop after the same step.

    Use: :meth:`install` before the first step (main thread only; elsewhere it is a no-op and the signal keeps
    its previous action), :meth:`connect` once the process group exists, :meth:`agreed` after each step on every
    rank, :meth:`uninstall` at the end.
    """

    def __init__(self):
        self.received: str | None = None
        self.group: dist.ProcessGroup | None = None
        self._previous: dict[int, object] = {}

    def connect(self) -> "Preemption":
        """A process group of the whole world for :meth:`agreed` alone (every rank calls this, in the same order
        as its other group creations): a step that failed may leave the groups it used with messages no one will
        take, and the agreement after a skipped step must not meet them. Returns ``self``."""
        if dist.is_initialized():
            self.group = dist.new_group()
        return self

    def install(self) -> "Preemption":
        """Handle :data:`SIGNALS` by recording them; returns ``self``."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for name in SIGNALS:
            number = getattr(signal, name)
            self._previous[number] = signal.signal(number, self._record)
        return self

    def _record(self, number: int, frame) -> None:
        self.received = self.received or signal.Signals(number).name

    def uninstall(self) -> None:
        """Give each signal back its previous action."""
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}

    def agreed(self, device: torch.device) -> str | None:
        """The signal any rank of the world has received so far, or ``None``; the same on every rank. One int64
        all-reduce (MAX) on ``device`` over :meth:`connect`'s group (the default group without it), read once on
        the host: call it once per step.

        Raises:
            RuntimeError: as ``all_reduce`` (a lost peer, a timeout).
        """
        code = SIGNALS.index(self.received) + 1 if self.received in SIGNALS else 0
        if not dist.is_initialized():
            return self.received
        flag = torch.tensor([code], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        code = int(flag.item())
        return SIGNALS[code - 1] if code else None
