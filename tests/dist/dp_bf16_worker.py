"""torchrun worker (``dp = 2`` x ``pp = 2``, 4 processes, gloo): FSDP2 under ``train.bf16`` through the trainer's
own :class:`~mpipe_hf.train.run.PipelineRun` and the executor, against the unsplit model on one process under the
same precision policy.

Usage: torchrun --nproc_per_node 4 dp_bf16_worker.py OUT_DIR CASES_JSON

A case is ``{"name", "recipe": a recipe mapping with dp_size 2, dp_shard and bf16, "steps"}``. Every rank joins
the ``(dp, pp)`` mesh, carves its share, wraps it for FSDP2 and runs ``steps`` steps exactly as ``mpipe-hf
train`` does (:meth:`PipelineRun.start` with ``bf16``, :meth:`PipelineRun.step`, no clipping). The optimizer
does not step: every step is compared with the same weights. After each step, every trained tensor's full
gradient (``DTensor.full_tensor``, gathered over the replicas) is kept.

Global rank 0 then runs the reference: the unsplit model (the same seed, the same adapter) over the step's whole
global batch (both replicas' ``M`` micro-batches, as a plan of ``2 M`` micro-batches reads them), each micro's
forward under its own bf16 autocast region, its summed token loss (and the MoE load-balancing term weighted by
its label tokens) backpropagated, and the gradients divided once by the batch's label tokens: the pipeline's
order of operations, so that the two differ only by the order of fp32 sums across the replicas. Every rank
compares its own tensors. Each rank writes ``OUT_DIR/rank{r}.json``.

With ``parallel.cp_size`` 2 the world is ``dp x cp x pp`` (8 processes): each replica's CP group splits every
micro-batch's sequence and FSDP2 shards over the flattened ``dp x cp`` ranks. A case's ``cp_unsummed`` is the negative
control: FSDP2 over ``dp`` alone, as if the CP ranks' gradients were not summed (their loss sums and label tokens
still are). A case's ``eval_micros`` adds an evaluation (:meth:`PipelineRun.evaluate`) of that many micro-batches at
the same weights, against the unsplit model's forward over them.
"""

import contextlib
import json
import os
import sys
from functools import partial
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from common import run_cases
from reference import reference_run
from mpipe_hf.data import MicroBatchPlan
from mpipe_hf.runtime.data_parallel import bf16_units
from mpipe_hf.runtime.mesh import reduction_mesh
from mpipe_hf.train.recipe import parse_recipe
from mpipe_hf.train.run import PipelineRun
from mpipe_hf.train.trainer import check_layout, load_config, load_data, load_model, load_processor

PREFIX = "base_model.model."


def plan_of(recipe, config, validate, replica, replicas, num_micro):
    dataset, collate = load_data(recipe, config, load_processor(recipe, config), quiet=True)
    return MicroBatchPlan(dataset, collate, num_micro, recipe.data.micro_batch_size, validate, recipe.data.shuffle,
                          recipe.train.seed, replica, replicas)


def full(grad: torch.Tensor) -> torch.Tensor:
    return grad.full_tensor() if isinstance(grad, DTensor) else grad


def pipelined(recipe, steps: int, unsummed: bool = False
              ) -> tuple[PipelineRun, list[float], list[dict[str, torch.Tensor]], list[str]]:
    """The trainer's path: ``(run, per-step losses, per-step full gradients by name, the names of the trained
    parameters of the modules autocast runs in bf16)``."""
    run = PipelineRun(recipe.parallel, recipe.train.seed, recipe.data)
    config = load_config(recipe.model)
    run.connect(config, bf16=True)
    adapter = recipe.lora.peft_config() if recipe.lora is not None else None
    run.carve(recipe.model, config, check_layout(recipe, config), adapter)
    units = bf16_units(run.carved.stages)  # before FSDP2 wraps them into subclasses (the same objects)
    if unsummed:  # the negative control: FSDP2 over dp alone, each CP rank keeping its own slice's gradients
        with mock.patch("mpipe_hf.train.run.reduction_mesh", lambda mesh: mesh["dp"]):
            run.start(bf16=True)
        every = reduction_mesh(run.mesh).get_group()  # the loss sums and label tokens still summed over dp x cp
        run.data_parallel.sum = lambda values: dist.all_reduce(values, group=every) or values
    else:
        run.start(bf16=True)
    plan = plan_of(recipe, config, run.carved.validate_micro, run.dp_rank, recipe.parallel.dp_size,
                   recipe.parallel.num_micro)
    losses, grads = [], []
    for step in range(steps):
        result = run.step(step, partial(plan.load, step), 0.0)
        assert result.ran, f"step {step} did not run"
        losses.append(result.stats.loss)
        # every trained tensor, gathered on every replica (full_tensor is a collective: the same order everywhere)
        grads.append({n: full(p.grad).detach().clone() for n, p in sorted(run.params.items())
                      if p.grad is not None})
        for p in run.params.values():
            p.grad = None
    held = {id(p) for m in units for p in m.parameters(recurse=False)}
    return run, losses, grads, sorted(n for n, p in run.params.items() if id(p) in held)


def reference(recipe, steps: int) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    """The unsplit model on this process, over each step's global batch, in the pipeline's order (module doc)."""
    config = load_config(recipe.model)
    model = load_model(recipe.model, config, recipe.train.seed)
    if recipe.lora is not None:
        from peft import get_peft_model
        if recipe.model.name_or_path is not None:  # as load_share: the adapter drawn after a checkpoint's load
            from accelerate.utils import set_seed
            set_seed(recipe.train.seed)
        model = get_peft_model(model, recipe.lora.peft_config())
    model.train()
    par = recipe.parallel
    if par.preprocess == "frozen":
        tower = getattr(model.get_base_model() if recipe.lora is not None else model, "model").visual
        tower.requires_grad_(False)
    plan = plan_of(recipe, config, None, 0, 1, par.dp_size * par.num_micro)
    losses, grads = [], []
    for step in range(steps):
        micros = [plan.load(step, m) for m in range(par.dp_size * par.num_micro)]
        losses.append(reference_run(model, micros, bf16=True, order="pipeline"))
        grads.append({n.removeprefix(PREFIX): p.grad.detach().clone()
                      for n, p in model.named_parameters(remove_duplicate=False)
                      if p.requires_grad and p.grad is not None})
        model.zero_grad(set_to_none=True)
    return losses, grads


def compare(mine: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict:
    """The largest difference of each tensor in units of ``1e-5 + 1e-5 * max|reference|`` (the worst tensor),
    the largest absolute one, each tensor's ``(largest difference, max|reference|)`` and the tensors that one side
    lacks."""
    scaled, absolute, missing, tensors = (0.0, None), 0.0, [], {}
    for name, g in mine.items():
        if name not in want:
            missing.append(name)
            continue
        diff = float((g - want[name]).abs().max())
        tensors[name] = (diff, float(want[name].abs().max()))
        absolute = max(absolute, diff)
        scaled = max(scaled, (diff / (1e-5 + 1e-5 * float(want[name].abs().max())), name), key=lambda x: x[0])
    return {"scaled": scaled[0], "worst": scaled[1], "max_abs": absolute, "missing": missing, "tensors": tensors,
            "ref_max": max(float(want[n].abs().max()) for n in mine if n in want)}


def eval_plan(recipe, config, validate):
    """The evaluation's plan of the recipe's training rows and its first ``case["eval_micros"]`` micro-batches
    (as ``mpipe-hf train`` reads an eval set: every row once, in order)."""
    dataset, collate = load_data(recipe, config, load_processor(recipe, config), quiet=True)
    return MicroBatchPlan(dataset, collate, recipe.parallel.num_micro, recipe.data.micro_batch_size, validate,
                          evaluation=True)


def evaluated(run, recipe, micros: int) -> tuple[float, int]:
    """``(eval loss, label tokens)`` of the pipeline's forward-only run (:meth:`PipelineRun.evaluate`) over the
    first ``micros`` micro-batches of :func:`eval_plan`, divided among the replicas."""
    plan = eval_plan(recipe, load_config(recipe.model), run.carved.validate_micro)
    return run.evaluate(plan.load_rows, plan.eval_micros()[:micros])


def reference_eval(recipe, micros: int) -> tuple[float, int]:
    """The unsplit model's ``(eval loss, label tokens)`` on this process over the same micro-batches: in eval
    mode, without autograd, each micro's forward under bf16 autocast, the summed token losses over the tokens."""
    config = load_config(recipe.model)
    model = load_model(recipe.model, config, recipe.train.seed).eval()
    plan = eval_plan(recipe, config, None)
    loss, tokens, vocab = 0.0, 0, config.get_text_config().vocab_size
    with torch.no_grad():
        for rows in plan.eval_micros()[:micros]:
            mb = plan.load_rows(rows)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(**{k: v for k, v in mb.items() if k != "labels"})
                loss += float(model.loss_function(logits=out.logits, labels=mb["labels"], vocab_size=vocab,
                                                  num_items_in_batch=1))
            tokens += int((mb["labels"][..., 1:] != -100).sum())
    return loss / tokens, tokens


def run_case(case: dict, out_dir: str) -> dict:
    recipe = parse_recipe(case["recipe"])
    steps = case.get("steps", 1)
    run, losses, grads, bf16_params = pipelined(recipe, steps, case.get("cp_unsummed", False))
    micros = case.get("eval_micros", 0)  # an evaluation at the same weights (the optimizer does not step)
    evaluation = evaluated(run, recipe, micros) if micros else None
    path = os.path.join(out_dir, f"ref-{case['name']}.pt")
    if dist.get_rank() == 0:
        torch.save((*reference(recipe, steps), reference_eval(recipe, micros) if micros else None), path)
    dist.barrier()
    ref_losses, ref_grads, ref_eval = torch.load(path, map_location="cpu", weights_only=False)
    run.executor.close()
    dist.barrier()
    if dist.get_rank() == 0:
        os.remove(path)
    return {"losses": losses, "ref_losses": ref_losses, "names": sorted(grads[0]), "bf16_params": bf16_params,
            "eval": evaluation, "ref_eval": ref_eval,
            "reduction_size": run.data_parallel.size,
            "grads": [compare(g, want) for g, want in zip(grads, ref_grads)],
            "bf16_units": run.data_parallel is not None and run.data_parallel.engine == "shard"}


def main():
    out_dir, cases = sys.argv[1], json.loads(sys.argv[2])

    def one(case):
        with contextlib.redirect_stdout(sys.stderr):  # the trainer's prints stay out of the timing lines
            return run_case(case, out_dir)
    dist.init_process_group("gloo")
    run_cases(cases, one, out_dir, dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
