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

from .decoder import DecoderStage, layer_type_masks
from .families import validate_counted_micro
from .family import Family
from .gemma4_new import refuse_other_modalities
from .tiny import token_id

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
    """A :class:`~.decoder.DecoderStage` whose layers get no rotary embedding (``position_embeddings`` ``None``,
    which ``NemotronHBlock`` passes on unread)."""

    def __init__(self, front, layers, layer_ids, layer_types, rotary_emb, *args, **kwargs):
        super().__init__(front, layers, layer_ids, layer_types, _NoRotary(), *args, **kwargs)


def _omni_tokens(model: nn.Module):
    """Nemotron-H Omni: each image's patch grid (``image_grid_hw``) times ``downsample_ratio ** 2`` (the pixel
    shuffle), as ``get_image_features`` splits its output."""
    shrink = round(1 / model.config.downsample_ratio) ** 2
    return lambda raw: int((raw["image_grid_hw"].prod(-1) // shrink).sum())


def _refuse_then_count(model: nn.Module):
    """Video and audio refused by name, then the image-token count (``Family.validate``)."""
    refuse = refuse_other_modalities({"pixel_values_videos": "video", "input_features": "audio"})(model)
    count = validate_counted_micro(_omni_tokens)(model)

    def validate_micro(raw) -> None:
        refuse(raw)
        count(raw)
    return validate_micro


NEMOTRON_H_OMNI = Family(text="language_model.model", head="language_model.lm_head", embed="embeddings",
                         norm="norm_f", vision=("vision_model", "multi_modal_projector"),
                         image_inputs=("pixel_values", "image_grid_hw"), masks=nemotron_masks,
                         stage=lambda model: NoRotaryStage, unused=("audio_tower", "embed_audio"),
                         validate=_refuse_then_count)

# one of each block type, in the order of the real pattern's runs (Mamba-2 and MoE alternate, attention between)
PATTERN = ("linear_attention", "moe", "linear_attention", "full_attention", "mlp", "moe")


def tiny_nemotron_h_omni_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``NemotronH_Omni_Reasoning_V3_Config`` (Nemotron 3 Nano Omni, scaled down, no audio tower): a 2-layer
    RADIO tower of width 32 in 16-px patches (3 class tokens, 2 registers), a 2 x 2 pixel shuffle into the
    projector, and a Nemotron-H text model of ``num_layers`` blocks in :data:`PATTERN`'s repeating order: Mamba-2
    (4 heads of 16, state 16 in 2 groups, 4-token convolution, 8-token scan chunks, so a row spans several; time
    steps drawn from [0.1, 1] rather than [0.001, 0.1]: with steps near 0.001 the decay is 1 to within 1e-4 and
    ``A_log``'s gradient fell to 1e-9 of the largest, under fp32's noise in it, so the check could not see it),
    attention (4 heads of 16, 2 key-value heads), a ReLU^2 MLP, and MoE (4 routed experts of width 32, 2 active, a
    shared expert); untied embeddings, as the real model."""
    from transformers import NemotronH_Omni_Reasoning_V3_Config
    types = [PATTERN[i % len(PATTERN)] for i in range(num_layers)]
    text = dict(model_type="nemotron_h", vocab_size=len(tokenizer), hidden_size=hidden_size, layers_block_type=types,
                num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
                intermediate_size=2 * hidden_size, mamba_num_heads=4, mamba_head_dim=hidden_size // 4,
                ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=8, time_step_min=0.1, time_step_max=1.0,
                n_routed_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=hidden_size // 2,
                moe_shared_expert_intermediate_size=hidden_size // 2, tie_word_embeddings=False,
                pad_token_id=tokenizer.pad_token_id, bos_token_id=None, eos_token_id=tokenizer.eos_token_id)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2.0, patch_size=16,
                  image_size=64, max_img_size=256, num_cls_tokens=3, num_registers=2, video_temporal_patch_size=2)
    return NemotronH_Omni_Reasoning_V3_Config(
        text_config=text, vision_config=vision, vision_hidden_size=32, projector_hidden_size=hidden_size,
        downsample_ratio=0.5, image_token_id=token_id(tokenizer, "<|image_pad|>"),
        video_token_id=token_id(tokenizer, "<|video_pad|>"), tie_word_embeddings=False)
