"""The Qwen-like text models whose ``forward`` does more than the shared decoder loop, each a
:class:`~mpipe_hf.models.decoder.DecoderStage` subclass that does it within the stage:

- LFM3-VL (``lfm3_vl``): an LFM3 text model of short-convolution, sliding and full attention layers.
  ``Lfm3Model.forward`` builds rotary embeddings only for the attention layer types its rotary module knows
  (``rotary_emb.layer_types``) and hands the short-convolution (``conv``) layers ``None`` (:class:`Lfm3Stage`); its
  final norm is ``embedding_norm`` (the family's ``norm``). The ``conv`` layers' mask is transformers' builder for
  that type, and a convolution's state lives within its layer, so no state crosses a stage boundary.
- HyperCLOVAX-Vision v2 (``hyperclovax_vision_v2``): a HyperCLOVAX text model with muP scalings (:class:`MupStage`).
- ERNIE 4.5 VL (``ernie4_5_vl_moe``): modality-isolated MoE layers. Each sparse layer also reads
  ``moe_mm_token_type_ids`` ``(B, L)``: text tokens (0) go to its text experts, image tokens and their start/end
  markers (1) to its vision experts (``Ernie4_5_VLMoeMoeBlock``). The ids are a raw key that travels with the hidden
  states to every stage (a mask input), and :class:`TokenTypeStage` hands them to each of its layers as
  ``Ernie4_5_VLMoeTextModel.forward`` does. The load-balancing loss over every layer's router logits is relayed
  across stages as Qwen3-VL-MoE's (:mod:`mpipe_hf.models.moe`; the block's ``router_logits`` output, recorded by
  transformers, is its index 1).
"""

from __future__ import annotations

import torch
from torch import nn

from ...models.decoder import DecoderStage

MOE_TYPES = "moe_mm_token_type_ids"


class _KnownTypesRotary(nn.Module):
    """``rotary_emb(x, position_ids, layer_type)`` for the types ``rotary`` knows, ``None`` for the others (as
    ``Lfm3Model.forward``'s ``position_embeddings.get(layer_type)``). Holds no parameter or persistent buffer."""

    def __init__(self, rotary: nn.Module):
        super().__init__()
        self.rotary = rotary

    def forward(self, x, position_ids, layer_type):
        if layer_type not in self.rotary.layer_types:
            return None
        return self.rotary(x, position_ids, layer_type=layer_type)


class Lfm3Stage(DecoderStage):
    """A :class:`~mpipe_hf.models.decoder.DecoderStage` whose short-convolution layers get no rotary embedding."""

    def __init__(self, front, layers, layer_ids, layer_types, rotary_emb, *args, **kwargs):
        super().__init__(front, layers, layer_ids, layer_types, _KnownTypesRotary(rotary_emb), *args, **kwargs)
        self.per_type_rotary = True


class MupStage(DecoderStage):
    """A :class:`~mpipe_hf.models.decoder.DecoderStage` for HyperCLOVAX's muP scalings, which
    ``HyperCLOVAXModel.forward`` and the conditional model's head apply outside the decoder layers: the embeddings
    (image features in place) times ``embedding_multiplier`` as they enter the first layer, and the logits times
    ``logits_scaling`` (the head's ``scale``). The residual and attention multipliers are inside the layers."""

    def __init__(self, front, *args, **kwargs):
        super().__init__(front, *args, **kwargs)
        if front is not None:
            front.register_forward_hook(self._scale_embeddings)
        if self.head is not None:
            self.head.scale = float(self.text_config.logits_scaling)

    def _scale_embeddings(self, _module, _inputs, out: dict) -> dict:
        return {**out, "hidden_states": out["hidden_states"] * self.text_config.embedding_multiplier}


class TokenTypeStage(DecoderStage):
    """A :class:`~mpipe_hf.models.decoder.DecoderStage` whose layers each get ``moe_mm_token_type_ids=`` the
    micro's (or, packed, the row's) ids from the stage's state (``None`` when the micro has none: every token is
    text), through a keyword pre-hook on each layer (the layer call itself is the shared loop's)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.__dict__["_types"] = None
        for layer in self.layers:
            layer.register_forward_pre_hook(self._with_types, with_kwargs=True)

    def _with_types(self, _module, args, kwargs):
        return args, {**kwargs, MOE_TYPES: self.__dict__["_types"]}

    def _layers(self, hidden: torch.Tensor, state: dict, padding, lengths, search: bool = True) -> torch.Tensor:
        self.__dict__["_types"] = state.get(MOE_TYPES)
        try:
            return super()._layers(hidden, state, padding, lengths, search)
        finally:
            self.__dict__["_types"] = None
