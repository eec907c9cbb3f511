"""Scaled-down real configs of the OCR group, for the tests: the Qwen2 tokenizer's real vocabulary
(``len(tokenizer)``), the image token ``<|image_pad|>`` (no token is added), SAM-style towers of 2 layers
(:func:`~mpipe_hf.models.tiny.sam_keys`) on 64-px images, text models of ``num_layers`` layers of ``hidden_size``,
untied embeddings."""

from __future__ import annotations

from transformers import GotOcr2Config, PPChart2TableConfig

from ...models.tiny import HEADS, VISION, lm_keys, sam_keys, text_keys, token_id


def tiny_got_ocr2_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 64,
                         cls=GotOcr2Config):
    """A ``GotOcr2Config`` (``cls``: ``PPChart2TableConfig``, the same model): the SAM-style tower of
    :func:`~mpipe_hf.models.tiny.sam_keys` on ``image_size``-px tiles, two stride-2 convolutions to
    ``(image_size / 32)**2`` tokens a tile, and a Qwen2 text model."""
    return cls(vision_config=sam_keys(image_size), text_config=lm_keys(tokenizer, "qwen2", num_layers, hidden_size),
               image_token_index=token_id(tokenizer, "<|image_pad|>"), image_seq_length=(image_size // 32) ** 2,
               tie_word_embeddings=False)


def tiny_pp_chart2table_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 64
                               ) -> PPChart2TableConfig:
    """A ``PPChart2TableConfig``: :func:`tiny_got_ocr2_config`'s shape (the same model class)."""
    return tiny_got_ocr2_config(tokenizer, num_layers, hidden_size, image_size, cls=PPChart2TableConfig)


def tiny_unlimited_ocr_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 64,
                              sliding_window: int = 16):
    """An ``UnlimitedOcrConfig`` scaled as the hub's global view and tiles are: the SAM-style tower in 4-px
    patches on ``image_size``-px global views (a 16 x 16 grid, two stride-2 convolutions to 4 x 4 queries, a
    newline after each row of them) and ``image_size * 3 / 4``-px tiles (3 x 3 queries each), a 2-layer CLIP-style
    encoder over the SAM features, and a DeepSeek-V2-style text model with plain multi-head attention whose layers
    are reference sliding-window (``sliding_window`` tokens once decoding; the whole prompt in training) but every
    fourth full: the first dense, then 4 routed experts of width ``hidden_size / 2`` (2 active) and one shared."""
    from transformers import UnlimitedOcrConfig
    sam = dict(sam_keys(image_size), patch_size=4, window_size=4, global_attn_indexes=[1],
               downsample_channels=[32, VISION["hidden_size"]])
    encoder = dict(VISION, image_size=56, patch_size=14)
    text = dict(text_keys(tokenizer, num_layers, hidden_size, sliding_window=sliding_window,
                          layer_types=["full_attention" if i % 4 == 3 else "reference_sliding_attention"
                                       for i in range(num_layers)],
                          mlp_layer_types=["dense"] + ["sparse"] * (num_layers - 1), n_routed_experts=4,
                          num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=hidden_size // 2),
                num_key_value_heads=HEADS)
    return UnlimitedOcrConfig(vision_config=dict(sam_config=sam, encoder_config=encoder), text_config=text,
                              image_token_id=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=False)


TINY = {"got_ocr2": tiny_got_ocr2_config, "pp_chart2table": tiny_pp_chart2table_config,
        "unlimited_ocr": tiny_unlimited_ocr_config}
