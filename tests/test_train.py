"""End to end: ``mpipe-hf train`` and ``accelerate launch -m mpipe_hf.train`` on the demo checkpoint and real
photos, and every family recipe in recipes/; the losses and the saved checkpoint equal a single-process training
run of the unsplit model."""

import copy
import dataclasses
import glob
import json
import os
from shutil import copy as shutil_copy
import subprocess
import sys

import pytest
import torch
import yaml
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoTokenizer

from mpipe_hf.data import (ConversationCollator, MicroBatchPlan, load_conversation_dataset,
                           qwen2_5_vl_processor)
from mpipe_hf.train import load_recipe
from mpipe_hf.train.recipe import TrainSection
from mpipe_hf.train.trainer import check

from train_common import (EPS, LR, NUM_MICRO, ROOT, STEPS, demo_plan, run, set_keys,
                          train_like_one_process, train_unsplit, write_recipe)

def reference_training(demo, freeze_visual):
    """The unsplit model trained on one process over the same micro-batches: losses, gradient norms, the final
    model and the last micro-batches."""
    model_dir = os.path.join(demo, "model")
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.model.visual.requires_grad_(not freeze_visual)
    plan = demo_plan(demo)
    train = TrainSection(max_steps=STEPS, learning_rate=LR, adam_epsilon=EPS)
    losses, norms, micros = train_unsplit(model, plan, NUM_MICRO, STEPS, train)
    return losses, norms, model, micros


def test_cli_and_accelerate_training_equal_single_process(demo, tmp_path):
    """The CLI trains with a frozen tower as P and gradient checkpointing; accelerate with the tower, the embedding
    and the first decoder layer as a trainable P, owner-backward and overflow mode min."""
    runs = {
        "cli": ([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train"],
                dict(trace=True, gradient_checkpointing=True)),
        "accelerate": ([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m",
                        "mpipe_hf.train"],
                       dict(preprocess="trainable", text_layers=1, owner_backward=True, overflow="min",
                            model={"name_or_path": os.path.join(demo, "model")})),
    }
    for name, (cmd, options) in runs.items():
        ref_losses, ref_norms, ref_model, micros = reference_training(demo, freeze_visual=name == "cli")
        out = str(tmp_path / name)
        recipe = write_recipe(demo, tmp_path / f"{name}.yaml", out, **options)
        run(cmd + [recipe])
        rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        assert [r["step"] for r in rows] == [1, 2]
        for row, ref, norm in zip(rows, ref_losses, ref_norms):
            assert abs(row["loss"] - ref) < 1e-4, (name, row, ref)
            assert abs(row["grad_norm"] - norm) < 1e-4 * norm, (name, row, norm)  # the norm over every rank
        assert rows[0]["grad_norm"] > 1.0, "max_grad_norm 1.0 clips the first step"
        assert rows[1]["learning_rate"] < rows[0]["learning_rate"] == LR  # the default linear decay
        loaded = AutoModelForImageTextToText.from_pretrained(os.path.join(out, "checkpoint"))
        with torch.no_grad():
            inputs = {k: v for k, v in micros[0].items() if k != "labels"}
            diff = (loaded(**inputs).logits - ref_model(**inputs).logits).abs().max().item()
        assert diff < 1e-4, (name, diff)
        assert not os.path.exists(os.path.join(out, "checkpoint.tmp"))
        if options.get("trace"):  # every action of every rank, in a Chrome trace that mpipe-hf plot draws
            from mpipe_hf.schedule import build_schedule
            from mpipe_hf.schedule.trace import read_chrome_trace
            timeline = read_chrome_trace(os.path.join(out, "trace.json"))
            orders = build_schedule(load_recipe(recipe).schedule())
            assert {r: [e.action for e in events] for r, events in timeline.items()} == {
                r: order * STEPS for r, order in orders.items()}
            png = os.path.join(out, "gantt.png")
            run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "plot", "--trace",
                 os.path.join(out, "trace.json"), "--out", png])
            assert os.path.getsize(png) > 10_000


@pytest.mark.parametrize("override,field", [
    (dict(num_micro=0), "num_micro"),
    (dict(pp_size=16), "pp_size"),
    (dict(vpp=0), "vpp"),
    (dict(preprocess="warm"), "preprocess"),
    (dict(layers_per_stage=[1, 1, 1, 1]), "layers_per_stage"),
    (dict(text_layers=3, layers_per_stage=[2, 6, 6, 2]), "text_layers = 3 exceeds stage 0's first chunk of 2"),
    (dict(text_layers=1, preprocess="identity"), "text_layers = 1 needs preprocess"),
    (dict(owner_backward=True), "owner_backward needs preprocess 'trainable'"),
    (dict(less_memory="yes"), "less_memory must be true or false"),
    (dict(stepz=3), "unknown key train.stepz"),
    (dict(lr_scheduler_type="zigzag"), "train.lr_scheduler_type must be one of"),
    (dict(adam_beta2=1.0), "train.adam_beta2 must be in [0, 1)"),
])
def test_bad_recipe_fails_before_any_process_starts(demo, tmp_path, monkeypatch, override, field):
    """``mpipe-hf train``'s ``main``, in-process with torchrun's launcher replaced by a failure, exits with the one
    ``mpipe-hf: error:`` line naming the field (the ``SystemExit`` the console script turns into status 1 and
    stderr; any other exception would be a traceback and fails the test), and nothing ran. The console script
    itself, in a subprocess, is checked in ``tests/test_recipe_schema.py``."""
    import torch.distributed.run
    from mpipe_hf.cli import main

    def launched(*args, **kwargs):
        raise AssertionError("mpipe-hf train started processes before it rejected the recipe")
    monkeypatch.setattr(torch.distributed.run, "main", launched)
    recipe = write_recipe(demo, tmp_path / "bad.yaml", str(tmp_path / "out"), **override)
    with pytest.raises(SystemExit) as exited:
        main(["train", recipe])
    error = str(exited.value.code)
    assert error.startswith("mpipe-hf: error: ") and field in error, error[-2000:]
    assert not os.path.exists(tmp_path / "out"), "nothing ran"


def test_unknown_model_type_is_a_value_error(demo, tmp_path):
    from transformers import GPT2Config
    GPT2Config(n_layer=2).save_pretrained(tmp_path / "gpt2")
    recipe = write_recipe(demo, tmp_path / "r.yaml", str(tmp_path / "out"),
                          model={"config": str(tmp_path / "gpt2"), "tokenizer": os.path.join(demo, "model")})
    from mpipe_hf.train.trainer import check
    with pytest.raises(ValueError, match="model_type 'gpt2' has no splitter; supported model_type values: .*'llava'"):
        check(load_recipe(recipe))


@pytest.mark.parametrize("model,field", [
    ({"name_or_path": "nowhere"}, "model.name_or_path '[^']*/nowhere' is not a checkpoint directory"),  # resolved
    ({"config": "nowhere.json"}, "model.config '[^']*/nowhere.json' does not exist"),  # against the recipe's folder
    ({}, "model needs exactly one of name_or_path"),
    ({"path": "x"}, "model must be a checkpoint path or a mapping with keys"),
    ({"name_or_path": "CONFIG_ONLY"}, "has no weights .*; for random weights use model.config"),
    ({"config": "DEMO/configs/qwen3.json"}, "model.tokenizer: .* holds no tokenizer"),
])
def test_bad_model_source_names_the_field(demo, tmp_path, model, field):
    (tmp_path / "config_only").mkdir()
    (tmp_path / "config_only" / "config.json").write_text(open(os.path.join(demo, "model", "config.json")).read())
    model = {k: v.replace("CONFIG_ONLY", str(tmp_path / "config_only")).replace("DEMO", demo)
             for k, v in model.items()}
    recipe = write_recipe(demo, tmp_path / "r.yaml", str(tmp_path / "out"), model=model)
    with pytest.raises(ValueError, match=field):
        check(load_recipe(recipe))  # the tokenizer is checked by check(): mpipe-hf plan needs none


def test_config_without_model_type_is_a_value_error(demo, tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"hidden_size": 8}))
    recipe = write_recipe(demo, tmp_path / "r.yaml", str(tmp_path / "out"),
                          model={"config": str(tmp_path / "c.json"), "tokenizer": os.path.join(demo, "model")})
    from mpipe_hf.train.trainer import check
    with pytest.raises(ValueError, match="model.config .* has no model_type"):
        check(load_recipe(recipe))


@pytest.mark.skipif(os.environ.get("MPIPE_HF_FULL") != "1", reason="the full suite (MPIPE_HF_FULL=1); CI runs the "
                    "same layout on Gemma 3 in test_tiny_models.py, exact against one process")
def test_a_rank_holding_only_a_frozen_preprocess_trains(demo, tmp_path):
    """Llama with stage 0's only layer moved into a frozen P: rank 0 has nothing to optimise, and the run
    still trains (rank 1 does)."""
    os.symlink(demo, tmp_path / "demo")  # the recipe names ../demo/... relative to its folder, recipes/
    raw = yaml.safe_load(open(os.path.join(ROOT, "recipes", "llama.yaml")))
    set_keys(raw, vpp=1, layers_per_stage=[1, 7], text_layers=1, max_steps=2, output_dir=str(tmp_path / "out"))
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text(yaml.safe_dump(raw))
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train", "recipes/r.yaml"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
    assert len(rows) == 2 and rows[1]["loss"] < rows[0]["loss"]


# CI trains the Qwen3-VL-MoE recipe (DeepStack, experts, the load-balancing loss); MPIPE_HF_FULL=1 adds the
# Qwen3.5, LLaVA, Qwen2-VL, Qwen3-VL, Llama and Qwen3 recipes (the families are exact in tests/test_numerics.py's
# CI cases, and the recipe path is the same code for each)
CI_RECIPES = ("qwen3_vl_moe.yaml",)  # the rest under MPIPE_HF_FULL=1
FAMILY_RECIPES = sorted(p for p in glob.glob(os.path.join(ROOT, "recipes", "*.yaml"))  # the LoRA recipe: test_lora.py
                        if not p.endswith(("qwen2_5_vl_demo.yaml", "qwen2_5_vl_lora.yaml",
                                           "qwen2_5_vl_video_demo.yaml",  # freeze_vit: tests/test_video.py
                                           "qwen3_vl_moe_ep.yaml",  # 4 processes: tests/test_ep.py
                                           # cp 2 x pp 2 over the rows make_long_video.py writes (4 processes):
                                           # scripts/bench/context_parallel_memory.py and BENCHMARKS.md's run
                                           "qwen2_5_vl_long_video.yaml"))
                        and (p.endswith(CI_RECIPES) or os.environ.get("MPIPE_HF_FULL") == "1"))


@pytest.mark.parametrize("path", FAMILY_RECIPES, ids=[os.path.basename(p) for p in FAMILY_RECIPES])
def test_family_recipe_trains_like_one_process_and_reloads(demo, tmp_path, path):
    """Each family recipe as shipped (its model, schedule and data; 2 steps, eps 1e-6) through ``mpipe-hf
    train``: the losses equal the unsplit model's, and the checkpoint loads with ``from_pretrained`` (no missing
    or unexpected key) and gives the one-process model's logits."""
    os.symlink(demo, tmp_path / "demo")  # the recipes name ../demo/... relative to their folder, recipes/
    processor, ref_model, micro = train_like_one_process(tmp_path, yaml.safe_load(open(path)))
    if "llava" in path:  # LLaVA's processor (patch size, strategy, image token) reloads from the checkpoint
        from transformers import AutoProcessor
        reloaded = AutoProcessor.from_pretrained(tmp_path / "out" / "checkpoint")
        image = Image.new("RGB", (80, 60), "red")
        a, b = (p(text=["<|image_pad|>\nhi"], images=[image], return_tensors="pt") for p in (reloaded, processor))
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["pixel_values"], b["pixel_values"])


def test_owner_decodes_only_its_own_rows(demo):
    """Loading micro m reads (and so decodes) only micro m's rows of the dataset."""
    processor = qwen2_5_vl_processor(AutoTokenizer.from_pretrained(os.path.join(demo, "model")))
    dataset = load_conversation_dataset(os.path.join(demo, "data", "train.jsonl"), processor, 2048)
    touched = []

    class Spy:
        def __len__(self):
            return len(dataset)

        def __getitem__(self, i):
            touched.append(i)
            return dataset[i]
    plan = MicroBatchPlan(Spy(), ConversationCollator(processor, 2048), num_micro=4, micro_batch_size=2)
    batch = plan.load(step=3, micro=2)
    assert touched == plan.rows(3, 2) == [28, 29]
    assert batch["image_grid_thw"].shape[0] == 2
    assert len({tuple(plan.rows(s, m)) for s in range(2) for m in range(4)}) == 8, "micros do not overlap"


def test_profile_then_simulate_auto_ranks_the_knobs(demo, tmp_path):
    """``mpipe-hf profile`` measures the recipe's model on one process; ``simulate --auto`` ranks candidates by
    the step time the simulator predicts from that profile, fastest first."""
    from mpipe_hf.schedule.tune import Profile
    os.symlink(demo, tmp_path / "demo")  # the recipe names ../demo/... relative to its folder, recipes/
    (tmp_path / "recipes").mkdir()
    shutil_copy(os.path.join(ROOT, "recipes", "qwen2_vl.yaml"), tmp_path / "recipes")
    cli = os.path.join(os.path.dirname(sys.executable), "mpipe-hf")
    proc = subprocess.run([cli, "profile", "recipes/qwen2_vl.yaml", "--out", "p.yaml"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    profile = Profile.load(str(tmp_path / "p.yaml"))
    assert profile.num_layers == 8 and profile.layer_forward_s > 0 and profile.layer_backward_s > 0
    assert profile.preprocess_forward_s > 0 and profile.feature_bytes > 0 and profile.graph_bytes > 0
    proc = subprocess.run([cli, "simulate", "--auto", "--profile", "p.yaml", "--pp", "2", "--micro", "4",
                           "--preprocess", "trainable", "--top", "50"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    times = [float(r[1]) for r in rows]
    assert len(rows) > 10 and times == sorted(times) and float(rows[0][2]) == 1.0
    assert any("owner-backward" in " ".join(r) for r in rows) and any("identity" in " ".join(r) for r in rows)


def test_old_flat_recipe_keys_name_their_new_place(tmp_path):
    from mpipe_hf.train.recipe import parse_recipe
    for key, place in (("pp_size", "'parallel' section"), ("steps", "'train' section: write `train: {max_steps"),
                       ("lr", "`train: {learning_rate"), ("micro_batch_size", "'data' section")):
        with pytest.raises(ValueError, match=place):
            parse_recipe({"model": "m", "data": "d.jsonl", key: 1})
    with pytest.raises(ValueError, match="unknown key parallel.steps; it lives at train.max_steps"):
        parse_recipe({"model": str(tmp_path), "data": "d.jsonl", "parallel": {"steps": 3}})


def test_shuffled_epochs_read_every_row_once_in_a_seeded_order():
    rows = list(range(10))
    plan = MicroBatchPlan(rows, lambda batch: batch, num_micro=2, micro_batch_size=3, shuffle=True, seed=7)
    stream = [i for step in range(5) for m in range(2) for i in plan.rows(step, m)]  # 30 rows: 3 epochs
    epochs = [stream[e * 10:(e + 1) * 10] for e in range(3)]
    assert all(sorted(e) == rows for e in epochs) and len({tuple(e) for e in epochs}) == 3
    again = MicroBatchPlan(rows, lambda batch: batch, num_micro=2, micro_batch_size=3, shuffle=True, seed=7)
    assert [again.rows(s, m) for s in range(5) for m in range(2)] == [plan.rows(s, m) for s in range(5)
                                                                       for m in range(2)]
    assert MicroBatchPlan(rows, None, 2, 3).rows(1, 1) == [9, 0, 1]  # file order, wrapping
    assert TrainSection(num_train_epochs=2.0).total_steps(plan.steps_per_epoch()) == 4  # ceil(2 * 10 / 6)
    assert TrainSection(max_steps=5).total_steps(plan.steps_per_epoch()) == 5


# bf16 in CI: MPipeTrainer's path against the plain Trainer (tests/test_hf_trainer.py, trainable-bf16: the same
# PipelineRun, tests/test_run.py) and the precision policy bitwise in tests/test_numerics.py
@pytest.mark.skipif(os.environ.get("MPIPE_HF_FULL") != "1", reason="the full suite (MPIPE_HF_FULL=1); CI runs bf16 "
                    "through MPipeTrainer (test_hf_trainer.py) and bitwise in test_numerics.py")
def test_bf16_training_equals_one_process_bf16(demo, tmp_path):
    """``train: {bf16: true}`` (fp32 master weights, bf16 autocast) through ``mpipe-hf train`` at R = 2, V = 2
    against the unsplit model under the same autocast on one process: the losses and the global gradient norm
    of every step agree to bf16's rounding of a different summation order, and bf16 does differ from fp32."""
    out = str(tmp_path / "bf16")
    recipe = write_recipe(demo, tmp_path / "bf16.yaml", out, bf16=True, max_steps=3)
    run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train", recipe])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    model = AutoModelForImageTextToText.from_pretrained(os.path.join(demo, "model"), dtype=torch.float32)
    model.model.visual.requires_grad_(False)
    plan = demo_plan(demo)
    train = TrainSection(max_steps=3, learning_rate=LR, adam_epsilon=EPS, bf16=True)
    losses, norms, _ = train_unsplit(copy.deepcopy(model), plan, NUM_MICRO, 3, train)
    fp32, _, _ = train_unsplit(model, plan, NUM_MICRO, 1, dataclasses.replace(train, bf16=False))
    print("bf16 loss rel diff", [abs(r["loss"] - x) / x for r, x in zip(rows, losses)],
          "grad-norm rel diff", [abs(r["grad_norm"] - n) / n for r, n in zip(rows, norms)],
          "bf16 against fp32", abs(rows[0]["loss"] - fp32[0]) / fp32[0])
    # the first step's loss to fp32's rounding (bf16 rounds each product the same way on both sides; only the
    # sums' order differs): measured 7.8e-9. The later steps take AdamW steps on gradients that differ by bf16's
    # rounding (the norm: measured 2.0e-3, 3.6e-3, 2.4e-4 on the demo's one-word answers), so their losses
    # differ more: measured 1.2e-4, 6.8e-5
    assert abs(rows[0]["loss"] - losses[0]) <= 1e-6 * losses[0], (rows[0], losses[0])
    for row, loss, norm in zip(rows, losses, norms):
        assert abs(row["loss"] - loss) <= 3e-4 * loss, (row, loss)
        assert abs(row["grad_norm"] - norm) <= 5e-3 * norm, (row, norm)
    assert abs(rows[0]["loss"] - fp32[0]) > 1e-5, "bf16 computes in bf16"


def test_eval_loss_equals_one_process_and_trackers_log_the_scalars(demo, tmp_path):
    """``data.eval_path`` with ``eval_steps: 1``: after each step the forward-only schedule reports ``eval_loss``
    over the whole eval set (2 rows per micro-batch, 11 rows: a short last micro-batch and a short last run),
    equal to the unsplit model's token-summed loss over the same rows after the same training. With
    ``report_to: [tensorboard]`` the event file, read back, holds every logged scalar: loss, eval loss, learning
    rate, gradient norm, label tokens/s, bubble, step time and peak activations per rank."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    rows = open(os.path.join(demo, "data", "train.jsonl")).read().splitlines()[20:31]
    eval_path = tmp_path / "eval.jsonl"
    eval_path.write_text("\n".join(rows) + "\n")
    for name in {img for r in rows for img in json.loads(r).get("images", [])}:
        os.makedirs(os.path.dirname(tmp_path / name), exist_ok=True)
        shutil_copy(os.path.join(demo, "data", name), tmp_path / name)
    out = str(tmp_path / "run")
    run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train",
         write_recipe(demo, tmp_path / "eval.yaml", out, eval_path=str(eval_path), eval_steps=1, max_steps=2,
                      micro_batch_size=2, report_to=["tensorboard"])])
    logged = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    evals = [r for r in logged if "eval_loss" in r]
    assert [r["step"] for r in evals] == [1, 2], logged

    model = AutoModelForImageTextToText.from_pretrained(os.path.join(demo, "model"), dtype=torch.float32)
    model.model.visual.requires_grad_(False)
    plan = demo_plan(demo, micro_batch_size=2)
    train_unsplit(model, plan, NUM_MICRO, 2, TrainSection(max_steps=STEPS, learning_rate=LR, adam_epsilon=EPS))
    held_out = demo_plan(demo, str(eval_path), micro_batch_size=2, shuffle=False)
    model.eval()
    loss_sum, tokens = 0.0, 0
    with torch.no_grad():
        for first in range(0, len(rows), 2):
            mb = held_out.load_rows(list(range(first, min(first + 2, len(rows)))))
            logits = model(**{k: v for k, v in mb.items() if k != "labels"}).logits
            loss_sum += model.loss_function(logits=logits, labels=mb["labels"],
                                            vocab_size=model.config.get_text_config().vocab_size,
                                            num_items_in_batch=1).item()
            tokens += int((mb["labels"][..., 1:] != -100).sum())
    assert evals[-1]["eval_label_tokens"] == tokens
    assert abs(evals[-1]["eval_loss"] - loss_sum / tokens) < 1e-5, (evals[-1], loss_sum / tokens)

    events = glob.glob(os.path.join(out, "runs", "*", "events.out.tfevents.*"))
    assert len(events) == 1, events
    acc = EventAccumulator(events[0])
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    wanted = {"loss", "eval_loss", "learning_rate", "grad_norm", "tokens_per_s", "bubble", "step_s",
              "bubble_per_rank/rank0", "bubble_per_rank/rank1", "step_s_per_rank/rank1",
              "peak_activation_mib_per_rank/rank0", "peak_activation_mib_per_rank/rank1"}
    assert wanted <= tags, wanted - tags
    steps = [r for r in logged if "loss" in r]
    assert [e.step for e in acc.Scalars("loss")] == [r["step"] for r in steps]
    assert [e.value for e in acc.Scalars("loss")] == pytest.approx([r["loss"] for r in steps])
    assert [e.value for e in acc.Scalars("eval_loss")] == pytest.approx([r["eval_loss"] for r in evals])


def test_wandb_offline_logs_the_run(demo, tmp_path):
    """``report_to: [wandb]`` in offline mode writes a local run (where wandb is installed)."""
    pytest.importorskip("wandb")
    out = str(tmp_path / "run")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train",
                           write_recipe(demo, tmp_path / "wandb.yaml", out, max_steps=1, report_to=["wandb"])],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline",
                               "WANDB_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert glob.glob(os.path.join(tmp_path, "wandb", "offline-run-*")), os.listdir(tmp_path)
