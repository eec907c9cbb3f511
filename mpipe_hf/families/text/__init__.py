"""Decoder-only language models: the whole model is the text stack ``model`` (no tower, no image inputs), split
into stages by layers. Types: ``llama``, ``qwen2``, ``qwen3``."""
