"""The reference of every numerics check: the unsplit HF model on one process over one schedule run's
micro-batches, with the pipeline's loss normalisation (SPEC.md, "Numerics contract")."""

import torch

from mpipe_hf.runtime.handlers import preprocess_seed


def hf_inputs(model, mb: dict) -> dict:
    """``mb`` as the HF model's ``forward`` takes it: the keys its family hands over as Python lists
    (``Family.list_inputs``, Unlimited-OCR's tile counts and grids) converted from their int64 tensors."""
    from mpipe_hf.models.registry import FAMILIES
    family = FAMILIES.get(model.config.model_type)
    lists = family.list_inputs if family is not None else ()
    return {k: v.tolist() if k in lists else v for k, v in mb.items()}


def reference_run(model, micros, seeds=None, bf16=False, order="hf"):
    """Loss and gradients of the unsplit model over one schedule run, normalised by the run's label tokens.
    ``seeds``: ``(tower, seed, run)``: the tower runs micro ``m`` under ``preprocess_seed(seed, run, m)``, as the
    pipeline's ``P`` does. ``bf16``: the forward under bf16 autocast. ``order``: ``hf``, each micro's loss
    divided by the run's tokens before its backward (``num_items_in_batch``, as the HF Trainer); ``pipeline``,
    the summed loss backpropagated and the gradients divided once at the end, the pipeline's order of
    operations."""
    total_tokens = sum(int((mb["labels"][..., 1:] != -100).sum()) for mb in micros)
    vocab = model.config.get_text_config().vocab_size
    kept = {p: p.grad for p in model.parameters()}
    if order == "pipeline":
        for p in kept:
            p.grad = None
    loss_total = 0.0
    for m, mb in enumerate(micros):
        if seeds is not None:
            tower, seed, run = seeds
            hook = tower.register_forward_pre_hook(
                lambda *_, s=preprocess_seed(seed, run, m): torch.default_generator.manual_seed(s) and None)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if order == "micro":  # HF's own loss of the micro (token mean + its MoE aux term), as the Trainer
                loss = model(**hf_inputs(model, mb)).loss / len(micros)
            else:
                out = model(**hf_inputs(model, {k: v for k, v in mb.items() if k != "labels"}))
                loss = model.loss_function(logits=out.logits, labels=mb["labels"], vocab_size=vocab,
                                           num_items_in_batch=total_tokens if order == "hf" else 1)
                loss = loss + aux_term(model, out, mb, total_tokens if order == "hf" else 1)
        if loss.requires_grad:  # a text-only micro-batch under freeze_llm trains nothing
            loss.backward()
        loss_total += loss.detach().item()
        if seeds is not None:
            hook.remove()
    if order == "pipeline":
        for p, before in kept.items():
            if p.grad is not None:
                p.grad.div_(total_tokens)
                if before is not None:
                    p.grad = before.add_(p.grad)
            else:
                p.grad = before
        return loss_total / total_tokens
    return loss_total


def aux_term(model, out, mb, divisor):
    """HF's MoE load-balancing term (``router_aux_loss_coef * out.aux_loss``, transformers'
    ``load_balancing_loss_func``) weighted by the micro's label tokens over ``divisor``, as the pipeline's
    ``"tokens"`` normalisation counts it; 0 for a model without one."""
    aux = getattr(out, "aux_loss", None)
    if aux is None:
        return 0.0
    tokens = int((mb["labels"][..., 1:] != -100).sum())
    return model.config.get_text_config().router_aux_loss_coef * aux * tokens / divisor
