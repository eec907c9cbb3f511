"""The MoE load-balancing loss folded into the last stage's loss, per micro-batch (the term itself:
:mod:`mpipe_hf.models.moe`)."""

from __future__ import annotations

import torch

Tensors = dict[str, torch.Tensor]


def with_aux(ctx, outputs: Tensors) -> tuple[Tensors, torch.Tensor | float]:
    """``(outputs, term)``: the last stage's outputs with the MoE load-balancing loss folded in
    (:mod:`mpipe_hf.models.moe`), and the term to add to a micro's mean (``"micro"``; else 0).
    ``"micro"`` normalisation: each micro's loss is its token mean plus its ``aux_loss``, as the HF Trainer
    computes a model's loss without ``num_items_in_batch`` (the MoE families' ``accepts_loss_kwargs = False``);
    the summed ``"loss"`` is left alone here and the term added after the division. ``"tokens"``: ``aux_loss``
    weighted by the micro's label tokens, so the step's loss is ``sum(token loss + aux * n) / N``: each micro's
    aux counts by its share of the step's tokens. Without an ``aux_loss`` nothing changes. ``ctx``: the
    :class:`~.step_context.StepContext` (its ``per_micro``, ``aux_sum`` and ``aux_micros``)."""
    aux = outputs.pop("aux_loss", None)
    if aux is None:
        return outputs, 0.0
    ctx.aux_micros += 1
    if ctx.per_micro:  # a micro without label tokens (a null micro-batch) adds nothing, as under "tokens"
        aux = aux * (outputs["num_tokens"] > 0)
        ctx.aux_sum = ctx.aux_sum + aux.detach().double()
        return outputs, aux
    weighted = aux * outputs["num_tokens"]
    ctx.aux_sum = ctx.aux_sum + weighted.detach().double()
    return {**outputs, "loss": outputs["loss"] + weighted}, 0.0
