"""Scaled-down real configs of the decoder-only language models (the same config classes as the hub checkpoints)."""

from __future__ import annotations

import functools
from typing import Callable

from ...models.tiny import HEADS, text_keys


def tiny_causal_lm_config(tokenizer, model_type: str = "qwen2", num_layers: int = 8, hidden_size: int = 64,
                          tie_word_embeddings: bool = False):
    """A ``Qwen2Config``, ``LlamaConfig`` or ``Qwen3Config`` (``model_type``) with the real vocabulary of
    ``tokenizer``, 4 heads of ``hidden_size / 4`` and 2 key-value heads (Qwen3: with its q/k norms).

    Raises:
        ValueError: ``model_type`` is not ``"qwen2"``, ``"llama"`` or ``"qwen3"``.
    """
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config
    classes = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3": Qwen3Config}
    if model_type not in classes:
        raise ValueError(f"model_type must be one of {sorted(classes)}, got {model_type!r}")
    extra = {"head_dim": hidden_size // HEADS} if model_type == "qwen3" else {}
    return classes[model_type](**text_keys(tokenizer, num_layers, hidden_size, tie_word_embeddings, **extra))


TINY: dict[str, Callable] = {t: functools.partial(tiny_causal_lm_config, model_type=t)
                             for t in ("llama", "qwen2", "qwen3")}
