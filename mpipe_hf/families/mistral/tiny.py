"""Scaled-down real configs of the Mistral group, for the tests: the Qwen2 tokenizer's real vocabulary
(``len(tokenizer)``), images ``<|image_pad|>`` rows split by ``<|vision_pad|>`` (Pixtral's ``[IMG_BREAK]``) and
closed by ``<|vision_end|>`` (``[IMG_END]``); a 2-layer Pixtral tower of width 32 in 8-px patches (images up to
64 px, any aspect ratio) and the 2 x 2 patch merger; text models of ``num_layers`` layers of ``hidden_size`` with
4 heads and 2 key-value heads; untied embeddings."""

from __future__ import annotations

from transformers import LightOnOcrConfig, Mistral3Config

from ...models.tiny import HEADS, VISION, lm_keys, text_keys, token_id

PIXTRAL = dict(model_type="pixtral", image_size=64, patch_size=8, head_dim=16, **VISION)


def tiny_mistral3_config(tokenizer, num_layers: int = 8, hidden_size: int = 64) -> Mistral3Config:
    """A ``Mistral3Config``: the Pixtral tower, the 2 x 2 patch merger, and a Mistral text model."""
    text = lm_keys(tokenizer, "mistral", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    return Mistral3Config(vision_config=dict(PIXTRAL), text_config=text,
                          image_token_index=token_id(tokenizer, "<|image_pad|>"), spatial_merge_size=2,
                          vision_feature_layer=-1, tie_word_embeddings=False)


def tiny_lighton_ocr_config(tokenizer, num_layers: int = 8, hidden_size: int = 64) -> LightOnOcrConfig:
    """A ``LightOnOcrConfig``: the Pixtral tower, the 2 x 2 patch merger, and a Qwen3 text model."""
    text = lm_keys(tokenizer, "qwen3", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    return LightOnOcrConfig(vision_config=dict(PIXTRAL), text_config=text,
                            image_token_id=token_id(tokenizer, "<|image_pad|>"), spatial_merge_size=2,
                            tie_word_embeddings=False)


def tiny_mistral4_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Mistral4Config`` (Mistral Small 4, scaled down): multi-head latent attention (query rank 32, key-value
    rank 16, 8 rotary + 8 plain query/key dims, 16-wide values, 4 heads), the first layer dense, then 4 routed
    experts of width 32 (2 active) and one shared; YaRN rotary (factor 4 over 1,024 positions), untied
    embeddings."""
    from transformers import Mistral4Config
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": 0.1, "partial_rotary_factor": 0.5}
    text = text_keys(tokenizer, num_layers, hidden_size, moe_intermediate_size=hidden_size // 2, n_shared_experts=1,
                     n_routed_experts=4, num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                     qk_nope_head_dim=8, v_head_dim=16, first_k_dense_replace=1, rope_parameters=rope)
    text["num_key_value_heads"] = text["num_attention_heads"]  # latent attention: one key and value per head
    return Mistral4Config(**text)


TINY = {"mistral3": tiny_mistral3_config, "lighton_ocr": tiny_lighton_ocr_config, "mistral4": tiny_mistral4_config}
"""``model_type`` -> ``tiny_<type>_config(tokenizer, num_layers=8, hidden_size=64)``."""
