"""What a run reports: the metrics row of a step, the recipe as tracker hyperparameters, the Chrome trace of
every action, the state each rank keeps, and the lines a failed run prints and logs."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import torch
import torch.distributed as dist

from ..data.conversation import counts_text, left_out_counts
from ..schedule.simulate import Event
from ..schedule.trace import chrome_trace
from .recipe import Recipe


def state_bytes(model, optimizer) -> dict:
    """What this rank keeps across steps, in bytes of its own tensors (an FSDP2 shard's local part): the weights
    it holds (its stages and its replica of ``P``), the gradients a step allocates (the trained weights only;
    none for a frozen one) and the AdamW moments."""
    from ..runtime.data_parallel import local

    def size(tensors):
        return sum(local(t).numel() * local(t).element_size() for t in tensors)
    trained = [p for group in optimizer.param_groups for p in group["params"]] if optimizer is not None else []
    moments = [v for state in (optimizer.state.values() if optimizer is not None else [])
               for v in state.values() if torch.is_tensor(v) and v.dim() > 0]
    return {"params": size(p for p in model.parameters() if p.device.type != "meta"), "grads": size(trained),
            "optimizer": size(moments)}


def step_row(step: int, stats, grad_norm: float, lr: float, skipped: int) -> dict:
    """The metrics row of step ``step`` (0-based): loss, gradient norm, learning rate, label tokens/s, bubble,
    step time and peak activation (and device) memory, the per-rank figures as lists; ``aux_loss`` (the MoE
    load-balancing term included in ``loss``) for a model that has one."""
    row = {"step": step + 1, "loss": stats.loss, "grad_norm": grad_norm, "learning_rate": lr,
           "tokens_per_s": round(stats.num_tokens / stats.wall_s, 1), "bubble": round(stats.bubble, 3),
           "step_s": round(stats.wall_s, 3), "bubble_per_rank": stats.rank_bubble,
           "step_s_per_rank": [round(t, 3) for t in stats.rank_wall_s],
           "peak_activations_rank0": stats.peak_activations,
           "peak_activation_mib_per_rank": [round(b / 2 ** 20, 3) for b in stats.rank_activation_bytes],
           "skipped_steps": skipped}
    if stats.rank_device_bytes:
        row["peak_device_mib_per_rank"] = [round(b / 2 ** 20, 1) for b in stats.rank_device_bytes]
    if stats.aux_loss is not None:  # the MoE load-balancing term inside ``loss`` (mpipe_hf.models.moe)
        row["aux_loss"] = stats.aux_loss
    return row


def progress_fields(stats, row: dict) -> dict:
    """The progress line's fields after step ``stats``, in order: the loss, the MoE term (``aux``) where the model
    has one, under context parallelism the costliest CP rank's work over the mean (``cp_max``, from ``row``'s
    ``cp_costliest_over_mean``), label tokens/s and the bubble."""
    fields = {"loss": f"{stats.loss:.4f}"}
    if stats.aux_loss is not None:
        fields["aux"] = f"{stats.aux_loss:.4f}"
    if "cp_costliest_over_mean" in row:
        fields["cp_max"] = f"{row['cp_costliest_over_mean']:.2f}"
    return {**fields, "tok_s": f"{row['tokens_per_s']:.0f}", "bubble": f"{stats.bubble:.2f}"}


def tracker_config(recipe: Recipe) -> dict:
    """The recipe as flat ``{section.key: value}`` hyperparameters for the trackers (lists as text)."""
    flat = {}
    for section, values in dataclasses.asdict(recipe).items():
        for key, value in (values or {}).items():  # lora: None without an adapter
            flat[f"{section}.{key}"] = value if isinstance(value, (bool, int, float, str)) or value is None else str(
                value)
    return flat


def write_trace(path: str, events: list, rank: int, world: int, group: dist.ProcessGroup) -> None:
    """Gather every rank's action events to rank 0 and write them as a Chrome trace (times from the earliest
    event; ranks on one host share the clock)."""
    gathered = [None] * world
    dist.all_gather_object(gathered, events, group=group)
    if rank == 0:
        origin = min(e.start for events in gathered for e in events)
        timeline = {r: [Event(e.start - origin, e.end - origin, e.action) for e in events]
                    for r, events in enumerate(gathered)}
        with open(path, "w") as f:
            json.dump(chrome_trace(timeline), f)
        print(f"mpipe_hf: trace of every action in {path} (chrome://tracing, Perfetto, or mpipe-hf plot --trace)",
              flush=True)


def error_line(err: BaseException) -> str:
    """The one line a failed run prints: the error's first line, its type when it is not a ``ValueError`` (a
    pipeline step's error already names its rank and action, ``pipeline rank 2, DATA_LOAD6: ...``)."""
    text = (str(err).strip().splitlines() or [""])[0]
    return text if isinstance(err, ValueError) or text.startswith("pipeline rank") else f"{type(err).__name__}: {text}"


def log_failure(err: BaseException, output_dir: str, rank: int) -> str:
    """Write this rank's full traceback to ``output_dir/logs/rank<rank>.log``; return the path."""
    import traceback
    path = os.path.join(output_dir, "logs", f"rank{rank}.log")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} rank {rank}\n")
        f.write("".join(traceback.format_exception(err)))
    return path


def layout_text(parallel, cfg) -> str:
    """The run's whole layout, ``pp_size=R vpp=V dp_size=D ep_size=E [cp_size=C] engine=...`` (``cp_size`` where
    above 1): the data-parallel engine is ``FSDP2`` (``parallel.dp_shard``: sharded replicas) or ``replicas``
    (whole replicas, gradients all-reduced: also a CP group's ranks at ``dp_size`` 1), ``none`` with one pipeline:
    ``parallel.reduction_engine``, as ``PipelineRun.start`` wraps the stages."""
    engine = {"shard": "FSDP2", "replicate": "replicas", None: "none"}[parallel.reduction_engine]
    cp = f" cp_size={parallel.cp_size}" if parallel.cp_size > 1 else ""  # context parallelism
    return (f"pp_size={cfg.pp_size} vpp={cfg.vpp} dp_size={parallel.dp_size} ep_size={parallel.ep_size}{cp} "
            f"engine={engine}")


def setup_line(recipe: Recipe, run, config, resume: str | None, start_step: int) -> str:
    """The line rank 0 prints before the first step: the model, the whole layout (:func:`layout_text`), the
    schedule's knobs, the precision, swap, the layers per stage, the freeze patterns, rank 0's trained share of its
    parameters and where a resumed run continues from."""
    cfg, par, opt = run.cfg, recipe.parallel, recipe.train
    line = (f"mpipe_hf: {config.model_type} {layout_text(par, cfg)} M={cfg.num_micro} "
            f"preprocess={cfg.preprocess} placement={cfg.placement} owners={par.owners} "
            f"text_layers={par.text_layers} overflow={cfg.overflow} owner_backward={cfg.owner_backward} "
            f"less_memory={cfg.less_memory} bf16={opt.bf16} gradient_checkpointing={opt.gradient_checkpointing} "
            f"swap={'off' if not recipe.swap.enabled else recipe.swap.ranks or 'every rank'} "
            f"layers per stage={run.counts}")
    if par.cp_size > 1:  # whether each CP rank runs its share of the tower, or the whole (and why)
        line += f"; tower {getattr(run, 'tower', 'whole')}"
    spec = opt.trainable_spec()
    if spec.freezes():
        line += "; " + " ".join([k for k in ("freeze_vit", "freeze_aligner", "freeze_llm") if getattr(spec, k)]
                                + [f"freeze={list(spec.freeze)}"] * bool(spec.freeze)
                                + [f"trainable={list(spec.trainable)}"] * bool(spec.trainable))
    if recipe.lora is not None:
        line += f"; lora r={recipe.lora.r} alpha={recipe.lora.lora_alpha}"
    line += (f"; rank 0 trains {sum(p.numel() for p in run.params.values())} of "
             f"{sum(p.numel() for p in run.carved.model.parameters())} parameters it holds")
    return line + (f"; resumed from {resume} at step {start_step}" if resume is not None else "")


def summary_line(job, wall_s: float, out: str) -> str:
    """The line rank 0 prints at the end: the steps this process ran (of the run's total, when it resumed), the
    time, the first and last loss, each rank's mean bubble (over the steps after the first, which warms up) and
    peak saved activations, the rows the last evaluation ran on (with those left out, when any failed to load:
    ``job.eval_rows``, ``(evaluated, total)`` or ``None``) and the checkpoint. The training rows left out are
    counted by reason (:func:`~mpipe_hf.data.conversation.left_out_counts`): at launch (``job.left_out``, the
    dataset's ``(dropped, bad rows)``) and during training (the distinct rows that failed to load)."""
    world = job.run.cfg.pp_size
    later = job.bubbles[1:] or job.bubbles
    mean = [round(sum(b[r] for b in later) / len(later), 3) for r in range(world)] if later else []
    peak = [round(max(p[r] for p in job.peaks) / 2 ** 20, 2) for r in range(world)] if job.peaks else []
    losses = job.losses
    trained = (f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; bubble per rank {mean} (mean of the steps after the "
               f"first); peak saved activations per rank {peak} MiB") if losses else "no step ran"
    ran = job.steps - job.start_step
    steps = f"{ran} steps" if not job.start_step else f"{ran} steps (resumed at step {job.start_step} of {job.steps})"
    evaluated = getattr(job, "eval_rows", None)  # (rows evaluated, eval rows) of the last evaluation, or None
    if evaluated is not None:
        used, total = evaluated
        trained += (f"; the last evaluation ran on {used} of {total} eval rows" + (
            f" ({total - used} failed to load and were left out)" if used < total else ""))
    dropped, bad = getattr(job, "left_out", ({}, 0))  # what the launch left out: {where: why}, bad rows
    left = counts_text(left_out_counts(dropped, bad, job.run.skips.bad_rows))
    return (f"mpipe_hf: {steps} in {wall_s:.1f}s ({job.run.skips.total} steps skipped; rows left out: {left}); "
            f"{trained}; checkpoint {out}")
