"""The MoE load-balancing loss across pipeline stages, equal to the unsplit model's.

Hugging Face's MoE families (Qwen3-VL-MoE, Qwen3.5-MoE, ...) add ``router_aux_loss_coef * aux`` to a
micro-batch's loss when ``config.output_router_logits`` is set, with ``load_balancing_loss_func`` (Switch
Transformer, Fedus et al. 2021, arXiv:2101.03961, eqs. 4-6, as transformers writes it): over *all* decoder
layers, ``T_e`` sums the (unpadded) tokens routed to expert ``e`` by each layer's top-k, ``P_e`` sums the router
probabilities of ``e``, ``N`` counts the token rows, and ``aux = E * sum_e (T_e / N) * (P_e / N)``. The product of
two sums over every layer does not split per stage. So each stage adds its layers' terms to *running sums* in
layer order, starting from zeros, and passes them on with the hidden states (``ROUTER_KEYS``): the last stage holds
the model's ``T``, ``P`` and ``N``, bit for bit (the same additions in the same order), computes ``aux``, and the
gradient of ``aux`` flows back through ``P`` to every stage's routers.

Under context parallelism each CP rank's routers see only its slice of the sequence (and its slice of the padding
mask), so its running sums are its slice's. The last stage sums them over the CP group (:func:`aux_loss` with the
micro's split: one all-reduce whose backward all-reduces the gradient, :class:`_SumOverGroup`) before ``aux`` is
computed: every CP rank then holds the whole micro's ``aux``, and the gradient of each rank's term reaches every
rank's routers. The term counts once over the group because the executor weights a micro's ``aux`` by the label
tokens of the rank's own slice (:func:`mpipe_hf.runtime.aux_loss.with_aux`): the CP ranks' weights add up to the
micro's label tokens, as in one process. Sums that reach a stage whole (a preprocess's text layers run on the
whole sequence on every CP rank) are counted on CP rank 0 alone (:func:`counted_once`).

The router modules are found from transformers' own record of them: the text model class's
``_can_record_outputs["router_logits"]`` (the module class whose output ``index`` is the layer's router logits).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from . import expert_precision  # noqa: F401 - the experts' bf16 grouped GEMM under autocast (registers it)

Tensors = dict[str, torch.Tensor]
ROUTER_KEYS = ("router_tokens", "router_probs", "router_rows")


class RouterSums:
    """The running sums of one stage's routers (see the module docstring).

    Args:
        layers: the stage's decoder layers; their router modules (the recorder's class) are watched.
        target: the router module class, index: the position of the logits ``(tokens, E)`` in its output.
        num_experts, top_k: ``E`` and the experts each token is routed to.
    """

    def __init__(self, layers: list[nn.Module], target: type, index: int, num_experts: int, top_k: int):
        self.routers = [m for layer in layers for m in layer.modules() if isinstance(m, target)]
        self.index, self.num_experts, self.top_k = index, num_experts, top_k

    @contextmanager
    def collect(self, state: Tensors, padding: torch.Tensor | None, like: torch.Tensor, split=None):
        """Watch the routers while the stage's layers run; ``sums`` (the yielded dict) then holds ``ROUTER_KEYS``:
        ``state``'s running sums (zeros when the stage is the first) plus this stage's layers, in layer order.
        ``padding``: the ``(B, L)`` mask (``None``: no padding); ``like``: the hidden states (device); ``split``:
        under context parallelism the micro's :class:`~mpipe_hf.runtime.context_parallel.SequenceSplit` (the
        routers see this rank's ``(B, L_r)`` tokens, so the mask is cut to them)."""
        if split is not None and padding is not None:
            padding = split.local(padding, padding.dim() - 1)
        logits: list[torch.Tensor] = []
        handles = [r.register_forward_hook(lambda _m, _i, out: logits.append(out[self.index]))
                   for r in self.routers]
        sums: Tensors = {}
        try:
            yield sums
        finally:
            for h in handles:
                h.remove()
        sums.update(self.add(state, logits, padding, like))

    def add(self, state: Tensors, logits: list[torch.Tensor], padding: torch.Tensor | None,
            like: torch.Tensor) -> Tensors:
        """``state``'s sums plus the terms of ``logits`` (one ``(B * L, E)`` tensor per router call, in layer
        order; without padding any number of tokens each), as ``load_balancing_loss_func`` adds them (masked by
        ``padding``)."""
        device = like.device
        tokens = state.get("router_tokens", torch.zeros(self.num_experts, dtype=torch.float32, device=device))
        probs = state.get("router_probs", torch.zeros(self.num_experts, dtype=torch.float32, device=device))
        rows = state.get("router_rows", torch.zeros((), dtype=torch.float32, device=device))
        pad = padding.reshape(-1).to(device=device, dtype=torch.float32) if padding is not None else None
        for gate in logits:  # a packed micro's linear-attention layers run per row: one gate call per row
            flat = pad if pad is not None else torch.ones(gate.shape[0], dtype=torch.float32, device=device)
            weights = torch.nn.functional.softmax(gate.to(device), dim=-1)
            _, chosen = torch.topk(weights, self.top_k, dim=-1)
            tokens = tokens + torch.zeros(self.num_experts, dtype=torch.float32, device=device).scatter_add_(
                0, chosen.reshape(-1), flat.repeat_interleave(self.top_k))
            probs = probs + (weights.float() * flat.unsqueeze(-1)).sum(dim=0)
            rows = rows + flat.sum()
        return {"router_tokens": tokens, "router_probs": probs, "router_rows": rows}


class _SumOverGroup(torch.autograd.Function):
    """``dist.all_reduce`` (sum) over ``group`` whose backward all-reduces the gradient: each rank's output is the
    group's sum, so the gradient of every rank's use of it reaches every rank's input."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def group_sums(sums: Tensors, group) -> Tensors:
    """``sums`` (``ROUTER_KEYS``: ``(E,)``, ``(E,)``, ``()``) summed over the ranks of ``group`` in one
    differentiable all-reduce (:class:`_SumOverGroup`); ``sums`` itself when ``group`` is ``None``."""
    if group is None:
        return sums
    num = sums["router_tokens"].shape[0]
    flat = torch.cat([sums["router_tokens"], sums["router_probs"], sums["router_rows"].reshape(1)])
    total = _SumOverGroup.apply(flat, group)
    return {"router_tokens": total[:num], "router_probs": total[num:2 * num], "router_rows": total[2 * num]}


def counted_once(state: Tensors, split) -> Tensors:
    """The running sums of ``state`` that reach a stage whole (from layers that ran on the whole sequence on every
    CP rank alike: a transposed preprocess's text layers), kept on CP rank 0 of ``split`` and zeros on the others,
    so that :func:`group_sums` counts them once. The gradient of the group's term reaches rank 0's copy of those
    routers; their weight gradients are summed over cp with every other weight's. ``{}`` without sums."""
    sums = {k: state[k] for k in ROUTER_KEYS if k in state}
    return sums if split.rank == 0 else {k: torch.zeros_like(t) for k, t in sums.items()}


def aux_loss(sums: Tensors, num_experts: int, split=None) -> torch.Tensor:
    """``E * sum_e (T_e / N) * (P_e / N)`` from the last stage's running sums (a 0-d tensor). ``split``: under
    context parallelism the micro's :class:`~mpipe_hf.runtime.context_parallel.SequenceSplit`, whose CP group the
    sums are first summed over (:func:`group_sums`): the whole micro's term, on every CP rank."""
    sums = group_sums(sums, split.group if split is not None else None)
    tokens = sums["router_tokens"] / sums["router_rows"]
    probs = sums["router_probs"] / sums["router_rows"]
    return torch.sum(tokens * probs.unsqueeze(0)) * num_experts


def router_spec(text_model: nn.Module, text_config) -> tuple[type, int, int, int, float] | None:
    """``(router class, logits index, E, top_k, coefficient)`` when the model adds the load-balancing loss
    (``output_router_logits`` set and a router recorded by transformers), else ``None``."""
    if not getattr(text_config, "output_router_logits", False):
        return None
    recorder = getattr(type(text_model), "_can_record_outputs", {}).get("router_logits")
    target = getattr(recorder, "target_class", None)
    num_experts = getattr(text_config, "num_experts", None) or getattr(text_config, "num_local_experts", None)
    if target is None or not num_experts:
        return None
    return (target, getattr(recorder, "index", 0) or 0, num_experts, text_config.num_experts_per_tok,
            float(getattr(text_config, "router_aux_loss_coef", 0.0)))
