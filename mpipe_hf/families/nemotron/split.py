"""Nemotron-H Omni (``nemotron_h_omni``): a RADIO vision tower, a pixel-shuffle MLP projector and a Nemotron-H text
model, declared over the generic splitter.

Nemotron-H's layers are each one block (``NemotronHBlock``: a norm, one mixer, the residual), the mixer chosen by
the layer's type (``config.layer_types``): ``linear_attention`` (Mamba-2, a state-space mixer whose convolution and
scan state lives within the layer: no state crosses a stage boundary, and a packed micro runs it row by row as the
other recurrent types), ``full_attention`` (no rotary embedding: ``NemotronHModel.forward`` hands the layers none),
``mlp`` and ``moe`` (these two mix no tokens, so they pack as they are). What ``NemotronHModel.forward`` computes
around the layers, read from transformers' own code and done here the same way: the causal mask for the attention
layers and the recurrent (padding) mask for the Mamba layers, from transformers' builders for those two types, and
no mask for the MLP and MoE layers (:func:`nemotron_masks`); no rotary embedding (:class:`NoRotaryStage`); the final
norm ``norm_f``, the embedding ``embeddings``. Its MoE adds no load-balancing loss (the conditional model's loss is
the token loss alone). The released checkpoints' audio tower and projector are never run by the split: frozen and
kept with stage 0 (``unused``; a config without ``audio_config`` has neither).

The image path is the model's own ``get_image_features`` (``pixel_values`` ``(patches, 3 * patch ** 2)`` and
``image_grid_hw`` ``(images, 2)``): each image gives ``h * w * downsample_ratio ** 2`` tokens. Video and audio
inputs are refused by name (their paths are not split).
"""

from __future__ import annotations

import torch
from torch import nn

from ...models.decoder import DecoderStage, layer_type_masks
from ...models.family import Family
from ...models.image_tokens import validate_counted_micro
from ...models.micro_checks import all_checks, refuse_other_modalities

ATTENTION_TYPES = frozenset({"full_attention", "linear_attention"})  # the types NemotronHModel builds masks for


def nemotron_masks(model: nn.Module):
    """``Family.masks``: ``{type: mask}`` as ``NemotronHModel.forward``'s ``causal_mask_mapping``: transformers'
    builder for ``full_attention`` (causal) and ``linear_attention`` (the recurrent padding mask), ``None`` for the
    ``mlp`` and ``moe`` layers, which take no mask."""
    def masks(text_config, hidden, padding, text_positions, state, types) -> dict:
        built = layer_type_masks(text_config, hidden, padding, text_positions, state, set(types) & ATTENTION_TYPES)
        return {t: built.get(t) for t in types}
    return masks


class _NoRotary(nn.Module):
    """Nemotron-H's stand-in rotary embedding: none for every layer (its attention is position-free; the causal
    mask alone orders the tokens). Holds no parameter or buffer."""

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> None:
        return None


class NoRotaryStage(DecoderStage):
    """A :class:`~mpipe_hf.models.decoder.DecoderStage` whose layers get no rotary embedding
    (``position_embeddings`` ``None``, which ``NemotronHBlock`` passes on unread)."""

    def __init__(self, front, layers, layer_ids, layer_types, rotary_emb, *args, **kwargs):
        super().__init__(front, layers, layer_ids, layer_types, _NoRotary(), *args, **kwargs)


def _omni_tokens(model: nn.Module):
    """Nemotron-H Omni: each image's patch grid (``image_grid_hw``) times ``downsample_ratio ** 2`` (the pixel
    shuffle), as ``get_image_features`` splits its output."""
    shrink = round(1 / model.config.downsample_ratio) ** 2
    return lambda raw: int((raw["image_grid_hw"].prod(-1) // shrink).sum())


NEMOTRON_H_OMNI = Family(text="language_model.model", head="language_model.lm_head", embed="embeddings",
                         norm="norm_f", vision=("vision_model", "multi_modal_projector"),
                         image_inputs=("pixel_values", "image_grid_hw"), masks=nemotron_masks,
                         stage=lambda model: NoRotaryStage, unused=("audio_tower", "embed_audio"),
                         validate=all_checks(refuse_other_modalities({"pixel_values_videos": "video",
                                                                      "input_features": "audio"}),
                                             validate_counted_micro(_omni_tokens)))

FAMILIES: dict[str, Family] = {"nemotron_h_omni": NEMOTRON_H_OMNI}
REFUSED: dict[str, str] = {}
