"""Scaled-down real Hugging Face configs for the demo and the tests (same classes as the real checkpoints)."""

from __future__ import annotations

from transformers import LlamaConfig, Qwen2_5_VLConfig, Qwen2Config


def tiny_qwen2_5_vl_config(tokenizer, num_layers: int = 8, vision_depth: int = 4, hidden_size: int = 64
                           ) -> Qwen2_5_VLConfig:
    """A ``Qwen2_5_VLConfig`` with the real vocabulary and special-token ids of ``tokenizer``, 4 heads of 16,
    ``mrope_section`` summing to ``head_dim / 2``, and untied embeddings (the pipeline splits them)."""
    heads = 4
    half = hidden_size // heads // 2
    section = [half - 2 * (half // 3), half // 3, half // 3]
    specials = tokenizer.convert_tokens_to_ids
    return Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id),
        vision_config=dict(depth=vision_depth, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                           temporal_patch_size=2, spatial_merge_size=2, window_size=112,
                           out_hidden_size=hidden_size, fullatt_block_indexes=[vision_depth - 1]),
        image_token_id=specials("<|image_pad|>"), video_token_id=specials("<|video_pad|>"),
        vision_start_token_id=specials("<|vision_start|>"), vision_end_token_id=specials("<|vision_end|>"),
        tie_word_embeddings=False,
    )


def tiny_causal_lm_config(tokenizer, model_type: str = "qwen2", num_layers: int = 8, hidden_size: int = 64):
    """A ``Qwen2Config`` or ``LlamaConfig`` (``model_type``) with the real vocabulary of ``tokenizer``, 4 heads of
    16, 2 key-value heads and untied embeddings.

    Raises:
        ValueError: ``model_type`` is neither ``"qwen2"`` nor ``"llama"``.
    """
    classes = {"qwen2": Qwen2Config, "llama": LlamaConfig}
    if model_type not in classes:
        raise ValueError(f"model_type must be one of {sorted(classes)}, got {model_type!r}")
    return classes[model_type](
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id)
