"""Inkling (``inkling_mm_model``, ``InklingForConditionalGeneration``): what its text model does outside the shared
decoder loop, read from transformers' ``InklingTextModel.forward`` and ``InklingForConditionalGeneration.forward``.

- No rotary embedding: each attention layer adds a relative-position bias that its own ``r_proj`` computes from the
  layer's hidden states (``InklingRelativeLogits``, distances within one sequence), so nothing positional is made
  before the layers and nothing but the hidden states crosses a stage boundary.
- Two attention types, ``hybrid`` (causal, the full mask) and ``hybrid_sliding`` (the sliding-window mask), each
  from transformers' builder for the type they stand for (:func:`inkling_masks`).
- A second mask for every layer: ``conv_mask``, the ``(B, L)`` padding mask (transformers'
  ``create_recurrent_attention_mask``: ``None`` without padding) that the short convolutions on keys, values and the
  two residual branches multiply in; a convolution's state lives within its layer, so it too stays on its stage.
- The head reads ``hidden / logits_mup_width_multiplier``: the logits times its inverse (the head's ``scale``).

The vision tower is a stack of linear layers over each patch ``(N, T, p, p, C)``: one image token a patch. Audio
inputs are refused by name; the audio tower is never run by the split. Inkling 2 (``inkling2``, ``inkling2_loop``)
is refused (:data:`REFUSED`): its layers read a stack of earlier block outputs, or run more than once per token.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.masking_utils import create_recurrent_attention_mask

from ...models.decoder import DecoderStage, layer_type_masks
from ...models.family import Family
from ...models.image_tokens import validate_counted_micro
from ...models.micro_checks import all_checks, refuse_other_modalities

# Inkling's layer type -> the transformers mask type its text model builds for it
MASK_TYPE = {"hybrid": "full_attention", "hybrid_sliding": "sliding_attention"}


def inkling_masks(text_config, hidden: torch.Tensor, padding: torch.Tensor | None,
                  text_positions: torch.Tensor | None, state: dict, types: set[str]) -> dict:
    """``{Inkling layer type: mask}`` (:func:`~mpipe_hf.models.decoder.layer_type_masks`' signature): ``hybrid``
    gets the causal mask and ``hybrid_sliding`` the ``sliding_window``-token mask, as ``InklingTextModel.forward``
    builds them.

    Raises:
        ValueError: a layer type other than the two.
    """
    unknown = sorted(set(types) - set(MASK_TYPE))
    if unknown:
        raise ValueError(f"inkling: layer types {unknown} are not 'hybrid' or 'hybrid_sliding'")
    built = layer_type_masks(text_config, hidden, padding, text_positions, state, {MASK_TYPE[t] for t in types})
    return {t: built[MASK_TYPE[t]] for t in types}


class _NoRotary(nn.Module):
    """The stage's rotary embedding for a model without one: ``None`` for every layer."""

    def forward(self, x, position_ids):
        return None


class InklingStage(DecoderStage):
    """A :class:`~mpipe_hf.models.decoder.DecoderStage` for Inkling's text model: no rotary embedding, every layer
    also given ``conv_mask`` (the padding mask of its short convolutions), and the logits over
    ``logits_mup_width_multiplier``.

    Raises:
        ValueError: a text config whose ``unpadded_vocab_size`` cuts the logits (the head here keeps them all).
    """

    def __init__(self, front, layers, layer_ids, layer_types, rotary_emb, text_config, *args, **kwargs):
        super().__init__(front, layers, layer_ids, layer_types, _NoRotary(), text_config, *args, **kwargs)
        unpadded = text_config.unpadded_vocab_size
        if unpadded is not None and unpadded < text_config.vocab_size:
            raise ValueError(f"inkling: unpadded_vocab_size {unpadded} < vocab_size {text_config.vocab_size} cuts "
                             f"the logits, which the split's head does not")
        if self.head is not None:
            self.head.scale = 1.0 / float(text_config.logits_mup_width_multiplier)

    def run_layers(self, hidden: torch.Tensor, state: dict, padding: torch.Tensor | None) -> torch.Tensor:
        """The layers over ``hidden`` ``(B, L, H)``, with ``conv_mask`` made once from ``padding`` ``(B, L)`` as
        ``InklingTextModel.forward`` makes it (``None`` without padding).

        Raises:
            ValueError: a packed micro-batch (``packed_lengths``): the short convolutions would read the row before,
                and the full layers' log-length scaling each token's place in the packed sequence, not in its row.
        """
        if "packed_lengths" in state:
            raise ValueError("inkling_mm_model cannot run packed micro-batches: its short convolutions would reach "
                             "into the row before and its log-length query scaling counts positions from the packed "
                             "sequence's start; set data.packing: false")
        conv_mask = create_recurrent_attention_mask(self.text_config, hidden, padding)
        return super().run_layers(hidden, {**state, "conv_mask": conv_mask}, padding)

    def layer_kwargs(self, layer_id: int, state) -> dict:
        """Every layer's ``conv_mask``; no ``position_ids`` (the model hands its layers none)."""
        return {"conv_mask": state["conv_mask"], "position_ids": None}


def _inkling_tokens(model: nn.Module):
    """Inkling: one image token a patch of ``pixel_values`` ``(N, T, p, p, C)``."""
    return lambda raw: int(raw["pixel_values"].shape[0])


INKLING = Family(vision=("model.vision_tower",), masks=lambda model: inkling_masks,
                 stage=lambda model: InklingStage, unused=("model.audio_tower",),
                 validate=all_checks(refuse_other_modalities({"audio_input_ids": "audio"}),
                                     validate_counted_micro(_inkling_tokens)))

FAMILIES: dict[str, Family] = {"inkling_mm_model": INKLING}
REFUSED: dict[str, str] = {
    "inkling2": "every layer attends over a growing stack of earlier block outputs (block_states, (B, L, k, H), "
                "read by its block attention residual) and the final input mixes the whole stack: a stage boundary "
                "would carry k + 1 hidden-state streams, not one",
    "inkling2_loop": "a looped block: layers loop_layer_index_start to loop_layer_index_end run loop_num_passes "
                     "times per forward, each pass reading the last: the same layers run more than once per token, "
                     "so no contiguous cut into stages exists",
}
