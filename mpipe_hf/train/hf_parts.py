"""The parts of the pipelined HF Trainer (:mod:`.hf`) that are not the Trainer itself: its configuration
(:class:`MPipeConfig`), the check of the ``TrainingArguments`` a pipeline cannot honour, the row-index loader
its loop iterates, :class:`MPipeCallback`, which puts the pipeline's figures into the Trainer's logs, and
:class:`PreemptionCallback`, which ends ``train()`` with a checkpoint on SIGTERM or SIGUSR1."""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import TrainerCallback

from ..data.owner import epoch_order
from ..schedule.swap import SwapConfig
from .preempt import Preemption
from ..models.freeze import Trainable
from .recipe import DataSection, ParallelSection

OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")
SAMPLING = ("random", "sequential")


@dataclass(frozen=True, kw_only=True)
class MPipeConfig(ParallelSection):
    """The pipeline of an :class:`MPipeTrainer`: the recipe's ``parallel`` section (the schedule, SPEC.md
    "Modes", and the layout: ``pp_size``, ``vpp``, ``preprocess``, ``overflow``, ``owner_backward``,
    ``less_memory``, ``placement``, ``text_layers``, ``layers_per_stage``, ``profile``, ``timeout_s``) and the
    bad-sample policy of its ``data`` section. ``num_micro`` is not set here: it is the Trainer's
    ``gradient_accumulation_steps``.

    ``zero_bubble`` works as in a recipe. ``mesh_order`` is checked as in a recipe and changes nothing here:
    with one pipeline (``dp_size`` 1) every order numbers the ranks alike.

    Attributes:
        max_length: the token limit of the default conversation collator.
        on_bad_sample, max_bad_rows: as the recipe's ``data`` section (with ``skip``, a row that fails to load
            is dropped from its step; the run stops once more than ``max_bad_rows`` rows failed, or that many
            steps in a row were skipped). ``max_bad_steps`` is ``max_bad_rows``'s old name (deprecated: a
            ``FutureWarning``).
        swap: activation swap, as a recipe's ``swap`` section (:class:`~mpipe_hf.schedule.swap.SwapConfig`;
            ``None``: off).
        trace: record every action on every rank and write ``output_dir/trace.json`` when ``train()`` ends (as
            a recipe's ``train.trace``).
        freeze_parameters, trainable_parameters, freeze_vit, freeze_aligner, freeze_llm: what trains, by pattern
            (ms-swift's names), as a recipe's ``train.freeze``, ``train.trainable`` and shortcuts
            (:class:`~mpipe_hf.models.freeze.Trainable`), on top of what the model passed in has frozen already.
        packing: each micro-batch's rows (``per_device_train_batch_size`` of them, as the Trainer's loader
            yields them) packed into one sequence with no padding, each row with its own positions and attending
            only to itself (:func:`~mpipe_hf.data.packing.pack_micro`). The micro-batches hold the
            rows they hold unpacked, so the loss and gradients are the unpacked ones under either normalisation.

    Raises:
        ValueError: a bad value, naming the field and the allowed values; ``num_micro`` set; ``dp_size`` other
            than 1 or ``owners: balanced`` (both are ``mpipe-hf train``'s, where the rows are known to the run: the
            Trainer's loop hands every process the same rows, and its dataset gives no image sizes without
            decoding the images); ``ep_size`` other than 1 (``mpipe-hf train``'s).

    ``cp_size``: context parallelism, as a recipe's ``parallel.cp_size`` (docs/context_parallel.md): launch
    ``pp_size * cp_size`` processes; the ``cp_size`` pipelines of the CP group run the same rows (the Trainer's
    loop hands every process the same row indices) and each keeps its slice of every micro-batch's sequence.
    An evaluation runs split as training does, and the per-micro loss of a model that takes no loss kwargs
    (:meth:`~.hf.MPipeTrainer.loss_normalization`) divides each CP rank's slice by the whole micro's label tokens.
    A packed micro-batch is split as one sequence, as a recipe's ``data.packing``. Refused by name before any
    collective, as a recipe's (:func:`check_context_parallel_trainer`): a model whose heads or layer types
    context parallelism cannot split, and ``packing`` for a family whose masks run packed rows one by one.
    ``TrainingArguments.parallelism_config`` (accelerate's own context parallelism: ring attention over a whole
    model per rank) is refused by :func:`check_training_args`.
    """

    max_length: int = 2048
    on_bad_sample: str = "skip"
    max_bad_rows: int = 10
    max_bad_steps: int | None = None  # the old name of max_bad_rows
    swap: SwapConfig | None = None
    trace: bool = False
    packing: bool = False
    freeze_parameters: tuple[str, ...] = ()
    trainable_parameters: tuple[str, ...] = ()
    freeze_vit: bool = False
    freeze_aligner: bool = False
    freeze_llm: bool = False

    def __post_init__(self):
        if self.max_bad_steps is not None:
            warnings.warn("MPipeConfig(max_bad_steps=...) is deprecated: a bad row now costs that row, not its "
                          "step; pass max_bad_rows", FutureWarning, stacklevel=3)
            object.__setattr__(self, "max_bad_rows", self.max_bad_steps)
            object.__setattr__(self, "max_bad_steps", None)
        if self.num_micro != 1:
            raise ValueError("MPipeConfig takes no num_micro: the micro-batches per step are "
                             "TrainingArguments.gradient_accumulation_steps")
        if self.owners != "modulo":  # the Trainer's dataset gives no image sizes without decoding its images
            raise ValueError(f"MPipeConfig owners must be 'modulo' (load-aware owners, 'balanced', are "
                             f"mpipe-hf train's: a recipe's parallel.owners), got {self.owners!r}")
        if self.ep_size != 1:  # EP groups are cut from a stage's dp x cp ranks: untried on the Trainer route
            raise ValueError(f"MPipeConfig ep_size must be 1 (expert parallelism is mpipe-hf train's: a recipe's "
                             f"parallel.ep_size), got {self.ep_size!r}")
        if self.dp_size != 1:  # the Trainer's loop gives every process the same rows: one pipeline's view
            raise ValueError(f"MPipeConfig dp_size must be 1 (data parallel over pipelines is mpipe-hf train's: a "
                             f"recipe's parallel.dp_size), got {self.dp_size!r}")
        if self.swap is not None and not isinstance(self.swap, SwapConfig):
            raise ValueError(f"MPipeConfig swap must be a SwapConfig or None, got {type(self.swap).__name__}")
        for key in ("trace", "packing"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"MPipeConfig {key} must be True or False, got {getattr(self, key)!r}")
        super().__post_init__()
        self.trainable_spec()  # raises for a bad pattern list or shortcut
        self.data()

    def trainable_spec(self) -> Trainable:
        """What trains, by pattern (:class:`~mpipe_hf.models.freeze.Trainable`)."""
        return Trainable(freeze=self.freeze_parameters, trainable=self.trainable_parameters,
                         freeze_vit=self.freeze_vit, freeze_aligner=self.freeze_aligner, freeze_llm=self.freeze_llm)

    def parallel(self, num_micro: int) -> ParallelSection:
        """The recipe's ``parallel`` section with ``num_micro`` micro-batches per step."""
        return ParallelSection(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ParallelSection)
                                  if f.name != "num_micro"}, num_micro=num_micro)

    def data(self, micro_batch_size: int = 1) -> DataSection:
        """The recipe's ``data`` section: the bad-sample policy and ``max_length``."""
        return DataSection(path="<the trainer's dataset>", micro_batch_size=micro_batch_size,
                           max_length=self.max_length, on_bad_sample=self.on_bad_sample,
                           max_bad_rows=self.max_bad_rows)


def check_training_args(args, mpipe: MPipeConfig) -> None:
    """Every ``TrainingArguments`` value a pipeline cannot honour, before any collective.

    Raises:
        ValueError: naming the argument and what to use instead.
    """
    problems = []
    if args.torch_compile:
        problems.append("torch_compile=True (compile each stage yourself; the pipeline runs the stages eagerly)")
    if args.deepspeed:
        problems.append("deepspeed (the pipeline holds one share of the model per rank; drop the DeepSpeed config)")
    if args.fsdp or args.fsdp_config and args.fsdp_config.get("fsdp_version"):
        problems.append("fsdp (data parallelism over pipelines is mpipe-hf train's, a recipe's parallel.dp_size; "
                        "drop fsdp)")
    if args.fp16:
        problems.append("fp16=True (use bf16=True: fp32 master weights with bf16 autocast)")
    if args.optim not in OPTIMIZERS:
        problems.append(f"optim={args.optim!r} (one of {list(OPTIMIZERS)}: AdamW over each rank's parameters)")
    if args.train_sampling_strategy not in SAMPLING:
        problems.append(f"train_sampling_strategy={args.train_sampling_strategy!r} (one of {list(SAMPLING)})")
    if args.gradient_accumulation_steps < 1:
        problems.append(f"gradient_accumulation_steps={args.gradient_accumulation_steps} (the micro-batches per "
                        f"step, >= 1)")
    problems += accelerate_parallelism(args)
    world, processes = int(os.environ.get("WORLD_SIZE", 1)), mpipe.pp_size * mpipe.cp_size
    if world != processes:
        cp = f" cp_size={mpipe.cp_size}" if mpipe.cp_size > 1 else ""
        problems.append(f"{world} processes for pp_size={mpipe.pp_size}{cp} (launch {processes} processes)")
    if problems:
        raise ValueError("MPipeTrainer cannot run with " + "; ".join(problems))


PARALLELISM_SIZES = ("dp_replicate", "dp_shard", "tp", "cp", "sp")


def accelerate_parallelism(args) -> list[str]:
    """accelerate's ``ParallelismConfig`` (``TrainingArguments.parallelism_config``, or ``accelerate launch
    --parallelism_config_*``, which passes it by ``PARALLELISM_CONFIG_*`` variables) with a size above 1, named:
    its context parallelism shards a whole model's sequence on every rank (ring attention, which the Trainer sets
    up around its own ``training_step``) and its other sizes wrap the model, while a pipeline rank holds one share
    of it and splits the sequence with ``MPipeConfig(cp_size=...)``. A ``ParallelismConfig`` of sizes 1 changes
    nothing and is let through. Returns the problems, for :func:`check_training_args`."""
    config = getattr(args, "parallelism_config", None)
    if config is not None:
        sizes = {name: getattr(config, f"{name}_size", 1) or 1 for name in PARALLELISM_SIZES}
    elif os.environ.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false").lower() == "true":
        sizes = {name: int(os.environ.get(f"PARALLELISM_CONFIG_{name.upper()}_SIZE", "1"))
                 for name in PARALLELISM_SIZES}
    else:
        return []
    above = ", ".join(f"{name}_size={size}" for name, size in sizes.items() if size > 1)
    if not above:
        return []
    return [f"accelerate's parallelism_config {above} (the pipeline splits the model itself: for context "
            f"parallelism set MPipeConfig(cp_size=...) and launch pp_size * cp_size processes; drop the "
            f"parallelism_config)"]


def check_context_parallel_trainer(mpipe: MPipeConfig, config) -> None:
    """With ``cp_size`` above 1, before any collective: the model's HF ``config`` against the split
    (:func:`~.checks.check_context_parallel`: heads, KV heads, layer types with a state along the sequence) and,
    with ``packing``, its family's masks (:func:`~.checks.check_context_parallel_packing`: those that run packed
    rows one by one, Gemma's, PaliGemma's and Molmo2's, are refused), as a recipe's.

    Raises:
        ValueError: naming ``MPipeConfig cp_size`` (and ``packing``), the model type and what it does not run with.
    """
    if mpipe.cp_size == 1:
        return
    from .checks import check_context_parallel, check_context_parallel_packing
    try:
        check_context_parallel(config, mpipe.cp_size)
        check_context_parallel_packing(config, mpipe.cp_size, mpipe.packing)
    except ValueError as err:
        raise ValueError(str(err).replace("parallel.cp_size", "MPipeConfig cp_size")
                         .replace("data.packing: true", "packing=True")
                         .replace("set data.packing: false or cp_size: 1", "set packing=False or cp_size=1")
                         .replace("set cp_size: 1", "set cp_size=1")) from None


class _EpochSampler(torch.utils.data.Sampler):
    """Row indices ``0 .. n-1`` in file order, or (``shuffle``) in the order of ``torch.randperm`` drawn from
    ``seed + epoch``: the same on every rank, and the same after a resume (the Trainer calls ``set_epoch``)."""

    def __init__(self, n: int, seed: int, shuffle: bool):
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        if not self.shuffle:
            return iter(range(self.n))
        return iter(epoch_order(self.n, self.seed, self.epoch))


class _RowLoader(DataLoader):
    """A ``DataLoader`` of row indices whose ``set_epoch`` reaches its sampler."""

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)


class _Pipeline(nn.Module):
    """What the Trainer sees as the wrapped model: the rank's share (so ``zero_grad`` and ``train`` reach it),
    never wrapped by DDP."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module


class MPipeCallback(TrainerCallback):
    """Puts the pipeline's figures into every training log of the Trainer (so they reach every ``report_to``
    backend), over the steps since the last log: ``bubble`` (the ranks' share of time not computing),
    ``tokens_per_s`` (label tokens), ``step_s_rank<r>`` (mean step time of each rank, seconds),
    ``peak_activation_mib_rank<r>`` (most bytes saved for backward at once), ``peak_device_mib_rank<r>`` (on a GPU,
    ``max_memory_allocated``), ``skipped_steps`` (in all), ``bad_rows`` (rows dropped at load since the last log)
    and ``bad_rows_total`` (in all). :class:`MPipeTrainer` adds it first, so the reporting callbacks see the
    figures."""

    def __init__(self):
        self.window, self.skips = [], None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:
            return
        before = set(logs)
        if self.window:
            world = len(self.window[0].rank_bubble)
            wall = sum(s.wall_s for s in self.window)
            logs["bubble"] = round(sum(s.bubble for s in self.window) / len(self.window), 4)
            if self.window[0].aux_loss is not None:  # the MoE load-balancing term inside the loss
                logs["aux_loss"] = sum(s.aux_loss for s in self.window) / len(self.window)
            logs["tokens_per_s"] = round(sum(s.num_tokens for s in self.window) / wall, 1) if wall else 0.0
            for r in range(world):
                logs[f"step_s_rank{r}"] = round(sum(s.rank_wall_s[r] for s in self.window) / len(self.window), 4)
                logs[f"peak_activation_mib_rank{r}"] = round(
                    max(s.rank_activation_bytes[r] for s in self.window) / 2 ** 20, 3)
                if self.window[0].rank_device_bytes:
                    logs[f"peak_device_mib_rank{r}"] = round(
                        max(s.rank_device_bytes[r] for s in self.window) / 2 ** 20, 1)
        logs["skipped_steps"] = self.skips.total if self.skips is not None else 0
        logs["bad_rows"] = sum(s.bad_rows for s in self.window)
        logs["bad_rows_total"] = self.skips.bad_rows if self.skips is not None else 0
        self.window = []
        last = state.log_history[-1] if state.log_history else {}
        if last.get("step") == state.global_step and "loss" in last:  # the Trainer kept this log before us
            last.update({k: v for k, v in logs.items() if k not in before})




class PreemptionCallback(TrainerCallback):
    """SIGTERM or SIGUSR1 (preemption, :mod:`.preempt`) during ``MPipeTrainer.train()``: every rank finishes the
    step, the Trainer saves ``checkpoint-<step>`` (whole or not at all) and ends ``train()``; rank 0 prints one
    line naming the checkpoint. ``resume_from_checkpoint=True`` continues from it. ``device``: where the
    agreement's all-reduce runs (the executor's device)."""

    def __init__(self, device: torch.device):
        self.device, self.preemption, self.received = device, Preemption().connect(), None

    def on_train_begin(self, args, state, control, **kwargs):
        self.preemption.install()

    def on_step_end(self, args, state, control, **kwargs):
        self.received = self.preemption.agreed(self.device)  # the same on every rank
        if self.received is not None:
            control.should_save = control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        self.preemption.uninstall()
        if self.received is not None and state.is_world_process_zero:
            path = os.path.abspath(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))
            print(f"mpipe_hf: preempted by {self.received} after step {state.global_step} of {state.max_steps}: "
                  f"saved {path}; continue with resume_from_checkpoint=True (or that path)", flush=True)
