"""FSDP2 under ``train.bf16``: the matmul modules are gathered in bf16 and reduced in fp32, the rest
of each chunk gathered in fp32, and the gradients equal one process's under autocast bit for bit
(:mod:`mpipe_hf.runtime.data_parallel` says why). The worker also runs an fp32-gathering engine,
which gathers every module in fp32.

Why the fp32 engine runs only in per-micro autocast regions in the worker: in one autocast region over the whole
step, autocast's cached bf16 cast of an fp32 FSDP2 weight carries micro 0's autograd sequence number, so in the
chunk's last backward FSDP2's post-backward hook on the chunk's input (a newer node) runs first and
reduce-scatters without that micro's gradient of the weight (measured: a gradient off by 1.6 on the worker's
model). The bf16 engine leaves autocast no FSDP2 weight to cast in these models, and is exact either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from mpipe_hf.runtime.data_parallel import bf16_units

WORKER = os.path.join(os.path.dirname(__file__), "dist", "fsdp_bf16_worker.py")


def test_bf16_units_are_the_matmuls_autocast_casts():
    """Every attention and MLP ``nn.Linear`` and a ``Conv1d``; not the embedding, the norms, an LM head tied to
    the embedding (the embedding uses the weight in fp32), nor an ``nn.Linear`` subclass (MultiheadAttention's
    ``out_proj``, whose forward never runs), nor a LoRA adapter's layers."""
    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    extra = nn.ModuleDict({"conv": nn.Conv1d(4, 4, 3), "mha": nn.MultiheadAttention(4, 1), "norm": nn.LayerNorm(4)})
    units = bf16_units({0: model, 1: extra})
    names = {n for m in (model, extra) for n, sub in m.named_modules() if any(sub is u for u in units)}
    layer = {f"model.layers.{i}.{part}" for i in range(2) for part in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")}
    assert names == layer | {"conv"}, names ^ (layer | {"conv"})
    untied = Qwen2ForCausalLM(Qwen2Config(**{**config.to_dict(), "tie_word_embeddings": False}))
    assert any(u is untied.lm_head for u in bf16_units({0: untied}))
    # LoRA: the adapted layers' frozen base layers, not the adapters (PEFT casts their input to lora_A's dtype)
    from peft import LoraConfig, get_peft_model
    lora = get_peft_model(untied, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], lora_dropout=0.1))
    names = {n for n, sub in lora.named_modules() if any(sub is u for u in bf16_units({0: lora}))}
    assert {n for n in names if "q_proj" in n} == {f"base_model.model.model.layers.{i}.self_attn.q_proj.base_layer"
                                                   for i in range(2)}, names
    assert len(names) == 2 * 7 + 1  # every layer's seven projections and the LM head


def test_fsdp_bf16_gathers_in_bf16_reduces_in_fp32_and_equals_one_process(tmp_path):
    """2 replicas (torchrun, gloo) of a Qwen2 chunk and a Conv1d/LayerNorm/Linear head, 3 micro-batches each,
    2 SGD steps: FSDP2 under bf16 gathers the Linear and Conv weights in bf16 (their forwards see bf16 weights)
    and the embedding and norms in fp32, reduce-scatters only fp32, and gathers 43% fewer bytes than the fp32
    engine; its losses and gradients equal one process under autocast exactly, with per-micro or step-wide
    autocast regions, with activation checkpointing and with a LoRA adapter with dropout (where the adapters'
    own layers gathered in bf16 would not be exact: measured 0.26), as the fp32 engine's do."""
    out = tmp_path / "fsdp.json"
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc_per_node=2", WORKER,
           str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = json.loads(out.read_text())
    print(json.dumps(runs, indent=1))
    for name, run in runs.items():
        assert run["loss_diff"] == 0.0 and run["grad_diff"] == [0.0, 0.0], (name, run)
        assert run["reduce_scatter"] == ["torch.float32"], (name, run)
    assert runs["fp32"]["all_gather"] == ["torch.float32"] and runs["fp32"]["weight_dtypes"] == ["torch.float32"]
    for name in ("bf16", "bf16_step", "bf16_ac", "bf16_lora"):
        assert runs[name]["all_gather"] == ["torch.bfloat16", "torch.float32"], runs[name]
    for name in ("bf16", "bf16_step", "bf16_ac"):
        assert runs[name]["weight_dtypes"] == ["torch.bfloat16"], runs[name]
        assert runs[name]["gathered_bytes"] < 0.6 * runs["fp32"]["gathered_bytes"], runs[name]
    # LoRA: the frozen base layers gathered in bf16, the adapters in fp32 (their input cast is PEFT's)
    assert runs["bf16_lora"]["weight_dtypes"] == ["torch.bfloat16", "torch.float32"], runs["bf16_lora"]


@pytest.mark.skipif(os.environ.get("MPIPE_HF_DP_GRID") != "full", reason="the full data-parallel grid only")
def test_dp2_pp2_fsdp_bf16_equals_the_replicas_bf16(demo, tmp_path):
    """``mpipe-hf train`` at ``dp = 2 x pp = 2`` under ``bf16`` (frozen tower): FSDP2 (bf16 gathers, fp32
    reduction) against the replicas' fp32 all-reduce, whose replicas run autocast as one process does. The first
    step's loss is the same bit for bit and its gradient norm the same to the rounding of its sum over shards in
    another order (measured 2.6e-6 relative; FSDP2 gathering in fp32 under one autocast region per step gave 6.516
    against 7.066: a micro-batch's gradients lost). Later steps differ by bf16's rounding of AdamW's updates."""
    sys.path.insert(0, os.path.dirname(__file__))
    from train_common import write_recipe
    rows = {}
    for shard in (True, False):
        out = str(tmp_path / f"shard{shard}")
        recipe = write_recipe(demo, tmp_path / f"shard{shard}.yaml", out, dp_size=2, dp_shard=shard,
                              preprocess="frozen", bf16=True, max_steps=2)
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train", recipe],
                              capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows[shard] = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    first, replicas = rows[True][0], rows[False][0]
    assert first["loss"] == replicas["loss"], (first, replicas)
    assert abs(first["grad_norm"] - replicas["grad_norm"]) <= 5e-6 * replicas["grad_norm"], (first, replicas)
    for a, b in zip(rows[True], rows[False]):
        assert abs(a["loss"] - b["loss"]) <= 3e-5 * b["loss"], (a, b)


DP_WORKER = os.path.join(os.path.dirname(__file__), "dist", "dp_bf16_worker.py")


def dp_cases(demo: str, out: str) -> list[dict]:
    """``dp = 2`` x ``pp = 2`` (``V = 2``, ``M = 3``), FSDP2 in bf16: LoRA on a MoE model's attention and fused
    experts, the MoE model trained whole (fused experts, router, load-balancing term), and a decoder-only LM
    trained whole with its head tied to the embedding (the pair split over ranks 0 and 1); that LM at ``pp = 1`` x
    ``dp = 4`` too, the tied weight in two chunks of one rank, and in ``P`` and a chunk: one parameter that FSDP2
    leaves whole (sharded once per unit, the embedding's gradient was 0.17 off on 0.17)."""
    parallel = {"pp_size": 2, "vpp": 2, "num_micro": 3, "dp_size": 2, "dp_shard": True, "timeout_s": 120,
                "mesh_order": "pp_inner"}
    train = {"bf16": True, "output_dir": out, "seed": 4}
    moe = {"model": {"config": os.path.join(demo, "configs", "qwen3_vl_moe.json"),
                     "tokenizer": os.path.join(demo, "model")},
           "data": {"path": os.path.join(demo, "data", "train.jsonl"), "micro_batch_size": 1, "min_pixels": 4096,
                    "max_pixels": 16384},
           "parallel": {**parallel, "preprocess": "frozen"}, "train": train}
    tied = {"model": {"config": os.path.join(demo, "configs", "qwen3.json"), "tokenizer": os.path.join(demo, "model")},
            "data": {"path": os.path.join(demo, "data", "text.jsonl"), "micro_batch_size": 2},
            "parallel": {**parallel, "preprocess": "identity"}, "train": train}
    lora = {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
            "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], "init_lora_weights": False}
    # one pipeline rank, two chunks (vpp 2) over dp 4: the embedding in chunk 0 and the head tied to it in chunk 1,
    # one weight of two FSDP2 units (FSDP2 would shard it twice: two parameters, each with half the gradient)
    tied_pp1 = {**tied, "parallel": {**tied["parallel"], "pp_size": 1, "dp_size": 4}}
    # and one chunk (vpp 1) with the embedding in a trainable P, which FSDP2 does not wrap, the head in the chunk
    tied_p = {**tied, "parallel": {**tied_pp1["parallel"], "vpp": 1, "preprocess": "trainable", "text_layers": 1}}
    return [dict(name="moe-lora", recipe={**moe, "lora": lora}), dict(name="moe-full", recipe=moe),
            dict(name="tied-full", recipe=tied), dict(name="tied-pp1-vpp2", recipe=tied_pp1),
            dict(name="tied-pp1-in-p", recipe=tied_p)]


def test_dp2_pp2_fsdp_bf16_through_the_executor_equals_one_process(demo, tmp_path):
    """FSDP2 + bf16 through ``PipelineRun`` and the executor (``dp = 2``, ``pp = 2``, ``M =
    3``, one step) against the unsplit model on one process under bf16 autocast, in the
    pipeline's order of sums: every trained tensor's gradient within ``1e-5 + 1e-5 * max|ref|`` (the order of the
    fp32 sums over the replicas differs), the losses to 1e-5. Before the fix the executor held a disabled
    autocast region over the step: autocast counts it as nesting, so the per-call regions never cleared their
    cast cache, and the last micro-batch's gradient of every fp32 weight autocast casts (LoRA adapters, fused
    experts, the tied head) was missing from the reduce-scatter."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
    from common import read_results, run_torchrun
    out = str(tmp_path)
    run_torchrun(DP_WORKER, 4, [out, json.dumps(dp_cases(demo, out))], timeout=900)
    for rank, results in enumerate(read_results(out, 4)):
        for name, res in results.items():
            assert res["names"], (rank, name)  # every rank trains something in these cases
            for a, b in zip(res["losses"], res["ref_losses"]):
                assert abs(a - b) < 1e-5, (rank, name, res["losses"], res["ref_losses"])
            if name.startswith("tied-pp1"):  # the tie kept: one parameter, not the head as a second DTensor
                assert "model.embed_tokens.weight" in res["names"] and "lm_head.weight" not in res["names"], res
            for step, g in enumerate(res["grads"]):
                assert not g["missing"], (rank, name, step, g["missing"][:5])
                assert g["scaled"] <= 1.0, (rank, name, step, g)
                assert g["ref_max"] > 1e-3, (rank, name, step, g)  # gradients far above the tolerance


# Context parallelism under FSDP2 and bf16: each CP rank's matmul weight gradient is one bf16 matmul over its slice of
# the sequence, rounded to bf16 there, where one process rounds one matmul over the whole sequence: one bf16
# rounding over a different sum, as an expert's under expert parallelism (tests/test_ep.py), held to the same
# 2^-7 of each tensor's max|ref| (measured 6.1e-3). Every other gradient is an fp32 sum, at the FSDP2 tolerance.
CP_BF16_REL = 2 ** -7


def cp_cases(demo: str, out: str) -> list[dict]:
    """``cp 2 x pp 2 x dp 2`` (8 processes), FSDP2 in bf16 over the flattened ``dp x cp`` ranks, the demo
    Qwen2.5-VL with a frozen tower, 2 steps of 2 micro-batches per replica; and its negative control, FSDP2 over
    ``dp`` alone (the CP ranks' gradients not summed), one step."""
    recipe = {"model": os.path.join(demo, "model"),
              "data": {"path": os.path.join(demo, "data", "train.jsonl"), "micro_batch_size": 1, "min_pixels": 3136,
                       "max_pixels": 12544},
              "parallel": {"pp_size": 2, "vpp": 1, "num_micro": 2, "dp_size": 2, "cp_size": 2, "dp_shard": True,
                           "timeout_s": 120, "mesh_order": "pp_inner", "preprocess": "frozen"},
              "train": {"bf16": True, "output_dir": out, "seed": 4}}
    return [dict(name="cp2-dp2-vl", recipe=recipe, steps=2, eval_micros=4),
            dict(name="cp2-dp2-vl-unsummed", recipe=recipe, steps=1, cp_unsummed=True)]


def cp_worst(res: dict) -> list[float]:
    """Per step, the worst gradient in units of its tolerance: ``CP_BF16_REL * max|ref|`` for the parameters of
    the modules autocast runs in bf16, ``1e-5 + 1e-5 * max|ref|`` for the rest."""
    bf16 = set(res["bf16_params"])
    return [max(diff / (CP_BF16_REL * top if name in bf16 else 1e-5 + 1e-5 * top)
                for name, (diff, top) in step["tensors"].items()) for step in res["grads"]]


def test_cp2_pp2_dp2_fsdp_bf16_equals_one_process(demo, tmp_path):
    """Context parallelism with FSDP2 and bf16 through ``PipelineRun`` (``cp 2 x pp 2 x dp 2``, 8 processes):
    FSDP2 shards over the 4 ``dp x cp`` ranks of each stage, and the loss and every trained tensor's gradient at
    both steps equal the unsplit model's on one process under bf16 autocast (the same policy), the loss within
    1e-5 (measured: the same bits) and each gradient within its tolerance (:func:`cp_worst`; measured 0.78 of
    it). The negative control, the CP ranks' gradients not summed, fails by more than 100 times. An evaluation of
    4 micro-batches at the same weights (each replica's CP group splitting its 2, the slices' sums added over
    ``dp x cp``) equals the unsplit model's forward: the same label tokens, the loss within 1e-5 relative."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
    from common import read_results, run_torchrun
    out = str(tmp_path)
    run_torchrun(DP_WORKER, 8, [out, json.dumps(cp_cases(demo, out))], timeout=900)
    for rank, results in enumerate(read_results(out, 8)):
        res, control = results["cp2-dp2-vl"], results["cp2-dp2-vl-unsummed"]
        assert res["bf16_units"] and res["reduction_size"] == 4 and res["bf16_params"], (rank, res["reduction_size"])
        assert len(res["losses"]) == 2 and all(abs(a - b) < 1e-5 for a, b in zip(res["losses"], res["ref_losses"]))
        assert all(not g["missing"] for g in res["grads"]), rank
        assert max(cp_worst(res)) <= 1.0, (rank, cp_worst(res))
        assert control["reduction_size"] == 2 and min(cp_worst(control)) > 100, (rank, cp_worst(control))
        (loss, tokens), (ref_loss, ref_tokens) = res["eval"], res["ref_eval"]
        assert tokens == ref_tokens and abs(loss - ref_loss) < 1e-5 * ref_loss, (rank, res["eval"], res["ref_eval"])


def test_a_step_inside_the_callers_autocast_region_is_refused(world):
    """A caller's autocast region, enabled or disabled, would nest the step's own regions and keep their casts
    past them (under FSDP2, a loss of gradient): the executor's step and its evaluation refuse it, naming
    the policy."""
    import torch
    from mpipe_hf.runtime import PipelineExecutor, Preprocess
    from mpipe_hf.schedule import ScheduleConfig
    stages = {0: nn.Linear(2, 2), 1: nn.Linear(2, 2)}
    executor = PipelineExecutor(ScheduleConfig(1, 2, 1, "identity"), 0, stages, Preprocess(None, (), ("x",)), world,
                                torch.device("cpu"), [p for m in stages.values() for p in m.parameters()])
    for enabled in (True, False):
        with torch.autocast("cpu", torch.bfloat16, enabled=enabled):
            with pytest.raises(ValueError, match="inside a torch.autocast region.*train.bf16"):
                executor.step(lambda m: {"x": torch.ones(1, 2)})
            with pytest.raises(ValueError, match="inside a torch.autocast region.*train.bf16"):  # an evaluation too
                executor.evaluate(lambda m: {"x": torch.ones(1, 2)})
    executor.close()
