"""Scaled-down real configs of the DeepSeek group, for the tests: the Qwen2 tokenizer's real vocabulary
(``len(tokenizer)``), images ``<|image_pad|>``, vision towers of 2 layers of width 32, text models of
``num_layers`` layers of ``hidden_size`` with 4 heads and 2 key-value heads, untied embeddings."""

from __future__ import annotations

from transformers import DeepseekOcr2Config, DeepseekVLConfig, DeepseekVLHybridConfig, JanusConfig

from ...models.tiny import VISION, lm_keys, sam_keys, token_id


def _siglip(image_size: int) -> dict:
    """A 2-layer SigLIP tower without its pooling head, in 14-px patches."""
    return dict(model_type="siglip_vision_model", image_size=image_size, patch_size=14, vision_use_head=False,
                **VISION)


def tiny_deepseek_vl_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56
                            ) -> DeepseekVLConfig:
    """A ``DeepseekVLConfig``: a SigLIP tower on ``image_size``-px images, the MLP aligner, and a Llama text
    model."""
    return DeepseekVLConfig(vision_config=_siglip(image_size),
                            text_config=lm_keys(tokenizer, "llama", num_layers, hidden_size),
                            image_token_id=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=False)


def tiny_deepseek_vl_hybrid_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56,
                                   high_res_size: int = 64) -> DeepseekVLHybridConfig:
    """A ``DeepseekVLHybridConfig``: :func:`tiny_deepseek_vl_config`'s low-resolution SigLIP tower beside a 2-layer
    SAM tower on ``high_res_size``-px images (8-px patches, layer 1 global; its features interpolated to the
    SigLIP grid), the hybrid aligner, and a Llama text model."""
    sam = dict(model_type="sam_vision_model", **sam_keys(high_res_size))
    return DeepseekVLHybridConfig(vision_config=_siglip(image_size), high_res_vision_config=sam,
                                  text_config=lm_keys(tokenizer, "llama", num_layers, hidden_size),
                                  image_token_id=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=False)


def tiny_janus_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 64) -> JanusConfig:
    """A ``JanusConfig``: a 2-layer SigLIP-like tower on ``image_size``-px images in 16-px patches (16 tokens an
    image), the aligner, a Llama text model, and a small VQ-VAE generation head (unused for understanding)."""
    vision = dict(image_size=image_size, patch_size=16, projection_dim=hidden_size, depth=2,
                  num_image_tokens=(image_size // 16) ** 2, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=2, mlp_ratio=2.0)
    vq = dict(embed_dim=8, num_embeddings=64, latent_channels=32, base_channels=32, channel_multiplier=[1, 2],
              num_res_blocks=1, num_patches=image_size // 16, projection_dim=hidden_size,
              image_token_embed_dim=hidden_size)
    return JanusConfig(vision_config=vision, vq_config=vq,
                       text_config=lm_keys(tokenizer, "llama", num_layers, hidden_size),
                       image_token_id=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=False)


def tiny_deepseek_ocr2_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 128
                              ) -> DeepseekOcr2Config:
    """A ``DeepseekOcr2Config`` scaled as the hub's 1,024-px global view and 768-px tiles are: a 2-layer SAM tower
    (:func:`~mpipe_hf.models.tiny.sam_keys`) in 2-px patches (windows of 4 in layer 0, global attention in layer
    1, as the hub's tower mixes them) on ``image_size``-px global views (a 64 x 64 grid, downsampled 4 x to the
    256 queries of ``query_1024_resolution``) and ``image_size * 3 / 4``-px tiles (the 144 of
    ``query_768_resolution``). The grids cannot shrink: the processor counts a view's tokens as its grid / 4
    squared, which must equal the 256 or 144 queries the tower returns, and a tile is 3/4 of the global view.
    Then a 2-layer Qwen2-style encoder of width 32 over patches and queries, and a DeepSeek-V2 text model with
    plain multi-head attention: the first layer dense, then 4 routed experts of width ``hidden_size / 2`` (2
    active) and one shared."""
    sam = dict(sam_keys(image_size), patch_size=2, window_size=4, downsample_channels=[32, VISION["hidden_size"]])
    text = lm_keys(tokenizer, "deepseek_ocr2_text", num_layers, hidden_size, moe_intermediate_size=hidden_size // 2,
                   n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                   mlp_layer_types=["dense"] + ["sparse"] * (num_layers - 1))
    return DeepseekOcr2Config(vision_config=dict(sam_config=sam, encoder_config=dict(VISION, num_key_value_heads=1)),
                              text_config=text, image_token_id=token_id(tokenizer, "<|image_pad|>"),
                              tie_word_embeddings=False)


TINY = {"deepseek_vl": tiny_deepseek_vl_config, "deepseek_vl_hybrid": tiny_deepseek_vl_hybrid_config,
        "janus": tiny_janus_config, "deepseek_ocr2": tiny_deepseek_ocr2_config}
"""``model_type`` -> ``tiny_<type>_config(tokenizer, num_layers=8, hidden_size=64, ...)``."""
