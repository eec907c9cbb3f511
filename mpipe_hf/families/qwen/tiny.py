"""Scaled-down real configs of the Qwen group (the same config classes as the hub checkpoints): the real
vocabulary and special-token ids of the tokenizer, 4 heads of ``hidden_size / 4``, M-RoPE sections summing to
half a head, 2-block towers of width 32 and untied embeddings."""

from __future__ import annotations

import functools
from typing import Callable

from ...models.tiny import HEADS, moe_keys, mrope_keys, qwen_special_ids, qwen_vision_keys, text_keys


def tiny_qwen2_5_vl_config(tokenizer, num_layers: int = 8, vision_depth: int = 4, hidden_size: int = 64):
    """A ``Qwen2_5_VLConfig`` with the real vocabulary and special-token ids of ``tokenizer``, 4 heads of 16,
    ``mrope_section`` summing to ``head_dim / 2``, windowed vision attention, and untied embeddings."""
    from transformers import Qwen2_5_VLConfig
    return Qwen2_5_VLConfig(
        text_config=text_keys(tokenizer, num_layers, hidden_size, rope_parameters=mrope_keys(hidden_size)),
        vision_config=dict(depth=vision_depth, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                           temporal_patch_size=2, spatial_merge_size=2, window_size=112,
                           out_hidden_size=hidden_size, fullatt_block_indexes=[vision_depth - 1]),
        tie_word_embeddings=False, **qwen_special_ids(tokenizer))


def tiny_qwen2_vl_config(tokenizer, num_layers: int = 8, vision_depth: int = 2, hidden_size: int = 64):
    """A ``Qwen2VLConfig``: as :func:`tiny_qwen2_5_vl_config`, with Qwen2-VL's vision tower (``embed_dim`` 32,
    LayerNorm blocks, no windows)."""
    from transformers import Qwen2VLConfig
    return Qwen2VLConfig(
        text_config=text_keys(tokenizer, num_layers, hidden_size, rope_parameters=mrope_keys(hidden_size)),
        vision_config=dict(depth=vision_depth, embed_dim=32, hidden_size=hidden_size, mlp_ratio=2, num_heads=2,
                           patch_size=14, temporal_patch_size=2, spatial_merge_size=2),
        tie_word_embeddings=False, **qwen_special_ids(tokenizer))


def tiny_qwen3_vl_config(tokenizer, num_layers: int = 8, vision_depth: int = 3, hidden_size: int = 64,
                         deepstack_visual_indexes: tuple[int, ...] = (0, 1, 2)):
    """A ``Qwen3VLConfig``: 16-px patches, a learned 8 x 8 position grid, interleaved M-RoPE, and DeepStack
    features from vision blocks ``deepstack_visual_indexes`` (added after decoder layers ``0 .. K-1``)."""
    from transformers import Qwen3VLConfig
    rope = {**mrope_keys(hidden_size), "mrope_interleaved": True}
    return Qwen3VLConfig(
        text_config=text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // HEADS, rope_parameters=rope),
        vision_config=dict(depth=vision_depth, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=hidden_size,
                           num_position_embeddings=64, deepstack_visual_indexes=list(deepstack_visual_indexes)),
        tie_word_embeddings=False, **qwen_special_ids(tokenizer))


def tiny_qwen3_5_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, moe: bool = False):
    """A ``Qwen3_5Config`` (``moe``: ``Qwen3_5MoeConfig``): hybrid Gated DeltaNet / full attention layers (three
    ``linear_attention`` to one ``full_attention``, as the real checkpoints), gated full attention with a partial
    rotary of half the 32-wide head, interleaved M-RoPE, a Qwen3-style tower; ``moe``: 4 experts, 2 active per
    token, a shared expert, the router's load-balancing loss weighted 0.01."""
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig
    head_dim = 2 * hidden_size // HEADS
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "mrope_section": [head_dim // 8, head_dim // 16, head_dim // 16], "mrope_interleaved": True}
    types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(num_layers)]
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=head_dim, rope_parameters=rope, layer_types=types,
                     linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                     linear_num_key_heads=2, linear_num_value_heads=4)
    if moe:
        text.update(moe_keys(hidden_size=hidden_size), shared_expert_intermediate_size=hidden_size)
        text.pop("intermediate_size")
    cls = Qwen3_5MoeConfig if moe else Qwen3_5Config
    return cls(text_config=text, vision_config=qwen_vision_keys(hidden_size), tie_word_embeddings=False,
               **qwen_special_ids(tokenizer))


def tiny_qwen3_vl_moe_config(tokenizer, num_layers: int = 8, hidden_size: int = 64,
                             deepstack_visual_indexes: tuple[int, ...] = (0, 1)):
    """A ``Qwen3VLMoeConfig``: :func:`tiny_qwen3_vl_config`'s shape with sparse MoE blocks (4 experts, 2 active,
    ``decoder_sparse_step`` 1), DeepStack features from 2 vision blocks, the load-balancing loss weighted 0.01."""
    from transformers import Qwen3VLMoeConfig
    rope = {**mrope_keys(hidden_size), "mrope_interleaved": True}
    moe = moe_keys(hidden_size=hidden_size)
    moe["num_local_experts"] = moe.pop("num_experts")
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // HEADS, rope_parameters=rope,
                     decoder_sparse_step=1, mlp_only_layers=[], **moe)
    return Qwen3VLMoeConfig(text_config=text, tie_word_embeddings=False, **qwen_special_ids(tokenizer),
                            vision_config=qwen_vision_keys(hidden_size, depth=2,
                                                           deepstack_visual_indexes=list(deepstack_visual_indexes)))


AUDIO = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
             n_window=50)


def thinker_ids(tokenizer) -> dict:
    """An Omni thinker's marker ids on the Qwen2 tokens in the same slots of the Qwen2 vocabulary (Omni's
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
    ids = thinker_ids(tokenizer)
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
                     rope_parameters={**mrope_keys(hidden_size), "mrope_interleaved": True},
                     moe_intermediate_size=hidden_size, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                     mlp_only_layers=[], output_router_logits=True, router_aux_loss_coef=0.01)
    audio = dict(AUDIO, output_dim=hidden_size, downsample_hidden_size=32, conv_chunksize=50)
    return Qwen3OmniMoeThinkerConfig(text_config=text, vision_config=vision, audio_config=audio,
                                     tie_word_embeddings=False, **thinker_ids(tokenizer))


TINY: dict[str, Callable] = {
    "qwen2_vl": tiny_qwen2_vl_config, "qwen2_5_vl": tiny_qwen2_5_vl_config, "qwen3_vl": tiny_qwen3_vl_config,
    "qwen3_vl_moe": tiny_qwen3_vl_moe_config, "qwen3_5": tiny_qwen3_5_config,
    "qwen3_5_moe": functools.partial(tiny_qwen3_5_config, moe=True),
    "qwen2_5_omni_thinker": tiny_qwen2_5_omni_thinker_config,
    "qwen3_omni_moe_thinker": tiny_qwen3_omni_moe_thinker_config,
}
