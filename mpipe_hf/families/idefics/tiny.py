"""Scaled-down real configs of the Idefics group, for the tests: the Qwen2 tokenizer's real vocabulary
(``len(tokenizer)``), images ``<|image_pad|>`` (the other markers the Qwen2 special tokens that :mod:`.data`
names), a 2-layer SigLIP-like tower of width 32 in 8-px patches, text models of ``num_layers`` layers of
``hidden_size`` with 4 heads and 2 key-value heads, untied embeddings."""

from __future__ import annotations

from transformers import Idefics2Config, Idefics3Config, SmolVLMConfig

from ...models.tiny import HEADS, VISION, lm_keys, token_id


def _pixel_shuffled(cls, vision_type: str, tokenizer, num_layers: int, hidden_size: int, image_size: int):
    vision = dict(model_type=vision_type, image_size=image_size, patch_size=8, **VISION)
    text = lm_keys(tokenizer, "llama", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    return cls(vision_config=vision, text_config=text, image_token_id=token_id(tokenizer, "<|image_pad|>"),
               scale_factor=2, tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id)


def tiny_idefics3_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 32
                         ) -> Idefics3Config:
    """An ``Idefics3Config``: the tower on ``image_size``-px tiles, pixel-shuffled by ``scale_factor`` 2 to 4 tokens
    a tile, and a Llama text model."""
    return _pixel_shuffled(Idefics3Config, "idefics3_vision", tokenizer, num_layers, hidden_size, image_size)


def tiny_smolvlm_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 32
                        ) -> SmolVLMConfig:
    """A ``SmolVLMConfig``: as :func:`tiny_idefics3_config` (SmolVLM is Idefics3 with another text model and
    prompt)."""
    return _pixel_shuffled(SmolVLMConfig, "smolvlm_vision", tokenizer, num_layers, hidden_size, image_size)


def tiny_idefics2_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 64
                         ) -> Idefics2Config:
    """An ``Idefics2Config``: the tower on images of up to ``image_size`` px (any aspect ratio, padded), the
    connector's MLP and a 2-layer Perceiver resampler to 8 latents an image (``resampler_n_latents``; the hub's
    64), and a Mistral text model."""
    vision = dict(image_size=image_size, patch_size=8, **VISION)
    perceiver = dict(hidden_size=hidden_size, resampler_n_latents=8, resampler_depth=2, resampler_n_heads=2,
                     resampler_head_dim=16, num_key_value_heads=1)
    text = lm_keys(tokenizer, "mistral", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    return Idefics2Config(vision_config=vision, perceiver_config=perceiver, text_config=text,
                          image_token_id=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=False)


TINY = {"idefics2": tiny_idefics2_config, "idefics3": tiny_idefics3_config, "smolvlm": tiny_smolvlm_config}
"""``model_type`` -> ``tiny_<type>_config(tokenizer, num_layers=8, hidden_size=64, ...)``."""
