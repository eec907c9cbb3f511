"""CI cases of the new families (issue 38): (config name, preprocess, text_layers, layers_per_stage).

``gemma4`` has no case yet: its split equals the unsplit model bit for bit on one process (tests/
test_families_new.py), and its first step's gradients agree to 0.09 of the tolerance in the R = 2 run, but after two
AdamW steps (eps 1e-6) fp32 reordering noise on near-zero gradient elements parts the parameters by up to 9e-5, so
the last step's per-tensor check and the reloaded logits (1e-4) fail, even with per-layer inputs and shared
key/value layers off; the lead decides how Gemma 4 is checked.
"""

TEXT_TYPES = ("mistral4",)  # decoder-only LMs: the text pool, T >= 1 (tests/dist/matrix.py's TEXT_CONFIGS)
SPECS: list[tuple] = [
    ("mistral4", "trainable", 1, None),
]
