"""Packing through ``mpipe-hf train``: ``data.packing`` at ``dp = 2`` x ``pp = 2`` against the unsplit
model on one process over the same rows unpacked (padded). ``MPipeTrainer`` with ``MPipeConfig(packing=True)``
against the plain one-process ``transformers.Trainer`` with padding is
``tests/test_hf_trainer.py::test_mpipe_trainer_equals_plain_trainer[frozen-packed]``. The model-level proof over every packed case (frozen and trainable towers, DeepStack, linear attention, a 1-D
family, and the negative controls) is ``tests/test_numerics.py::test_packed_step_equals_unpacked``."""

import dataclasses
import json
import os
import subprocess
import sys

import torch
from transformers import AutoModelForImageTextToText

from train_common import EPS, LR, train_unsplit, write_recipe
from mpipe_hf.data.packing import PackedPlan
from mpipe_hf.train import load_recipe
from mpipe_hf.train.plan_packing import packed_plan
from mpipe_hf.train.recipe import TrainSection
from mpipe_hf.train.sources import load_config, load_data, load_processor

STEPS, NUM_MICRO, BUDGET = 2, 2, 200


class Unpacked:
    """The packed plan's rows, each micro-batch collated as it is unpacked (padded): the reference's view."""

    def __init__(self, plan: PackedPlan, collate):
        self.plan, self.collate = plan, collate

    def load(self, step, m):
        return self.collate([self.plan.dataset[i] for i in self.plan.rows(step, m)])


def reference_plan(recipe_path, num_micro):
    """The packer over the recipe's rows as ``mpipe-hf train`` builds it (its cut, costs and seed; one replica of
    ``num_micro``, every replica's micro-batches), and the collator."""
    recipe = load_recipe(recipe_path)
    config = load_config(recipe.model)
    dataset, collate = load_data(recipe, config, load_processor(recipe, config))
    return Unpacked(packed_plan(dataset, config, dataclasses.replace(
        recipe, parallel=dataclasses.replace(recipe.parallel, dp_size=1)), num_micro), collate)


def test_packed_dp2_pp2_training_equals_one_process_unpacked(demo, tmp_path):
    """``data.packing`` (a token budget of 200, about 3 rows per micro-batch) on ``dp = 2`` replicas of an ``R =
    2``, ``V = 2`` pipeline with a trainable tower: every step's loss and global gradient norm, and the weights
    after 2 AdamW steps, equal the unsplit model's on one process over the same rows, collated unpacked with
    padding (the step's 4 micro-batches). Each packed micro-batch holds rows of 0 to 3 images and is one sequence
    with no padding."""
    out = str(tmp_path / "run")
    recipe = write_recipe(demo, tmp_path / "packed.yaml", out, dp_size=2, dp_shard=False, preprocess="trainable",
                          num_micro=NUM_MICRO, max_steps=STEPS, packing=True, max_tokens_per_micro=BUDGET)
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc_per_node=4", "-m",
           "mpipe_hf.train", recipe]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    from mpipe_hf.train.plan_packing import packing_line  # rank 0 says packing is on, and how it packs
    packed = load_recipe(recipe)
    config = load_config(packed.model)
    dataset, _ = load_data(packed, config, load_processor(packed, config), quiet=True)
    assert packing_line(packed_plan(dataset, config, packed, NUM_MICRO)) in proc.stdout, proc.stdout[-3000:]
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    model = AutoModelForImageTextToText.from_pretrained(os.path.join(demo, "model"), dtype=torch.float32)
    plan = reference_plan(recipe, 2 * NUM_MICRO)
    rows_per_micro = [len(plan.plan.rows(s, m)) for s in range(STEPS) for m in range(2 * NUM_MICRO)]
    assert min(rows_per_micro) >= 2, rows_per_micro  # every micro-batch packs several rows
    losses, norms, _ = train_unsplit(model, plan, 2 * NUM_MICRO, STEPS,
                                     TrainSection(max_steps=STEPS, learning_rate=LR, adam_epsilon=EPS))
    assert len(rows) == STEPS
    for step, (row, loss, norm) in enumerate(zip(rows, losses, norms)):
        assert abs(row["loss"] - loss) < 1e-5 * (1 + step), (step, row["loss"], loss)
        assert abs(row["grad_norm"] - norm) < 1e-5 * (1 + step) * norm, (step, row["grad_norm"], norm)
    trained = AutoModelForImageTextToText.from_pretrained(os.path.join(out, "checkpoint"), dtype=torch.float32)
    expected = model.state_dict()
    worst = max((t - expected[n]).abs().max().item() for n, t in trained.state_dict().items())
    assert worst < 1e-4, worst
