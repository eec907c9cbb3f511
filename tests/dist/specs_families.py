"""CI cases of the generic splitter's families, one per line: (config name, preprocess, text_layers, layout), run by
tests/test_numerics.py::test_model_families at a per-tensor tolerance (1e-5 + 1e-5 max|ref|), and per-family case
options (:data:`OPTIONS`). A new family adds its line here (docs/adding_a_family.md).

Gemma 4, Gemma 4 Unified, Muse Glimmer and Muse Spark run at the default settings: lr 1e-3, eps 1e-6, two AdamW
steps, each step's update (matrix.update_problems) and the last step's gradients (1e-5 + 1e-5 max|ref|) checked at
the usual bounds. Their tiny models once needed lr 1e-4 and eps 1e-3 (Muse Spark: one step), because their attention
started far sharper than a random model's: Gemma 4 takes ``q . k`` unscaled after unit RMS norms (a spread of
sqrt(head_dim)), Muse Glimmer multiplies its normalised queries by 3.87, so each softmax was nearly one-hot over
near-ties, and the fp32 rounding of one AdamW step (the split's sums in another order) moved the step-2 gradients by
1.2e-4 (Gemma 4; 2.9e-4 with the CI's seed), 2.1e-4 (Gemma 4 Unified), 2.0e-4 (Muse Glimmer) and 6.7e-3 (Muse Spark,
whose tokens crossed routing choices) of their largest, against Gemma 3's 1.1e-5. Started at the usual temperature
(:func:`mpipe_hf.models.tiny.usual_temperature`; the tiny Muse configs' ``qk_scale_factor`` 1.0), they part by
1.9e-5, 8.8e-6, 8.1e-6 and 4.0e-5, and none fails a check (measured in one process: step 1's gradients summed in the
reference's order and in the pipeline's, one AdamW step each, step 2 compared as CI does; medians over three seeds).
One ulp added to 1% of the parameters now moves Gemma 4's gradients by 3.1e-6 of their largest (1.5e-5 before; Gemma
3: 1.3e-6). Muse Spark's routing on the CI batch (seed 0): the closest second and third of its top-2-of-4 scores are
2.3e-6 apart, and the two runs' scores part by at most 8e-7 (2.7e-5 to 1.4e-4 at 3.87, where tokens switched
experts): no choice flips, also with ``ATEN_CPU_CAPABILITY=default``'s kernels, but a CPU whose rounding parts the
scores three times further could flip one, and the case would fail; the routers are random, so some of the 1,232
routing choices of a batch are always that close.

LFM3-VL packed (:data:`PACKED_OPTIONS`, a case of ``grad_matrix.py --packed``, not of CI) runs at AdamW eps 1e-3,
the default lr and bounds otherwise. Its model is not sensitive as Gemma 4's was: unpacked, the measurement above
parts its step-2 gradients by 6.4e-6 of their largest, as Gemma 3's. Packed, its first step's gradients agree to
0.03 of the tolerance, and one AdamW step parts the updates of layer 0's convolution input projection most (2.7e-4
of their rms, four times the next tensor); at eps 1e-6 the step-2 gradients of the embeddings and of layer 0's
convolution then differ by 5.8e-5 to 1.6e-4 of their largest, up to twice the bound, and at eps 1e-3 (AdamW's slope
lr / eps in the gradient 1 instead of 1000) every check passes (measured with ``grad_matrix.py --packed --only
lfm3_vl``). Why the packed first step parts that projection more than the padded one is not yet found.
"""

# Qwen3.5(-MoE), Qwen3-VL-MoE, GLM-4.1V/4.5V, InternVL, Gemma 3, PaliGemma, Mistral 3, LLaVA-NeXT, -OneVision,
# Idefics3, SmolVLM: a frozen tower at T = 0 and a trainable one at T = 1 each
# (the full family x preprocess x T grid: python scripts/check/grad_matrix.py --families). Qwen3.5's layout [3, 3, 3, 3] cuts
# between linear-attention layer 2 and full-attention layer 3; Qwen3-VL-MoE's relays DeepStack features (layers
# 0, 1) from stage 0 to stage 1; the MoE families add the load-balancing loss (HF's aux_loss in the reference),
# once more in the HF Trainer's order (each micro's own loss, "micro"), the order MPipeTrainer picks for them.
SPECS: list[tuple] = [
    ("qwen3_5", "frozen", 0, [3, 3, 3, 3]), ("qwen3_5", "trainable", 1, [4, 2, 3, 3]),
    ("qwen3_5_moe", "frozen", 0, [3, 3, 3, 3]), ("qwen3_5_moe", "trainable", 1, None),
    ("qwen3_vl_moe", "frozen", 0, [1, 3, 4, 4]), ("qwen3_vl_moe", "trainable", 1, [2, 2, 4, 4]),
    ("glm4v", "frozen", 0, None), ("glm4v", "trainable", 1, None),
    ("glm4v_moe", "frozen", 0, None), ("glm4v_moe", "trainable", 1, None),
    ("internvl", "frozen", 0, None), ("internvl", "trainable", 1, None),
    ("gemma3", "frozen", 0, None), ("gemma3", "trainable", 1, None),
    ("paligemma", "frozen", 0, None), ("paligemma", "trainable", 1, None),
    ("mistral3", "frozen", 0, None), ("mistral3", "trainable", 1, None),
    ("llava_next", "frozen", 0, None), ("llava_next", "trainable", 1, None),
    ("llava_onevision", "frozen", 0, None), ("llava_onevision", "trainable", 1, None),
    ("idefics3", "frozen", 0, None), ("idefics3", "trainable", 1, None),
    ("smolvlm", "frozen", 0, None), ("smolvlm", "trainable", 1, None),
]
# llava-like towers (LLaVA, DeepSeek, OCR, Idefics2, Mistral and Gemma groups), a trainable tower at T = 1
SPECS += [
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
# Qwen-like towers (the qwen_like, glm and qwen groups)
SPECS += [("glm46v", "trainable", 1, None), ("glmga", "trainable", 1, None),
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
# decoder-only LMs: the text pool, T >= 1 (tests/dist/matrix.py's TEXT_CONFIGS)
TEXT_TYPES = ("mistral4", "gemma3n_text")
SPECS += [
    ("mistral4", "trainable", 1, None),
    # Gemma 3n's language model (its image-text model needs timm: scripts/check/check_timm_families.py): the AltUp streams
    # (4, B, L, H), per-layer inputs and shared key/value states cross the stage boundaries
    ("gemma3n_text", "trainable", 1, None),
    ("gemma4", "trainable", 0, None),
    ("gemma4", "frozen", 1, None),
]
OPTIONS: dict = {}  # per-family case options: none, every family at the default settings (above)
PACKED_OPTIONS = {"lfm3_vl": {"adam_eps": 1e-3}}  # LFM3-VL packed: the default lr and bounds, eps 1e-3 (above)
# families whose stock image processor needs torchvision: their vision inputs built directly
# (pools_without_processor.py)
SPECS += [("llama4", "trainable", 1, None), ("gemma4_unified", "trainable", 1, None),
          ("muse_glimmer", "trainable", 1, None), ("muse_spark", "trainable", 1, None)]
# Inkling (its stock image processor needs torchvision): no rotary embedding, a relative-position bias from the hidden
# states, short convolutions with their own padding mask; specs_ci adds its frozen-tower (T = 0) case
SPECS += [("inkling_mm_model", "trainable", 1, None)]
# Nemotron-H Omni (its stock image processor needs torchvision): Mamba-2, attention, MLP and MoE blocks, no rotary
# embedding; specs_ci adds its frozen-tower (T = 0) case
SPECS += [("nemotron_h_omni", "trainable", 1, None)]
# Gemma 3n (its language model here, the image-text model in scripts/check/check_timm_families.py) runs at the default
# settings too: its split's first step is bit for bit the unsplit model's (tests/test_family_gemma.py). (Its front
# once made the AltUp streams before the per-layer inputs, the model's order reversed: autograd then summed the input
# embeddings' gradient in another order, an ulp apart, and the second step's gradients parted by up to 6.3e-4 of
# their largest)
