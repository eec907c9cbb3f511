"""The context-parallel cases tests/test_numerics.py runs in the R = 4 launch: cp 2 x pp 2 on the world's
``(cp, pp)`` mesh (tests/dist/numerics_worker.py), each checked against one process: the loss, every gradient and
every AdamW update of 2 steps. One list per behaviour, each with its comment; :data:`CP_CASES` is all of them."""

from matrix import family_cases, make_case, packed_cases

# a decoder-only LM with its front on stage 0, Qwen2.5-VL with a frozen tower (the first stage injects the features
# and M-RoPE ids on the whole sequence, then cuts it) and with a trainable one whose preprocess runs a decoder layer
# too (its hidden states cut on stage 0)
BASE_CASES = [make_case("qwen2-identity", 2, 1, 4, "identity", cp_size=2, steps=2),
              make_case("vision", 2, 1, 4, "frozen", cp_size=2, steps=2),
              make_case("vl-text", 2, 1, 4, "trainable", cp_size=2, steps=2)]
# per-token inputs between layers cut with the sequence, on rows whose image tokens lie on both CP ranks' slices (an
# image across the split in every micro, a text-only row before one with images): Qwen3-VL's DeepStack with a
# trainable tower, its 3 DeepStack layers over stages 0 and 1; Gemma 3's sliding window (16 of about 80 tokens) and
# bidirectional image blocks with a trainable tower and a decoder layer in P (whole there, cut on stage 0); Gemma 4's
# per-layer inputs and shared key/value states (stored on stage 2, read on stages 2 and 3), its images across the split
LAYER_INPUT_CASES = (family_cases([("qwen3_vl", "trainable", 0, [1, 3, 4, 4])], cp_size=2, reload=False,
                                  data="turns-qwen3_vl")
                     + family_cases([("gemma3", "trainable", 1, None)], cp_size=2, reload=False, data="turns-gemma3")
                     + family_cases([("gemma4", "trainable", 0, None)], cp_size=2, reload=False))
# the MoE router sums gathered over the CP group (the load-balancing term), and cp with ep: Qwen3-VL-MoE (4 experts,
# 2 active, the term weighted 0.01) at its frozen layout, strict per-tensor gradients of both steps
ROUTER_CASES = family_cases([("qwen3_vl_moe", "frozen", 0, [1, 3, 4, 4])], cp_size=2, reload=False)
# the tower divided over the CP ranks by images or frames, and video rows (the base cases divide theirs too: a
# frozen tower, and a trainable one recomputed by rank 0, on micro-batches of one image where one CP rank has none):
# several images a micro-batch with a trainable tower whose owners keep its graph (owner-backward), and Qwen2.5-VL's
# video pool with a trainable tower, its videos divided by temporal patch
TOWER_CASES = [make_case("vision", 2, 1, 4, "trainable", cp_size=2, steps=2, data="packed-vl", owner_backward=True),
               make_case("vision", 2, 1, 3, "trainable", cp_size=2, steps=2, data="video-vl")]
# packed micro-batches split across their rows: Qwen2.5-VL's micros of 2 to 3 rows (a text-only row beside rows of
# one and two images) packed into one sequence, cut in two halves by the CP ranks, so a row crosses the split in
# every micro; against the rows unpacked and padded on one process
PACKED_CASES = packed_cases([("vl", "frozen", 0, None)], cp_size=2)
# the per-micro loss (the HF Trainer's for a model without loss kwargs, train.loss_normalization: micro): each CP
# rank's slice sum over the whole micro's label tokens, the CP ranks' parts summed in the dp x cp reduction, the
# divisor counting micros over the replicas only: a decoder-only LM on padded text rows (label tokens on both CP
# ranks' slices, unequal between them and between micros), and Qwen3-VL-MoE's load-balancing term added to each
# micro's mean once over the CP group (Qwen2.5-VL's per-micro loss at cp 2: tests/test_hf_trainer.py)
LOSS_CASES = ([make_case("qwen2-identity", 2, 1, 4, "identity", cp_size=2, steps=2, order="micro")]
              + family_cases([("qwen3_vl_moe", "frozen", 0, [1, 3, 4, 4])], cp_size=2, reload=False, order="micro"))
CP_CASES = BASE_CASES + LAYER_INPUT_CASES + ROUTER_CASES + TOWER_CASES + PACKED_CASES + LOSS_CASES
# the negative control: each CP rank's positions counted from 0 on its own slice, as if computed after the split
CP_CONTROL = make_case("vision", 2, 1, 4, "frozen", cp_size=2, steps=2, positions_after_split=True)
# the router negative control: each CP rank's load-balancing term from its own slice's sums (not summed over cp)
ROUTER_CONTROL = dict(ROUTER_CASES[0], router_sums_local=True, name=ROUTER_CASES[0]["name"] + "-router_sums_local")
# the packed negative control: each CP rank's packed mask built from the rows its own slice sees (the row that
# crosses the split cut in two there)
PACKED_CONTROL = packed_cases([("vl", "frozen", 0, None)], cp_size=2, rows_cut_at_split=True)[0]
# the tower's negative control (one step): the gather's backward leaves each CP rank the gradient its own stages
# gave its own rows, not summed over the CP group
TOWER_CONTROL = dict(TOWER_CASES[1], tower_grads_unrouted=True, steps=1,
                     name=TOWER_CASES[1]["name"] + "-tower_grads_unrouted")
# the DeepStack negative control (one step): each CP rank adds the feature rows as if its slice began the sequence
LAYER_INPUT_CONTROL = dict(LAYER_INPUT_CASES[0], deepstack_offset_lost=True, steps=1,
                           name=LAYER_INPUT_CASES[0]["name"] + "-deepstack_offset_lost")
# the per-micro loss's negative control: each CP rank's slice sum over its own slice's label tokens
LOSS_CONTROL = dict(LOSS_CASES[0], micro_tokens_local=True, name=LOSS_CASES[0]["name"] + "-micro_tokens_local")
