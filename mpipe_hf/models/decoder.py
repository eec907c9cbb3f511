"""The decoder part every family shares: a run of HF decoder layers, and the LM head with the summed loss.

A :class:`DecoderStage` mirrors the loop of a Hugging Face text model's ``forward`` (``LlamaModel``,
``Qwen2Model``, ``Qwen2_5_VLTextModel``): causal masks per layer type from the padding mask, rotary embeddings
from the position ids, then the layers. A family supplies the *front* (what turns raw inputs into the first hidden
states and position ids: embedding, image features, M-RoPE ids) and decides which layers go where.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

Tensors = dict[str, torch.Tensor]
CARRIED_KEYS = ("attention_mask", "labels")   # raw keys that travel with the hidden states to the last stage


class LMHead(nn.Module):
    """Final norm, ``lm_head`` and the token loss summed over the micro-batch (the executor divides by the step's
    label-token count). ``hidden`` ``(B, L, H)``, ``labels`` ``(B, L)`` -> ``{"loss": (), "num_tokens": ()}``."""

    def __init__(self, model: nn.Module, norm: nn.Module, vocab_size: int):
        super().__init__()
        self.norm, self.lm_head, self.vocab_size = norm, model.lm_head, vocab_size
        self.__dict__["_loss_function"] = model.loss_function  # reads only the config; not a submodule

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> Tensors:
        logits = self.lm_head(self.norm(hidden))
        loss = self._loss_function(logits=logits, labels=labels, vocab_size=self.vocab_size,
                                   num_items_in_batch=1)  # reduction "sum"
        return {"loss": loss, "num_tokens": (labels[..., 1:] != -100).sum()}


class DecoderStage(nn.Module):
    """Decoder layers with an optional front and an optional head: one pipeline stage, or a text preprocess.

    Inputs: the front's raw keys when ``front`` is set, else ``hidden_states`` ``(B, L, H)`` and
    ``position_ids`` (``(B, L)``-like, or ``(3, B, L)`` for M-RoPE); always ``attention_mask`` ``(B, L)``, and
    ``labels`` ``(B, L)`` on a stage. Outputs: ``{"loss", "num_tokens"}`` with a head, else ``hidden_states``,
    ``position_ids`` and the ``carry`` keys (read from the inputs, or from what the front returned).

    A family that feeds something into the residual stream between layers (Qwen3-VL's DeepStack) overrides
    :meth:`after_layer`.

    Args:
        front: ``front(inputs) -> {"hidden_states": (B, L, H), "position_ids": ..., **extra keys}``, or ``None``.
        layers: the HF decoder layers of this stage, in order.
        layer_ids: their indices in the text model (``after_layer`` reads them).
        layer_types: ``"full_attention"`` or ``"sliding_attention"`` per layer.
        rotary_emb: the text model's rotary embedding module.
        text_config: the text model's config (masks read it).
        head: the :class:`LMHead` on the last stage, else ``None``.
        carry: input keys passed on unchanged to the next stage.
    """

    def __init__(self, front: nn.Module | None, layers: list[nn.Module], layer_ids: list[int],
                 layer_types: list[str], rotary_emb: nn.Module, text_config, head: LMHead | None = None,
                 carry: tuple[str, ...] = CARRIED_KEYS):
        super().__init__()
        self.front, self.layers, self.layer_ids, self.layer_types = front, nn.ModuleList(layers), layer_ids, layer_types
        self.rotary_emb, self.text_config, self.head, self.carry = rotary_emb, text_config, head, carry

    def after_layer(self, layer_id: int, hidden: torch.Tensor, state: Tensors) -> torch.Tensor:
        """What enters the residual stream after decoder layer ``layer_id``; nothing by default."""
        return hidden

    def forward(self, inputs: Tensors) -> Tensors:
        state = {**inputs, **self.front(inputs)} if self.front is not None else inputs
        hidden, position_ids = state["hidden_states"], state["position_ids"]
        if self.layers:
            padding = inputs.get("attention_mask")  # absent: no padding (the loader's host knew; see handlers)
            # with padding HF's skip test would read the mask back to the host once per stage and micro-batch
            mask_kwargs = dict(config=self.text_config, inputs_embeds=hidden, attention_mask=padding, cache=None,
                               position_ids=None, allow_is_causal_skip=padding is None)
            masks = {"full_attention": create_causal_mask(**mask_kwargs)}
            if "sliding_attention" in self.layer_types:
                masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_kwargs)
            position_embeddings = self.rotary_emb(hidden, position_ids)
            layer_positions = position_ids if position_ids.dim() == 2 else None  # M-RoPE ids stay out, as in HF
            for layer_id, layer, layer_type in zip(self.layer_ids, self.layers, self.layer_types):
                hidden = layer(hidden, attention_mask=masks[layer_type], position_embeddings=position_embeddings,
                               position_ids=layer_positions, cache=None, use_cache=False)
                hidden = self.after_layer(layer_id, hidden, state)
        if self.head is not None:
            return self.head(hidden, inputs["labels"])
        carried = {k: state[k] for k in self.carry if k in state}  # an all-ones mask was dropped at load
        return {"hidden_states": hidden, "position_ids": position_ids, **carried}


def matmul_costs(text_config) -> tuple[float, float]:
    """``(decoder layer, LM head)`` cost per token, as the weights each multiplies by (proportional to its FLOPs):
    attention projections plus the gated MLP (``3 * hidden * intermediate``) for a layer, ``hidden * vocab``
    for the head. Attention scores, norms and the loss's softmax are left out; a profile measures them."""
    h = text_config.hidden_size
    heads = text_config.num_attention_heads
    head_dim = getattr(text_config, "head_dim", None) or h // heads
    kv = getattr(text_config, "num_key_value_heads", None) or heads
    layer = 2 * h * heads * head_dim + 2 * h * kv * head_dim + 3 * h * text_config.intermediate_size
    return float(layer), float(h * text_config.vocab_size)


def layer_types(text_config) -> list[str]:
    """Attention type of every decoder layer: ``config.layer_types``; else all sliding-window attention when the
    config sets ``sliding_window`` (and does not turn it off with ``use_sliding_window``), as ``MistralModel``
    does; else all full attention."""
    types = getattr(text_config, "layer_types", None)
    if types:
        return list(types)
    sliding = getattr(text_config, "sliding_window", None) is not None and getattr(
        text_config, "use_sliding_window", True)
    return ["sliding_attention" if sliding else "full_attention"] * text_config.num_hidden_layers


def decoder_stage(text_model: nn.Module, text_config, layer_ids: list[int], front: nn.Module | None = None,
                  head: LMHead | None = None, carry: tuple[str, ...] = CARRIED_KEYS,
                  cls: type[DecoderStage] = DecoderStage) -> DecoderStage:
    """A :class:`DecoderStage` (or subclass ``cls``) over layers ``layer_ids`` of ``text_model`` (an HF text model
    with ``layers`` and ``rotary_emb``)."""
    types = layer_types(text_config)
    return cls(front, [text_model.layers[i] for i in layer_ids], list(layer_ids), [types[i] for i in layer_ids],
               text_model.rotary_emb, text_config, head, carry)
