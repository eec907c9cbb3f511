"""Gemma 4 across pipeline stages: per-layer inputs and shared key/value states.

Two things in ``Gemma4TextModel.forward`` reach past one decoder layer, and both cross stage boundaries here:

- *Per-layer inputs* (PLE): before the layers, the model looks up ``embed_tokens_per_layer`` at the token ids
  (with every image, video and audio placeholder read as the pad token), projects the merged input embeddings by
  ``per_layer_model_projection`` and normalises them (``per_layer_projection_norm``), and hands layer ``i`` the
  slice ``[:, :, i]`` of the result ``(B, L, layers, hidden_size_per_layer_input)``. The projection reads the input
  embeddings (image features included), which no later stage holds, so the stage with the front computes the tensor
  once (:class:`PerLayerFront`, with the three modules, which go wherever ``embed_tokens`` goes) and it travels
  with the hidden states to every stage (``per_layer_inputs``); its gradient flows back the same way.
- *Shared key/value states*: the last ``num_kv_shared_layers`` layers compute no keys or values of their own; they
  read those of the last earlier layer of their attention type (``kv_sharing_modes``: that layer ``"store"``s
  them in a ``KVSharingDict``, the consumers ``"reuse"`` them). Training without a cache does the same (the dict
  is made afresh for every forward), so wherever a stage boundary falls between a producer and its consumers the
  stored keys and values ``(B, kv_heads, L, head_dim)`` travel with the hidden states (``shared_kv.<type>.key``
  / ``.value``), and the consumers' gradient reaches the producer through them.

A packed micro-batch (several rows in one sequence) is refused: both tensors would have to be cut per row.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import KVSharingDict

from ...models.decoder import CARRIED_KEYS, DecoderStage, layer_type_masks
from ...models.sequence_split import SPLIT_KEY, local_if_whole

Tensors = dict[str, torch.Tensor]
PER_LAYER_KEY = "per_layer_inputs"
KV_PREFIX = "shared_kv."
PER_LAYER_PARTS = ("embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm")


def kv_keys(text_config) -> tuple[str, ...]:
    """The carried keys of the shared key/value states, two per attention type that shares them."""
    if not getattr(text_config, "num_kv_shared_layers", 0):
        return ()
    return tuple(f"{KV_PREFIX}{t}.{part}" for t in sorted(set(text_config.layer_types)) for part in ("key", "value"))


class PerLayerFront(nn.Module):
    """Stage 0's front (or ``P``'s), then Gemma 4's per-layer inputs from its output, as ``Gemma4Model.forward``
    and ``Gemma4TextModel.get_per_layer_inputs`` / ``project_per_layer_inputs`` compute them.

    Inputs: the front's (``input_ids`` ``(B, L)``, ...). Output: the front's, and ``per_layer_inputs``
    ``(B, L, layers, D)`` with ``D = hidden_size_per_layer_input``: ``(norm(proj(h) / sqrt(H)) + embed(ids')) /
    sqrt(2)``, ``h`` the input embeddings with image features, ``ids'`` the ids with every multimodal placeholder
    read as ``pad_token_id``.

    Args:
        front: the :class:`~mpipe_hf.models.image_features.ImageFront`; text_model: ``Gemma4TextModel`` (its three PLE modules are held
            here, so that they are this stage's parameters); config: the ``Gemma4Config`` (placeholder ids).
    """

    def __init__(self, front: nn.Module, text_model: nn.Module, config):
        super().__init__()
        text = config.get_text_config()
        self.front = front
        self.embed_tokens_per_layer = text_model.embed_tokens_per_layer
        self.per_layer_model_projection = text_model.per_layer_model_projection
        self.per_layer_projection_norm = text_model.per_layer_projection_norm
        self.shape = (text.num_hidden_layers, text.hidden_size_per_layer_input)
        self.projection_scale, self.input_scale = text_model.per_layer_model_projection_scale, \
            text_model.per_layer_input_scale
        self.pad_token_id = text.pad_token_id
        ids = [getattr(config, k, None) for k in ("image_token_id", "video_token_id", "audio_token_id")]
        self.placeholders = [int(i) for i in ids if i is not None]

    def forward(self, inputs: Tensors) -> Tensors:
        out = self.front(inputs)
        ids, hidden = inputs["input_ids"], out["hidden_states"]
        placeholder = torch.zeros_like(ids, dtype=torch.bool)
        for token_id in self.placeholders:
            placeholder |= ids == token_id
        token_part = self.embed_tokens_per_layer(torch.where(placeholder, self.pad_token_id, ids))
        token_part = token_part.reshape(*ids.shape, *self.shape)
        projected = self.per_layer_model_projection(hidden) * self.projection_scale
        projected = self.per_layer_projection_norm(projected.reshape(*hidden.shape[:-1], *self.shape))
        return {**out, PER_LAYER_KEY: (projected + token_part) * self.input_scale}


def cut_layer_inputs(state: Tensors, split, keys: tuple[str, ...]) -> None:
    """Under context parallelism (:mod:`mpipe_hf.models.sequence_split`), this rank's slice, in ``state``, of the
    per-layer inputs ``(B, L, layers, D)`` and of the shared key/value states ``(B, kv_heads, L, head_dim)`` under
    ``keys`` where they hold the whole sequence; slices handed on by the previous stage stay as they are. Both are
    per token, so a slice is what the one-process model computes for these tokens: each layer's attention gets its
    keys and values of this rank's tokens, which the Ulysses all-to-all gathers, stored or reused alike."""
    if state.get(PER_LAYER_KEY) is not None:
        state[PER_LAYER_KEY] = local_if_whole(state[PER_LAYER_KEY], split, 1)
    for key in keys:
        if key in state:
            state[key] = local_if_whole(state[key], split, 2)


class SharedKVStage(DecoderStage):
    """A :class:`~mpipe_hf.models.decoder.DecoderStage` of Gemma 4 layers (module docstring): each layer gets its slice of
    ``per_layer_inputs`` and the stage's ``KVSharingDict`` (seeded from the carried ``shared_kv.*`` keys); what
    the stage's producers stored leaves with the hidden states. ``text_model``: the ``Gemma4TextModel``;
    ``config``: the model's config; the other arguments are :class:`~mpipe_hf.models.decoder.DecoderStage`'s.

    Under context parallelism both per-token inputs are cut with the sequence (:func:`cut_layer_inputs`).

    Raises:
        ValueError: a packed micro-batch (at forward).
    """

    hooks_cut_sequence = True  # layer_kwargs reads inputs cut with the sequence (sequence_split.CUTS_WITH_SEQUENCE)

    def __init__(self, front, layers, layer_ids, layer_types, rotary_emb, text_config, head=None,
                 carry=CARRIED_KEYS, masks=layer_type_masks, router=None, *, text_model=None, config=None):
        if front is not None and getattr(text_config, "hidden_size_per_layer_input", None):
            front = self.wrap_front(front, text_model, config)
        self.kv_keys = kv_keys(text_config)
        carry = tuple(dict.fromkeys(carry + (PER_LAYER_KEY,) + self.kv_keys))
        super().__init__(front, layers, layer_ids, layer_types, rotary_emb, text_config, head, carry, masks, router)

    def wrap_front(self, front: nn.Module, text_model: nn.Module, config) -> nn.Module:
        """The front that adds the per-layer inputs (Gemma 4's :class:`PerLayerFront`; a model that computes them
        otherwise overrides this)."""
        return PerLayerFront(front, text_model, config)

    def layer_kwargs(self, layer_id: int, state: Tensors) -> dict:
        per_layer = state.get(PER_LAYER_KEY)
        return {"per_layer_input": per_layer[:, :, layer_id] if per_layer is not None else None,
                "shared_kv_states": state["shared_kv_states"]}

    def run_layers(self, hidden: torch.Tensor, state: Tensors, padding: torch.Tensor | None) -> torch.Tensor:
        if "packed_lengths" in state:
            raise ValueError(f"{self.text_config.model_type} cannot run packed micro-batches: its per-layer inputs "
                             "and shared key/value states would have to be cut per row; set data.packing: false")
        split = state.get(SPLIT_KEY)
        if split is not None:  # what arrives whole (from a front or P) is cut to this rank's tokens, as hidden is
            cut_layer_inputs(state, split, self.kv_keys)
        shared = KVSharingDict()
        for key in self.kv_keys[::2]:
            if key in state:
                shared[key[len(KV_PREFIX):-len(".key")]] = (state[key], state[key[:-len("key")] + "value"])
        state["shared_kv_states"] = shared
        hidden = super().run_layers(hidden, state, padding)
        for layer_type, (key, value) in shared.items():
            state[f"{KV_PREFIX}{layer_type}.key"], state[f"{KV_PREFIX}{layer_type}.value"] = key, value
        return hidden

    def forward(self, inputs: Tensors) -> Tensors:
        return super().forward(dict(inputs))  # run_layers writes into the state: never the caller's dict


def shared_kv_stage(model: nn.Module):
    """``Family.stage`` of Gemma 4: :class:`SharedKVStage` bound to ``model``'s text model and config."""
    text_model, config = model.model.language_model, model.config

    def build(*args, **kwargs) -> SharedKVStage:
        return SharedKVStage(*args, **kwargs, text_model=text_model, config=config)
    return build
