"""Mistral's models: Mistral 3 (Mistral-Small-3.1) and LightOnOCR, a Pixtral tower (images at their own size and
aspect, ``image_sizes``) whose patches a 2 x 2 merger joins before the projector, into a Mistral (Qwen3 for
LightOnOCR) decoder; Mistral Small 4, a decoder-only LM with latent attention and routed experts. Types:
``mistral3``, ``lighton_ocr``, ``mistral4``, and ``mistral_large4`` (refused)."""
