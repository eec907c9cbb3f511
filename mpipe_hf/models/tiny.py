"""Scaled-down real Hugging Face configs for the demo and the tests (same classes as the real checkpoints)."""

from __future__ import annotations

from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, Qwen2_5_VLConfig, Qwen2Config, Qwen2VLConfig,
                          Qwen3Config, Qwen3VLConfig)

HEADS = 4


def _text(tokenizer, num_layers: int, hidden_size: int, tie: bool = False, **extra) -> dict:
    """Text-model keys shared by every tiny config: the real vocabulary, 4 heads of ``hidden_size / 4``, 2 key-value
    heads."""
    return dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                num_hidden_layers=num_layers, num_attention_heads=HEADS, num_key_value_heads=2,
                max_position_embeddings=4096, tie_word_embeddings=tie, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=None, eos_token_id=tokenizer.eos_token_id, **extra)


def _mrope(hidden_size: int) -> dict:
    half = hidden_size // HEADS // 2
    return {"rope_type": "default", "rope_theta": 10000.0,
            "mrope_section": [half - 2 * (half // 3), half // 3, half // 3]}


def _qwen_specials(tokenizer) -> dict:
    ids = tokenizer.convert_tokens_to_ids
    return dict(image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
                vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))


def tiny_qwen2_5_vl_config(tokenizer, num_layers: int = 8, vision_depth: int = 4, hidden_size: int = 64
                           ) -> Qwen2_5_VLConfig:
    """A ``Qwen2_5_VLConfig`` with the real vocabulary and special-token ids of ``tokenizer``, 4 heads of 16,
    ``mrope_section`` summing to ``head_dim / 2``, windowed vision attention, and untied embeddings."""
    return Qwen2_5_VLConfig(
        text_config=_text(tokenizer, num_layers, hidden_size, rope_parameters=_mrope(hidden_size)),
        vision_config=dict(depth=vision_depth, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                           temporal_patch_size=2, spatial_merge_size=2, window_size=112,
                           out_hidden_size=hidden_size, fullatt_block_indexes=[vision_depth - 1]),
        tie_word_embeddings=False, **_qwen_specials(tokenizer))


def tiny_qwen2_vl_config(tokenizer, num_layers: int = 8, vision_depth: int = 2, hidden_size: int = 64
                         ) -> Qwen2VLConfig:
    """A ``Qwen2VLConfig``: as :func:`tiny_qwen2_5_vl_config`, with Qwen2-VL's vision tower (``embed_dim`` 32,
    LayerNorm blocks, no windows)."""
    return Qwen2VLConfig(
        text_config=_text(tokenizer, num_layers, hidden_size, rope_parameters=_mrope(hidden_size)),
        vision_config=dict(depth=vision_depth, embed_dim=32, hidden_size=hidden_size, mlp_ratio=2, num_heads=2,
                           patch_size=14, temporal_patch_size=2, spatial_merge_size=2),
        tie_word_embeddings=False, **_qwen_specials(tokenizer))


def tiny_qwen3_vl_config(tokenizer, num_layers: int = 8, vision_depth: int = 3, hidden_size: int = 64,
                         deepstack_visual_indexes: tuple[int, ...] = (0, 1, 2)) -> Qwen3VLConfig:
    """A ``Qwen3VLConfig``: 16-px patches, a learned 8 x 8 position grid, interleaved M-RoPE, and DeepStack
    features from vision blocks ``deepstack_visual_indexes`` (added after decoder layers ``0 .. K-1``)."""
    rope = {**_mrope(hidden_size), "mrope_interleaved": True}
    return Qwen3VLConfig(
        text_config=_text(tokenizer, num_layers, hidden_size, head_dim=hidden_size // HEADS, rope_parameters=rope),
        vision_config=dict(depth=vision_depth, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=hidden_size,
                           num_position_embeddings=64, deepstack_visual_indexes=list(deepstack_visual_indexes)),
        tie_word_embeddings=False, **_qwen_specials(tokenizer))


def tiny_llava_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56,
                      vision_feature_layer: int | list[int] = -2, strategy: str = "default") -> LlavaConfig:
    """A ``LlavaConfig``: a 3-layer CLIP vision tower on ``image_size``-px images in 14-px patches, a Qwen2 text
    model with the real vocabulary, and ``<|image_pad|>`` as the image token."""
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                              image_size=image_size, patch_size=14, projection_dim=32)
    return LlavaConfig(vision_config=vision.to_dict(), text_config={"model_type": "qwen2",
                                                                    **_text(tokenizer, num_layers, hidden_size)},
                       image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
                       vision_feature_layer=vision_feature_layer, vision_feature_select_strategy=strategy,
                       tie_word_embeddings=False)


def tiny_causal_lm_config(tokenizer, model_type: str = "qwen2", num_layers: int = 8, hidden_size: int = 64,
                          tie_word_embeddings: bool = False):
    """A ``Qwen2Config``, ``LlamaConfig`` or ``Qwen3Config`` (``model_type``) with the real vocabulary of
    ``tokenizer``, 4 heads of ``hidden_size / 4`` and 2 key-value heads (Qwen3: with its q/k norms).

    Raises:
        ValueError: ``model_type`` is not ``"qwen2"``, ``"llama"`` or ``"qwen3"``.
    """
    classes = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3": Qwen3Config}
    if model_type not in classes:
        raise ValueError(f"model_type must be one of {sorted(classes)}, got {model_type!r}")
    extra = {"head_dim": hidden_size // HEADS} if model_type == "qwen3" else {}
    return classes[model_type](**_text(tokenizer, num_layers, hidden_size, tie_word_embeddings, **extra))
