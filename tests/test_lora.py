"""LoRA under the pipeline: the adapter is put in with peft before the split, and the pipelined run
equals the same ``PeftModel`` trained on one process.

- ``tests/dist/lora_worker.py`` (one torchrun, R = 2): every step's loss, global grad norm and every adapter
  gradient (fp32, atol 1e-5) over 3 AdamW steps, and the adapter after them, for Qwen2.5-VL with a frozen tower
  and decoder LoRA (clipping that clips), LoRA in the tower with ``modules_to_save`` and owner-backward, decoder
  layers in ``P`` (``text_layers``), a rank that trains nothing (tower-only LoRA), and a decoder-only Qwen2 built
  from its config; the adapter saved in PEFT's format reloads with ``PeftModel.from_pretrained`` and the merged
  weights with ``from_pretrained``, both to the trained model's logits; with ``lora_dropout > 0`` two runs from
  the same seed are identical.
- ``recipes/qwen2_5_vl_lora.yaml`` through ``mpipe-hf train``: the shipped recipe trains, its losses equal the
  one-process ``PeftModel``'s, and its adapter and merged outputs reload to the same logits.
- Bad ``lora`` values and adapters the split would freeze fail before any process starts.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import read_results, run_torchrun  # noqa: E402
from matrix import strict_grad_problems  # noqa: E402

from mpipe_hf.train.recipe import load_recipe, parse_recipe  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "dist", "lora_worker.py")
RUNS_WORKER = os.path.join(ROOT, "tests", "dist", "recipe_runs_worker.py")
DECODER_ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]  # Qwen2.5-VL's tower names its attention qkv, proj
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]  # fused (E, out, in) nn.Parameters, not nn.Linear
# 2 steps: by step 3 the adapted routers pick other experts for near-tied tokens on float noise (grad norms then
# differ by 3e-5, while steps 1 and 2 agree to 1e-6). The seed matters for the same reason: peft 0.22 draws the
# adapters otherwise, and at seed 4 a near tie falls in step 2 (its norm 1.4e-5 off); seeds 5 to 7 agree to 6e-7
# under peft 0.21 and 0.22
MOE_STEPS = 2


def vl_recipe(demo, out, parallel, lora, **train):
    return {"model": os.path.join(demo, "model"),
            "data": {"path": os.path.join(demo, "data", "train.jsonl"), "micro_batch_size": 1},
            "parallel": {"pp_size": 2, "vpp": 2, "num_micro": 4, "timeout_s": 120, **parallel},
            "train": {"learning_rate": 2e-3, "adam_epsilon": 1e-6, "weight_decay": 0.01, "warmup_steps": 1,
                      "output_dir": out, "seed": 3, **train},
            "lora": lora}


def qwen3_checkpoint(demo, out):
    """A checkpoint of the demo's Qwen3 config (tied embeddings), written by ``save_pretrained``."""
    from transformers import AutoConfig, AutoModelForCausalLM
    path = os.path.join(out, "qwen3-checkpoint")
    if not os.path.isdir(path):
        torch.manual_seed(11)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(os.path.join(demo, "configs", "qwen3.json"))
                                         ).save_pretrained(path)
    return path


def cases(demo, out):
    tied = {"model": {"name_or_path": qwen3_checkpoint(demo, out), "tokenizer": os.path.join(demo, "model")},
            "data": {"path": os.path.join(demo, "data", "text.jsonl"), "micro_batch_size": 2},
            "parallel": {"pp_size": 2, "vpp": 2, "num_micro": 4, "preprocess": "trainable", "text_layers": 1,
                         "timeout_s": 120},
            "train": {"learning_rate": 2e-3, "adam_epsilon": 1e-6, "output_dir": out, "seed": 2},
            "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "gate_proj"],
                     "init_lora_weights": False}}
    text = {"model": {"config": os.path.join(demo, "configs", "qwen3.json"), "tokenizer": os.path.join(demo, "model")},
            "data": {"path": os.path.join(demo, "data", "text.jsonl"), "micro_batch_size": 2},
            "parallel": {"pp_size": 2, "vpp": 2, "num_micro": 4, "preprocess": "identity", "timeout_s": 120},
            "train": {"learning_rate": 2e-3, "adam_epsilon": 1e-6, "output_dir": out, "seed": 5},
            "lora": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "init_lora_weights": False}}
    moe = {"model": {"config": os.path.join(demo, "configs", "qwen3_vl_moe.json"),
                     "tokenizer": os.path.join(demo, "model")},
           "data": {"path": os.path.join(demo, "data", "train.jsonl"), "micro_batch_size": 1, "min_pixels": 4096,
                    "max_pixels": 16384},
           "parallel": {"pp_size": 2, "vpp": 2, "num_micro": 4, "preprocess": "frozen", "timeout_s": 120},
           "train": {"learning_rate": 1e-3, "adam_epsilon": 1e-4, "output_dir": out, "seed": 5},
           "lora": {"r": 2, "lora_alpha": 4, "target_modules": DECODER_ATTENTION,
                    "target_parameters": EXPERTS + ["mlp.gate.weight"], "init_lora_weights": False}}
    return [
        # Qwen3-VL-MoE from its config: LoRA on the attention (target_modules), on the fused experts and the
        # router (target_parameters, peft's ParamWrapper); the load-balancing loss flows through the adapted router
        dict(name="moe-experts", reload=True, steps=MOE_STEPS, recipe=moe),
        # frozen tower, LoRA on the decoder's attention; clipping that clips (max_grad_norm 0.05)
        dict(name="vl-frozen-decoder", reload=True, recipe=vl_recipe(
            demo, out, {"preprocess": "frozen"}, {"r": 8, "lora_alpha": 16, "target_modules": DECODER_ATTENTION,
                                                  "init_lora_weights": False}, max_grad_norm=0.05)),
        # LoRA in the tower and the decoder, the merger trained whole; P trained by its owners' backward
        dict(name="vl-tower-owner-backward", reload=True, recipe=vl_recipe(
            demo, out, {"preprocess": "trainable", "owner_backward": True, "vpp": 1},
            {"r": 4, "lora_alpha": 8, "target_modules": r".*\.(qkv|q_proj|v_proj)",
             "modules_to_save": ["model.visual.merger"], "init_lora_weights": False})),
        # the tower's adapters frozen by freeze_vit, the merger trained whole, the decoder's adapters
        dict(name="vl-freeze-vit", recipe=vl_recipe(
            demo, out, {"preprocess": "trainable"},
            {"r": 4, "lora_alpha": 8, "target_modules": r".*\.(qkv|q_proj|v_proj)",
             "modules_to_save": ["model.visual.merger"], "init_lora_weights": False}, freeze_vit=True)),
        # decoder layer 0 in P with the tower (text_layers 1): its adapters train in P
        dict(name="vl-text-layers", recipe=vl_recipe(
            demo, out, {"preprocess": "trainable", "text_layers": 1, "overflow": "min"},
            {"r": 4, "lora_alpha": 4, "use_rslora": True, "target_modules": DECODER_ATTENTION,
             "init_lora_weights": "gaussian"})),
        # LoRA in the tower only: rank 1's stages have no trainable parameter and no optimizer
        dict(name="vl-tower-only", recipe=vl_recipe(
            demo, out, {"preprocess": "trainable"}, {"r": 4, "target_modules": r".*visual.*\.qkv",
                                                     "init_lora_weights": False})),
        # a decoder-only LM (tied embeddings), built from its config and the seed, LoRA on every linear layer
        dict(name="qwen3-from-config", reload=True, recipe=text),
        # the same family from a checkpoint (the tied pair split over ranks 0 and 1), layer 0 in a trainable P
        dict(name="qwen3-checkpoint-tied", reload=True, recipe=tied),
        # dropout on the adapter: two runs from the same seed are bitwise the same
        dict(name="vl-dropout-repeat", repeat=True, recipe=vl_recipe(
            demo, out, {"preprocess": "frozen"}, {"r": 8, "lora_dropout": 0.3, "target_modules": DECODER_ATTENTION,
                                                  "init_lora_weights": False})),
    ]


@pytest.fixture(scope="module")
def results(demo, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("lora"))
    run_torchrun(WORKER, 2, [out, json.dumps(cases(demo, out))], timeout=1500)
    return read_results(out, 2)


@pytest.mark.parametrize("name", ["vl-frozen-decoder", "vl-tower-owner-backward", "vl-freeze-vit", "vl-text-layers",
                                  "vl-tower-only", "qwen3-from-config", "qwen3-checkpoint-tied", "moe-experts"])
def test_pipelined_lora_equals_one_process_peft_model(results, name):
    """Every step's loss and grad norm, every adapter gradient of every step (atol 1e-5; at the last step each
    tensor non-zero and within the strict per-tensor bound, :func:`matrix.strict_grad_problems`) and the adapter
    after 3 AdamW steps (``MOE_STEPS`` for the MoE case) equal the unsplit PeftModel's; no frozen base weight has a
    gradient, and only adapter tensors (and modules_to_save copies) train."""
    for rank, res in enumerate(results):
        r = res[name]
        assert len(r["losses"]) == (MOE_STEPS if name == "moe-experts" else 3) and r["ref_has"], r
        for got, want in zip(r["losses"], r["ref_losses"]):
            assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (rank, r["losses"], r["ref_losses"])
        for got, want in zip(r["norms"], r["ref_norms"]):
            assert abs(got - want) <= 1e-5 * max(1.0, want), (rank, r["norms"], r["ref_norms"])
        assert all(d <= 1e-5 for d in r["grad_diff"]), (rank, r["grad_diff"])
        assert strict_grad_problems(r["last_grad_stats"]) == [], rank  # every tensor non-zero, each to 1e-3 of it
        assert r["grads_missing"] == [], r["grads_missing"]
        assert r["param_diff"] <= 1e-5, (rank, r["param_diff"])
        assert r["with_grad"] == [n for n in r["names"] if n in r["with_grad"]], r["with_grad"][:5]  # no base weight
        assert r["base_trainable"] == [], r
        assert r["names"] == r["adapter_names"]
        assert r["optimizer"] == bool(r["names"])
    trained = [res[name]["names"] for res in results]
    assert trained[0], "rank 0 trains P's or stage 0's adapter"
    if name == "vl-tower-only":  # rank 1 holds decoder stages only, without adapters: it runs with no optimizer
        assert trained[1] == [] and not results[1][name]["optimizer"]
        assert all(".visual." in n for n in trained[0])
    else:
        assert all(trained), trained
    if name == "vl-tower-owner-backward":
        assert any("merger.modules_to_save" in n for n in trained[0]) and any(".visual.blocks" in n
                                                                             for n in trained[0])
    if name == "vl-freeze-vit":  # the merger and the decoder's adapters train; the tower's adapters do not
        assert any("merger.modules_to_save" in n for n in trained[0])
        assert not any(".visual.blocks" in n for names in trained for n in names)
    if name in ("vl-text-layers", "qwen3-checkpoint-tied"):  # layer 0's adapters train in P, on rank 0
        assert any("layers.0." in n for n in trained[0])
    if name == "moe-experts":  # every rank trains its layers' attention, both fused expert tensors and the router
        for names in trained:
            layers = {n.split(".layers.")[1].split(".")[0] for n in names}
            for part in ("self_attn.q_proj.lora_A", "mlp.experts.lora_A", "mlp.experts.base_layer.lora_B",
                         "mlp.gate.lora_A"):
                assert {n.split(".layers.")[1].split(".")[0] for n in names if part in n} == layers, (part, names)
    if name == "vl-frozen-decoder":  # the clip clipped: max_grad_norm 0.05 against norms of
        assert all(n > 0.05 for n in results[0][name]["norms"]), results[0][name]["norms"]


@pytest.mark.parametrize("name", ["vl-frozen-decoder", "vl-tower-owner-backward", "qwen3-from-config",
                                  "qwen3-checkpoint-tied", "moe-experts"])
def test_adapter_and_merged_checkpoints_reload_to_the_same_logits(demo, results, name):
    """PEFT's files, gathered from both ranks: ``PeftModel.from_pretrained(base, dir)`` gives the trained
    model's logits, and so do the merged weights through ``from_pretrained`` (no missing or unexpected key);
    the base alone does not."""
    r = results[0][name]
    assert r["adapter_files"] == ["adapter_config.json", "adapter_model.safetensors"], r["adapter_files"]
    assert r["adapter_config"]["peft_type"] == "LORA" and r["adapter_config"]["inference_mode"] is True
    assert r["adapter_logit_diff"] < 1e-4 and r["merged_logit_diff"] < 1e-4, r
    assert r["base_logit_diff"] > 1e-2, r  # the adapter changed the model: the comparison above can fail
    assert r["merged_keys"] == []
    if name == "moe-experts":  # both ranks' expert and router adapters, saved under peft's nested wrapper names
        assert sorted(r["adapter_config"]["target_parameters"]) == sorted(EXPERTS + ["mlp.gate.weight"])
        config = json.load(open(os.path.join(demo, "configs", "qwen3_vl_moe.json")))
        layers = config["text_config"]["num_hidden_layers"]
        for part in ("mlp.experts.lora_B", "mlp.experts.base_layer.lora_A", "mlp.gate.lora_A", "q_proj.lora_A"):
            held = {k.split(".layers.")[1].split(".")[0] for k in r["adapter_keys"] if part in k}
            assert held == {str(i) for i in range(layers)}, (part, held)


def test_lora_dropout_runs_are_deterministic(results):
    """``lora_dropout: 0.3``: two pipelined runs from the same seed give bitwise the same losses and adapter
    gradients on every rank, and dropout is on (the losses differ from the same run without dropout)."""
    for res in results:
        r = res["vl-dropout-repeat"]
        assert r["repeat_losses_equal"] and r["repeat_grads_equal"], r
    assert results[0]["vl-dropout-repeat"]["losses"][0] != results[0]["vl-frozen-decoder"]["losses"][0]


def resume_pair(demo, out: str, **train) -> dict:
    """The LoRA resume recipe: 4 steps with ``save_steps: 2``, the tower's LoRA with a trainable ``P`` and the
    merger saved whole, dropout on."""
    return vl_recipe(demo, out, {"preprocess": "trainable"},
                     {"r": 4, "lora_dropout": 0.1, "target_modules": r".*\.(qkv|q_proj|v_proj)",
                      "modules_to_save": ["model.visual.merger"]}, max_steps=4, save_steps=2, **train)


@pytest.fixture(scope="module")
def lora_runs(demo, tmp_path_factory):
    """In one launch of 2 processes (tests/dist/recipe_runs_worker.py, one run after another): the shipped
    recipes/qwen2_5_vl_lora.yaml at R = 2 (shipped at R = 4: 4 processes on CI's 2 cores; ``MPIPE_HF_FULL=1``
    runs R = 4 in a launch of its own), 3 steps in fp32 with dropout off (the reference cannot draw the decoder
    stages' masks), to ``out``; the resume recipe (:func:`resume_pair`) to ``full``, then resumed from
    ``full/checkpoint-2`` to ``resumed``. Returns the folder, which holds demo/ and recipes/ as the recipes
    expect."""
    tmp = tmp_path_factory.mktemp("lora_runs")
    os.symlink(demo, tmp / "demo")  # the recipe names ../demo/... relative to its folder, recipes/
    raw = yaml.safe_load(open(os.path.join(ROOT, "recipes", "qwen2_5_vl_lora.yaml")))
    raw["train"].update(max_steps=3, bf16=False, adam_epsilon=1e-6, output_dir=str(tmp / "out"))
    raw["lora"]["lora_dropout"] = 0.0
    raw["parallel"]["timeout_s"] = 120
    full = os.environ.get("MPIPE_HF_FULL") == "1"
    if not full:
        raw["parallel"]["pp_size"] = 2
    (tmp / "recipes").mkdir()
    recipes = {"recipe": raw, "full": resume_pair(demo, str(tmp / "full")),
               "resumed": resume_pair(demo, str(tmp / "resumed"), resume=str(tmp / "full" / "checkpoint-2"))}
    paths = []
    for name, recipe in recipes.items():
        paths.append(str(tmp / "recipes" / f"{name}.yaml"))
        with open(paths[-1], "w") as f:
            yaml.safe_dump(recipe, f)
    if full:
        run_torchrun(RUNS_WORKER, raw["parallel"]["pp_size"], paths[:1], timeout=900)
    run_torchrun(RUNS_WORKER, 2, paths[int(full):], timeout=900)
    return tmp


def test_the_shipped_lora_recipe_trains_like_one_process_and_reloads(lora_runs):
    """The shipped LoRA recipe's run (:func:`lora_runs`): the losses and grad norms equal the one-process
    PeftModel's, the adapter directory holds PEFT's files beside the processor's (no config.json), and both
    outputs reload to the same logits."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "dist"))
    import lora_worker
    tmp_path = lora_runs
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        recipe = load_recipe("recipes/recipe.yaml")
        ref_model, ref_losses, _, ref_norms, micro = lora_worker.reference(recipe, 3)
        rows = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
        assert [r["step"] for r in rows] == [1, 2, 3]
        for row, loss, norm in zip(rows, ref_losses, ref_norms):
            assert abs(row["loss"] - loss) < 1e-5 * loss and abs(row["grad_norm"] - norm) < 1e-4 * norm, (rows,
                                                                                                         ref_losses)
        files = sorted(os.listdir(tmp_path / "out" / "checkpoint"))
        assert "adapter_model.safetensors" in files and "adapter_config.json" in files and "config.json" not in files
        assert "tokenizer.json" in files and "preprocessor_config.json" in files
        from peft import PeftModel
        from transformers import AutoModelForImageTextToText
        base = AutoModelForImageTextToText.from_pretrained("demo/model")
        loaded = PeftModel.from_pretrained(base, "out/checkpoint").eval()
        merged = AutoModelForImageTextToText.from_pretrained("out/merged").eval()
        inputs = {k: v for k, v in micro.items() if k != "labels"}
        with torch.no_grad():
            want = ref_model.eval()(**inputs).logits
            assert (loaded(**inputs).logits - want).abs().max() < 1e-4
            assert (merged(**inputs).logits - want).abs().max() < 1e-4
        # generate as a user would: the processor saved beside the adapter, greedy; adapter and merged agree
        from mpipe_hf.data import load_checkpoint_processor
        processor = load_checkpoint_processor("out/checkpoint")
        messages = [{"role": "user", "content": [{"type": "image", "path": "demo/data/images/coffee.png"},
                                                 {"type": "text", "text": "Describe the image."}]}]
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                               return_dict=True, return_tensors="pt")
        with torch.no_grad():
            a = loaded.generate(**prompt, max_new_tokens=6, do_sample=False)
            b = merged.generate(**prompt, max_new_tokens=6, do_sample=False)
        assert a.shape[1] > prompt["input_ids"].shape[1] and torch.equal(a, b)
        memory = json.load(open("out/memory.json"))["model_state_bytes_per_rank"]
        adapter_bytes = os.path.getsize("out/checkpoint/adapter_model.safetensors")
        assert sum(m["optimizer"] for m in memory) < 3 * adapter_bytes  # two AdamW moments of the adapter only
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("lora, field", [
    ({"r": 0}, "lora.r"), ({"r": 2.5}, "lora.r"), ({"lora_alpha": 0}, "lora.lora_alpha"),
    ({"lora_dropout": 1.0}, "lora.lora_dropout"), ({"lora_dropout": "x"}, "lora.lora_dropout"),
    ({"target_modules": []}, "lora.target_modules"), ({"target_modules": [3]}, "lora.target_modules"),
    ({"modules_to_save": "merger"}, "lora.modules_to_save"), ({"init_lora_weights": "pissa"},
                                                              "lora.init_lora_weights"),
    ({"merge": "yes"}, "lora.merge"), ({"rank": 8}, "lora.rank"),
    ({"target_parameters": EXPERTS[0]}, "lora.target_parameters"),
    ({"target_parameters": []}, "lora.target_parameters"),
    ({"target_parameters": EXPERTS, "lora_dropout": 0.1}, "lora.target_parameters"),
])
def test_bad_lora_values_name_the_field(demo, tmp_path, lora, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        parse_recipe(vl_recipe(demo, str(tmp_path), {}, lora))


@pytest.mark.parametrize("parallel, lora, message", [
    ({"preprocess": "frozen"}, {"target_modules": "all-linear"}, "freezes"),  # hits the tower's linear layers
    ({"preprocess": "frozen"}, {"target_modules": ["q_proj"], "modules_to_save": ["model.visual.merger"]}, "freezes"),
    ({"preprocess": "trainable"}, {"target_modules": ["q_proj"]}, "no adapter tensor sits in P"),
    ({"preprocess": "frozen"}, {"target_modules": ["no_such_layer"]}, "no_such_layer"),
    ({"preprocess": "frozen"}, {"target_modules": ["q_proj"], "target_parameters": EXPERTS}, "names no parameter"),
])
def test_an_adapter_that_would_not_train_fails_before_launch(demo, tmp_path, monkeypatch, parallel, lora, message):
    """``mpipe-hf train`` checks the adapter on the meta model before it starts any process: its ``main``, run
    here in-process with torchrun's launcher replaced by a failure, exits with the one ``mpipe-hf: error:``
    line (the ``SystemExit`` the console script turns into status 1 and stderr; any other exception is a
    traceback and fails the test)."""
    import torch.distributed.run
    from mpipe_hf.cli import main

    def launched(*args, **kwargs):
        raise AssertionError("mpipe-hf train started processes before it rejected the adapter")
    monkeypatch.setattr(torch.distributed.run, "main", launched)
    path = tmp_path / "recipe.yaml"
    with open(path, "w") as f:
        yaml.safe_dump(vl_recipe(demo, str(tmp_path / "out"), parallel, lora), f)
    with pytest.raises(SystemExit) as exited:
        main(["train", str(path)])
    error = str(exited.value.code)
    assert error.startswith("mpipe-hf: error: ") and message in error and "lora" in error, error[-3000:]


def test_a_lora_run_resumes_bit_exactly(lora_runs):
    """4 steps with ``save_steps: 2`` (tower LoRA, trainable P, dropout on; :func:`lora_runs`): ``checkpoint-2``
    holds the adapter in PEFT's format and every rank's state, and the run resumed from it gives steps 3 and 4 bit
    for bit (losses, grad norms, learning rates, the final adapter); the base weights are read from ``model``
    again, not saved."""
    from safetensors.torch import load_file
    tmp_path = lora_runs

    def run(out):
        return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    full = str(tmp_path / "full")
    a = run(full)
    ckpt = os.path.join(full, "checkpoint-2")
    held = set(os.listdir(ckpt))
    assert {"adapter_model.safetensors", "adapter_config.json", "rank0_state.pt", "rank1_state.pt",
            "trainer_state.json"} <= held and not any(n.startswith("model") for n in held), held
    b = run(str(tmp_path / "resumed"))
    assert [r["step"] for r in b] == [3, 4]
    for x, y in zip(a[2:], b):
        assert (x["loss"], x["grad_norm"], x["learning_rate"]) == (y["loss"], y["grad_norm"], y["learning_rate"])
    wa = load_file(os.path.join(full, "checkpoint", "adapter_model.safetensors"))
    wb = load_file(os.path.join(tmp_path, "resumed", "checkpoint", "adapter_model.safetensors"))
    assert sorted(wa) == sorted(wb) and all(wa[k].equal(wb[k]) for k in wa)
    assert any("merger" in k for k in wa) and any("visual.blocks" in k for k in wa)


@pytest.mark.skipif(os.environ.get("MPIPE_HF_FULL") != "1", reason="a 4-process run: the full suite (MPIPE_HF_FULL=1); "
                    "CI runs LoRA under FSDP2 with pp 2 in tests/test_ep.py's launch")
def test_lora_with_data_parallel_equals_one_process(demo, tmp_path):
    """``dp = 2`` replicas (FSDP2 over each stage chunk, base and adapter in one sharded group) of an ``R = 2``
    pipeline with decoder LoRA: 3 steps equal the one-process PeftModel over the global batch of ``2 M``
    micro-batches (first step to 1e-5, later ones to 1e-4, as the full fine-tuning test), and the adapter
    gathered from the shards reloads to its logits."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "dist"))
    import lora_worker
    out = str(tmp_path / "run")
    lora = {"r": 8, "target_modules": DECODER_ATTENTION, "init_lora_weights": False}
    raw = vl_recipe(demo, out, {"preprocess": "frozen", "dp_size": 2, "dp_shard": True}, lora, max_steps=3)
    with open(tmp_path / "dp.yaml", "w") as f:
        yaml.safe_dump(raw, f)
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train",
                           str(tmp_path / "dp.yaml")], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    one = vl_recipe(demo, out, {"preprocess": "frozen", "num_micro": 8}, lora, max_steps=3)
    ref_model, losses, _, norms, micro = lora_worker.reference(parse_recipe(one), 3)
    for step, (row, loss, norm) in enumerate(zip(rows, losses, norms)):
        atol = 1e-5 if step == 0 else 1e-4
        assert abs(row["loss"] - loss) < atol and abs(row["grad_norm"] - norm) < atol, (step, row, loss, norm)
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText
    loaded = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(os.path.join(demo, "model")),
                                       os.path.join(out, "checkpoint")).eval()
    inputs = {k: v for k, v in micro.items() if k != "labels"}
    with torch.no_grad():
        assert (loaded(**inputs).logits - ref_model.eval()(**inputs).logits).abs().max() < 1e-4


@pytest.mark.parametrize("lora, merge, message", [
    (dict(target_modules=["q_proj", "lm_head"]), False, "share one weight"),          # tied: head and embedding
    (dict(target_modules=["q_proj"], modules_to_save=["embed_tokens"]), False, "share one weight"),
    (dict(target_modules=["q_proj"], modules_to_save=["no_such_module"]), False, "names no module"),
    (dict(target_modules=["q_proj", "embed_tokens"]), True, "lora.merge"),            # an Embedding adapter
])
def test_adapters_the_pipeline_cannot_hold_are_errors(demo, lora, merge, message):
    """Checked on the meta model before launch (``check_adapter``, as ``mpipe-hf train`` runs it)."""
    from peft import LoraConfig
    from transformers import AutoConfig
    from mpipe_hf.models.load import check_adapter
    from mpipe_hf.schedule import ScheduleConfig
    name = "qwen3.json" if "lm_head" in str(lora) or "embed_tokens" in str(lora.get("modules_to_save")) else \
        "llama.json"
    config = AutoConfig.from_pretrained(os.path.join(demo, "configs", name))
    with pytest.raises(ValueError, match=message):
        check_adapter(config, ScheduleConfig(2, 2, 4, "identity"), LoraConfig(r=4, **lora), merge=merge)
