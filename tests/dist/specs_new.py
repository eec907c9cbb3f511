"""CI cases of the new families (issue 38): (config name, preprocess, text_layers, layout), and per-family case
options (:data:`OPTIONS`).

Gemma 4's later steps. Its first step's gradients agree to 0.09 of the tolerance. Its step-2 gradients are taken at
parameters that the two runs' fp32 rounding has already parted by an ulp here and there, and the tiny Gemma 4's
gradients are that sensitive: in one process, one ulp added to 1% of its parameters moves its gradients by 9e-5 of
their largest (1e-4 with every parameter; the same test moves Gemma 3's by 3.5e-6 and 1e-5, the keys' bias left out:
its gradient is zero by design). The optimizer is not the cause: with SGD (lr 1e-4 to 1e-2), whose step-1 updates
agree to an ulp, the step-2 gradients still differ by 2e-5 to 2.4e-4 of their largest. Gemma 4 therefore checks step
2's gradients at 1e-5 + 1e-4 max|ref|, the parting one ulp makes; a gradient 5% off
(:func:`matrix.gradient_controls`) is still 500 times over that bound. AdamW's eps then decides how much of that
parting reaches the step-2 update: lr * m / (sqrt(v) + eps) has a slope of up to lr / eps in the gradient, so at eps
1e-6 the embeddings' step-2 update differs by 3.3% of its rms (matrix.UPDATE_REL is 1%), at eps 1e-3 by 1.4e-4 of
the worst tensor's. Gemma 4 therefore runs at eps 1e-3. Its lr, 1e-4, no longer weakens a check: each step's update
is checked against the reference's relative to its own size (matrix.update_problems), as for every family. (Gemma 4
alone passes at lr 1e-3 too; Gemma 4 Unified and Muse Glimmer, which share these settings, part step 2's gradients
there by up to 2.7e-4 of their largest.)

LFM3-VL packed (:data:`PACKED_OPTIONS`) is the same case: its first step's gradients agree to 0.03 of the
tolerance, but with lr 1e-3 and eps 1e-6 the parameters are 1.7e-4 apart after one step and its short
convolutions' step-2 gradients differ by up to 1.4e-4 of their largest; with lr 1e-9 every check passes
(measured: ``grad_matrix.py --packed --only lfm3_vl``).
"""


TEXT_TYPES = ("mistral4",)  # decoder-only LMs: the text pool, T >= 1 (tests/dist/matrix.py's TEXT_CONFIGS)
SPECS: list[tuple] = [
    ("mistral4", "trainable", 1, None),
    ("gemma4", "trainable", 0, None),
    ("gemma4", "frozen", 1, None),
]
LATER_STEPS = {"adam_eps": 1e-3, "lr": 1e-4, "last_step_rel": 1e-4}  # the settings above
OPTIONS = {"gemma4": LATER_STEPS}  # Gemma 4's, above
PACKED_OPTIONS = {"lfm3_vl": LATER_STEPS}
# families whose stock image processor needs torchvision: their vision inputs built directly
# (pools_without_processor.py)
SPECS += [("llama4", "trainable", 1, None), ("gemma4_unified", "trainable", 1, None),
          ("muse_glimmer", "trainable", 1, None), ("muse_spark", "trainable", 1, None)]
# Gemma 4 Unified's text model is Gemma 4's, and so is its sensitivity (measured: default settings part step 2's
# gradients by up to 1.6e-4 of their largest, with lr 1e-9 every step's check passes): Gemma 4's settings
OPTIONS["gemma4_unified"] = OPTIONS["gemma4"]
# Muse Glimmer, soft-capped as Gemma: the same (default settings part step 2's gradients by up to 2.2e-4 of their
# largest; with lr 1e-9 every step's check passes)
OPTIONS["muse_glimmer"] = OPTIONS["gemma4"]
# Muse Spark (Muse Glimmer's text model, with experts routed by top-2 of 4 and a post-expert norm of eps 1e-8):
# one step. Its first step agrees; at Gemma 4's settings the second step's gradients differ by up to 9e-3 of
# their largest (the parameters' fp32 parting moves tokens across the routing's discrete choices), while with lr
# 1e-9 both steps agree within every bound (measured), so the difference comes from the parameters
OPTIONS["muse_spark"] = {"steps": 1}
