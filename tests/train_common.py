"""What the end-to-end training tests share: recipes written for the demo, the unsplit model trained on one
process as the HF Trainer trains it (the reference), and ``mpipe-hf train`` checked against it."""

import copy
import dataclasses
import json
import os
import subprocess
import sys

import torch
import yaml
from transformers import AutoTokenizer

from mpipe_hf.data import (ConversationCollator, MicroBatchPlan, load_conversation_dataset,
                           qwen2_5_vl_processor)
from mpipe_hf.models import split
from mpipe_hf.models.base import freeze
from mpipe_hf.train import load_recipe
from mpipe_hf.train.recipe import SECTIONS
from mpipe_hf.train.trainer import load_config, load_data, load_model, load_processor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist"))
from reference import hf_inputs  # noqa: E402  (the keys a family hands over as lists, converted)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, NUM_MICRO, LR = 2, 4, 2e-3
# AdamW moves a parameter by about lr * g / (|g| + eps): with torch's eps = 1e-8, fp32 noise of 1e-8 on a
# near-zero gradient element becomes a visible part of lr. eps = 1e-6 keeps that noise below 1e-5 * lr / 1e-3.
EPS = 1e-6


SECTION_OF = {f.name: name for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


def set_keys(raw, **keys):
    """Put each key into its section of the recipe mapping ``raw`` (an unknown key goes to ``train``)."""
    for key, value in keys.items():
        if key == "model":
            raw["model"] = value
        else:
            raw.setdefault(SECTION_OF.get(key, "train"), {})[key] = value
    return raw


def write_recipe(demo, recipe_path, output_dir, **overrides):
    recipe = set_keys({"data": {"path": os.path.join(demo, "data", "train.jsonl")}},
                      model=os.path.join(demo, "model"), pp_size=2, vpp=2, num_micro=NUM_MICRO, max_steps=STEPS,
                      learning_rate=LR, adam_epsilon=EPS, output_dir=output_dir, timeout_s=120)
    set_keys(recipe, **overrides)
    with open(recipe_path, "w") as f:
        yaml.safe_dump(recipe, f)
    return str(recipe_path)


def run(cmd, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def demo_plan(demo, path=None, num_micro=NUM_MICRO, micro_batch_size=1, shuffle=True):
    """The demo's conversation rows (or ``path``'s) as the trainer reads them, with the recipe's defaults."""
    processor = qwen2_5_vl_processor(AutoTokenizer.from_pretrained(os.path.join(demo, "model")))
    dataset = load_conversation_dataset(path or os.path.join(demo, "data", "train.jsonl"), processor, 2048)
    return MicroBatchPlan(dataset, ConversationCollator(processor, 2048), num_micro, micro_batch_size,
                          shuffle=shuffle, seed=0)


def train_unsplit(model, plan, num_micro, steps, train, skipped=()):
    """``steps`` steps of the unsplit ``model`` on one process, as the HF Trainer does them: AdamW in the
    Trainer's decay groups, ``get_scheduler``, ``clip_grad_norm_``, and with ``train.bf16`` the forward and
    loss under bf16 autocast (AMP). The steps in ``skipped`` are left out (no optimizer or scheduler step).
    Returns the losses, the gradient norms before clipping, and the last step's micro-batches."""
    import contextlib
    from transformers import Trainer, get_scheduler
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": [p for n, p in named if n in decay], "weight_decay": train.weight_decay},
                                   {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}],
                                  lr=train.learning_rate, betas=(train.adam_beta1, train.adam_beta2),
                                  eps=train.adam_epsilon)
    scheduler = get_scheduler(train.lr_scheduler_type, optimizer, num_warmup_steps=train.warmup_steps,
                              num_training_steps=train.max_steps)
    vocab = model.config.get_text_config().vocab_size
    losses, norms = [], []
    for step in range(steps):
        if step in skipped:
            continue
        micros = [plan.load(step, m) for m in range(num_micro)]
        total = sum(int((mb["labels"][..., 1:] != -100).sum()) for mb in micros)
        loss_sum = 0.0
        for mb in micros:
            with torch.autocast("cpu", dtype=torch.bfloat16) if train.bf16 else contextlib.nullcontext():
                out = model(**hf_inputs(model, {k: v for k, v in mb.items() if k != "labels"}))
                loss = model.loss_function(logits=out.logits, labels=mb["labels"], vocab_size=vocab,
                                           num_items_in_batch=total)
                if getattr(out, "aux_loss", None) is not None:  # MoE: HF's load-balancing term, token-weighted
                    tokens = int((mb["labels"][..., 1:] != -100).sum())
                    loss = loss + model.config.get_text_config().router_aux_loss_coef * out.aux_loss * tokens / total
            loss.backward()
            loss_sum += loss.detach().item()
        params = [p for _, p in named]
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, train.max_grad_norm) if train.max_grad_norm > 0
                           else torch.nn.utils.get_total_norm([p.grad for p in params])))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss_sum)
    return losses, norms, micros


def recipe_reference(recipe, steps):
    """The recipe's model (same seed) trained unsplit on one process over the trainer's micro-batches: the
    per-step losses, the gradient norms, the model and one micro-batch."""
    cfg = recipe.schedule()
    config = load_config(recipe.model)
    model = load_model(recipe.model, config, recipe.train.seed)
    carved = split(copy.deepcopy(model), cfg, 0, recipe.parallel.layers_per_stage, recipe.parallel.text_layers)
    freeze(model, carved.frozen)  # what the pipeline freezes (a frozen P)
    dataset, collate = load_data(recipe, config, load_processor(recipe, config))
    plan = MicroBatchPlan(dataset, collate, cfg.num_micro, recipe.data.micro_batch_size, None, recipe.data.shuffle,
                          recipe.train.seed)
    losses, norms, micros = train_unsplit(model, plan, cfg.num_micro, steps, recipe.train)
    return losses, norms, model, micros[0]


def train_like_one_process(tmp_path, raw, logits_tol: float = 1e-4):
    """``mpipe-hf train`` on the recipe ``raw`` (2 steps, eps 1e-6, run in ``tmp_path``) against the unsplit model:
    equal losses and gradient norms, a checkpoint that ``from_pretrained`` loads to the one-process logits (within
    ``logits_tol``). Returns the processor, the one-process model and one micro-batch."""
    set_keys(raw, max_steps=2, adam_epsilon=EPS, output_dir=str(tmp_path / "out"), timeout_s=120)
    (tmp_path / "recipes").mkdir()
    with open(tmp_path / "recipes" / "recipe.yaml", "w") as f:
        yaml.safe_dump(raw, f)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        recipe = load_recipe("recipes/recipe.yaml")
        ref_losses, ref_norms, ref_model, micro = recipe_reference(recipe, 2)
        processor = load_processor(recipe, load_config(recipe.model))
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train",
                               "recipes/recipe.yaml"], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        os.chdir(cwd)
    assert proc.returncode == 0, proc.stderr[-5000:]
    rows = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
    assert len(rows) == 2 and all(abs(r["loss"] - ref) < 1e-4 for r, ref in zip(rows, ref_losses)), (rows, ref_losses)
    # the global norm over the ranks is the unsplit model's (a tied pair and P counted once); AdamW hides a wrong
    # clip scale from the losses, so the norm itself is compared
    assert all(abs(r["grad_norm"] - n) < 1e-4 * n for r, n in zip(rows, ref_norms)), (rows, ref_norms)
    loaded, info = type(ref_model).from_pretrained(tmp_path / "out" / "checkpoint", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        inputs = hf_inputs(ref_model, {k: v for k, v in micro.items() if k != "labels"})
        diff = (loaded(**inputs).logits - ref_model(**inputs).logits).abs().max().item()
    assert diff < logits_tol, diff
    return processor, ref_model, micro


def train_tiny_family_like_one_process(demo, tmp_path, model_type: str, build, logits_tol: float = 1e-4):
    """``mpipe-hf train`` on the tiny ``build(tokenizer)`` config of ``model_type`` (random weights drawn from it,
    the family's own chat template, the demo's rows; recipes/qwen3_5.yaml's schedule with a trainable ``P`` of one
    text layer) against the unsplit model (:func:`train_like_one_process`, whose result it returns)."""
    os.symlink(demo, tmp_path / "demo")
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(demo, "model"))
    tokenizer.chat_template = None  # the demo's is Qwen's ChatML: the family's own default renders instead
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    build(tokenizer).to_json_file(str(tmp_path / f"{model_type}.json"))
    raw = yaml.safe_load(open(os.path.join(ROOT, "recipes", "qwen3_5.yaml")))
    raw["model"].update(config=f"../{model_type}.json", tokenizer="../tokenizer")
    raw["parallel"].update(preprocess="trainable", layers_per_stage=None, text_layers=1)
    return train_like_one_process(tmp_path, raw, logits_tol)


def conversation_rows(images):
    """Rows of every form the loader takes, three steps of 2 micros x 2 rows: text-only, 1, 2 and 3 images,
    string and parts content, a system message, several turns; line 6 has a truncated image."""
    def user(text, n, parts):
        if parts:
            return {"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": text}]}
        return {"role": "user", "content": "<image>" * n + text}

    def answer(text):
        return {"role": "assistant", "content": text}
    rows = []
    for i in range(12):
        n, parts = i % 4, i % 2 == 1
        messages = [user(f"Describe {n} pictures." if n else "What is a stage?", n, parts),
                    answer(f"Answer {i}: " + " and ".join(["a photo"] * n or ["a part of the model"]))]
        if i % 3 == 0:
            messages += [{"role": "user", "content": "Shorter, please."}, answer(f"Short {i}.")]
        if i % 4 == 2:
            messages.insert(0, {"role": "system", "content": "Answer briefly."})
        rows.append({"messages": messages, "images": [images[(i + j) % len(images)] for j in range(n)]})
    rows[5]["images"] = ["truncated.png"]
    return rows
