"""Scaled-down real configs of the InternVL group, for the tests: the Qwen2 tokenizer's real vocabulary
(``len(tokenizer)``), images ``<|image_pad|>`` (``<img>``/``</img>`` stood in by ``<|vision_start|>`` /
``<|vision_end|>``), a 2-layer InternViT-style tower of width 32 on ``image_size``-px tiles in 14-px patches,
pixel-shuffled by ``downsample_ratio`` 0.5 to 4 tokens a tile, text models of ``num_layers`` layers of
``hidden_size`` with 4 heads and 2 key-value heads, untied embeddings."""

from __future__ import annotations

from transformers import InternVLConfig, QianfanOCRConfig

from ...models.tiny import HEADS, VISION, lm_keys, token_id


def tiny_internvl_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56
                         ) -> InternVLConfig:
    """An ``InternVLConfig``: the tower and a Qwen2 text model (as InternVL3's)."""
    vision = dict(model_type="internvl_vision", image_size=[image_size, image_size], patch_size=[14, 14], **VISION)
    seq = (image_size // 14) ** 2 // 4
    return InternVLConfig(vision_config=vision, text_config=lm_keys(tokenizer, "qwen2", num_layers, hidden_size),
                          image_token_id=token_id(tokenizer, "<|image_pad|>"), image_seq_length=seq,
                          downsample_ratio=0.5, tie_word_embeddings=False)


def tiny_qianfan_ocr_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56
                            ) -> QianfanOCRConfig:
    """A ``QianfanOCRConfig``: the tower and a Qwen3 text model. The tower's stochastic depth is off
    (``drop_path_rate`` 0; the hub config's 0.1 drops residual branches at random in training)."""
    vision = dict(image_size=[image_size, image_size], patch_size=[14, 14], drop_path_rate=0.0, **VISION)
    text = lm_keys(tokenizer, "qwen3", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    return QianfanOCRConfig(vision_config=vision, text_config=text, image_token_id=token_id(tokenizer, "<|image_pad|>"),
                            image_seq_length=(image_size // 14) ** 2 // 4, downsample_ratio=0.5,
                            tie_word_embeddings=False)


TINY = {"internvl": tiny_internvl_config, "qianfan_ocr": tiny_qianfan_ocr_config}
"""``model_type`` -> ``tiny_<type>_config(tokenizer, num_layers=8, hidden_size=64, image_size=56)``."""
