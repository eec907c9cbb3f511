"""Qwen-like families: a decoder-only text model after a NaViT-style tower sized per image by its patch grid
(``image_grid_thw``, or MiniCPM's ``target_sizes``), the tower's merged patches written as the image placeholder
repeated, as Qwen-VL's, each tower and text model of the family's own classes. M-RoPE positions computed on the
host by the model's ``get_rope_index``: ``paddleocr_vl``, ``cosmos3_edge``, ``cosmos3_omni`` (Qwen3-VL's model
under another name), ``ernie4_5_vl_moe`` (modality-isolated experts), ``minicpmv4_7`` (canvas M-RoPE),
``hunyuan_vl`` (XD-RoPE over four axes). 1-D positions: ``exaone4_5``, ``llava_onevision1_5``, ``video_llama_3``,
``minicpmv4_6``, ``minicpm_ocr``, ``lfm3_vl``, ``hyperclovax_vision_v2``, ``kimi_k25``. Refused: ``ovis2_5``,
``hy_v4_vl``."""
