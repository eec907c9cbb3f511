"""The MoE load-balancing loss folded into the last stage's loss, per micro-batch (the term itself:
:mod:`mpipe_hf.models.moe`)."""

from __future__ import annotations

import torch

Tensors = dict[str, torch.Tensor]


def micro_tokens(outputs: Tensors) -> torch.Tensor:
    """The whole micro-batch's label tokens, at least 1, from a last stage's outputs: ``"micro_tokens"`` where
    a CP rank's head counts its own slice's as ``"num_tokens"`` (:class:`~mpipe_hf.models.decoder.LMHead`), else
    ``"num_tokens"``. A per-micro mean divides by it."""
    return outputs.get("micro_tokens", outputs["num_tokens"]).clamp_min(1)


def with_aux(ctx, outputs: Tensors) -> tuple[Tensors, torch.Tensor | float]:
    """``(outputs, term)``: the last stage's outputs with the MoE load-balancing loss folded in
    (:mod:`mpipe_hf.models.moe`), and the term to add to a micro's mean (``"micro"``; else 0).
    ``"micro"`` normalisation: each micro's loss is its token mean plus its ``aux_loss`` (under context
    parallelism each CP rank's part of both, by its share of the micro's label tokens), as the HF Trainer
    computes a model's loss without ``num_items_in_batch`` (the MoE families' ``accepts_loss_kwargs = False``);
    the summed ``"loss"`` is left alone here and the term added after the division. ``"tokens"``: ``aux_loss``
    weighted by the micro's label tokens, so the step's loss is ``sum(token loss + aux * n) / N``: each micro's
    aux counts by its share of the step's tokens. Without an ``aux_loss`` nothing changes. ``ctx``: the
    :class:`~.step_context.StepContext` (its ``per_micro``, ``aux_sum`` and ``aux_micros``)."""
    aux = outputs.pop("aux_loss", None)
    if aux is None:
        return outputs, 0.0
    ctx.aux_micros += 1
    if ctx.per_micro:  # this rank's share of the micro's label tokens: 1 (a CP rank: its slice's, 1 over the
        # group, which computed the whole micro's term on each); 0 for a micro without any (a null micro-batch)
        aux = aux * (outputs["num_tokens"] / micro_tokens(outputs))
        ctx.aux_sum = ctx.aux_sum + aux.detach().double()
        return outputs, aux
    weighted = aux * outputs["num_tokens"]
    ctx.aux_sum = ctx.aux_sum + weighted.detach().double()
    return {**outputs, "loss": outputs["loss"] + weighted}, 0.0
