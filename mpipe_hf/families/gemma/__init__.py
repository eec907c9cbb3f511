"""Gemma's vision-language models and their kin: Gemma-style decoders (sliding and global attention layers,
soft-capped logits) reading images through a tower in the preprocess, with what crosses stage boundaries beyond the
hidden states where the text model reaches past one layer: bidirectional image blocks in the masks (:mod:`.masks`),
Gemma 4's per-layer inputs and shared key/value states (:mod:`.shared_kv`), Gemma 3n's AltUp streams
(:mod:`.altup`), Muse's layers without rotary embedding.

Types: ``gemma3``, ``shieldgemma2`` (Gemma 3's model class), ``paligemma``, ``gemma3n`` (timm tower),
``gemma3n_text``, ``gemma4``, ``gemma4_unified`` (encoder-free), ``muse_glimmer``, ``muse_spark``; refused:
``diffusion_gemma``.
"""
