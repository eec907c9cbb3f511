"""DeepSeek's vision-language models: DeepSeek-VL (a SigLIP tower ``model.vision_model`` and an MLP
``model.aligner``), its hybrid (a SAM high-resolution tower beside it), Janus (the same understanding path, and an
image-generation head the split never runs), all into a Llama decoder; DeepSeek-OCR-2 (a SAM tower, a Qwen2-style
encoder over patches and queries, local tiles and a global view, into a DeepSeek-V2 MoE decoder). Types:
``deepseek_vl``, ``deepseek_vl_hybrid``, ``janus``, ``deepseek_ocr2``."""
