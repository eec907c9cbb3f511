"""The image path of the Qwen Omni thinkers (``qwen2_5_omni_thinker``, ``qwen3_omni_moe_thinker``; issue 38's
qwen_like group).

A thinker (``Qwen2_5OmniThinkerForConditionalGeneration``, ``Qwen3OmniMoeThinkerForConditionalGeneration``) is a
Qwen-VL model with an audio tower beside the vision tower: ``model.visual``, ``model.audio_tower``,
``model.language_model`` and a top-level ``lm_head``. Its image path is split as Qwen2.5-VL's (Qwen3-Omni's as
Qwen3-VL-MoE's: DeepStack and the MoE load-balancing loss relayed); the audio tower never runs (an ``unused``
part, frozen and kept with stage 0), and micro-batches with audio or video inputs are refused by name at load
(:func:`refuse_audio_video`). The thinker's ``get_rope_index`` differs from Qwen-VL's: positional arguments, no
``mm_token_type_ids``, and positions from the padding mask even without an image (``cumsum - 1``, padding at 1),
which :func:`omni_host_inputs` computes on the host as the thinker's ``forward`` does.
"""

from __future__ import annotations

import torch

from .families import _qwen_tokens, validate_counted_micro
from .family import Family
from .packed import gather_rows, is_packed, row_positions, unpad_rows
from .tiny import mrope_keys, qwen_special_ids, text_keys

AUDIO_VIDEO_KEYS = ("input_features", "feature_attention_mask", "audio_feature_lengths", "pixel_values_videos",
                    "video_grid_thw", "video_second_per_grid", "use_audio_in_video")


def refuse_audio_video(model):
    """``family.validate``: :func:`~.families.validate_counted_micro`'s image-token count check, after refusing a
    micro-batch with audio or video inputs.

    Raises:
        ValueError: the micro-batch has one of :data:`AUDIO_VIDEO_KEYS` (the message names it), or its image-token
            count differs from its images'.
    """
    count = validate_counted_micro(_qwen_tokens)(model)

    def validate_micro(raw) -> None:
        found = [key for key in AUDIO_VIDEO_KEYS if key in raw]
        if found:
            kind = "audio" if any("feature" in key or "audio" in key for key in found) else "video"
            raise ValueError(f"{model.config.model_type}: {kind} inputs ({', '.join(found)}) are not supported: "
                             f"only the thinker's image path is split (its audio tower and video inputs are not)")
        count(raw)
    return validate_micro


def omni_host_inputs(model, deepstack: bool = False):
    """``host(raw) -> {"position_ids": ...}`` for a thinker: ``get_rope_index(input_ids, image_grid_thw, None,
    attention_mask)`` ``(3, B, L)``, as the thinker's ``forward`` calls it (with an all-ones mask where the loader
    dropped one); a packed micro's ``(4, 1, N)``: its rows' own, unpacked to a padded batch with its mask, after
    the text-position row. ``deepstack``: also ``visual_pos_index``, the image tokens' flat positions ``(n,)``
    (:mod:`.deepstack`)."""
    rope_index, image_token_id = model.model.get_rope_index, model.config.image_token_id

    def positions(raw):
        ids, grid, mask = raw["input_ids"], raw.get("image_grid_thw"), raw.get("attention_mask")
        if is_packed(raw):
            lengths = raw["packed_lengths"].tolist()
            rows, row_mask = unpad_rows(ids, lengths)
            found, _ = rope_index(rows, grid, None, row_mask)
            return torch.cat([row_positions(lengths).unsqueeze(0), gather_rows(found, row_mask)])
        if mask is None:  # no padding: the loader dropped the all-ones mask the model was given
            mask = torch.ones_like(ids)
        return rope_index(ids, grid, None, mask)[0]

    def host(raw):
        out = {"position_ids": positions(raw)}
        if deepstack:
            out["visual_pos_index"] = (raw["input_ids"] == image_token_id).flatten().nonzero().squeeze(1)
        return out
    return host


THINKER = dict(vision=("model.visual",), image_inputs=("pixel_values", "image_grid_thw"),
               stage0_inputs=("position_ids",), positions="host", unused=("model.audio_tower",),
               validate=refuse_audio_video)
QWEN2_5_OMNI = Family(host=omni_host_inputs, **THINKER)
QWEN3_OMNI = Family(host=lambda model: omni_host_inputs(model, deepstack=True), deepstack=True,
                    stage0_inputs=("position_ids", "visual_pos_index"),
                    **{k: v for k, v in THINKER.items() if k != "stage0_inputs"})

AUDIO = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
             n_window=50)


def _thinker_ids(tokenizer) -> dict:
    """The thinker's marker ids on the Qwen2 tokens in the same slots of the Qwen2 vocabulary (Omni's
    ``<|AUDIO|>``, ``<|audio_bos|>``, ``<|audio_eos|>`` are Qwen2's ``<|object_ref_start|>``,
    ``<|object_ref_end|>``, ``<|box_start|>``)."""
    ids, specials = tokenizer.convert_tokens_to_ids, qwen_special_ids(tokenizer)
    return dict(image_token_id=specials["image_token_id"], video_token_id=specials["video_token_id"],
                audio_token_id=ids("<|object_ref_start|>"), audio_start_token_id=ids("<|object_ref_end|>"),
                audio_end_token_id=ids("<|box_start|>"), vision_start_token_id=specials["vision_start_token_id"],
                vision_end_token_id=specials["vision_end_token_id"])


def tiny_qwen2_5_omni_thinker_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Qwen2_5OmniThinkerConfig``: a 2-layer Qwen2.5-VL tower (width 32, 14-px patches, windowed attention
    but in the last block), a 2-layer Whisper-style audio tower of width 32 (present, never run), and a Qwen2.5
    text model with M-RoPE sections ``[4, 2, 2]``."""
    from transformers import Qwen2_5OmniThinkerConfig
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14, temporal_patch_size=2,
                  spatial_merge_size=2, window_size=56, out_hidden_size=hidden_size, fullatt_block_indexes=[1])
    text = text_keys(tokenizer, num_layers, hidden_size, rope_parameters=mrope_keys(hidden_size))
    ids = _thinker_ids(tokenizer)
    return Qwen2_5OmniThinkerConfig(
        text_config=text, vision_config=vision, audio_config=dict(AUDIO, output_dim=hidden_size),
        image_token_index=ids.pop("image_token_id"), video_token_index=ids.pop("video_token_id"),
        audio_token_index=ids.pop("audio_token_id"), tie_word_embeddings=False, **ids)


def tiny_qwen3_omni_moe_thinker_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Qwen3OmniMoeThinkerConfig``: a 2-layer Qwen3-VL tower (width 32, 16-px patches, an 8 x 8 position grid,
    DeepStack features from both blocks), a 2-layer audio tower (never run), and a Qwen3 MoE text model (4
    experts, 2 active, interleaved M-RoPE, the load-balancing loss on and weighted 0.01)."""
    from transformers import Qwen3OmniMoeThinkerConfig
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, temporal_patch_size=2,
                  spatial_merge_size=2, out_hidden_size=hidden_size, num_position_embeddings=64,
                  deepstack_visual_indexes=[0, 1])
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // 4,
                 rope_parameters={**mrope_keys(hidden_size), "mrope_interleaved": True}, moe_intermediate_size=hidden_size,
                 num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                 output_router_logits=True, router_aux_loss_coef=0.01)
    audio = dict(AUDIO, output_dim=hidden_size, downsample_hidden_size=32, conv_chunksize=50)
    return Qwen3OmniMoeThinkerConfig(text_config=text, vision_config=vision, audio_config=audio,
                                     tie_word_embeddings=False, **_thinker_ids(tokenizer))
