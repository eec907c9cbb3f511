"""Expert parallelism under the pipeline (issue 40): ``pp = 2`` x ``ep = 2`` on 4 gloo processes
(``tests/dist/ep_worker.py``, one torchrun for every case) against the unsplit model on one process, for a tiny
Qwen3-VL-MoE, a tiny Qwen3.5-MoE (shared expert) and a tiny GLM-4.5V (a dense first layer, a shared expert); and the checks made before any collective."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import collator, make_ragged_pool, read_results, run_torchrun  # noqa: E402
from matrix import strict_grad_problems  # noqa: E402

from mpipe_hf.data import qwen2_tokenizer  # noqa: E402
from mpipe_hf.models import tiny  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "dist", "ep_worker.py")
LOSS_ATOL = 1e-5
CASES = [
    dict(name="qwen3_vl_moe-trainable-T0", family="qwen3_vl_moe", preprocess="trainable", text_layers=0),
    dict(name="qwen3_5_moe-frozen-T0", family="qwen3_5_moe", preprocess="frozen", text_layers=0),
    dict(name="qwen3_vl_moe-trainable-T1-fsdp2", family="qwen3_vl_moe", preprocess="trainable", text_layers=1,
         dp_shard=True),
    dict(name="qwen3_5_moe-trainable-T1", family="qwen3_5_moe", preprocess="trainable", text_layers=1),
    dict(name="qwen3_vl_moe-frozen-bf16", family="qwen3_vl_moe", preprocess="frozen", text_layers=0, bf16=True),
    dict(name="glm4v_moe-trainable-T1", family="glm4v_moe", preprocess="trainable", text_layers=1),
    dict(name="qwen3_vl_moe-dp-experts", family="qwen3_vl_moe", preprocess="frozen", text_layers=0,
         dp_experts=True),
]
for c in CASES:
    c.update(data=f"ragged-{c['family']}", vpp=1, num_micro=2, steps=2)


def build_fixture(path: str) -> None:
    import torch
    tok = qwen2_tokenizer(5120)
    configs = {"qwen3_vl_moe": tiny.tiny_qwen3_vl_moe_config(tok, num_layers=4),
               "qwen3_5_moe": tiny.tiny_qwen3_5_config(tok, num_layers=4, moe=True),
               "glm4v_moe": tiny.tiny_glm4v_config(tok, num_layers=4, moe=True)}
    pools = {f"ragged-{k}": make_ragged_pool(collator(c, tok)) for k, c in configs.items()}
    torch.save({"configs": {k: c.to_dict() for k, c in configs.items()}, "pools": pools}, path)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ep"))
    fixture = os.path.join(out, "fixture.pt")
    build_fixture(fixture)
    run_torchrun(WORKER, 4, [fixture, out, json.dumps(CASES)], timeout=600)
    return read_results(out, 4)


def problems(res: dict) -> list[str]:
    out = []
    if max(abs(a - b) for a, b in zip(res["losses"], res["ref_losses"])) >= LOSS_ATOL:
        out.append(f"losses {res['losses']} vs {res['ref_losses']}")
    out += [f"step 0: {p}" for p in strict_grad_problems(res["first"]["grad_stats"])]
    out += [f"last step: {p}" for p in strict_grad_problems(res["last"]["grad_stats"])]
    if res["param_diff"] >= 1e-4:
        out.append(f"weights after the AdamW steps differ by {res['param_diff']:.3g}")
    return out


@pytest.mark.parametrize("case", [c for c in CASES if not c.get("dp_experts")], ids=lambda c: c["name"])
def test_pp2_ep2_equals_one_process(case, results):
    per_rank = [r[case["name"]] for r in results]
    for rank, res in enumerate(per_rank):
        assert not problems(res), (rank, problems(res))
        assert res["experts"], rank  # every rank holds MoE layers
        assert res["exchanges"] > 0 and res["rows_from_peer"] > 0, res  # tokens crossed the EP group
        for name, shape in res["held"].items():  # E / ep experts of each fused tensor, never all E
            assert shape[0] * 2 == res["fused"][name][0] and shape[1:] == res["fused"][name][1:], (name, shape)
    print({case["name"]: [r["wall_s"] for r in per_rank]})


def test_expert_gradients_summed_over_dp_fail(results):
    """The negative control: the expert shards' gradients all-reduced over ``dp`` as if replicated."""
    per_rank = [r["qwen3_vl_moe-dp-experts"] for r in results]
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
    moe = tiny.tiny_qwen3_vl_moe_config(tok, num_layers=2)  # 4 experts
    check_expert_parallel(moe, 2)
    with pytest.raises(ValueError, match="must divide the model's 4 experts"):
        check_expert_parallel(moe, 8)
    with pytest.raises(ValueError, match="has none"):
        check_expert_parallel(tiny.tiny_qwen3_5_config(tok, num_layers=4), 2)  # dense: no EP plan
    with pytest.raises(ValueError, match="data.packing"):
        check_expert_parallel(moe, 2, packed=True)
    with pytest.raises(ValueError, match="zero_bubble"):
        check_expert_parallel(moe, 2, zero_bubble=True)
    with pytest.raises(ValueError, match="target_parameters"):
        check_expert_parallel(moe, 2, adapter=LoraConfig(target_modules=["q_proj"],
                                                         target_parameters=["mlp.experts.gate_up_proj"]))
    check_expert_parallel(moe, 2, adapter=LoraConfig(target_modules=["q_proj"], target_parameters=["mlp.gate.weight"]))
