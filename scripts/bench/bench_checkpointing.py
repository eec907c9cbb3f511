"""Activation memory with and without gradient checkpointing, on a recipe's model and data (one process).

Usage: python scripts/bench/bench_checkpointing.py [RECIPE.yaml] [--micros 4]

The recipe's model is split for one rank with every layer on the one stage (``R = 1``) and a frozen tower, as
``mpipe-hf profile`` does. Each micro-batch runs its forward with ``saved_tensors_hooks`` counting the distinct
storages autograd keeps for the backward (the weights' left out); the median over the micro-batches is printed
for ``train: {gradient_checkpointing: false}`` and ``true`` (HF's ``activation_checkpointing_enable``, v5's name
for ``gradient_checkpointing_enable``, non-reentrant), with the loss of both to show they compute the same.
"""

import argparse
import statistics

import torch

from mpipe_hf.data import MicroBatchPlan
from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.train import load_recipe
from mpipe_hf.runtime.memory import saved_bytes, storage_ids
from mpipe_hf.train.trainer import load_config, load_data, load_processor, load_share


def measure(recipe, checkpointing: bool, micros: int):
    config = load_config(recipe.model)
    cfg = ScheduleConfig(1, 1, micros, "frozen")
    text_layers = 0 if hasattr(config, "vision_config") else 1
    carved, _ = load_share(recipe.model, config, cfg, 0, None, text_layers, recipe.train.seed)
    model = carved.model.train()
    if checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    params = storage_ids(model.parameters())
    dataset, collate = load_data(recipe, config, load_processor(recipe, config))
    plan = MicroBatchPlan(dataset, collate, micros, recipe.data.micro_batch_size)
    sizes, losses = [], []
    for m in range(micros):
        raw = carved.preprocess.with_host(plan.load(0, m))  # with Qwen-VL's positions, computed at load
        with torch.no_grad():
            feats = carved.preprocess.module(carved.preprocess.inputs(raw))
        outs = []
        sizes.append(saved_bytes(lambda: outs.append(carved.stages[0]({**carved.preprocess.stage0_inputs(raw),
                                                                       **feats})), params))
        outs[0]["loss"].backward()
        losses.append(float(outs[0]["loss"].detach()))
    return statistics.median(sizes), losses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default="recipes/qwen2_5_vl_demo.yaml")
    parser.add_argument("--micros", type=int, default=4)
    args = parser.parse_args(argv)
    recipe = load_recipe(args.recipe)
    off, loss_off = measure(recipe, False, args.micros)
    on, loss_on = measure(recipe, True, args.micros)
    print(f"saved activations per micro-batch, median of {args.micros}: without checkpointing {off / 2**20:.2f} MiB, "
          f"with {on / 2**20:.2f} MiB ({off / on:.1f}x less); losses equal: {loss_off == loss_on}")


if __name__ == "__main__":
    main()
