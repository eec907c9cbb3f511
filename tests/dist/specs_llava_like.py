"""CI cases of the llava_like families: (config name, preprocess, text_layers, layers_per_stage)."""

SPECS: list[tuple] = [
    ("vipllava", "trainable", 1, None),
    ("shieldgemma2", "trainable", 1, None),
    ("aya_vision", "trainable", 1, None),
    ("qianfan_ocr", "trainable", 1, None),
    ("llava_next_video", "trainable", 1, None),
    ("deepseek_vl", "trainable", 1, None),
    ("lighton_ocr", "trainable", 1, None),
    ("video_llava", "trainable", 1, None),
    ("janus", "trainable", 1, None),
    ("got_ocr2", "trainable", 1, None),
    ("pp_chart2table", "trainable", 1, None),
    ("deepseek_vl_hybrid", "trainable", 1, None),
    ("aria", "trainable", 1, None),
    ("idefics2", "trainable", 1, None),
    ("deepseek_ocr2", "trainable", 1, None),
    # the families whose stock image processor needs torchvision: their vision inputs built directly
    # (tests/dist/direct_llava_like.py)
    ("cohere2_vision", "trainable", 1, None),
    ("lfm2_vl", "trainable", 1, None),
    ("step3p7", "trainable", 1, None),
    ("minimax_m3_vl", "trainable", 1, None),
    ("molmo2", "trainable", 1, None),
    ("unlimited_ocr", "trainable", 1, None),
]
