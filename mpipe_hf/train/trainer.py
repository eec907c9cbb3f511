"""The trainer: every rank loads the checkpoint, keeps its stages, loads its own micro-batches and runs the MPipe
Transpose schedule; AdamW steps each rank's own parameters (SPEC.md, "The job").

Launch with ``mpipe-hf train RECIPE.yaml`` (starts the processes itself), ``torchrun ... -m mpipe_hf.train
RECIPE.yaml`` or ``accelerate launch ... -m mpipe_hf.train RECIPE.yaml``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist
from accelerate.utils import set_seed
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

from ..data import CaptionCollator, MicroBatchPlan, load_caption_dataset, qwen2_5_vl_processor
from ..models import get_family
from ..runtime import PipelineExecutor, build_mesh, init_distributed
from .checkpoint import save_checkpoint
from .recipe import Recipe, load_recipe


@dataclass
class TrainResult:
    """Per-step losses (mean over label tokens), and where the checkpoint went."""

    losses: list[float]
    checkpoint: str
    wall_s: float


def check(recipe: Recipe) -> list[int]:
    """Every check that needs no process group: schedule, model type, layer layout, world size, data file.

    Returns the decoder layers per stage. Raises ``ValueError`` naming the field.
    """
    cfg = recipe.schedule()
    if not os.path.isdir(recipe.model):
        raise ValueError(f"model {recipe.model!r} is not a checkpoint directory")
    if not os.path.isfile(recipe.data):
        raise ValueError(f"data {recipe.data!r} is not a file")
    config = AutoConfig.from_pretrained(recipe.model)
    family = get_family(config.model_type)
    if not hasattr(config, "vision_config"):
        raise ValueError(f"model_type {config.model_type!r} is a text-only model; the trainer runs image-caption "
                         f"recipes of vision-language models (model_type 'qwen2_5_vl'). Text-only families can be "
                         f"split (mpipe_hf.models.get_splitter) but have no recipe trainer yet")
    counts = family.layer_counts(config, cfg, recipe.layers_per_stage, recipe.text_layers)
    world = int(os.environ.get("WORLD_SIZE", cfg.pp_size))
    if world != cfg.pp_size:
        raise ValueError(f"pp_size is {cfg.pp_size} but {world} processes were launched; launch pp_size processes")
    return counts


def _load_processor(model_dir: str, recipe: Recipe):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    image_processor = AutoImageProcessor.from_pretrained(
        model_dir, size={"shortest_edge": recipe.min_pixels, "longest_edge": recipe.max_pixels})
    return qwen2_5_vl_processor(tokenizer, image_processor=image_processor)


def train(recipe: Recipe) -> TrainResult:
    """Run ``recipe.steps`` optimizer steps and save a checkpoint to ``output_dir/checkpoint``.

    Raises:
        ValueError: a bad recipe, model or sample (before any collective for the recipe and model).
    """
    layers_per_stage = check(recipe)
    cfg = recipe.schedule()
    device = init_distributed(timedelta(seconds=recipe.timeout_s))
    mesh = build_mesh(cfg.pp_size)
    group, rank = mesh.get_group("pp"), mesh.get_local_rank("pp")
    set_seed(recipe.seed)
    model = AutoModelForImageTextToText.from_pretrained(recipe.model, dtype=torch.float32).to(device)
    split = get_family(model.config.model_type).split(model, cfg, rank, layers_per_stage, recipe.text_layers)
    processor = _load_processor(recipe.model, recipe)
    if rank != 0:  # rank 0 builds the datasets cache first
        dist.barrier(group=group)
    dataset = load_caption_dataset(recipe.data)
    if rank == 0:
        dist.barrier(group=group)
    plan = MicroBatchPlan(dataset, CaptionCollator(processor), cfg.num_micro, recipe.micro_batch_size,
                          split.validate_micro)
    params = split.trainable_parameters(cfg, rank)
    optimizer = torch.optim.AdamW(params.values(), lr=recipe.lr, weight_decay=recipe.weight_decay,
                                  eps=recipe.adam_eps)
    executor = PipelineExecutor(cfg, rank, split.stages, split.preprocess, group, device, params.values(),
                                timedelta(seconds=recipe.timeout_s))
    os.makedirs(recipe.output_dir, exist_ok=True)
    log = open(os.path.join(recipe.output_dir, "metrics.jsonl"), "w") if rank == 0 else None
    if rank == 0:
        print(f"mpipe_hf: R={cfg.pp_size} V={cfg.vpp} M={cfg.num_micro} preprocess={cfg.preprocess} "
              f"text_layers={recipe.text_layers} overflow={cfg.overflow} owner_backward={cfg.owner_backward} "
              f"less_memory={cfg.less_memory} layers per stage={layers_per_stage}", flush=True)
    losses, start = [], time.perf_counter()
    bar = tqdm(range(recipe.steps), disable=rank != 0, desc="train", dynamic_ncols=True)
    for step in bar:
        stats = executor.step(partial(plan.load, step))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(stats.loss)
        row = {"step": step + 1, "loss": round(stats.loss, 5), "tokens_per_s": round(stats.num_tokens / stats.wall_s, 1),
               "bubble": round(stats.bubble, 3), "step_s": round(stats.wall_s, 3),
               "peak_activations_rank0": stats.peak_activations}
        bar.set_postfix(loss=f"{stats.loss:.4f}", tok_s=f"{row['tokens_per_s']:.0f}", bubble=f"{stats.bubble:.2f}")
        if log is not None:
            log.write(json.dumps(row) + "\n")
            log.flush()
    wall = time.perf_counter() - start
    out = os.path.join(recipe.output_dir, "checkpoint")

    def extras(directory):
        model.config.save_pretrained(directory)
        processor.tokenizer.save_pretrained(directory)
        processor.image_processor.save_pretrained(directory)
    save_checkpoint(out, split.state_dict(cfg, rank), rank, cfg.pp_size, group, extras)
    if rank == 0:
        log.close()
        print(f"mpipe_hf: {recipe.steps} steps in {wall:.1f}s; loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
              f"checkpoint {out}", flush=True)
    return TrainResult(losses, out, wall)


def main(argv: list[str] | None = None) -> None:
    """``python -m mpipe_hf.train RECIPE.yaml`` under torchrun or accelerate launch."""
    import sys
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m mpipe_hf.train RECIPE.yaml (under torchrun or accelerate launch)")
    try:
        train(load_recipe(args[0]))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
