"""The gradients a pipeline step adds to (:class:`StepGradients`), as :meth:`~.executor.PipelineExecutor.step`
keeps them: set aside at the step's start, put back where the step fails, and at its end normalised over the
step's label tokens, summed over the replicas and added to those set aside."""

from __future__ import annotations

from typing import Iterable

from torch import nn

from .data_parallel import is_sharded


class StepGradients:
    """The gradients a step adds to: ``params`` (the parameters this rank optimises) and the preprocess's
    ``trainable`` ones (a replica of ``P`` on a rank that does not optimise it). Built at the step's start, it sets
    aside the gradients already in ``.grad`` (earlier steps', not yet stepped on), so the step's normalisation and
    ``GRAD_REDUCE`` touch only the step's share."""

    def __init__(self, params: list[nn.Parameter], trainable: Iterable[nn.Parameter]):
        self.mine = set(params)
        self.trained = params + [p for p in trainable if p not in self.mine]
        self.kept = {p: p.grad for p in self.trained}
        for p in self.trained:
            p.grad = None

    def put_back(self) -> None:
        """Undo the step: every gradient is the one set aside (the step's own are dropped)."""
        for p in self.trained:
            p.grad = self.kept[p]

    def finish(self, divisor: float, replicas: int, data_parallel=None) -> None:
        """End a step that ran: the step's gradients of this rank's parameters divided by ``divisor`` (its label
        tokens, or its micro-batches over every replica), those FSDP2 already averaged over the ``replicas`` by
        ``divisor / replicas``; summed over the replicas (``data_parallel``, when there are any), and added to the
        gradients set aside. A replica of ``P`` this rank does not optimise gets its set-aside gradient back."""
        for p in self.trained:
            if p not in self.mine:  # a replica of P on a rank that does not own it: rank 0 optimises P
                p.grad = self.kept[p]
            elif p.grad is not None:  # FSDP averaged its gradients over the replicas: divide the rest
                p.grad.div_(divisor / replicas if is_sharded(p.grad) else divisor)
        if data_parallel is not None:
            data_parallel.sum_replicated([p for p in self.trained if p in self.mine])
        for p in self.trained:  # gradients of earlier steps, not yet stepped on, stay and add up
            if p in self.mine and self.kept[p] is not None:
                p.grad = self.kept[p] if p.grad is None else self.kept[p].add_(p.grad)
