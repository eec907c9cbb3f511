"""The trainer: every rank loads the checkpoint, keeps its stages, loads its own micro-batches and runs the MPipe
Transpose schedule; AdamW steps each rank's own parameters (SPEC.md, "The job").

Launch with ``mpipe-hf train RECIPE.yaml`` (starts the processes itself), ``torchrun ... -m mpipe_hf.train
RECIPE.yaml`` or ``accelerate launch ... -m mpipe_hf.train RECIPE.yaml``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist
import yaml
from accelerate.utils import set_seed
from tqdm.auto import tqdm
from transformers import (AutoConfig, AutoImageProcessor, AutoModelForCausalLM, AutoModelForImageTextToText,
                          AutoTokenizer)

from ..data import (ConversationCollator, ConversationDataset, MicroBatchPlan, TextCollator, build_processor,
                    image_processor_for, load_conversation_dataset, load_text_dataset)
from ..data.processor import QWEN_PROCESSORS
from ..models import get_family
from ..models.adapters import is_adapter_tensor, merged_state
from ..models.load import (check_adapter, load_adapter_values, load_share_values, split_from_checkpoint,
                           split_from_config)
from ..runtime import PipelineExecutor, build_mesh, init_distributed
from ..runtime.data_parallel import DataParallel
from ..schedule.owners import step_owners
from ..schedule.simulate import Event
from ..schedule.trace import chrome_trace
from .checkpoint import save_adapter, save_checkpoint, save_hub_files
from .collective import together
from .loop import Skips, evaluate_rows, finite_step, run_step
from .metrics import MetricsLog, available_trackers
from .state import checkpoints, load_rank_state, rank_state, rank_state_name, resolve_resume
from .optimizer import build_optimizer, build_scheduler, clip_grad_norm
from .precision import autocast_modules
from .recipe import ModelSource, Recipe, load_recipe

CONVERSATION_FIELDS, CAPTION_FIELDS, TEXT_FIELDS = ("messages",), ("image", "prompt", "caption"), ("text",)


@dataclass
class TrainResult:
    """Per-step losses (mean over label tokens), and where the checkpoint went."""

    losses: list[float]
    checkpoint: str
    wall_s: float


def is_vision_language(config) -> bool:
    return hasattr(config, "vision_config")


def load_config(source: ModelSource):
    """The HF config of ``source`` (a checkpoint directory, a config directory or a ``config.json`` file)."""
    path = source.name_or_path or source.config
    if os.path.isfile(path):
        with open(path) as f:
            raw = json.load(f)
        if not isinstance(raw, dict) or "model_type" not in raw:
            raise ValueError(f"model.config {path!r} has no model_type; write a config with save_pretrained or "
                             f"copy a checkpoint's config.json")
        return AutoConfig.for_model(raw.pop("model_type"), **raw)
    return AutoConfig.from_pretrained(path)


def first_row(path: str) -> str:
    """The first line of the JSONL at ``path`` that is not blank ("" for an empty file)."""
    with open(path) as f:
        return next((line for line in f if line.strip()), "")


def check_output_dir(path: str) -> None:
    """``train.output_dir`` can be created and written (a probe file is made and removed).

    Raises:
        ValueError: naming the field and the operating system's error.
    """
    import tempfile
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".mpipe_hf_probe"):
            pass
    except OSError as err:
        raise ValueError(f"train.output_dir {path!r} is not writable ({err})") from err


def _check_data(path: str, config, field: str = "data.path") -> None:
    """The first row is in a form the model reads (the loader checks every row in full)."""
    forms = [CONVERSATION_FIELDS, CAPTION_FIELDS] if is_vision_language(config) else [CONVERSATION_FIELDS,
                                                                                      TEXT_FIELDS]
    first = first_row(path)
    try:
        row = json.loads(first)
    except json.JSONDecodeError as err:
        raise ValueError(f"{field} {path!r}: the first line is not JSON ({err})") from err
    if not isinstance(row, dict) or not any(all(k in row for k in form) for form in forms):
        kind = "vision-language" if is_vision_language(config) else "decoder-only"
        raise ValueError(f"{field} {path!r}: a {kind} model ({config.model_type!r}) reads rows with "
                         f"{' or '.join(str(list(f)) for f in forms)}; the first row has "
                         f"{sorted(row) if isinstance(row, dict) else type(row).__name__}")


def check(recipe: Recipe) -> list[int]:
    """Every check that needs no process group: schedule, model type, layer layout, world size, data file.

    Returns the decoder layers per stage: ``layers_per_stage``, else balanced by the costs of the recipe's
    ``profile``, else by the layers' and the LM head's matmul cost estimated from the config. Raises
    ``ValueError`` naming the field.
    """
    cfg = recipe.schedule()
    recipe.model.check_tokenizer()
    if not os.path.isfile(recipe.data.path):
        raise ValueError(f"data.path {recipe.data.path!r} is not a file")
    config = load_config(recipe.model)
    get_family(config.model_type)  # an unknown model_type fails here, naming the supported ones
    _check_data(recipe.data.path, config)
    if recipe.data.eval_path is not None:
        if not os.path.isfile(recipe.data.eval_path):
            raise ValueError(f"data.eval_path {recipe.data.eval_path!r} is not a file")
        _check_data(recipe.data.eval_path, config, "data.eval_path")
    available_trackers(recipe.train.report_to)
    counts = check_layout(recipe, config)
    if recipe.lora is not None:
        check_adapter(config, cfg, recipe.lora.peft_config(), counts, recipe.parallel.text_layers, recipe.lora.merge)
    processes = cfg.pp_size * recipe.parallel.dp_size
    world = int(os.environ.get("WORLD_SIZE", processes))
    if world != processes:
        raise ValueError(f"parallel.pp_size ({cfg.pp_size}) * parallel.dp_size ({recipe.parallel.dp_size}) = "
                         f"{processes} processes, but {world} were launched; launch {processes}")
    check_output_dir(recipe.train.output_dir)  # last: it creates the directory
    return counts


def check_layout(recipe: Recipe, config, profile=None) -> list[int]:
    """Decoder layers per stage: ``layers_per_stage``, else balanced by the costs of ``profile`` (default: the
    recipe's ``profile``), else by the layers' and the LM head's matmul cost from the config; checked against the
    model. Raises ``ValueError`` naming the field."""
    cfg = recipe.schedule()
    layout = recipe.parallel.layers_per_stage
    if profile is None and recipe.parallel.profile is not None:
        from ..schedule.tune import Profile
        profile = Profile.load(recipe.parallel.profile)
    layers = config.get_text_config().num_hidden_layers
    if profile is not None and profile.num_layers != layers:
        raise ValueError(f"the profile measures a model of {profile.num_layers} decoder layers, but "
                         f"{config.model_type!r} here has {layers}; profile this recipe's model (mpipe-hf profile "
                         f"RECIPE.yaml) or set parallel.layers_per_stage")
    if layout is None and profile is not None:
        from ..schedule.tune import profile_layers
        layout = profile_layers(profile, cfg, recipe.parallel.text_layers)
    return get_family(config.model_type).layer_counts(config, cfg, layout, recipe.parallel.text_layers)


def load_model(source: ModelSource, config, seed: int):
    """The HF model: ``from_pretrained`` on a checkpoint, or ``from_config`` with weights drawn from ``seed`` (the
    same on every rank)."""
    cls = AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM
    if source.name_or_path is not None:
        return cls.from_pretrained(source.name_or_path, dtype=torch.float32)
    set_seed(seed)
    return cls.from_config(config, dtype=torch.float32)  # as from_pretrained above, whatever the config's dtype


def load_share(source: ModelSource, config, cfg, rank: int, layers_per_stage: list[int], text_layers: int,
               seed: int, adapter=None):
    """``(SplitModel, LoadReport)``: this rank's share of the model, built on the meta device and materialised
    alone, from the checkpoint's safetensors (read tensor by tensor) or drawn from ``seed`` exactly as the unsplit
    ``load_model`` would (see :mod:`mpipe_hf.models.load`). With ``adapter`` (a ``peft.LoraConfig``), the share of
    that model after ``set_seed(seed); peft.get_peft_model(model, adapter)``."""
    if source.name_or_path is not None:
        return split_from_checkpoint(source.name_or_path, config, cfg, rank, layers_per_stage, text_layers,
                                     adapter, seed)
    return split_from_config(config, cfg, rank, layers_per_stage, text_layers, seed, adapter)


def load_processor(recipe: Recipe, config):
    """The tokenizer (decoder-only LM) or the family's processor (vision-language). A checkpoint's own image
    processor is used when it has one; a config-initialised model gets one built from its config. Qwen families
    resize images to ``min_pixels .. max_pixels``."""
    tokenizer = AutoTokenizer.from_pretrained(recipe.model.tokenizer_dir)
    if not is_vision_language(config):
        return tokenizer
    saved = recipe.model.name_or_path is not None and os.path.isfile(
        os.path.join(recipe.model.name_or_path, "preprocessor_config.json"))
    if saved:  # the recipe's pixel bounds win over the checkpoint's (size, and min/max_pixels where it has them)
        size = ({"size": {"shortest_edge": recipe.data.min_pixels, "longest_edge": recipe.data.max_pixels},
                 "min_pixels": recipe.data.min_pixels, "max_pixels": recipe.data.max_pixels}
                if config.model_type in QWEN_PROCESSORS else {})
        image_processor = AutoImageProcessor.from_pretrained(recipe.model.name_or_path, **size)
    else:
        image_processor = image_processor_for(config, recipe.data.min_pixels, recipe.data.max_pixels)
    return build_processor(config, tokenizer, image_processor)


def load_data(recipe: Recipe, config, processor, quiet: bool = False, path: str | None = None):
    """``(dataset, collate)`` of ``path`` (default ``data.path``): ``messages``/``images`` conversation rows (or
    the older ``{image, prompt, caption}`` rows) rendered with the checkpoint's chat template, else the family's;
    for a decoder-only LM, conversation rows or ``{text}`` rows. Rows that do not fit ``data.max_length`` without
    cutting an image are dropped with one warning (none when ``quiet``)."""
    path, max_length = path or recipe.data.path, recipe.data.max_length
    if not is_vision_language(config):
        if "messages" not in json.loads(first_row(path)):
            return load_text_dataset(path), TextCollator(processor, max_length)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = load_conversation_dataset(path, processor, max_length, model_type=config.model_type)
    for warning in caught if not quiet else []:  # the dropped rows, as one line
        print(f"mpipe_hf: warning: {warning.message}", flush=True)
    return dataset, ConversationCollator(processor, max_length, model_type=config.model_type)


def owner_costs(dataset, config) -> list[int]:
    """Each dataset row's preprocess cost for load-aware owners (``parallel.owners: balanced``), known on every
    rank without decoding anything: a vision-language model's rows, their image tokens (the loader counted them
    from the image file headers); a decoder-only LM's, their tokens (conversation rows) or characters (``text``
    rows), which its text layers' work grows with."""
    if isinstance(dataset, ConversationDataset):
        return list(dataset.image_tokens if is_vision_language(config) else dataset.num_tokens)
    return [len(text) for text in dataset["text"]]


def owner_headroom(recipe: Recipe, cfg, layers_per_stage: list[int], row_costs: list[int]) -> list[float] | None:
    """Placement ``fill`` with a ``profile``: each owner's idle end of a steady step
    (:func:`~mpipe_hf.schedule.owners.fill_headroom` under the profile's costs), in the unit of ``row_costs``
    (the profile's preprocess seconds per micro-batch over the mean cost of a micro-batch of the data); ``None``
    otherwise (balanced owners then start even)."""
    if cfg.placement != "fill" or recipe.parallel.profile is None or not sum(row_costs):
        return None
    from ..schedule.owners import fill_headroom
    costs = placement_costs(recipe, layers_per_stage)
    per_micro = sum(row_costs) / len(row_costs) * recipe.data.micro_batch_size
    if costs.preprocess_forward <= 0:
        return None
    return [h * per_micro / costs.preprocess_forward for h in fill_headroom(cfg, costs)]


def train(recipe: Recipe) -> TrainResult:
    """Run ``recipe.train.max_steps`` optimizer steps (or ``num_train_epochs`` passes over the data) and save a
    checkpoint to ``output_dir/checkpoint``.

    Raises:
        ValueError: a bad recipe, model or sample (before any collective for the recipe and model).
    """
    layers_per_stage = check(recipe)
    cfg = recipe.schedule()
    os.makedirs(recipe.train.output_dir, exist_ok=True)
    device = init_distributed(timedelta(seconds=recipe.parallel.timeout_s))
    par, opt = recipe.parallel, recipe.train
    mesh = build_mesh(cfg.pp_size, par.dp_size)
    group, rank, dp_rank = mesh.get_group("pp"), mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    every = (dist.get_rank(), dist.get_world_size(), None)  # setup errors go to every rank of every replica
    lead = every[0] == 0  # prints, logs and trackers
    config = load_config(recipe.model)
    adapter = recipe.lora.peft_config() if recipe.lora is not None else None
    carved, _ = together(lambda: load_share(recipe.model, config, cfg, rank, layers_per_stage, par.text_layers,
                                            opt.seed, adapter), "model load", *every)
    model = carved.model.to(device).train()  # from_pretrained leaves eval mode; the HF Trainer trains in train mode
    if opt.gradient_checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    set_seed(opt.seed)
    processor = load_processor(recipe, config)
    if not lead:  # rank 0 builds the datasets cache first
        dist.barrier()
    try:
        loaded = load_data(recipe, config, processor, quiet=not lead)
    except Exception as err:  # noqa: BLE001 - raised on every rank by together()
        loaded = err
    if lead:
        dist.barrier()

    def data():
        if isinstance(loaded, Exception):
            raise loaded
        return loaded
    dataset, collate = together(data, "data load", *every)
    plan = MicroBatchPlan(dataset, collate, cfg.num_micro, recipe.data.micro_batch_size, carved.validate_micro,
                          recipe.data.shuffle, opt.seed, dp_rank, par.dp_size)
    steps = opt.total_steps(plan.steps_per_epoch())
    row_costs = owner_costs(dataset, config) if par.owners == "balanced" else None
    room = owner_headroom(recipe, cfg, layers_per_stage, row_costs) if row_costs is not None else None

    def owners_of(k: int):  # step k's owners, the same on every rank (from the rows' costs; no collective)
        return None if row_costs is None else step_owners("balanced", plan.micro_costs(k, row_costs), cfg, room)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    resume = resolve_resume(opt.resume, opt.output_dir, run_id, restart)
    if resume is not None:  # the weights first, into the whole tensors (before FSDP shards them)
        load_values = load_adapter_values if carved.peft is not None else load_share_values
        together(lambda: load_values(resume, carved, cfg, rank), "resume", *every)
    data_parallel = None
    if par.dp_size > 1:  # FSDP2 per stage chunk, before the optimizer sees the (then DTensor) parameters
        data_parallel = DataParallel(mesh["dp"], "shard" if par.dp_shard else "replicate")
        data_parallel.wrap(carved.stages)
    params = carved.trainable_parameters(cfg, rank)
    optimizer = build_optimizer(model, params, opt)  # None where a frozen P is all the rank holds
    scheduler = build_scheduler(optimizer, opt, steps)
    heads = {id(p) for p, peer in carved.tied_parameters(cfg, rank) if peer == 0}  # the head copy of a tied pair
    counted = [p for p in params.values() if id(p) not in heads]
    stages, preprocess = (autocast_modules(carved.stages, carved.preprocess, device) if opt.bf16
                          else (carved.stages, carved.preprocess))
    executor = PipelineExecutor(cfg, rank, stages, preprocess, group, device, params.values(),
                                timedelta(seconds=par.timeout_s), carved.tied_parameters(cfg, rank),
                                trace=opt.trace, costs=placement_costs(recipe, layers_per_stage), seed=opt.seed,
                                measure_memory=True, data_parallel=data_parallel, swap=recipe.swap)
    skips, start_step = Skips(), 0
    if resume is not None:  # every rank's optimizer, schedule, RNG and step
        start_step = together(lambda: load_rank_state(resume, rank, optimizer, scheduler, skips, params,
                                                      opt.reset_optimizer), "resume", *every)
    metrics = MetricsLog(opt.output_dir, opt.report_to, start_step if resume is not None else None,
                         tracker_config(recipe), enabled=lead)
    eval_set = None
    if recipe.data.eval_path is not None:
        eval_set = together(lambda: load_data(recipe, config, processor, quiet=not lead,
                                              path=recipe.data.eval_path)[0], "eval data load", *every)
        eval_plan = MicroBatchPlan(eval_set, collate, cfg.num_micro, recipe.data.micro_batch_size,
                                   carved.validate_micro)

    def evaluation(done: int) -> None:  # eval_loss over the whole eval set, logged at step ``done``
        begin = time.perf_counter()
        loss, tokens = evaluate_rows(executor, eval_plan.load_rows, len(eval_set), recipe.data.micro_batch_size)
        metrics.log({"step": done, "eval_loss": loss, "eval_label_tokens": tokens,
                     "eval_runtime": round(time.perf_counter() - begin, 3)})
        if lead:
            tqdm.write(f"mpipe_hf: step {done}: eval_loss {loss:.5f} over {tokens} label tokens")
    if lead:
        print(f"mpipe_hf: {config.model_type} R={cfg.pp_size} V={cfg.vpp} M={cfg.num_micro} "
              f"preprocess={cfg.preprocess} "
              f"placement={cfg.placement} owners={par.owners} "
              f"text_layers={par.text_layers} overflow={cfg.overflow} owner_backward={cfg.owner_backward} "
              f"less_memory={cfg.less_memory} bf16={opt.bf16} gradient_checkpointing={opt.gradient_checkpointing} "
              f"swap={'off' if not recipe.swap.enabled else recipe.swap.ranks or 'every rank'} "
              f"layers per stage={layers_per_stage}"
              + (f"; lora r={recipe.lora.r} alpha={recipe.lora.lora_alpha}: rank 0 trains "
                 f"{sum(p.numel() for p in params.values())} of {sum(p.numel() for p in model.parameters())} "
                 f"parameters it holds" if recipe.lora is not None else "")
              + (f"; resumed from {resume} at step {start_step}" if resume is not None else ""), flush=True)
        if restart:
            print(f"mpipe_hf: restart {restart} of the worker group after a failure: "
                  + (f"resumed from {resume}" if resume is not None else "no checkpoint of this run yet: from the "
                     "start"), flush=True)
    losses, rank_bubbles, peaks, start = [], [], [], time.perf_counter()

    def extras(directory, with_config=carved.peft is None):  # what a hub snapshot holds besides the weights
        save_hub_files(directory, model.config, processor, recipe.model.name_or_path, with_config)

    def save_share(path: str, save_extras, rank_files: dict | None = None, merged: bool = False) -> None:
        """This pipeline's share, written by replica 0 (the replicas hold the same values; FSDP shards are
        gathered first, on every replica); a failure is raised on every rank of every replica. A LoRA run
        writes its adapter in PEFT's format, or with ``merged`` the weights with the adapter merged in."""
        state = carved.state_dict(cfg, rank)
        adapter_only = carved.peft is not None and not merged
        if adapter_only:  # the frozen base is not saved again (nor gathered from its FSDP2 shards)
            state = {n: t for n, t in state.items() if is_adapter_tensor(n)}
        state = gather_full(state)
        rank_files = gather_full(rank_files or {})
        failure = None
        if dp_rank == 0:
            try:
                if adapter_only:
                    save_adapter(path, carved.peft, state, rank, cfg.pp_size, group, recipe.model.name_or_path,
                                 save_extras, rank_files)
                else:
                    weights = (together(lambda: merged_state(carved.model, state), f"merging {path}", rank,
                                        cfg.pp_size, group) if merged else state)
                    save_checkpoint(path, weights, rank, cfg.pp_size, group, save_extras, rank_files=rank_files)
            except Exception as err:  # noqa: BLE001 - shared with the other replicas below
                failure = err
        if data_parallel is None and failure is not None:
            raise failure
        if data_parallel is not None:
            together(lambda: raise_(failure), f"saving {path}", *every)

    def save_state(done: int) -> None:  # checkpoint-<done>: weights, hub files, each rank's state, the run's record
        def with_state(directory):
            extras(directory)
            with open(os.path.join(directory, "trainer_state.json"), "w") as f:
                json.dump({"global_step": done, "max_steps": steps, "run_id": run_id,
                           "log_history": metrics.history}, f, indent=1)
            with open(os.path.join(directory, "recipe.yaml"), "w") as f:
                yaml.safe_dump(dataclasses.asdict(recipe), f)
        path = os.path.join(opt.output_dir, f"checkpoint-{done}")
        save_share(path, with_state, {rank_state_name(rank): rank_state(done, optimizer, scheduler, skips, params)})
        if lead and opt.save_total_limit is not None:
            for _, old in checkpoints(opt.output_dir)[:-opt.save_total_limit]:
                shutil.rmtree(old, ignore_errors=True)

    def skipped(step: int) -> None:
        if lead:
            tqdm.write(skips.warning(step))
        metrics.log({"step": step + 1, "skipped": True, "skipped_steps": skips.total, "error": skips.last})

    bar = tqdm(range(start_step, steps), disable=not lead, desc="train", dynamic_ncols=True, initial=start_step,
               total=steps)
    for step in bar:
        ahead = partial(plan.load, step + 1) if step + 1 < steps else None  # placement fill loads it early
        stats = run_step(executor, partial(plan.load, step), recipe.data, skips, step, ahead, owners=owners_of(step),
                         next_owners=owners_of(step + 1) if ahead is not None else None)
        if stats is None:
            skipped(step)
        else:
            grad_norm = clip_grad_norm(list(params.values()), counted, opt.max_grad_norm, group, device,
                                       data_parallel)
            lr = scheduler.get_last_lr()[0]
            if not finite_step(stats, grad_norm, params.values(), skips, recipe.data):
                skipped(step)
            else:
                if optimizer is not None:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                else:  # the schedule's AdamW of no parameters (a rank that trains nothing): a no-op, in torch's order
                    scheduler.optimizer.step()
                scheduler.step()  # on every rank: the learning rate rank 0 logs is the run's
                losses.append(stats.loss)
                rank_bubbles.append(stats.rank_bubble)
                peaks.append(stats.rank_activation_bytes)
                row = step_row(step, stats, grad_norm, lr, skips.total)
                bar.set_postfix(loss=f"{stats.loss:.4f}", tok_s=f"{row['tokens_per_s']:.0f}",
                                bubble=f"{stats.bubble:.2f}")
                if (step + 1) % opt.logging_steps == 0 or step + 1 == steps:
                    metrics.log(row)
        done = step + 1
        if eval_set is not None and ((opt.eval_steps and done % opt.eval_steps == 0) or done == steps):
            evaluation(done)
        if opt.save_steps and done % opt.save_steps == 0:
            save_state(done)
    if eval_set is not None and start_step == steps:  # resumed at the end: nothing left but the evaluation
        evaluation(steps)
    wall = time.perf_counter() - start
    out = os.path.join(opt.output_dir, "checkpoint")
    save_share(out, extras)
    if recipe.lora is not None and recipe.lora.merge:
        save_share(os.path.join(opt.output_dir, "merged"), partial(extras, with_config=True), merged=True)
    if opt.trace and dp_rank == 0:
        write_trace(os.path.join(opt.output_dir, "trace.json"), executor.events, rank, cfg.pp_size, group)
    metrics.close()
    held = [None] * dist.get_world_size()
    dist.all_gather_object(held, state_bytes(model, optimizer))
    if lead:
        with open(os.path.join(opt.output_dir, "memory.json"), "w") as f:
            json.dump({"model_state_bytes_per_rank": held}, f, indent=1)
        later = rank_bubbles[1:] or rank_bubbles  # the first step warms up
        mean = [round(sum(b[r] for b in later) / len(later), 3) for r in range(cfg.pp_size)] if later else []
        peak = [round(max(p[r] for p in peaks) / 2 ** 20, 2) for r in range(cfg.pp_size)] if peaks else []
        trained = (f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; bubble per rank {mean} (mean of the steps after "
                   f"the first); peak saved activations per rank {peak} MiB") if losses else "no step ran"
        print(f"mpipe_hf: {steps} steps in {wall:.1f}s ({skips.total} skipped); {trained}; checkpoint {out}",
              flush=True)
    return TrainResult(losses, out, wall)


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


def raise_(err: BaseException | None) -> None:
    if err is not None:
        raise err


def gather_full(tree):
    """``tree`` (dicts, lists and tensors, as a state dict) with every DTensor replaced by its full tensor (a
    collective over its mesh: every replica calls this with the same tree)."""
    from ..runtime.data_parallel import is_sharded
    if isinstance(tree, dict):
        return {k: gather_full(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(gather_full(v) for v in tree)
    return tree.full_tensor() if torch.is_tensor(tree) and is_sharded(tree) else tree


def step_row(step: int, stats, grad_norm: float, lr: float, skipped: int) -> dict:
    """The metrics row of step ``step`` (0-based): loss, gradient norm, learning rate, label tokens/s, bubble,
    step time and peak activation (and device) memory, the per-rank figures as lists."""
    row = {"step": step + 1, "loss": stats.loss, "grad_norm": grad_norm, "learning_rate": lr,
           "tokens_per_s": round(stats.num_tokens / stats.wall_s, 1), "bubble": round(stats.bubble, 3),
           "step_s": round(stats.wall_s, 3), "bubble_per_rank": stats.rank_bubble,
           "step_s_per_rank": [round(t, 3) for t in stats.rank_wall_s],
           "peak_activations_rank0": stats.peak_activations,
           "peak_activation_mib_per_rank": [round(b / 2 ** 20, 3) for b in stats.rank_activation_bytes],
           "skipped_steps": skipped}
    if stats.rank_device_bytes:
        row["peak_device_mib_per_rank"] = [round(b / 2 ** 20, 1) for b in stats.rank_device_bytes]
    return row


def tracker_config(recipe: Recipe) -> dict:
    """The recipe as flat ``{section.key: value}`` hyperparameters for the trackers (lists as text)."""
    flat = {}
    for section, values in dataclasses.asdict(recipe).items():
        for key, value in (values or {}).items():  # lora: None without an adapter
            flat[f"{section}.{key}"] = value if isinstance(value, (bool, int, float, str)) or value is None else str(
                value)
    return flat


def placement_costs(recipe: Recipe, layers_per_stage: list[int]):
    """The simulator costs of ``recipe.parallel.profile`` for this layout (placement ``fill`` places by them), or
    ``None``."""
    if recipe.parallel.profile is None:
        return None
    from ..schedule.tune import Profile, costs_for
    par = recipe.parallel
    return costs_for(Profile.load(par.profile), recipe.schedule(), layers_per_stage, par.text_layers)


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


def main(argv: list[str] | None = None) -> None:
    """``python -m mpipe_hf.train RECIPE.yaml`` under torchrun or accelerate launch.

    A failure prints one line, ``mpipe-hf: error: ...`` (on rank 0 for an error every rank shares, the error of a
    pipeline step; on each failing rank for one of its own), writes each rank's full traceback to
    ``output_dir/logs/rank<r>.log`` and exits with status 1.
    """
    import sys
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m mpipe_hf.train RECIPE.yaml (under torchrun or accelerate launch)")
    recipe = load_recipe(args[0])
    rank = int(os.environ.get("RANK", 0))
    try:
        train(recipe)
    except Exception as err:  # noqa: BLE001 - reported as one line, the traceback in the log
        path = log_failure(err, recipe.train.output_dir, rank)
        shared = getattr(err, "shared", False) or str(err).startswith("pipeline rank")
        if rank == 0 or not shared:
            where = "" if shared or int(os.environ.get("WORLD_SIZE", 1)) == 1 else f"rank {rank}: "
            print(f"mpipe-hf: error: {where}{error_line(err)} (tracebacks: {os.path.dirname(path)})",
                  file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)  # no teardown: a failed step's helper threads would only add noise ("terminate called ...")
    if dist.is_initialized():
        dist.destroy_process_group()
