"""The cases tests/test_numerics.py runs in CI, one torchrun per world size (:func:`cases`): the covering
subset of the gradient matrix and the extra cases each behaviour's test reads (each group's comment says what
it checks)."""

from matrix import (FAMILY_SPECS, MOE_ORDER_SPECS, TEXT_CONFIGS, covering_subset, family_cases, freeze_cases,
                    gradient_controls, make_case, packed_cases, packing_controls)
from specs_context_parallel import (CP_CASES, CP_CONTROL, LAYER_INPUT_CONTROL, LOSS_CONTROL,  # noqa: F401
                                    PACKED_CONTROL, ROUTER_CONTROL, TOWER_CONTROL)  # (test_numerics)
from specs_video import VIDEO_CONTROLS, video_cases


PIXEL_CASES = [make_case("vision", 2, 1, 4, "frozen", data="images"),
               make_case("vl-identity", 2, 1, 4, "identity", data="images")]
# corrupt_owner and bad_micro load without a MicroBatchPlan (a loader that raises, as one over a user's collator
# without null_batch does): the step is still skipped through the vote; a bad row a plan drops is ROW_CASES'
ERROR_CASES = [
    make_case("vision", 4, 2, 4, "frozen", corrupt_owner=2),
    make_case("vision", 4, 1, 5, "trainable", mid_step_owner=3),
    make_case("vision", 4, 1, 4, "frozen", mid_step_owner=3, recover=False),
    make_case("vl-text", 4, 1, 4, "trainable", owner_backward=True, bad_micro=3),
]
# rows collated on their owners, one row's PNG truncated after its header (tests/dist/row_cases.py): two schedule
# runs accumulated, the bad row one of three in run 0's micro 2, alone in run 1's micro 3
ROW_CASES = [make_case("vision", 4, 1, 4, "trainable", bad_rows=True, accumulate=2)]
FAMILY_CASES = family_cases()
# every family checked above with a trainable tower only is checked with its tower frozen too (T = 0: the tower
# runs in the preprocess under no_grad and ships features only); the reload is the trainable case's
_TRAINABLE_ONLY = sorted({c["family"] for c in FAMILY_CASES if c["preprocess"] == "trainable"}
                         - {c["family"] for c in FAMILY_CASES if c["preprocess"] == "frozen"} - set(TEXT_CONFIGS))
FAMILY_CASES += [dict(case, reload=False) for case in family_cases([(f, "frozen", 0, None) for f in _TRAINABLE_ONLY])]
# the MoE load-balancing loss in the HF Trainer's order (each micro's own loss: what MPipeTrainer runs for them)
MOE_CASES = [c for c in FAMILY_CASES if c["family"] in ("qwen3_vl_moe", "qwen3_5_moe", "glm4v_moe")] + family_cases(
    MOE_ORDER_SPECS, order="micro")
FILL_CASES = [make_case("vision", 4, 2, 8, "frozen", placement="fill", steps=3, lookahead=True),
              make_case("vl-text", 3, 1, 5, "frozen", placement="fill", overflow="min", accumulate=2,
                        lookahead=True),
              make_case("llama-text", 3, 2, 4, "frozen", placement="fill")]
# a trainable tower with dropout: rank 0's recompute in TRANSPOSE_BWD and the owner-backward graph draw the
# forward's masks (the reference seeds its tower per micro as the pipeline does); the frozen tower too
DROPOUT_CASES = [dict(case, dropout=0.5, name=case["name"] + "-dropout" + ("-ob" if ob else ""), owner_backward=ob)
                 for case in FAMILY_CASES if case["family"] == "llava" for ob in (False, True)
                 if not ob or case["preprocess"] == "trainable"]
# bf16 autocast (fp32 master weights) and fp32, against one process in the pipeline's order of operations
# (summed loss, gradients divided once): bitwise; against the HF Trainer's order (num_items_in_batch): close.
# fp32 in the HF Trainer's order at R = 2, V = 2, M = 3 (frozen tower, ragged photos) is the first step of
# family-vl-frozen-T0 (FAMILY_CASES): the same model, seed and micro-batches, checked the same way
PRECISION_CASES = [make_case("vision", 2, 2, 4, "frozen", bf16=True, order="pipeline"),
                   make_case("vision", 2, 1, 3, "trainable", bf16=True, order="pipeline"),
                   make_case("vl-text", 2, 2, 3, "trainable", bf16=True, order="pipeline"),
                   make_case("vision", 2, 2, 4, "frozen", order="pipeline"),
                   make_case("vision", 2, 2, 3, "frozen", bf16=True)]
# the fused MoE experts on the bf16 grouped GEMM, cast once per step (mpipe_hf.models.expert_precision): bitwise too
PRECISION_CASES += family_cases([("qwen3_vl_moe", "trainable", 1, [2, 2, 4, 4])], bf16=True, order="pipeline")
# activation swap in every mode: frozen at R = 4, V = 2, M = 8, trainable, owner-backward,
# identity, placement fill, a text P, gradient checkpointing, and rank 0 alone; exact, with bytes moved
SWAP_CASES = [make_case("vision", 4, 2, 8, "frozen", swap="all", steps=3),
              make_case("vl-text", 4, 1, 5, "trainable", owner_backward=True, swap="rank0"),
              make_case("vision", 4, 2, 8, "frozen", placement="fill", lookahead=True, swap="rank0", steps=2),
              make_case("vl-identity", 2, 2, 4, "identity", swap="all"),
              make_case("vision", 2, 2, 4, "trainable", swap="all", steps=3),
              # at least two layers per stage: with checkpointing only the layers' inputs are saved, the first
              # is the stage's own input (never offloaded)
              make_case("llama-text", 2, 2, 4, "frozen", swap="all", gradient_checkpointing=True,
                        layers_per_stage=[3, 3, 3, 3]),
              # swap on but no group far enough from its backward: the same actions and bytes as swap off
              make_case("vl-identity", 2, 2, 4, "identity", swap="never"),
              make_case("vl-identity", 2, 2, 4, "identity", swap="off")]
# zero-bubble MPipe: the backward split into B and W in every mode, with filling, swap, gradient
# checkpointing, and the families
ZB_CASES = [make_case("vision", 4, 2, 8, "frozen", zero_bubble=True, steps=3),
            make_case("vision", 4, 2, 8, "frozen", placement="fill", lookahead=True, zero_bubble=True, steps=2),
            make_case("vl-text", 4, 1, 5, "trainable", owner_backward=True, zero_bubble=True),
            make_case("vision", 3, 2, 5, "trainable", overflow="min", zero_bubble=True, steps=2),
            make_case("llama-text", 3, 1, 4, "trainable", less_memory=True, zero_bubble=True, accumulate=2),
            make_case("vision", 2, 2, 4, "trainable", zero_bubble=True, steps=3),
            make_case("vl-identity", 2, 2, 4, "identity", zero_bubble=True),
            make_case("llama-text", 2, 2, 4, "frozen", zero_bubble=True, gradient_checkpointing=True),
            make_case("vision", 2, 2, 4, "frozen", zero_bubble=True, swap="all", steps=2)] + [
    dict(case, zero_bubble=True, reload=False, name=case["name"] + "-zb") for case in family_cases(FAMILY_SPECS)
    if case["preprocess"] == "trainable"] + [  # the new families' zero-bubble: scripts/check/grad_matrix.py --families
    dict(case, zero_bubble=True, reload=False, name=case["name"] + "-zb") for case in family_cases(
        [("qwen3_5_moe", "trainable", 1, None), ("gemma3", "trainable", 0, None),
         ("gemma3n_text", "trainable", 1, None)])]  # Gemma 3n: W's parameter groups share graph nodes
# load-aware owners: LPT over each run's real image-token counts (ragged photos), with prefix
# and with filling plus look-ahead (M = 6 of the pool's 8 micros: each run's micros, and owners, differ from the
# next's), and reversed owners, trainable with the graph shipped and with owner-backward
OWNER_CASES = [make_case("vision", 4, 2, 8, "frozen", owners="balanced", steps=2),
               make_case("vision", 4, 2, 6, "frozen", placement="fill", lookahead=True, owners="balanced", steps=3),
               make_case("vl-text", 3, 1, 5, "trainable", owners="reversed"),
               make_case("vision", 2, 2, 4, "trainable", owner_backward=True, owners="reversed", steps=2)]
# packing: packed micro-batches against the same rows unpacked, and the two negative controls, which must fail:
# positions as one range over the packed sequence (the mask then spans rows; M-RoPE loses each image's grid),
# and Qwen3.5's linear attention run over the packed sequence at once (its state flows into the next row)
PACKED_CASES = packed_cases() + packed_cases([("qwen3_vl", "frozen", 1, [1, 3, 4, 4])], attn="eager")
CONTROL_CASES, GRADIENT_CONTROLS = packing_controls(), gradient_controls()  # matrix.py: the bugs each must catch
# what trains by pattern (matrix.FREEZE_SPECS), rows mixing images and videos, and the two video controls
FREEZE_CASES, VIDEO_CASES = freeze_cases(), video_cases()
VIDEO_CONTROL, DEEPSTACK_CONTROL = video_cases(VIDEO_CONTROLS)
# Gemma 3n's AltUp streams 1 and 2 swapped where a stage hands them on: the language model's check must fail
ALTUP_CONTROL = dict(family_cases([("gemma3n_text", "trainable", 1, None)], altup_swapped=True)[0], reload=False)
EXTRA = {2: PACKED_CASES + CONTROL_CASES + GRADIENT_CONTROLS + PIXEL_CASES + FAMILY_CASES
         + MOE_CASES[-len(MOE_ORDER_SPECS):] + DROPOUT_CASES + PRECISION_CASES + SWAP_CASES[3:] + ZB_CASES[5:]
         + OWNER_CASES[3:] + FREEZE_CASES + VIDEO_CASES + [VIDEO_CONTROL, DEEPSTACK_CONTROL, ALTUP_CONTROL],
         3: FILL_CASES[1:] + ZB_CASES[3:5] + OWNER_CASES[2:3],
         4: ERROR_CASES + ROW_CASES + FILL_CASES[:1] + SWAP_CASES[:3]  # SWAP_CASES: R = 4 for the first 3
         + ZB_CASES[:3] + OWNER_CASES[:2]
         + CP_CASES + [CP_CONTROL, ROUTER_CONTROL, PACKED_CONTROL,
                       LAYER_INPUT_CONTROL, TOWER_CONTROL, LOSS_CONTROL]}  # CP last: its pipelines' groups differ


def cases(pp_size):
    return [c for c in covering_subset() if c["pp_size"] == pp_size] + EXTRA.get(pp_size, [])
