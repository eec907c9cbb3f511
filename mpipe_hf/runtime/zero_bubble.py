"""A stage's backward in two parts, for zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism",
ICLR 2024; :mod:`mpipe_hf.schedule.zero_bubble` places them).

``B`` computes only the gradient of the stage's inputs. On its way it stops at the graph's *intermediates*: the
nodes where a weight's path meets the inputs' path (a linear layer's ``addmm``), and keeps the gradient that
reached each. ``W`` later runs autograd from those intermediates to the weights, so every node is evaluated once
over the two, and the weight gradients equal the unsplit backward's. The graph analysis is torch's own
(``torch.distributed.pipelining._backward``, what its ``ScheduleInterleavedZeroBubble`` runs on); this module adds
the checks that make a split safe, and falls back to the whole backward in ``B`` where it is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class WeightWork:
    """What ``B`` left for ``W``: the weights and their parameter groups (intermediates and the gradients that
    reached them), or nothing when ``B`` ran the whole backward."""

    weights: list[nn.Parameter] = field(default_factory=list)
    groups: list[dict] = field(default_factory=list)

    def run(self) -> None:
        """Accumulate the weight gradients into ``.grad``; the work is dropped afterwards. Each parameter group's
        pass keeps the graph: two groups' paths to their weights may share nodes (in Gemma 3n's decoder layer they
        do), which the first pass would otherwise free before the second reads them; the graph goes with the
        work."""
        if self.groups:
            from torch.distributed.pipelining._backward import stage_backward_weight  # imported when used: ~0.9 s
            stage_backward_weight(iter(self.weights), self.groups, retain_graph=True)
        self.weights, self.groups = [], []


def backward_input(outputs: list[torch.Tensor], grads: list[torch.Tensor | None], inputs: list[torch.Tensor],
                   weights: list[nn.Parameter]) -> WeightWork:
    """Backprop ``grads`` (``None``: a scalar loss, gradient 1) from ``outputs`` into ``inputs``' ``.grad`` only,
    keeping what :meth:`WeightWork.run` needs for the ``weights``' gradients.

    Where that split is not exact (no input takes a gradient, or some weight reached from ``outputs`` has a
    path that never meets the inputs', such as a reentrant checkpoint's weights), this runs the whole backward
    and returns an empty :class:`WeightWork`.
    """
    roots = [o.grad_fn for o in outputs]
    wanted = [x for x in inputs if x.requires_grad]
    weights = [w for w in weights if w.requires_grad]
    # torch's pipelining package imports torch._dynamo (~0.9 s a process): only runs that split B and W pay it
    from torch.distributed.pipelining._backward import (_get_grad_fn_or_grad_acc, construct_reverse_graph,
                                                        get_param_groups)
    reverse = construct_reverse_graph([r for r in roots if r is not None])
    input_nodes = [_get_grad_fn_or_grad_acc(x) for x in wanted]
    weight_nodes = {_get_grad_fn_or_grad_acc(w): w for w in weights}
    groups = get_param_groups(input_nodes, list(weight_nodes), reverse) if input_nodes else []
    covered = set().union(*(g["params"] for g in groups))
    reached = [node for node in weight_nodes if node in reverse]
    if not input_nodes or any(node not in covered for node in reached):
        torch.autograd.backward(outputs, grads)
        return WeightWork()
    handles = []
    for group in groups:
        group["intermediates"] = list(group["intermediates"])
        group["grads"] = [None] * len(group["intermediates"])
        for i, node in enumerate(group["intermediates"]):
            def keep(grad_outputs, group=group, i=i):
                group["grads"][i] = grad_outputs
            handles.append(node.register_prehook(keep))
    try:
        found = torch.autograd.grad(outputs, wanted, grads, retain_graph=True, allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    for x, g in zip(wanted, found):
        if g is not None:
            x.grad = g if x.grad is None else x.grad + g
    for group in groups:  # an intermediate autograd never reached passes no gradient on
        group["grads"] = [g if g is not None else () for g in group["grads"]]
    return WeightWork([weight_nodes[node] for node in reached], groups)
