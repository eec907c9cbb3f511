"""Where a model's LM head is: the one answer every path that reads the head uses (a family's declared
``Family.head`` names the same module; Llama 4's sits inside its causal LM, ``language_model.lm_head``)."""

from __future__ import annotations

from torch import nn


def output_head(model: nn.Module) -> tuple[str, nn.Module] | None:
    """``(name, module)`` of ``model``'s LM head: transformers' ``get_output_embeddings()`` (which a composite
    model such as Llama 4 forwards to its inner causal LM), else a top-level ``lm_head``; ``None`` where the
    model has neither. ``model`` may be a ``peft.PeftModel`` (its names then carry peft's prefix) and the head a
    peft wrapper of the linear layer. ``name`` is the module's name in ``model`` (its first, where shared)."""
    try:
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        head = None
    if head is None:
        head = getattr(model, "lm_head", None)
    if not isinstance(head, nn.Module):
        return None
    name = next((n for n, m in model.named_modules(remove_duplicate=False) if m is head), None)
    return None if name is None else (name, head)
