"""The pipelined step equals the unsplit Hugging Face model on one process (fp32, gloo, 2-4 processes).

- The gradient matrix's pairwise covering subset (tests/dist/matrix.py): every P kind (visual tower, tower plus
  the first T text layers, text layers of Llama and Qwen2, identity), frozen and trainable, overflow full and
  min, owner-backward, less_memory, R in {2, 3, 4}, V in {1, 2, 3}, M < R, M not a multiple of R, M = 2R, ragged
  VL batches and whole steps without an image, 3 AdamW steps, gradient accumulation over two schedule runs. The
  full grid is ``python scripts/check/grad_matrix.py``.
- Model families: Qwen2.5-VL, Qwen2-VL, Qwen3-VL (DeepStack layers relayed across ranks), LLaVA (two
  feature-layer/strategy settings), Llama, Qwen2 and Qwen3 with tied embeddings, each at R = 2, V = 2, frozen
  and trainable, 2 AdamW steps, then saved and reloaded with ``from_pretrained``.
- Bubble filling: placement ``fill`` (frozen ``P``) at R = 3 and 4, overflow full and min, with the next
  step's micros loaded and preprocessed in this step's idle time.
- Pixel policy: a frozen visual tower never ships pixels; the bytes that travel are exactly the owners' token ids,
  masks, grids and labels, and the features.
- Load-aware owners: owners balanced by the real micro-batches' image tokens, or reversed, per run.
- Error path: a corrupt image, a rejected sample or a failure in the middle of a step on one rank raises the
  first error's text on every rank, quickly; no gradient of the failed step is left; the next step is exact.
- A bad row: an image that does not decode costs its row, not the step: the owner drops it (or, alone
  in its micro-batch, a null micro-batch stands in), every rank learns the count, and the step equals one process
  trained without that row.
- What trains by pattern and video rows: ``train.freeze`` / ``train.trainable`` and the shortcuts
  against the unsplit model frozen the same way; rows mixing images and videos; two video negative controls.

One torchrun per world size runs all its cases in one process group.
"""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import build_fixture, read_results, run_torchrun  # noqa: E402
from mpipe_hf.schedule.actions import Action, Kind  # noqa: E402
from matrix import NEGATIVE_CONTROLS, REL_TOL, check_case, check_reload  # noqa: E402
from specs_ci import (ALTUP_CONTROL, CONTROL_CASES, CP_CASES, CP_CONTROL, DEEPSTACK_CONTROL,  # noqa: E402
                      DROPOUT_CASES, ERROR_CASES, LAYER_INPUT_CONTROL, LOSS_CONTROL, PACKED_CONTROL, ROUTER_CONTROL,
                      TOWER_CONTROL, FAMILY_CASES, FILL_CASES, FREEZE_CASES, GRADIENT_CONTROLS, MOE_CASES, OWNER_CASES,
                      PACKED_CASES,
                      PIXEL_CASES, PRECISION_CASES, ROW_CASES, SWAP_CASES, VIDEO_CASES, VIDEO_CONTROL, ZB_CASES, cases)
from specs_video import VIDEO_CONFIGS  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "dist", "numerics_worker.py")
HIDDEN = 64  # the tiny config's hidden size

@pytest.fixture(scope="module")
def fixture_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("numerics") / "fixture.pt")
    build_fixture(path, videos=VIDEO_CONFIGS)
    return path


@pytest.fixture(scope="module")
def results(fixture_path, tmp_path_factory):
    """``results(R)``: the per-rank results of every case of that pipeline size (one torchrun, cached)."""
    cache = {}

    def get(pp_size):
        if pp_size not in cache:
            out = str(tmp_path_factory.mktemp(f"pp{pp_size}"))
            run_torchrun(WORKER, pp_size, [fixture_path, out, json.dumps(cases(pp_size))], timeout=1500)
            per_rank = read_results(out, pp_size)
            cache[pp_size] = {c["name"]: [r[c["name"]] for r in per_rank] for c in cases(pp_size)}
        return cache[pp_size]
    return get


@pytest.mark.parametrize("pp_size", [2, 3, 4])
def test_gradient_matrix_covering_subset(pp_size, results):
    got = results(pp_size)
    # bf16 in the HF Trainer's order has its own relative bound (test_precision_policy_equals_one_process)
    problems = {c["name"]: p for c in cases(pp_size) if not (c.get("bf16") and c.get("order") != "pipeline")
                and not any(c.get(k) for k in NEGATIVE_CONTROLS) and (p := check_case(c, got[c["name"]]))}
    assert not problems, problems


@pytest.mark.parametrize("pp_size", [2, 3, 4])
def test_closed_executors_hand_their_groups_to_the_next(pp_size, results):
    """Every case closes its executor; each later case's executor runs on the groups the previous one handed on
    (after a failed step, on the fresh groups it moved to), and is exact, as the other tests here check."""
    got = results(pp_size)  # the CP cases run pipelines of their own mesh (test_context_parallel_equals_one_process)
    reused = [[r["reused_groups"] for r in got[c["name"]]] for c in cases(pp_size) if not c.get("cp_size")]
    assert reused[0] == [False] * pp_size and all(r == [True] * pp_size for r in reused[1:]), reused


@pytest.mark.parametrize("case", FAMILY_CASES, ids=[c["name"] for c in FAMILY_CASES])
def test_model_families(case, results):
    """Loss, every gradient and the parameters after 2 AdamW steps equal the unsplit model's; the checkpoint
    reloads with ``from_pretrained`` to the trained parameters, bit for bit, and the one-process logits."""
    per_rank = results(2)[case["name"]]
    problems = check_case(case, per_rank) + (check_reload(per_rank) if case["reload"] else [])
    assert not problems, problems


@pytest.mark.parametrize("case", MOE_CASES, ids=[c["name"] for c in MOE_CASES])
def test_moe_load_balancing_loss_equals_hf(case, results):
    """With ``output_router_logits``, the pipeline's loss holds HF's load-balancing term (``router_aux_loss_coef
    * aux_loss``, transformers' global formula over every layer, the reference's own ``aux_loss``) exactly, in
    the token-normalised order and in the HF Trainer's per-micro order; its gradient reaches every stage's
    routers; the step reports the term. Without the relayed sums the loss is off by the term (about 1e-2 here)."""
    per_rank = results(2)[case["name"]]
    problems = check_case(case, per_rank)
    assert not problems, problems
    aux = per_rank[0]["aux_losses"]
    assert all(a is not None and a > 1e-3 for a in aux) and all(r["aux_losses"] == aux for r in per_rank), aux
    routers = [n for r in per_rank for n in r["names"] if n.endswith("mlp.gate.weight")]
    assert routers and len(routers) == len({n.split(".layers.")[1].split(".")[0] for n in routers}), routers


@pytest.mark.parametrize("case", PACKED_CASES, ids=[c["name"] for c in PACKED_CASES])
def test_packed_step_equals_unpacked(case, results):
    """Packing: each micro-batch (a text-only row next to rows of one and two photos) packed into one sequence
    with no padding trains like the unsplit model on the same rows unpacked and padded: the loss, every gradient
    at 1e-5 + 1e-5 * max|ref| per tensor, and the parameters after 2 AdamW steps. Qwen2.5-VL (M-RoPE per row, the
    text-position row), Qwen3-VL (DeepStack at each row's image tokens), Qwen3.5 (linear attention reset per row),
    LLaVA (1-D RoPE), Gemma 3 (bidirectional image blocks within a row); frozen and trainable towers; SDPA and
    eager attention."""
    per_rank = results(2)[case["name"]]
    problems = check_case(case, per_rank)
    assert not problems, problems


@pytest.mark.parametrize("case", CONTROL_CASES, ids=[c["name"] for c in CONTROL_CASES])
def test_packing_bugs_fail_the_packed_test(case, results):
    """The negative controls: the peers' packing bugs fail :func:`test_packed_step_equals_unpacked`'s check, by
    far more than its tolerance (the loss, a gradient at hundreds of times the per-tensor tolerance)."""
    per_rank = results(2)[case["name"]]
    assert check_case(case, per_rank), "the bug went unnoticed"
    assert max(abs(a - b) for a, b in zip(per_rank[0]["losses"], per_rank[0]["ref_losses"])) > 1e-4
    assert max(r["grad_scaled"] for r in per_rank) > 100


@pytest.mark.parametrize("case", GRADIENT_CONTROLS, ids=[c["name"] for c in GRADIENT_CONTROLS])
def test_gradient_checks_catch_each_weakness(case, results):
    """The gradient negative controls (and the MoE term summed per stage instead of relayed): each wrong gradient
    fails the family check, where the earlier, looser checks (step 0 at 1e-5 + 1e-5 * max|ref| per tensor, the
    parameters after the AdamW steps; a zero-initialised model) let it pass. The cut features: the tower's
    gradients are missing; the zero-initialised Gemma 3: its reference tower gradients are 0; the small tensors:
    more than REL_TOL of their scale; the later steps: the last step's gradients; the last AdamW step skipped at
    lr 5e-5: the last step's updates (the parameters after the steps, under 1e-4 apart, passed the absolute check
    it replaces)."""
    per_rank = results(2)[case["name"]]
    problems = check_case(case, per_rank)
    expect = {"detach_features": "vision_tower", "keep_zero_init": "reference gradient is zero",
              "scale_small": "norm2.weight", "scale_later": "last step", "stage_sums": "losses",
              "skip_last_step": "step 1: the update of"}
    kind = next(k for k in expect if case.get(k))
    assert any(expect[kind] in p for p in problems), problems
    if kind == "stage_sums":  # the MoE term from each stage's own routers: the loss moves by more than 1e-4
        assert max(abs(a - b) for a, b in zip(per_rank[0]["losses"], per_rank[0]["ref_losses"])) > 1e-4
    elif kind == "skip_last_step":  # the first step's updates agree: only the skipped one fails
        assert not any("step 0: the update" in p for p in problems), problems
    if kind not in ("stage_sums", "detach_features"):  # what the old checks saw: a pass
        assert all(r["grad_scaled"] < 1.0 for r in per_rank), [r["grad_scaled_worst"] for r in per_rank]
        assert all(r["param_diff"] < 1e-4 for r in per_rank), [r["param_diff"] for r in per_rank]


@pytest.mark.parametrize("case", DROPOUT_CASES, ids=[c["name"] for c in DROPOUT_CASES])
def test_tower_dropout_is_replayed_exactly(case, results):
    """A tower with dropout 0.5 trains like the one-process model drawing the same masks; the dropout is live
    (the losses differ from the same case without it)."""
    per_rank = results(2)[case["name"]]
    problems = check_case(case, per_rank)
    assert not problems, problems
    plain = results(2)[case["name"].split("-dropout")[0]]
    assert per_rank[0]["ref_losses"] != plain[0]["ref_losses"], "the dropout changed nothing"


@pytest.mark.parametrize("case", PRECISION_CASES, ids=[c["name"] for c in PRECISION_CASES])
def test_precision_policy_equals_one_process(case, results):
    """fp32 master weights with bf16 autocast, and fp32: in the pipeline's order of operations (summed loss, the
    gradients divided once) the loss and every gradient are bitwise the one-process run's. In the HF Trainer's
    order (each micro's loss divided by the step's tokens before its backward) fp32 agrees to 2e-6 (that case
    is family-vl-frozen-T0's first step: test_model_families) and bf16 to
    its rounding of differently scaled gradients: measured 1.0e-2 relative norm on the worst parameter, 6e-9
    relative on the loss (1.2e-2 and 1e-8 with the full Qwen2 vocabulary)."""
    per_rank = results(2)[case["name"]]
    rel = max(r["grad_rel_norm"] for r in per_rank)
    loss_rel = max(abs(a - b) / b for a, b in zip(per_rank[0]["losses"], per_rank[0]["ref_losses"]))
    print(case["name"], "loss relative diff", loss_rel, "worst gradient relative norm diff", rel)
    problems = check_case(case, per_rank)
    if case.get("bf16") and case.get("order") != "pipeline":  # bf16 rounding: a relative bound, not 1e-5
        problems = [p for p in problems if "gradient of" not in p]
        assert rel < 5e-2 and loss_rel < 1e-6, (rel, loss_rel)
    assert not problems, problems
    if case.get("order") == "pipeline":
        for rank, res in enumerate(per_rank):
            assert res["losses"] == res["ref_losses"] and res["max_diff"] == 0.0, (rank, res["worst"],
                                                                                   res["max_diff"])


@pytest.mark.parametrize("case", FILL_CASES, ids=[c["name"] for c in FILL_CASES])
def test_bubble_filling_is_exact(case, results):
    """Placement ``fill`` moves the transposed forwards into the owners' idle time, and with a next step's
    loader into this step's (first, steady and last steps of 3 AdamW steps; 2 accumulated runs); the numerics
    stay exact, and each owner loads each of its micros once per run."""
    per_rank = results(case["pp_size"])[case["name"]]
    assert not check_case(case, per_rank), check_case(case, per_rank)


def test_frozen_tower_never_ships_pixels(results):
    frozen, identity = (results(2)[c["name"]] for c in PIXEL_CASES)
    owner = frozen[1]  # rank 1 owns micros 1 and 3 and ships them to rank 0
    sent, raw = owner["bytes_sent"], owner["owned_bytes"]
    assert not any(k.startswith("GRAPH_SEND/") for k in sent)
    shipped = {k.split("/", 1)[1]: v for k, v in sent.items() if k.startswith("DATA_SEND/")}
    assert "pixel_values" in raw and "pixel_values" not in shipped
    # the M-RoPE positions are computed on the owner's host at load: stage 0 reads them, not the grid
    # and token types they come from
    assert shipped.pop("position_ids") == 3 * raw["input_ids"], "(3, B, L) int64 positions"
    host_only = ("pixel_values", "image_grid_thw", "mm_token_type_ids")
    assert shipped == {k: v for k, v in raw.items() if k not in host_only}, "exactly the raw keys stage 0 reads"
    assert owner["owned_image_tokens"] > 0
    assert sent["FWD_SEND/image_features"] == owner["owned_image_tokens"] * HIDDEN * 4, "one fp32 row per image token"
    # identity (T = 0): only raw data moves, the pixels included, and no features
    shipped = {k.split("/", 1)[1]: v for k, v in identity[1]["bytes_sent"].items() if k.startswith("DATA_SEND/")}
    computed = {k for k in shipped if k == "position_ids" or k.startswith("vision_meta.")}  # on the owner's host
    assert "position_ids" in computed and "vision_meta.cu_seqlens" in computed
    owned = {k: v for k, v in identity[1]["owned_bytes"].items() if k != "mm_token_type_ids"}
    assert {k: v for k, v in shipped.items() if k not in computed} == owned
    assert not any(k.startswith(("FWD_SEND/", "GRAPH_SEND/")) for k in identity[1]["bytes_sent"])


@pytest.mark.parametrize("case", OWNER_CASES, ids=[c["name"] for c in OWNER_CASES])
def test_load_aware_owners_are_exact(case, results):
    """Owners other than ``m % NT`` (LPT over the runs' image tokens, or reversed) give the one-process loss, every
    gradient and the parameters after the AdamW steps; each rank loads exactly the micros the run's owners give
    it; every rank computed the same owners, and they are not ``m % NT``."""
    per_rank = results(case["pp_size"])[case["name"]]
    problems = check_case(case, per_rank)
    assert not problems, problems
    owners = per_rank[0]["owners"]
    assert all(res["owners"] == owners for res in per_rank), [res["owners"] for res in per_rank]
    nt = min(case["pp_size"], case["num_micro"])
    assert any(run != [m % nt for m in range(case["num_micro"])] for run in owners), owners


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c["name"] for c in ERROR_CASES])
def test_failure_on_one_rank_fails_every_rank_then_next_step_is_exact(case, results):
    per_rank = results(4)[case["name"]]
    errors = {res["error"] for res in per_rank}
    assert len(errors) == 1 and None not in errors, f"every rank raises the same first error: {errors}"
    error = errors.pop()
    expected = {"corrupt_owner": ("cannot identify image file", "pipeline rank 2, DATA_LOAD"),
                "mid_step_owner": ("ValueError: ", "image tokens and features differ", "pipeline rank 0, 0F"),
                "bad_micro": ("ValueError: ", "image-token count", "pipeline rank 3, DATA_LOAD3")}
    kind = next(k for k in expected if k in case)
    if case.get("recover") is False:
        expected[kind] = ("image tokens and features differ", "pipeline rank 0, 0F", "cannot be recovered "
                          "in-process", "torchrun --max-restarts")
    assert all(text in error for text in expected[kind]), error
    assert all(res["error_after_s"] < 30 for res in per_rank), [res["error_after_s"] for res in per_rank]
    if kind != "mid_step_owner":  # a bad sample fails every rank before the step's first transfer
        assert all(res["failed_step_sent_bytes"] == 0 for res in per_rank), per_rank
        assert not any(res["failed_step_broke_groups"] for res in per_rank), "a bad sample broke the groups"
    else:  # a failure mid-transfer: gloo recovers on fresh groups; without recovery (NCCL) the executor ends
        assert all(res["failed_step_broke_groups"] for res in per_rank)
        refused = [res.get("next_step_refused", "") for res in per_rank]
        ended = case.get("recover") is False
        assert all(("executor ended" in text) == ended for text in refused), refused
    assert all(res["grads_after_error"] == [] for res in per_rank), "the failed step left gradients behind"
    assert not check_case(case, per_rank), check_case(case, per_rank)


def test_a_bad_row_costs_that_row_not_the_step(results):
    """A row whose image does not decode (a PNG truncated after its header), one of three in a micro-batch of run
    0 and alone in a micro-batch of run 1: both runs train, and the loss and every gradient (accumulated over the
    two runs) equal one process trained on the same micro-batches without those rows, each run normalised by its
    remaining label tokens. The owner (rank 2, then rank 3) dropped the row; every rank counts one bad row per run,
    with the owner's text, and after each run every rank's plan knows the rows that failed on any rank (it leaves
    them out from then on)."""
    case = ROW_CASES[0]
    per_rank = results(4)[case["name"]]
    problems = check_case(case, per_rank)
    assert not problems, problems
    for rank, res in enumerate(per_rank):
        assert [count for count, _ in res["bad_rows"]] == [1, 1], (rank, res["bad_rows"])
        for run, line in enumerate((14, 15)):  # the owner's text: the row's line and PIL's reason
            text = res["bad_rows"][run][1]
            assert text.startswith(f"rows.jsonl:{line} (") and "image file is truncated" in text, res["bad_rows"]
        owner = {0: 2, 1: 3}
        assert [len(d) for d in res["dropped_here"]] == [int(owner[run] == rank) for run in (0, 1)], \
            (rank, res["dropped_here"])
        assert res["failed_rows"] == [[13], [13, 14]], (rank, res["failed_rows"])  # each owner's, on every rank


@pytest.mark.parametrize("case", SWAP_CASES, ids=[c["name"] for c in SWAP_CASES])
def test_activation_swap_is_exact_and_moves_the_activations(case, results):
    """With swap on, the loss, every gradient and the parameters after the steps equal one process's, and every
    swapping rank moved bytes to the host in every step (only rank 0 with ``swap: rank0``)."""
    per_rank = results(case["pp_size"])[case["name"]]
    problems = check_case(case, per_rank)
    assert not problems, problems
    for rank, res in enumerate(per_rank):
        swaps = case["swap"] == "all" or (case["swap"] == "rank0" and rank == 0)
        moved = res["swap_offloaded_bytes"]
        assert all(b > 0 for b in moved) if swaps else all(b == 0 for b in moved), (rank, moved)


@pytest.mark.parametrize("case", ZB_CASES, ids=[c["name"] for c in ZB_CASES])
def test_zero_bubble_is_exact_and_defers_weight_gradients(case, results):
    """With the backward split into ``B`` and ``W``, the loss, every gradient and the parameters after the steps
    equal one process's; every rank that holds a stage whose inputs take a gradient computed weight gradients
    in its ``W`` actions from what its ``B`` kept (not the whole backward in ``B``), and each rank's order has a
    ``W`` for every backward."""
    got = results(case["pp_size"])[case["name"]]
    assert not check_case(case, got)
    for rank, res in enumerate(got):
        order = res["order"]
        assert sum(Action.parse(a).kind is Kind.W for a in order) == case["vpp"] * case["num_micro"], (rank, order)
        splits = rank > 0 or case["vpp"] > 1 or case["preprocess"] == "trainable"
        assert (res["deferred_weights"] > 0) == splits, (rank, res["deferred_weights"])


def test_swapping_zero_groups_changes_nothing_and_swapping_lowers_the_peak(results):
    """The same case with swap off, with swap on but no forward far enough from its backward, and with every
    group swapped: the first two run the same actions and hold the same bytes on every rank; swapping lowers
    every rank's peak of saved bytes on the device."""
    got = results(2)
    every, never, off = (got[SWAP_CASES[i]["name"]] for i in (3, -2, -1))  # vl-identity R2 V2 M4 each
    for rank in range(2):
        assert never[rank]["order"] == off[rank]["order"]
        assert never[rank]["peak_activation_bytes"] == off[rank]["peak_activation_bytes"]
        assert all(a < b for a, b in zip(every[rank]["peak_activation_bytes"], off[rank]["peak_activation_bytes"]))


@pytest.mark.parametrize("pp_size", [3, 4])
def test_every_pair_is_connected_before_the_step_in_one_global_order(pp_size, results):
    """NCCL sets a pair's communicator up at its first send or receive, blocking until both ranks
    make it. Every first use of a (group, peer) in every case (fill, owners, tied weights, failures) is the
    executor's connect prologue, in one global order (tests/test_connect.py proves that order cannot
    deadlock), never a transfer of the schedule."""
    stray = {name: [res["stray_first_uses"] for res in per_rank]
             for name, per_rank in results(pp_size).items() if any(res["stray_first_uses"] for res in per_rank)}
    assert not stray, stray


# ---- what trains by pattern, and video rows (tests/test_freeze.py has the rest) ---------------------------

@pytest.mark.parametrize("case", FREEZE_CASES, ids=[c["name"] for c in FREEZE_CASES])
def test_frozen_by_pattern_equals_one_process(case, results):
    per_rank = results(2)[case["name"]]
    assert check_case(case, per_rank) == []
    trained = sorted(n for res in per_rank for n in res["names"])
    assert trained and trained == per_rank[0]["ref_names"]  # the same parameters train on both sides


@pytest.mark.parametrize("case", VIDEO_CASES, ids=[c["name"] for c in VIDEO_CASES])
def test_video_rows_equal_one_process(case, results):
    """Micro-batches mixing images and videos (Qwen2.5-VL, Qwen2-VL, Qwen3-VL, Qwen3.5, LLaVA-OneVision;
    GLM-4.1V and GLM-4.6V with images and videos in different micro-batches; frozen, trainable, identity and
    ``freeze_vit`` towers; padded and packed): the loss and every gradient, per tensor, as the unsplit model's."""
    per_rank = results(2)[case["name"]]
    assert check_case(case, per_rank) == []
    tower = ("model.visual.", "model.vision_tower.", "model.multi_modal_projector.")  # P's vision part
    tower_trains = any(n.startswith(tower) for res in per_rank for n in res["names"])
    assert tower_trains == (case["preprocess"] == "trainable")  # the tower's gradients were among those checked


def test_the_video_time_matters_to_the_video_check(results):
    """The negative control: the host's ``get_rope_index`` without Qwen2.5-VL's ``second_per_grid_ts`` (the videos'
    temporal positions spaced as at one second a temporal patch) fails the check of
    :func:`test_video_rows_equal_one_process`, attention weights' gradients off by far more than the tolerance."""
    per_rank = results(2)[VIDEO_CONTROL["name"]]
    assert check_case(VIDEO_CONTROL, per_rank), "the wrong temporal positions went unnoticed"
    worst = max(diff / top for res in per_rank for top, diff in res["grad_stats"].values() if top > 0)
    assert worst > 100 * REL_TOL, worst


def test_the_video_deepstack_order_matters_to_the_video_check(results):
    """The second negative control: Qwen3-VL's video DeepStack features joined after the images' instead of in the
    tokens' order (a micro holds a row with a video before a row with an image) fails the check."""
    per_rank = results(2)[DEEPSTACK_CONTROL["name"]]
    assert check_case(DEEPSTACK_CONTROL, per_rank), "video DeepStack features out of order went unnoticed"


def test_the_altup_stream_order_matters_to_the_gemma3n_check(results):
    """The negative control of Gemma 3n's language model: its AltUp streams 1 and 2 swapped where a stage hands its
    streams ``(4, B, L, H)`` on fails the family check (``family-gemma3n_text-trainable-T1`` passes it)."""
    per_rank = results(2)[ALTUP_CONTROL["name"]]
    problems = check_case(ALTUP_CONTROL, per_rank)
    assert any("step 0" in p or "loss" in p for p in problems), problems


@pytest.mark.parametrize("case", CP_CASES, ids=[c["name"] for c in CP_CASES])
def test_context_parallel_equals_one_process(case, results):
    """cp 2 x pp 2 (4 processes): each micro-batch's sequence split over the 2 CP ranks of each stage (Ulysses
    attention), masks, rotary embeddings and shifted labels built on the whole sequence; the loss and every
    gradient of 2 AdamW steps, and every update, equal one process's; both CP pipelines hold the same parameters,
    checked each against the reference."""
    per_rank = results(4)[case["name"]]
    problems = check_case(case, per_rank)
    assert not problems, problems
    assert len(per_rank) == 4 and per_rank[0]["names"] == per_rank[2]["names"] != per_rank[1]["names"]


def test_positions_after_the_split_fail_the_context_parallel_check(results):
    """The negative control: each CP rank's rotary positions counted from 0 on its own slice (as if computed after
    the split) fails the check the CP cases pass, gradients off by far more than the tolerance."""
    per_rank = results(4)[CP_CONTROL["name"]]
    assert check_case(CP_CONTROL, per_rank), "positions computed after the split went unnoticed"
    worst = max(diff / top for res in per_rank for top, diff in res["grad_stats"].values() if top > 0)
    assert worst > 100 * REL_TOL, worst


def test_router_sums_of_one_slice_fail_the_context_parallel_check(results):
    """The router negative control: each CP rank's MoE load-balancing term from its own slice's router sums (not
    summed over the CP group) fails the check the MoE CP case passes: the routers' updates differ."""
    per_rank = results(4)[ROUTER_CONTROL["name"]]
    problems = check_case(ROUTER_CONTROL, per_rank)
    assert any("mlp.gate.weight" in p for p in problems), problems


def test_a_packed_mask_built_per_slice_fails_the_context_parallel_check(results):
    """The packed negative control: each CP rank's packed mask built from the rows its own slice sees (the row that
    crosses the split, in every micro of the pool, cut in two there) fails the check the packed CP case passes."""
    per_rank = results(4)[PACKED_CONTROL["name"]]
    problems = check_case(PACKED_CONTROL, per_rank)
    assert any("gradient" in p for p in problems), problems


def test_deepstack_rows_off_the_slice_fail_the_context_parallel_check(results):
    """The DeepStack negative control: each CP rank adds the DeepStack feature rows as if its slice began the
    sequence (the second rank adds the first slice's image rows at its own tokens and drops its own) fails the check
    the Qwen3-VL CP case passes: the loss and the gradients differ."""
    per_rank = results(4)[LAYER_INPUT_CONTROL["name"]]
    problems = check_case(LAYER_INPUT_CONTROL, per_rank)
    assert any("losses" in p for p in problems) and any("gradient" in p for p in problems), problems


def test_tower_gradients_not_summed_over_cp_fail_the_context_parallel_check(results):
    """The tower's negative control: the divided tower's gather hands each CP rank back only the gradient its own
    stages gave its own feature rows (not summed over the CP group, so a feature whose token lies in the other
    rank's slice gets none) and fails the check the video CP case passes: the tower's gradients differ."""
    per_rank = results(4)[TOWER_CONTROL["name"]]
    problems = check_case(TOWER_CONTROL, per_rank)
    assert any("model.visual." in p for p in problems), problems


def test_a_per_micro_mean_over_the_slice_fails_the_context_parallel_check(results):
    """The per-micro loss's negative control: each CP rank divides its slice's summed token loss by its own
    slice's label tokens instead of the whole micro's, and fails the check the per-micro CP cases pass: the loss
    (about twice one process's on these padded text rows) and the gradients differ."""
    per_rank = results(4)[LOSS_CONTROL["name"]]
    problems = check_case(LOSS_CONTROL, per_rank)
    assert any("losses" in p for p in problems) and any("gradient" in p for p in problems), problems
