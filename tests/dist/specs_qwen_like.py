"""CI cases of the qwen_like families: (config name, preprocess, text_layers, layers_per_stage)."""

SPECS: list[tuple] = [("glm46v", "trainable", 1, None), ("glmga", "trainable", 1, None),
                      ("glm_ocr", "trainable", 1, None), ("cosmos3_omni", "trainable", 1, None),
                      ("paddleocr_vl", "trainable", 1, None), ("cosmos3_edge", "trainable", 1, None),
                      ("exaone4_5", "trainable", 1, None), ("llava_onevision1_5", "trainable", 1, None),
                      ("video_llama_3", "trainable", 1, None),
                      ("ernie4_5_vl_moe", "trainable", 1, None),
                      ("qwen2_5_omni_thinker", "trainable", 1, None), ("qwen3_omni_moe_thinker", "trainable", 1, None),
                      ("lfm3_vl", "trainable", 1, None),
                      ("hyperclovax_vision_v2", "trainable", 1, None),
                      ("minicpmv4_6", "trainable", 1, None),
                      ("minicpmv4_7", "trainable", 1, None),
                      ("hunyuan_vl", "trainable", 1, None)]
# families whose stock image processor needs torchvision: their vision inputs built directly
# (pools_without_processor.py)
SPECS += [("kimi_k25", "trainable", 1, None), ("minicpm_ocr", "trainable", 1, None)]
