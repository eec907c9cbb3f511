"""Decoder-only language models (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``) carved into a
transposed text preprocess and pipeline stages.

The preprocess ``P`` is the embedding plus the first ``T = text_layers`` decoder layers (``T >= 1``), frozen or
trainable; with preprocess ``identity`` (``T = 0``) stage 0 embeds the tokens itself and only the token ids move.
The code mirrors ``LlamaModel.forward`` / ``Qwen2Model.forward`` / ``Qwen3Model.forward``: position ids
``arange(L)``, causal masks per layer type from the padding mask, then the layers; the last stage holds the norm,
``lm_head`` and the summed loss. Tied input and output embeddings (``tie_word_embeddings``, as in the small Qwen3
and Llama 3.2 checkpoints) are held as two copies whose gradients the executor sums (:func:`~.base.tied_lm_head`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..runtime import Preprocess
from ..schedule import ScheduleConfig
from .base import SplitModel, assemble, plan_layers, stage_layer_ids, tied_lm_head
from .decoder import CARRIED_KEYS, LMHead, decoder_stage, matmul_costs

RAW_KEYS = ("input_ids", "attention_mask", "labels")


class TokenFront(nn.Module):
    """``input_ids`` ``(B, L)`` -> ``{"hidden_states": (B, L, H), "position_ids": (1, L)}``, as ``LlamaModel``
    without a cache."""

    def __init__(self, embed_tokens: nn.Module):
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ids = inputs["input_ids"]
        return {"hidden_states": self.embed_tokens(ids),
                "position_ids": torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)}


def _validate_micro(raw: dict[str, torch.Tensor]) -> None:
    """Raise ``ValueError`` when a text micro-batch lacks a key or its shapes disagree."""
    missing = [k for k in RAW_KEYS if k not in raw]
    if missing:
        raise ValueError(f"a text micro-batch needs {list(RAW_KEYS)}; missing {missing}")
    shapes = {k: tuple(raw[k].shape) for k in RAW_KEYS}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"input_ids, attention_mask and labels must share one (batch, length) shape, got {shapes}")


def layer_counts(config, cfg: ScheduleConfig, layers_per_stage: list[int] | None = None,
                 text_layers: int = 0) -> list[int]:
    """Decoder layers per stage for ``config``; checks the layout and ``text_layers`` against the model.

    Raises:
        ValueError: as :func:`~.base.plan_layers`; ``text_layers = 0`` with a frozen or trainable preprocess
            (that is preprocess ``identity``).
    """
    if cfg.transposed and text_layers < 1:
        raise ValueError(f"a decoder-only LM transposes the embedding and the first text_layers decoder layers: "
                         f"text_layers must be >= 1 with preprocess {cfg.preprocess!r}, or use preprocess "
                         f"'identity' (T = 0)")
    return plan_layers(config.num_hidden_layers, cfg, layers_per_stage, text_layers, matmul_costs(config))


def split(model: nn.Module, cfg: ScheduleConfig, rank: int, layers_per_stage: list[int] | None = None,
          text_layers: int = 0) -> SplitModel:
    """Carve ``model`` (a ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or ``Qwen3ForCausalLM``) for pipeline rank
    ``rank`` of ``cfg``.

    Args:
        model: the HF causal LM (e.g. from ``from_pretrained``).
        cfg: the schedule configuration; ``cfg.preprocess`` sets whether ``P`` trains.
        rank: this process's pipeline rank.
        layers_per_stage: decoder layers per stage (``R * V`` entries); balanced when ``None``.
        text_layers: ``T``, the decoder layers ``P`` takes from stage 0 (with the embedding).

    Raises:
        ValueError: as :func:`layer_counts`.
    """
    config, inner = model.config, model.model
    counts = layer_counts(config, cfg, layers_per_stage, text_layers)
    p_ids, ids = stage_layer_ids(counts, text_layers)
    layout = [[f"model.layers.{i}" for i in ids[s]] for s in range(cfg.num_stages)]
    layout[-1] += ["model.norm", "lm_head"]
    front = TokenFront(inner.embed_tokens)
    if cfg.transposed:
        p_fqns = ["model.embed_tokens"] + [f"model.layers.{i}" for i in p_ids]
        block = decoder_stage(inner, config, p_ids, front, carry=())
        preprocess, front = Preprocess(block, RAW_KEYS[:2], CARRIED_KEYS), None
    else:
        layout[0].insert(0, "model.embed_tokens")
        p_fqns, preprocess = [], Preprocess(None, (), RAW_KEYS)
    frozen = list(p_fqns) if cfg.preprocess == "frozen" else []
    head = LMHead(model, inner.norm, config.vocab_size)

    def stage(s):
        return decoder_stage(inner, config, ids[s], front if s == 0 else None,
                             head if s == cfg.num_stages - 1 else None)
    tied = tied_lm_head(model, cfg, "model.embed_tokens", frozen)
    return assemble(model, cfg, rank, layout, stage, preprocess, p_fqns, frozen, _validate_micro, tied)
