"""The two trainers share one run object (:class:`mpipe_hf.train.run.PipelineRun`): ``mpipe-hf train`` on
a recipe and :class:`~mpipe_hf.MPipeTrainer` on the same rows, settings and loss normalisation give the same
per-step losses, gradient norms and learning rates, and write the same checkpoints (every weight tensor, and each
rank's ``rank<r>_state.pt``), bit for bit. fp32, the demo Qwen2.5-VL checkpoint, ``pp_size = 2``, 3 steps.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from test_resume import weights  # a checkpoint's tensors, by name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(os.path.dirname(sys.executable), "mpipe-hf")
STEPS = 3


def write_recipe(demo, path, output_dir, **parallel):
    """3 steps of 4 micro-batches of one row, shuffled, clipping that clips, warm-up and decay, and the Qwen2.5-VL
    Trainer's loss normalisation (``micro``: the model takes no ``num_items_in_batch``)."""
    raw = {"model": os.path.join(demo, "model"),
           "data": {"path": os.path.join(demo, "data", "train.jsonl"), "micro_batch_size": 1},
           "parallel": {"pp_size": 2, "vpp": 2, "num_micro": 4, "preprocess": "frozen", "timeout_s": 120,
                        **parallel},
           "train": {"max_steps": STEPS, "learning_rate": 2e-3, "warmup_steps": 1, "weight_decay": 0.01,
                     "adam_epsilon": 1e-6, "max_grad_norm": 0.5, "save_steps": 2, "output_dir": output_dir,
                     "loss_normalization": "micro", "seed": 0}}
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    return str(path)


def trainer_worker(recipe_path: str, out: str) -> None:
    """Run by torchrun (this file as a script, 2 processes): the recipe's run through ``MPipeTrainer``. The rows
    are read by the recipe's own loaders (the same processor, dataset and collator), so that only the trainer
    differs; the Trainer's arguments are the recipe's ``train`` section under the Trainer's names."""
    from transformers import AutoModelForImageTextToText, TrainingArguments
    from mpipe_hf import MPipeConfig, MPipeTrainer
    from mpipe_hf.train import load_recipe
    from mpipe_hf.train.sources import load_config, load_data, load_processor

    recipe = load_recipe(recipe_path)
    par, opt = recipe.parallel, recipe.train
    config = load_config(recipe.model)
    processor = load_processor(recipe, config)
    dataset, collate = load_data(recipe, config, processor, quiet=True)
    model = AutoModelForImageTextToText.from_pretrained(recipe.model.name_or_path, dtype=torch.float32)
    args = TrainingArguments(
        output_dir=out, max_steps=opt.max_steps, per_device_train_batch_size=recipe.data.micro_batch_size,
        gradient_accumulation_steps=par.num_micro, learning_rate=opt.learning_rate,
        lr_scheduler_type=opt.lr_scheduler_type, warmup_steps=opt.warmup_steps, weight_decay=opt.weight_decay,
        adam_beta1=opt.adam_beta1, adam_beta2=opt.adam_beta2, adam_epsilon=opt.adam_epsilon,
        max_grad_norm=opt.max_grad_norm, logging_steps=1, save_steps=opt.save_steps, report_to="none",
        remove_unused_columns=False, train_sampling_strategy="random" if recipe.data.shuffle else "sequential",
        use_cpu=True, seed=opt.seed)
    mpipe = MPipeConfig(pp_size=par.pp_size, vpp=par.vpp, preprocess=par.preprocess, timeout_s=par.timeout_s,
                        zero_bubble=par.zero_bubble, trace=True)
    trainer = MPipeTrainer(model=model, args=args, mpipe_config=mpipe, train_dataset=dataset, data_collator=collate,
                           processing_class=processor)
    assert trainer.loss_normalization() == opt.loss_normalization, trainer.loss_normalization()
    trainer.train()
    trainer.save_model(os.path.join(out, "final"))
    trainer.save_state()


def run(cmd, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, f"{cmd[:5]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc




def assert_same_weights(a_dir, b_dir):
    a, b = weights(a_dir), weights(b_dir)
    assert a and sorted(a) == sorted(b), (a_dir, sorted(set(a) ^ set(b))[:5])
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, (a_dir, differ[:5], max((a[k] - b[k]).abs().max().item() for k in differ))


def assert_same_state(a_dir, b_dir, rank):
    """Each rank's training state: the same parameters in the same order, AdamW's moments bit for bit, the same
    LR schedule position and step."""
    a, b = (torch.load(os.path.join(d, f"rank{rank}_state.pt"), map_location="cpu", weights_only=False)
            for d in (a_dir, b_dir))
    assert a["step"] == b["step"] == 2 and a["param_names"] == b["param_names"]
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"] == 2
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sorted(sa) == sorted(sb) and sa
    for i in sa:
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(sa[i][key], sb[i][key]), (rank, a["param_names"][i], key)


# CI runs the routes with zero-bubble (the B/W split on both sides); MPIPE_HF_FULL=1 adds the plain schedule
ROUTES = [{"zero_bubble": True}] + ([{}] if os.environ.get("MPIPE_HF_FULL") == "1" else [])


@pytest.mark.parametrize("parallel", ROUTES, ids=[("zero_bubble" if p else "mpipe") for p in ROUTES])
def test_trainer_and_recipe_routes_are_one_run(demo, tmp_path, parallel):
    """The recipe under ``mpipe-hf train`` and the same run under ``MPipeTrainer`` (torchrun): every step's loss,
    gradient norm and learning rate, ``checkpoint-2`` (weights and both ranks' training state) and the final
    weights are equal, bit for bit. They run the same arithmetic: the same :class:`PipelineRun` step, AdamW and
    ``get_scheduler`` over the same rows; the only rounding between them is the Trainer's, which sums the step's
    loss into an fp32 tensor before logging it, so its loss is the recipe's rounded to fp32."""
    recipe_out, trainer_out = str(tmp_path / "recipe"), str(tmp_path / "trainer")
    path = write_recipe(demo, tmp_path / "run.yaml", recipe_out, **parallel)
    run([CLI, "train", path])
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                os.path.abspath(__file__), path, trainer_out])
    assert "Traceback" not in proc.stderr
    ref = {r["step"]: r for r in map(json.loads, open(os.path.join(recipe_out, "metrics.jsonl"))) if "loss" in r}
    state = json.load(open(os.path.join(trainer_out, "trainer_state.json")))
    got = {h["step"]: h for h in state["log_history"] if "loss" in h}
    assert sorted(ref) == sorted(got) == list(range(1, STEPS + 1))
    for step in ref:
        assert got[step]["loss"] == float(np.float32(ref[step]["loss"])), (step, got[step], ref[step])
        assert got[step]["grad_norm"] == ref[step]["grad_norm"], (step, got[step], ref[step])
        assert got[step]["learning_rate"] == ref[step]["learning_rate"], step
    assert ref[1]["grad_norm"] > 0.5, "the clip clips"
    for rank in range(2):
        assert_same_state(os.path.join(recipe_out, "checkpoint-2"), os.path.join(trainer_out, "checkpoint-2"), rank)
    assert_same_weights(os.path.join(recipe_out, "checkpoint-2"), os.path.join(trainer_out, "checkpoint-2"))
    assert_same_weights(os.path.join(recipe_out, "checkpoint"), os.path.join(trainer_out, "final"))
    assert os.path.isfile(os.path.join(trainer_out, "trace.json")), "MPipeConfig(trace=True) writes the trace"


def test_the_trainer_refuses_what_only_a_recipe_runs():
    """``MPipeConfig`` names the field it cannot honour: data parallel over pipelines and load-aware owners are
    ``mpipe-hf train``'s (the Trainer hands every process the same rows)."""
    from mpipe_hf import MPipeConfig
    with pytest.raises(ValueError, match="dp_size must be 1"):
        MPipeConfig(pp_size=2, dp_size=2)
    with pytest.raises(ValueError, match="owners must be 'modulo'"):
        MPipeConfig(pp_size=2, owners="balanced", overflow="full")
    with pytest.raises(ValueError, match="trace must be True or False"):
        MPipeConfig(pp_size=2, trace="yes")
    with pytest.raises(ValueError, match="swap must be a SwapConfig"):
        MPipeConfig(pp_size=2, swap={"enabled": True})


def test_loss_normalization_is_a_recipe_field():
    from mpipe_hf.train.recipe import TrainSection
    assert TrainSection().loss_normalization == "tokens"  # the executor's default: recipes train as before
    assert TrainSection(loss_normalization="micro").loss_normalization == "micro"
    with pytest.raises(ValueError, match="train.loss_normalization must be 'tokens' or 'micro'"):
        TrainSection(loss_normalization="mean")


if __name__ == "__main__":
    trainer_worker(sys.argv[1], sys.argv[2])
