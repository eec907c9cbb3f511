"""torchrun worker: pipelined LoRA steps against the same ``PeftModel`` on one process, case after case in one
process group.

Usage: torchrun --nproc_per_node R lora_worker.py OUT_DIR CASES_JSON

A case is ``{"name", "recipe": a recipe mapping with a lora section, "steps", "repeat", "reload"}``. Each rank
loads its share with the trainer's own ``load_share`` (the adapter put in by peft on the meta model before the
split), and runs ``steps`` AdamW steps as ``mpipe-hf train`` does (``run_step``, ``clip_grad_norm``, the
optimizer and LR schedule of ``train``), keeping every step's adapter gradients. Rank 0 then trains the reference:
the unsplit model (``from_pretrained`` or ``from_config`` with the recipe's seed) through ``peft.get_peft_model``
with a ``LoraConfig`` built here from the recipe's fields (``target_parameters`` included), over the same
micro-batches, with the HF Trainer's order of operations (an MoE model's load-balancing term added per micro,
weighted by its label tokens, as the pipeline's loss holds it). ``repeat``: the pipelined run is done twice
from a fresh load (the second run's losses and gradients are reported, to check determinism). ``reload``: the
adapter is saved with ``save_adapter`` and the merged weights with ``merged_state``; rank 0 loads them with
``PeftModel.from_pretrained`` and ``from_pretrained`` and reports the logit differences against the trained
reference, and the saved keys.

Each rank writes OUT_DIR/rank{r}.json.
"""

import contextlib
import json
import os
import sys
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist
from accelerate.utils import set_seed
from safetensors import safe_open

from common import run_cases
from mpipe_hf.data import MicroBatchPlan
from mpipe_hf.models.adapters import is_adapter_tensor, merged_state
from mpipe_hf.runtime import PipelineExecutor, build_mesh, init_distributed
from mpipe_hf.train.checkpoint import save_adapter, save_checkpoint
from mpipe_hf.train.loop import Skips, run_step
from mpipe_hf.models import get_family
from mpipe_hf.models.freeze import apply_trainable
from mpipe_hf.train.optimizer import build_optimizer, build_scheduler, clip_grad_norm
from mpipe_hf.train.recipe import parse_recipe
from mpipe_hf.train.trainer import check_layout, load_config, load_data, load_model, load_processor, load_share

TIMEOUT = timedelta(seconds=120)
PREFIX = "base_model.model."


def plan_of(recipe, carved, config):
    dataset, collate = load_data(recipe, config, load_processor(recipe, config), quiet=True)
    cfg = recipe.schedule()
    return MicroBatchPlan(dataset, collate, cfg.num_micro, recipe.data.micro_batch_size,
                          carved.validate_micro if carved is not None else None, recipe.data.shuffle,
                          recipe.train.seed)


def pipelined(recipe, steps, rank, group, device):
    """The trainer's load and steps: ``(carved, params, per-step losses, per-step grads {name: tensor})``."""
    cfg, par, opt = recipe.schedule(), recipe.parallel, recipe.train
    config = load_config(recipe.model)
    counts = check_layout(recipe, config)
    carved, _ = load_share(recipe.model, config, cfg, rank, counts, par.text_layers, opt.seed,
                           recipe.lora.peft_config())
    apply_trainable(carved.model, get_family(config.model_type), opt.trainable_spec(), carved.frozen, carved.tied,
                    strict=False)  # the freeze / trainable patterns, as the trainer's Run.freeze
    carved.model.to(device).train()
    set_seed(opt.seed)
    plan = plan_of(recipe, carved, config)
    params = carved.trainable_parameters(cfg, rank)
    optimizer = build_optimizer(carved.model, params, opt)
    scheduler = build_scheduler(optimizer, opt, steps)
    heads = {id(p) for p, peer in carved.tied_parameters(cfg, rank) if peer == 0}
    counted = [p for p in params.values() if id(p) not in heads]
    executor = PipelineExecutor(cfg, rank, carved.stages, carved.preprocess, group, device, params.values(),
                                TIMEOUT, carved.tied_parameters(cfg, rank), seed=opt.seed)
    losses, grads, norms = [], [], []
    for step in range(steps):
        stats = run_step(executor, partial(plan.load, step), recipe.data, Skips(), step)
        norms.append(clip_grad_norm(list(params.values()), counted, opt.max_grad_norm, group, device))
        losses.append(stats.loss)
        grads.append({n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None})
        with_grad = sorted(n for n, p in carved.model.named_parameters() if p.grad is not None)
        if optimizer is not None:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
    executor.close()
    return carved, params, losses, grads, norms, optimizer, with_grad


def reference(recipe, steps):
    """The unsplit ``PeftModel`` trained on one process: ``(model, losses, grads per step, norms, one micro)``."""
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, get_scheduler
    opt, lora = recipe.train, recipe.lora
    config = load_config(recipe.model)
    base = load_model(recipe.model, config, opt.seed)
    if recipe.model.name_or_path is not None:
        set_seed(opt.seed)  # load_model seeds only a from_config build
    model = get_peft_model(base, LoraConfig(r=lora.r, lora_alpha=lora.lora_alpha, lora_dropout=lora.lora_dropout,
                                            target_modules=lora.target_modules, exclude_modules=lora.exclude_modules,
                                            modules_to_save=lora.modules_to_save, use_rslora=lora.use_rslora,
                                            init_lora_weights=lora.init_lora_weights,
                                            **({"target_parameters": lora.target_parameters}
                                               if lora.target_parameters else {})))
    apply_trainable(model.base_model.model, get_family(config.model_type), opt.trainable_spec())
    model.train()
    set_seed(opt.seed)
    plan = plan_of(recipe, None, config)
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": [p for n, p in named if n in decay], "weight_decay": opt.weight_decay},
                                   {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}],
                                  lr=opt.learning_rate, betas=(opt.adam_beta1, opt.adam_beta2), eps=opt.adam_epsilon)
    scheduler = get_scheduler(opt.lr_scheduler_type, optimizer, num_warmup_steps=opt.warmup_steps,
                              num_training_steps=steps)
    vocab = config.get_text_config().vocab_size
    num_micro = recipe.parallel.num_micro
    losses, grads, norms = [], [], []
    for step in range(steps):
        micros = [plan.load(step, m) for m in range(num_micro)]
        total = sum(int((mb["labels"][..., 1:] != -100).sum()) for mb in micros)
        loss_sum = 0.0
        for mb in micros:
            out = model(**{k: v for k, v in mb.items() if k != "labels"})
            loss = model.loss_function(logits=out.logits, labels=mb["labels"], vocab_size=vocab,
                                       num_items_in_batch=total)
            if getattr(out, "aux_loss", None) is not None:  # MoE: HF's load-balancing term, token-weighted
                tokens = int((mb["labels"][..., 1:] != -100).sum())
                loss = loss + config.get_text_config().router_aux_loss_coef * out.aux_loss * tokens / total
            loss.backward()
            loss_sum += loss.detach().item()
        params = [p for _, p in named]
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, opt.max_grad_norm) if opt.max_grad_norm > 0
                           else torch.nn.utils.get_total_norm([p.grad for p in params])))
        grads.append({n.removeprefix(PREFIX): p.grad.detach().clone() for n, p in named if p.grad is not None})
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss_sum)
    return model, losses, grads, norms, micros[0]


def reload_check(recipe, carved, rank, group, out_dir, name, ref_model, micro):
    """Save the adapter (PEFT format) and the merged weights; rank 0 reloads both and compares logits."""
    from peft import PeftModel
    cfg = recipe.schedule()
    state = carved.state_dict(cfg, rank)
    adapter_dir, merged_dir = os.path.join(out_dir, f"adapter-{name}"), os.path.join(out_dir, f"merged-{name}")
    config = carved.model.config
    save_adapter(adapter_dir, carved.peft, state, rank, cfg.pp_size, group, recipe.model.name_or_path)
    save_checkpoint(merged_dir, merged_state(carved.model, state), rank, cfg.pp_size, group, config.save_pretrained)
    out = {}
    if rank == 0:
        ref_model.eval()
        base = load_model(recipe.model, load_config(recipe.model), recipe.train.seed)
        loaded = PeftModel.from_pretrained(base, adapter_dir).eval()
        merged, info = type(base).from_pretrained(merged_dir, output_loading_info=True)
        inputs = {k: v for k, v in micro.items() if k != "labels"}
        with torch.no_grad():
            want = ref_model(**inputs).logits
            out["adapter_logit_diff"] = float((loaded(**inputs).logits - want).abs().max())
            out["merged_logit_diff"] = float((merged.eval()(**inputs).logits - want).abs().max())
            out["base_logit_diff"] = float((load_model(recipe.model, load_config(recipe.model), recipe.train.seed)
                                            .eval()(**inputs).logits - want).abs().max())
        out["merged_keys"] = sorted(info["missing_keys"]) + sorted(info["unexpected_keys"])
        with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
            out["adapter_config"] = json.load(f)
        out["adapter_files"] = sorted(os.listdir(adapter_dir))
        with safe_open(os.path.join(adapter_dir, "adapter_model.safetensors"), "pt") as f:
            out["adapter_keys"] = sorted(f.keys())
    dist.barrier(group=group)
    return out


def run_case(case, rank, group, device, out_dir):
    recipe = parse_recipe(case["recipe"])
    steps = case.get("steps", 3)
    runs = [pipelined(recipe, steps, rank, group, device) for _ in range(2 if case.get("repeat") else 1)]
    carved, params, losses, grads, norms, optimizer, with_grad = runs[-1]
    result = {"losses": losses, "norms": norms, "names": sorted(params),
              "optimizer": optimizer is not None,
              "adapter_names": sorted(n for n in params if is_adapter_tensor(n)),
              # every tensor holding a gradient after the last backward (before zero_grad): the trained ones
              "with_grad": with_grad,
              "base_trainable": sorted(n for n in params if not is_adapter_tensor(n))}
    if case.get("repeat"):
        first = runs[0]
        result["repeat_losses_equal"] = first[2] == losses
        result["repeat_grads_equal"] = all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
                                           for a, b in zip(first[3], grads))
    ref_path = os.path.join(out_dir, f"ref-{case['name']}.pt")
    ref_model = micro = None
    if rank == 0 and not case.get("repeat"):
        ref_model, ref_losses, ref_grads, ref_norms, micro = reference(recipe, steps)
        torch.save({"losses": ref_losses, "grads": ref_grads, "norms": ref_norms,
                    "params": {n.removeprefix(PREFIX): p.detach() for n, p in ref_model.named_parameters()
                               if p.requires_grad}}, ref_path)
    dist.barrier(group=group)
    if not case.get("repeat"):
        ref = torch.load(ref_path, weights_only=False)  # this run's own file
        result["ref_losses"], result["ref_norms"] = ref["losses"], ref["norms"]
        # every adapter gradient of every step; one the reference lacks (or has alone) is an infinite difference
        result["grad_diff"] = [max((float((g[n] - want[n].to(g[n])).abs().max()) if n in want else float("inf")
                                    for n in g), default=0.0) for g, want in zip(grads, ref["grads"])]
        last, want = grads[-1], ref["grads"][-1]  # the last step: lora_B has left its zero initialisation
        result["last_grad_stats"] = {n: [float(want[n].abs().max()), float((last[n] - want[n].to(last[n])).abs().max())]
                                     for n in last if n in want}
        result["grads_missing"] = sorted({n for g, want in zip(grads, ref["grads"]) for n in params
                                          if (n in g) != (n in want)})[:5]
        result["ref_has"] = all(n in ref["params"] for n in params)
        result["param_diff"] = max((float((p.detach().cpu() - ref["params"][n]).abs().max()) for n, p in params.items()),
                                   default=0.0)
        if case.get("reload"):
            result.update(reload_check(recipe, carved, rank, group, out_dir, case["name"], ref_model, micro))
    dist.barrier(group=group)
    if rank == 0 and os.path.exists(ref_path):
        os.remove(ref_path)
    return result


def main():
    out_dir, cases = sys.argv[1], json.loads(sys.argv[2])
    device = init_distributed()
    mesh = build_mesh(int(os.environ["WORLD_SIZE"]))
    group, rank = mesh.get_group("pp"), mesh.get_local_rank("pp")
    def run(case):
        with contextlib.redirect_stdout(sys.stderr):  # the trainer's prints stay out of the timing lines
            return run_case(case, rank, group, device, out_dir)
    run_cases(cases, run, out_dir, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
