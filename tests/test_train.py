"""End to end: ``mpipe-hf train`` and ``accelerate launch -m mpipe_hf.train`` on the demo checkpoint and real
photos; the losses and the saved checkpoint equal a single-process training run of the unsplit model."""

import json
import os
import runpy
import subprocess
import sys

import pytest
import torch
import yaml
from transformers import AutoModelForImageTextToText, AutoTokenizer

from mpipe_hf.data import CaptionCollator, MicroBatchPlan, load_caption_dataset, qwen2_5_vl_processor
from mpipe_hf.train import load_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, NUM_MICRO, LR = 2, 4, 2e-3
# AdamW moves a parameter by about lr * g / (|g| + eps): with torch's eps = 1e-8, fp32 noise of 1e-8 on a
# near-zero gradient element becomes a visible part of lr. eps = 1e-6 keeps that noise below 1e-5 * lr / 1e-3.
EPS = 1e-6


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("demo"))
    runpy.run_path(os.path.join(ROOT, "scripts", "make_demo.py"))["main"]([out])
    return out


def write_recipe(demo, path, output_dir, **overrides):
    recipe = dict(model=os.path.join(demo, "model"), data=os.path.join(demo, "data", "train.jsonl"), pp_size=2,
                  vpp=2, num_micro=NUM_MICRO, steps=STEPS, lr=LR, adam_eps=EPS, output_dir=output_dir,
                  timeout_s=120)
    recipe.update(overrides)
    with open(path, "w") as f:
        yaml.safe_dump(recipe, f)
    return str(path)


def run(cmd, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def reference_training(demo, freeze_visual):
    """The unsplit model trained on one process over the same micro-batches: losses and the final model."""
    model_dir = os.path.join(demo, "model")
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.model.visual.requires_grad_(not freeze_visual)
    processor = qwen2_5_vl_processor(AutoTokenizer.from_pretrained(model_dir))
    plan = MicroBatchPlan(load_caption_dataset(os.path.join(demo, "data", "train.jsonl")),
                          CaptionCollator(processor), NUM_MICRO, 1)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0,
                                  eps=EPS)
    losses = []
    for step in range(STEPS):
        micros = [plan.load(step, m) for m in range(NUM_MICRO)]
        total = sum(int((mb["labels"][..., 1:] != -100).sum()) for mb in micros)
        loss_sum = 0.0
        for mb in micros:
            logits = model(**{k: v for k, v in mb.items() if k != "labels"}).logits
            loss = model.loss_function(logits=logits, labels=mb["labels"],
                                       vocab_size=model.config.text_config.vocab_size, num_items_in_batch=total)
            loss.backward()
            loss_sum += loss.detach().item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss_sum)
    return losses, model, micros


def test_cli_and_accelerate_training_equal_single_process(demo, tmp_path):
    """The CLI trains with a frozen tower as P; accelerate with the tower, the embedding and the first decoder
    layer as a trainable P, owner-backward and overflow mode min."""
    runs = {
        "cli": ([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train"], {}),
        "accelerate": ([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m",
                        "mpipe_hf.train"],
                       dict(preprocess="trainable", text_layers=1, owner_backward=True, overflow="min")),
    }
    for name, (cmd, options) in runs.items():
        ref_losses, ref_model, micros = reference_training(demo, freeze_visual=not options)
        out = str(tmp_path / name)
        recipe = write_recipe(demo, tmp_path / f"{name}.yaml", out, **options)
        run(cmd + [recipe])
        rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        assert [r["step"] for r in rows] == [1, 2]
        for row, ref in zip(rows, ref_losses):
            assert abs(row["loss"] - ref) < 1e-4, (name, row, ref)
        loaded = AutoModelForImageTextToText.from_pretrained(os.path.join(out, "checkpoint"))
        with torch.no_grad():
            inputs = {k: v for k, v in micros[0].items() if k != "labels"}
            diff = (loaded(**inputs).logits - ref_model(**inputs).logits).abs().max().item()
        assert diff < 1e-4, (name, diff)
        assert not os.path.exists(os.path.join(out, "checkpoint.tmp"))


@pytest.mark.parametrize("override,field", [
    (dict(num_micro=0), "num_micro"),
    (dict(pp_size=16), "pp_size"),
    (dict(vpp=0), "vpp"),
    (dict(preprocess="warm"), "preprocess"),
    (dict(layers_per_stage=[1, 1, 1, 1]), "layers_per_stage"),
    (dict(text_layers=3), "text_layers = 3 exceeds stage 0's first chunk of 2"),
    (dict(text_layers=1, preprocess="identity"), "text_layers = 1 needs preprocess"),
    (dict(owner_backward=True), "owner_backward needs preprocess 'trainable'"),
    (dict(less_memory="yes"), "less_memory must be true or false"),
    (dict(stepz=3), "unknown recipe keys"),
])
def test_bad_recipe_fails_before_any_process_starts(demo, tmp_path, override, field):
    recipe = write_recipe(demo, tmp_path / "bad.yaml", str(tmp_path / "out"), **override)
    cli = os.path.join(os.path.dirname(sys.executable), "mpipe-hf")
    proc = subprocess.run([cli, "train", recipe], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert field in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not os.path.exists(tmp_path / "out"), "nothing ran"


def test_unknown_model_type_is_a_value_error(demo, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    config = json.load(open(os.path.join(demo, "model", "config.json")))
    json.dump({**config, "model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"]},
              open(model_dir / "config.json", "w"))
    recipe = write_recipe(demo, tmp_path / "r.yaml", str(tmp_path / "out"), model=str(model_dir))
    from mpipe_hf.train.trainer import check
    with pytest.raises(ValueError, match="model_type 'qwen2_vl' has no splitter"):
        check(load_recipe(recipe))


def test_owner_decodes_only_its_own_rows(demo):
    """Loading micro m reads (and so decodes) only micro m's rows of the dataset."""
    dataset = load_caption_dataset(os.path.join(demo, "data", "train.jsonl"))
    touched = []

    class Spy:
        def __len__(self):
            return len(dataset)

        def __getitem__(self, i):
            touched.append(i)
            return dataset[i]
    processor = qwen2_5_vl_processor(AutoTokenizer.from_pretrained(os.path.join(demo, "model")))
    plan = MicroBatchPlan(Spy(), CaptionCollator(processor), num_micro=4, micro_batch_size=2)
    batch = plan.load(step=3, micro=2)
    assert touched == plan.rows(3, 2) == [28, 29]
    assert batch["image_grid_thw"].shape[0] == 2
    assert len({tuple(plan.rows(s, m)) for s in range(2) for m in range(4)}) == 8, "micros do not overlap"
