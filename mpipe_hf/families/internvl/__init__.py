"""InternVL and Qianfan-OCR: an InternViT tower ``model.vision_tower`` over GOT-OCR2-style tiles of an image (up
to a maximum number of tower-side tiles and a thumbnail), pixel-shuffled by ``downsample_ratio`` and projected by
``model.multi_modal_projector`` into a Qwen2 (InternVL3) or Qwen3 (Qianfan-OCR) decoder. Types: ``internvl``,
``qianfan_ocr``."""
