"""A training recipe: one YAML file with every knob, validated before any process group exists.

Relative paths in a recipe file (``model.name_or_path``, ``model.config``, ``model.tokenizer``, ``data.path``,
``data.eval_path``, ``parallel.profile``, ``train.output_dir``, ``train.resume`` other than ``auto``) are relative
to the recipe file's folder, not the working directory: ``recipes/x.yaml`` names the repository's ``demo/model``
as ``../demo/model``. Each section lives in a module of its own (``recipe_model``, ``recipe_data``,
``recipe_parallel``, ``recipe_lora``; ``train`` here), every name importable from this one.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import yaml

from ..models.freeze import Trainable
from ..schedule import ScheduleConfig
from ..schedule.swap import SwapConfig
from .recipe_data import DataSection
from .recipe_lora import LoraSection
from .recipe_model import TOKENIZER_FILES, WEIGHT_FILES, ModelSource
from .recipe_parallel import ParallelSection
from .recipe_paths import resolve_paths

__all__ = ["RENAMED", "SECTIONS", "TOKENIZER_FILES", "WEIGHT_FILES", "DataSection", "LoraSection", "ModelSource",
           "ParallelSection", "Recipe", "TrainSection", "load_recipe", "parse_recipe", "read_recipe_file"]


@dataclass(frozen=True)
class TrainSection:
    """``train:`` the optimisation, under the names of ``transformers.TrainingArguments``.

    Attributes:
        max_steps: optimizer steps; -1: as many as ``num_train_epochs`` passes over the data take (rounded up).
        num_train_epochs: passes over the data when ``max_steps`` is -1.
        logging_steps: write a row to ``output_dir/metrics.jsonl`` every this many steps (and the last).
        learning_rate: the peak learning rate of AdamW.
        lr_scheduler_type: a ``transformers.SchedulerType`` value (``linear``, ``cosine``, ``constant``,
            ``constant_with_warmup``, ...), through ``transformers.get_scheduler``.
        warmup_steps, warmup_ratio: linear warm-up steps; ``warmup_ratio`` (of ``max_steps``, rounded up) when
            ``warmup_steps`` is 0.
        weight_decay: AdamW's decoupled decay, on every parameter but biases and norm weights (the HF grouping).
        adam_beta1, adam_beta2, adam_epsilon: AdamW's ``betas`` and ``eps``.
        max_grad_norm: clip the gradients by their global norm over every pipeline rank (each tied pair and each
            ``P`` counted once); 0 turns clipping off.
        seed: for anything random (random init from a config included).
        output_dir: where the metrics log and the final checkpoint go.
        gradient_checkpointing: recompute each decoder layer (and vision block) in the backward instead of
            keeping its activations, through HF's ``activation_checkpointing_enable`` (v5's name for
            ``gradient_checkpointing_enable``; non-reentrant); a stage then
            holds only its layers' inputs per micro-batch in flight.
        bf16: compute in bf16 with fp32 master weights (autocast; :mod:`mpipe_hf.train.precision`).
        trace: record every action's start and end on every rank and write ``output_dir/trace.json`` (Chrome
            trace; ``mpipe-hf plot --trace`` draws it).
        save_steps: also write ``output_dir/checkpoint-<step>/`` every this many steps (weights as
            ``from_pretrained`` loads them, and every rank's optimizer, LR schedule, RNG states and step); 0: only
            the final ``output_dir/checkpoint``.
        save_total_limit: keep only this many ``checkpoint-<step>`` directories, the newest (``None``: all).
        resume: ``auto`` (the newest complete ``checkpoint-<step>`` of ``output_dir``, or a fresh start when
            there is none) or a checkpoint directory: continue from it, bit-exactly. A checkpoint of another
            ``pp_size``, ``vpp`` or layout resumes too: the weights, and the optimizer state by parameter name
            (not bit-exact: the order of the sums differs). A worker group restarted by ``mpipe-hf train
            --max-restarts N`` resumes from this run's newest checkpoint by itself.
        reset_optimizer: on resume, start AdamW's moments afresh instead of loading them (the step, learning rate
            schedule and data position still continue); needed when the checkpoint's optimizer state does not
            cover this run's trained parameters.
        eval_steps: with ``data.eval_path``, evaluate every this many steps (0: only after the last step).
        report_to: experiment trackers, through Accelerate's tracker API (``tensorboard``, ``wandb``, ``mlflow``,
            ``comet_ml``, ``aim``, ``clearml``, ``dvclive``, ``swanlab``, ``trackio``) or ``[]``; they log what
            ``metrics.jsonl`` holds, from rank 0, under ``output_dir/runs``.
        freeze, trainable, freeze_vit, freeze_aligner, freeze_llm: what trains, by pattern
            (:class:`~mpipe_hf.models.freeze.Trainable`, docs/freeze.md).
        loss_normalization: ``tokens`` (default): a step's loss is its summed token loss over its label tokens;
            ``micro``: the mean of the micro-batches' token means (the HF Trainer's for a model that takes no
            ``num_items_in_batch``, such as Qwen2.5-VL).

    Raises:
        ValueError: a count that is not an integer in its range (``max_steps`` >= 1 or -1, ``logging_steps`` >= 1,
            ``warmup_steps``, ``save_steps`` and ``eval_steps`` >= 0, ``save_total_limit`` >= 1 or null, ``seed`` in
            ``[0, 2**32)``); a rate, decay, norm or ``num_train_epochs`` that is not a finite number (a numeric
            string included, as YAML reads ``1e-4``) >= 0 (> 0 for ``num_train_epochs``); a beta outside
            ``[0, 1)``, a ``warmup_ratio`` outside ``[0, 1]``; an unknown ``lr_scheduler_type``; a flag that is not
            a boolean; an ``output_dir`` that is not a non-empty string or is a file; a ``resume`` that is not
            ``auto`` or an existing directory; a ``report_to`` that is not a list of known trackers.
    """

    max_steps: int = -1
    num_train_epochs: float = 3.0
    logging_steps: int = 1
    learning_rate: float = 5e-5
    lr_scheduler_type: str = "linear"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    seed: int = 0
    output_dir: str = "outputs/run"
    gradient_checkpointing: bool = False
    bf16: bool = False
    trace: bool = False
    save_steps: int = 0
    save_total_limit: int | None = None
    resume: str | None = None
    reset_optimizer: bool = False
    eval_steps: int = 0
    report_to: list[str] = dataclasses.field(default_factory=list)
    loss_normalization: str = "tokens"
    freeze: list[str] = dataclasses.field(default_factory=list)
    trainable: list[str] = dataclasses.field(default_factory=list)
    freeze_vit: bool = False
    freeze_aligner: bool = False
    freeze_llm: bool = False

    def trainable_spec(self) -> Trainable:
        """What trains, by pattern (:class:`~mpipe_hf.models.freeze.Trainable`)."""
        return Trainable(freeze=self.freeze, trainable=self.trainable, freeze_vit=self.freeze_vit,
                         freeze_aligner=self.freeze_aligner, freeze_llm=self.freeze_llm)

    def total_steps(self, steps_per_epoch: float) -> int:
        """``max_steps``, or ``ceil(num_train_epochs * steps_per_epoch)`` when it is -1."""
        return self.max_steps if self.max_steps > 0 else max(1, math.ceil(self.num_train_epochs * steps_per_epoch))

    def __post_init__(self):
        spec = self.trainable_spec()  # raises for a bad pattern list or shortcut
        object.__setattr__(self, "freeze", list(spec.freeze))
        object.__setattr__(self, "trainable", list(spec.trainable))
        self._check_counts()
        self._check_rates()
        self._check_output()

    def _check_counts(self):
        if not isinstance(self.max_steps, int) or isinstance(self.max_steps, bool) or (
                self.max_steps < 1 and self.max_steps != -1):
            raise ValueError(f"train.max_steps must be an integer >= 1, or -1 (use num_train_epochs), got "
                             f"{self.max_steps!r}")
        if not isinstance(self.logging_steps, int) or isinstance(self.logging_steps, bool) or self.logging_steps < 1:
            raise ValueError(f"train.logging_steps must be an integer >= 1, got {self.logging_steps!r}")
        if not isinstance(self.warmup_steps, int) or isinstance(self.warmup_steps, bool) or self.warmup_steps < 0:
            raise ValueError(f"train.warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if not isinstance(self.save_steps, int) or isinstance(self.save_steps, bool) or self.save_steps < 0:
            raise ValueError(f"train.save_steps must be an integer >= 0, got {self.save_steps!r}")
        if self.save_total_limit is not None and (not isinstance(self.save_total_limit, int) or isinstance(
                self.save_total_limit, bool) or self.save_total_limit < 1):
            raise ValueError(f"train.save_total_limit must be an integer >= 1 or null, got {self.save_total_limit!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2 ** 32:
            raise ValueError(f"train.seed must be an integer in [0, 2**32), got {self.seed!r}")
        if not isinstance(self.eval_steps, int) or isinstance(self.eval_steps, bool) or self.eval_steps < 0:
            raise ValueError(f"train.eval_steps must be an integer >= 0, got {self.eval_steps!r}")

    def _check_rates(self):
        for key in ("num_train_epochs", "learning_rate", "weight_decay", "adam_epsilon", "adam_beta1", "adam_beta2",
                    "max_grad_norm", "warmup_ratio"):
            value, number = getattr(self, key), math.nan
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                try:
                    number = float(value)  # YAML reads 1e-4 (no dot) as a string
                except (ValueError, OverflowError):  # not a number; an integer too large for a float
                    pass
            strict = key == "num_train_epochs"
            if not math.isfinite(number) or number < 0 or (strict and number == 0):  # NaN: every comparison False
                raise ValueError(f"train.{key} must be a finite number {'>' if strict else '>='} 0, got {value!r}")
            object.__setattr__(self, key, number)
        for key in ("adam_beta1", "adam_beta2", "warmup_ratio"):
            if getattr(self, key) > 1 or (key != "warmup_ratio" and getattr(self, key) >= 1):
                raise ValueError(f"train.{key} must be in [0, 1{']' if key == 'warmup_ratio' else ')'}, got "
                                 f"{getattr(self, key)!r}")
        from transformers import SchedulerType
        kinds = [k.value for k in SchedulerType]
        if self.lr_scheduler_type not in kinds:
            raise ValueError(f"train.lr_scheduler_type must be one of {kinds}, got {self.lr_scheduler_type!r}")
        if self.loss_normalization not in ("tokens", "micro"):
            raise ValueError(f"train.loss_normalization must be 'tokens' or 'micro', got "
                             f"{self.loss_normalization!r}")
        for key in ("gradient_checkpointing", "bf16", "trace", "reset_optimizer"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"train.{key} must be true or false, got {getattr(self, key)!r}")

    def _check_output(self):
        if self.resume is not None and (not isinstance(self.resume, str) or (  # its training state: resolve_resume
                self.resume != "auto" and not os.path.isdir(self.resume))):
            raise ValueError(f"train.resume must be null, 'auto' or an existing checkpoint directory, got "
                             f"{self.resume!r}")
        if not isinstance(self.output_dir, str) or not self.output_dir or os.path.isfile(self.output_dir):
            raise ValueError(f"train.output_dir must be a directory path (a non-empty string, not a file), got "
                             f"{self.output_dir!r}")
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS
        report_to = [self.report_to] if isinstance(self.report_to, str) else self.report_to
        if not isinstance(report_to, (list, tuple)) or any(not isinstance(t, str) or t not in LOGGER_TYPE_TO_CLASS
                                                           for t in report_to):  # a list item is unhashable
            raise ValueError(f"train.report_to must be a list of trackers from {sorted(LOGGER_TYPE_TO_CLASS)}, got "
                             f"{self.report_to!r}")
        object.__setattr__(self, "report_to", list(report_to))


SECTIONS = {"model": ModelSource, "data": DataSection, "parallel": ParallelSection, "train": TrainSection,
            "lora": LoraSection, "swap": SwapConfig}
RENAMED = {"steps": "train.max_steps", "lr": "train.learning_rate", "adam_eps": "train.adam_epsilon",
           "data": "data.path", "eval_data": "data.eval_path", "eval_dataset": "data.eval_path"}


@dataclass(frozen=True)
class Recipe:
    """What ``mpipe-hf train RECIPE.yaml`` runs, in four sections and the optional ``lora`` and ``swap`` (each
    validated on construction). In a recipe file (:func:`load_recipe`) a relative path is relative to the file's
    folder; in a mapping given to :func:`parse_recipe`, to the working directory.

    Attributes:
        model: a :class:`ModelSource`; in YAML a checkpoint path, or ``{name_or_path: DIR}``, or
            ``{config: FILE, tokenizer: DIR}`` for random initialisation.
        data: a :class:`DataSection` (in YAML a mapping, or just the JSONL path).
        parallel: a :class:`ParallelSection`: the schedule and the layout.
        train: a :class:`TrainSection`: the optimisation, with ``TrainingArguments`` names.
        lora: a :class:`LoraSection` (a LoRA adapter; only it trains), or ``None`` (no ``lora:`` section, or
            ``lora: null``): full fine-tuning.
        swap: a :class:`~mpipe_hf.schedule.swap.SwapConfig`: activation swap (off without a ``swap:`` section).

    Raises:
        ValueError: ``swap.ranks`` beyond ``parallel.pp_size``; swap with FSDP2 (``parallel.dp_shard`` and
            ``dp_size > 1``: the gathered weights would be taken for activations); ``parallel.zero_bubble`` with
            FSDP2 (it reduces gradients before ``W`` computes them).
    """

    model: ModelSource
    data: DataSection
    parallel: ParallelSection
    train: TrainSection = dataclasses.field(default_factory=TrainSection)
    lora: LoraSection | None = None
    swap: SwapConfig = dataclasses.field(default_factory=SwapConfig)

    def __post_init__(self):
        self.swap.check(self.parallel.pp_size)
        if self.swap.enabled and self.parallel.dp_size > 1 and self.parallel.dp_shard:
            raise ValueError("swap.enabled with parallel.dp_shard (FSDP2, dp_size > 1) is not supported: FSDP2's "
                             "gathered weights would be taken for activations; set parallel.dp_shard: false "
                             "(replicas) or swap.enabled: false")
        if self.data.packing and self.train.loss_normalization != "tokens":
            raise ValueError("data.packing with train.loss_normalization: micro is not supported: rows are packed "
                             "by tokens, so a micro-batch's mean would weigh each row by how it was packed; set "
                             "train.loss_normalization: tokens (the step's loss over its label tokens, as unpacked)")
        if self.parallel.zero_bubble and self.parallel.dp_size > 1 and self.parallel.dp_shard:
            raise ValueError("parallel.zero_bubble with parallel.dp_shard (FSDP2, dp_size > 1) is not supported: "
                             "FSDP2 reduces a chunk's gradients before W computes them; set parallel.dp_shard: "
                             "false (replicas) or parallel.zero_bubble: false")

    def schedule(self) -> ScheduleConfig:
        """The schedule part alone."""
        return self.parallel.schedule()


def _section_keys() -> dict[str, str]:
    """``{key: its section}`` for every key of a section."""
    return {f.name: name for name, cls in SECTIONS.items() if dataclasses.is_dataclass(cls)
            for f in dataclasses.fields(cls)}


def parse_recipe(raw, where: str = "recipe") -> Recipe:
    """A :class:`Recipe` from its YAML mapping.

    Raises:
        ValueError: an unknown section or key (a key of the old flat layout names its new place), a missing
            one, or a bad value; the message names ``section.key`` and what it allows.
    """
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a recipe is a mapping of sections ({sorted(SECTIONS)}) to their keys, got "
                         f"{type(raw).__name__} {raw!r:.60}")
    homes = _section_keys()
    for key in raw:
        if key in SECTIONS:
            continue
        if key in RENAMED or key in homes:
            new = RENAMED.get(key, f"{homes.get(key)}.{key}")
            section, name = new.split(".")
            raise ValueError(f"{where}: the top-level key {key!r} now lives in the {section!r} section: write "
                             f"`{section}: {{{name}: ...}}`")
        raise ValueError(f"{where}: unknown section {key!r}; a recipe has the sections {sorted(SECTIONS)}")
    for name in ("model", "data", "parallel"):
        if name not in raw:
            raise ValueError(f"{where}: missing the {name!r} section")
    data = raw["data"]
    sections = {"data": _build("data", DataSection, {"path": data} if isinstance(data, str) else data, where)}
    for name in ("parallel", "train", "swap"):
        if name in raw:
            sections[name] = _build(name, SECTIONS[name], {} if raw[name] is None else raw[name], where)  # `train:`
    if raw.get("lora") is not None:  # `lora: {}` is LoRA with peft's defaults; no section (or null) is none
        sections["lora"] = _build("lora", LoraSection, raw["lora"], where)
    return Recipe(model=ModelSource.parse(raw["model"]), **sections)  # the file system last


def _build(name: str, cls, values, where: str):
    if not isinstance(values, dict):
        raise ValueError(f"{where}: section {name!r} must be a mapping of keys to values, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in fields:
            moved = RENAMED.get(key) or (f"{_section_keys()[key]}.{key}" if key in _section_keys() else None)
            hint = f"; it lives at {moved}" if moved else ""
            raise ValueError(f"{where}: unknown key {name}.{key}{hint}; allowed: {sorted(fields)}")
    missing = [k for k, f in fields.items() if f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING and k not in values]
    if missing:
        raise ValueError(f"{where}: section {name!r} lacks {missing}")
    return cls(**values)


def load_recipe(path: str) -> Recipe:
    """Read and validate a recipe file (sections ``model``, ``data``, ``parallel``, ``train``, ``lora``,
    ``swap``). Its relative paths are relative to the file's folder, not the working directory: they are resolved
    before any section is validated (:func:`~.recipe_paths.resolve_paths`).

    Raises:
        ValueError: the file is missing, is a directory or cannot be read; it is not UTF-8 text or not YAML (the
            message gives the line and column); it is not a mapping of sections; and as :func:`parse_recipe`, with
            the file's name. Each message is one line.
    """
    return parse_recipe(resolve_paths(read_recipe_file(path), os.path.dirname(os.path.abspath(path))), path)


def read_recipe_file(path: str):
    """The YAML value of the recipe file ``path`` (``{}`` for an empty file), unvalidated.

    Raises:
        ValueError: one line naming ``path``: missing, a directory, unreadable, not UTF-8 text, or not YAML.
    """
    if os.path.isdir(path):
        raise ValueError(f"recipe {path!r} is a directory; give the recipe's YAML file")
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise ValueError(f"recipe {path!r} not found (no such file)") from None
    except OSError as err:
        raise ValueError(f"recipe {path!r} cannot be read: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ValueError(f"recipe {path!r} is not a YAML file (not UTF-8 text)") from None
    except yaml.YAMLError as err:
        mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        raise ValueError(f"{where}: the recipe is not valid YAML ({problem or ' '.join(str(err).split())})") \
            from None
    return {} if raw is None else raw
