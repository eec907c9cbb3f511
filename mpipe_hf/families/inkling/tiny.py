"""The scaled-down real config of Inkling, for the tests."""

from __future__ import annotations

from ...models.tiny import text_keys


def tiny_inkling_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """An ``InklingConfig`` (as thinkingmachines/Inkling, scaled down): a 4-layer patch tower over 4-px patches of
    2 frames (one token a patch); a text model of ``num_layers`` alternating sliding (16 tokens, also the bias's
    reach) and full layers, 4 heads of 16 (2 key-value heads), a relative-position bias of width 4 reaching 32 tokens
    back on the full layers with the log-length query scaling from 8 tokens, short convolutions of 4 taps, the first
    MLP dense and the others 4 routed experts (2 active) with one shared expert; the head reads the hidden states over
    ``logits_mup_width_multiplier`` 4; untied embeddings, as the real model. Images are ``<|image_pad|>`` x patches;
    its audio tower is never run."""
    from transformers import InklingConfig
    types = ["hybrid_sliding" if i % 2 == 0 else "hybrid" for i in range(num_layers)]
    types[-1] = "hybrid"
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // 4, swa_num_attention_heads=4,
                     swa_num_key_value_heads=2, swa_head_dim=hidden_size // 4, sliding_window_size=16, d_rel=4,
                     rel_extent=32, log_scaling_n_floor=8, layer_types=types, conv_kernel_size=4,
                     mlp_layer_types=["dense"] + ["sparse"] * (num_layers - 1), moe_intermediate_size=hidden_size // 2,
                     n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, route_scale=1.0,
                     logits_mup_width_multiplier=4.0)
    ids = tokenizer.convert_tokens_to_ids
    vision = dict(patch_size=4, temporal_patch_size=2, num_hidden_layers=4, hidden_size=32)
    return InklingConfig(text_config=text, vision_config=vision, audio_config=dict(n_mel_bins=4, mel_vocab_size=8),
                         tie_word_embeddings=False, image_token_id=ids("<|image_pad|>"),
                         audio_token_id=ids("<|quad_start|>"), image_bos_token_id=ids("<|vision_start|>"),
                         audio_bos_token_id=ids("<|quad_end|>"))


TINY = {"inkling_mm_model": tiny_inkling_config}
