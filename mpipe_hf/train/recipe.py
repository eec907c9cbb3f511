"""A training recipe: one YAML file with every knob, validated before any process group exists."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import yaml

from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..schedule import ScheduleConfig
from ..schedule.owners import OWNER_POLICIES
from ..schedule.swap import SwapConfig

WEIGHT_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME)  # each rank reads its own tensors from safetensors
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class ModelSource:
    """Where the model comes from: a checkpoint, or a config for random initialisation.

    Attributes:
        name_or_path: a local Hugging Face checkpoint directory (``save_pretrained`` output or a hub snapshot):
            config, safetensors weights, tokenizer and, for a vision-language model, the image processor.
        config: a ``config.json`` file, or a directory holding one, for a randomly initialised model (``seed``).
        tokenizer: the directory with the tokenizer files; defaults to ``name_or_path``, or to ``config``'s
            directory. The image processor is the checkpoint's own (``name_or_path``) when it saved one, else it is
            built from the config.

    Raises:
        ValueError: a value that is not a non-empty string or null; not exactly one of ``name_or_path`` and
            ``config``; a path that does not exist; a checkpoint without ``config.json`` or weights; a ``tokenizer``
            that is not a directory (and, from :meth:`check_tokenizer`, a tokenizer directory without tokenizer
            files).
    """

    name_or_path: str | None = None
    config: str | None = None
    tokenizer: str | None = None

    def __post_init__(self):
        for key in ("name_or_path", "config", "tokenizer"):  # before the file system: os.path takes 5 for a descriptor
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"model.{key} must be a path (a non-empty string) or null, got {value!r}")
        if (self.name_or_path is None) == (self.config is None):
            raise ValueError("model needs exactly one of name_or_path (a checkpoint directory) and config (a "
                             "config.json for random initialisation)")
        if self.name_or_path is not None and not os.path.isdir(self.name_or_path):
            raise ValueError(f"model.name_or_path {self.name_or_path!r} is not a checkpoint directory")
        if self.name_or_path is not None:
            missing = [n for n, names in (("config.json", [CONFIG_NAME]), ("weights", WEIGHT_FILES))
                       if not any(os.path.isfile(os.path.join(self.name_or_path, f)) for f in names)]
            if missing:
                raise ValueError(f"model.name_or_path {self.name_or_path!r} has no {' and no '.join(missing)} "
                                 f"(weights: one of {WEIGHT_FILES}; a .bin checkpoint converts with "
                                 f"from_pretrained(...).save_pretrained(dir)); for random weights use model.config")
        if self.config is not None and not os.path.exists(self.config):
            raise ValueError(f"model.config {self.config!r} does not exist (a config.json or a directory with one)")
        if self.tokenizer is not None and not os.path.isdir(self.tokenizer):
            raise ValueError(f"model.tokenizer {self.tokenizer!r} is not a directory")

    def check_tokenizer(self) -> None:
        """Raise ``ValueError`` naming the field when the tokenizer directory holds no tokenizer (training needs
        one; ``mpipe-hf plan`` does not)."""
        if not any(os.path.isfile(os.path.join(self.tokenizer_dir, f)) for f in TOKENIZER_FILES):
            field = "model.tokenizer" if self.tokenizer or self.name_or_path is None else "model.name_or_path"
            raise ValueError(f"{field}: {self.tokenizer_dir!r} holds no tokenizer (none of {TOKENIZER_FILES}); set "
                             f"model.tokenizer to the directory with the tokenizer files")

    @property
    def tokenizer_dir(self) -> str:
        """Where the tokenizer and image-processor files are read from."""
        if self.tokenizer is not None:
            return self.tokenizer
        if self.name_or_path is not None:
            return self.name_or_path
        return self.config if os.path.isdir(self.config) else os.path.dirname(os.path.abspath(self.config))

    @classmethod
    def parse(cls, value) -> "ModelSource":
        """A recipe's ``model`` value: a checkpoint path, or ``{name_or_path | config, tokenizer}``.

        Raises:
            ValueError: another type, or unknown keys (the message lists the allowed ones).
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(name_or_path=value)
        allowed = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(value, dict) or set(value) - set(allowed):
            raise ValueError(f"model must be a checkpoint path or a mapping with keys {allowed}, got {value!r}")
        return cls(**value)


@dataclass(frozen=True)
class DataSection:
    """``data:`` what the model reads.

    Attributes:
        path: a JSONL file: ``{"image", "prompt", "caption"}`` rows for a vision-language model (image paths
            relative to the file), ``{"text"}`` rows for a decoder-only LM.
        micro_batch_size: rows per micro-batch.
        min_pixels, max_pixels: image resize bounds of the processor, in pixels.
        shuffle: read each epoch's rows in an order drawn from ``train.seed`` and the epoch (default); else in
            file order.
        max_length: the most tokens a row may take (text and image tokens); a longer row is cut at
            ``max_length``, or dropped with a counted warning when the cut would go through an image's tokens.
        on_bad_sample: ``skip`` (default): a step whose data load fails on any rank is skipped on every rank (no
            optimizer step), with a warning naming the rows and a count in the metrics; ``raise``: the run stops.
        max_bad_steps: with ``skip``, the run stops with the last error after this many skipped steps in a row
            (a step is skipped for a bad sample, or for a loss or gradient norm that is not finite).
        eval_path: a JSONL file of the same form as ``path``: ``train.eval_steps`` and the end of the run report
            ``eval_loss`` over every row of it (forward-only schedule, summed over the label tokens of the whole
            set and divided once); ``None``: no evaluation.

    Raises:
        ValueError: a count that is not an integer >= 1, ``min_pixels > max_pixels``, a ``shuffle`` that is not a
            boolean, an ``on_bad_sample`` other than ``skip``/``raise``, a ``path`` that is not a non-empty string, an
            ``eval_path`` that is not one or null (that the files exist is checked by
            :func:`mpipe_hf.train.trainer.check`: ``mpipe-hf plan`` needs no data).
    """

    path: str
    micro_batch_size: int = 1
    min_pixels: int = 56 * 56
    max_pixels: int = 112 * 112
    shuffle: bool = True
    max_length: int = 2048
    on_bad_sample: str = "skip"
    max_bad_steps: int = 3
    eval_path: str | None = None

    def __post_init__(self):
        for key in ("path", "eval_path"):
            value = getattr(self, key)
            if (not isinstance(value, str) or not value) and (key == "path" or value is not None):
                raise ValueError(f"data.{key} must be a JSONL file path{'' if key == 'path' else ' or null'}, got "
                                 f"{value!r}")
        for key in ("micro_batch_size", "min_pixels", "max_pixels", "max_length", "max_bad_steps"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"data.{key} must be an integer >= 1, got {value!r}")
        if not isinstance(self.shuffle, bool):
            raise ValueError(f"data.shuffle must be true or false, got {self.shuffle!r}")
        if self.on_bad_sample not in ("skip", "raise"):
            raise ValueError(f"data.on_bad_sample must be 'skip' or 'raise', got {self.on_bad_sample!r}")
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"data.min_pixels ({self.min_pixels}) exceeds data.max_pixels ({self.max_pixels})")


@dataclass(frozen=True, kw_only=True)
class ParallelSection(ScheduleConfig):
    """``parallel:`` the schedule (the fields of :class:`ScheduleConfig`: ``pp_size``, ``vpp``, ``num_micro``,
    ``preprocess``, ``overflow``, ``owner_backward``, ``less_memory``, ``placement``) and the layout.

    Attributes:
        text_layers: ``T``, decoder layers the transposed preprocess takes from stage 0 with the tower and the
            embedding (0: the tower alone; must be 0 with preprocess ``identity``).
        layers_per_stage: decoder layers per stage, ``pp_size * vpp`` entries; ``None``: balanced by cost.
        profile: a cost profile (``mpipe-hf profile``): placement ``fill`` places the transposed forwards by it,
            and the default layout is balanced by its costs; unit costs and a layout balanced by the config's
            matmul sizes when ``None``.
        timeout_s: the longest any transfer may wait, in seconds.
        dp_size: pipeline replicas (data parallelism): ``dp_size * pp_size`` processes on one ``(dp, pp)`` mesh,
            each replica on its own share of the global batch (:mod:`mpipe_hf.runtime.data_parallel`).
        dp_shard: with ``dp_size > 1``: ``true``, FSDP2 shards each stage chunk over the replicas; ``false``,
            each replica keeps its stages whole and the gradients are summed by one all-reduce.
        owners: who loads and preprocesses each micro-batch (SPEC.md, "Terms"): ``modulo`` (default), rank
            ``m % NT``; ``balanced`` (overflow ``full`` only), each step's micro-batches spread over the owners by
            their image tokens (LPT, :func:`~mpipe_hf.schedule.owners.balance_owners`; for a decoder-only LM by
            their length), so that no owner draws the heavy ones. Every rank computes the same owners from the
            image sizes the loader read from the file headers, with no collective.

    Raises:
        ValueError: as :class:`ScheduleConfig`, the field named ``parallel.<field>``; a ``text_layers`` that is
            not an integer >= 0, or above 0 with preprocess ``identity``; a ``layers_per_stage`` that is not
            ``pp_size * vpp`` integers >= 1; a ``profile`` that is not a file; a ``timeout_s`` that is not a number
            of seconds in ``(0, 1e9]`` (a numeric string included, as YAML reads ``1e3``).
    """

    text_layers: int = 0
    layers_per_stage: list[int] | None = None
    profile: str | None = None
    timeout_s: float = 300.0
    dp_size: int = 1
    dp_shard: bool = True
    owners: str = "modulo"

    def __post_init__(self):
        if not isinstance(self.dp_size, int) or isinstance(self.dp_size, bool) or self.dp_size < 1:
            raise ValueError(f"parallel.dp_size must be an integer >= 1, got {self.dp_size!r}")
        if not isinstance(self.dp_shard, bool):
            raise ValueError(f"parallel.dp_shard must be true (FSDP2) or false (replicas with one all-reduce), got "
                             f"{self.dp_shard!r}")
        try:
            super().__post_init__()
        except ValueError as err:  # ScheduleConfig's messages start with the bare field name
            raise ValueError(f"parallel.{err}") from None
        text_layers = self.text_layers
        if not isinstance(text_layers, int) or isinstance(text_layers, bool) or text_layers < 0:
            raise ValueError(f"parallel.text_layers must be an integer >= 0, got {text_layers!r}")
        if text_layers and not self.transposed:
            raise ValueError(f"parallel.text_layers = {text_layers} needs preprocess 'frozen' or 'trainable'; "
                             f"preprocess 'identity' is T = 0 (set text_layers: 0)")
        layout = self.layers_per_stage
        if layout is not None and (not isinstance(layout, (list, tuple)) or len(layout) != self.num_stages or any(
                not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in layout)):
            raise ValueError(f"parallel.layers_per_stage must be null or a list of {self.num_stages} integers >= 1 "
                             f"(pp_size * vpp decoder-layer counts), got {layout!r}")
        if self.profile is not None and (not isinstance(self.profile, str) or not os.path.isfile(self.profile)):
            raise ValueError(f"parallel.profile {self.profile!r} is not a file (mpipe-hf profile RECIPE.yaml "
                             f"writes one) or null")
        timeout = math.nan
        if isinstance(self.timeout_s, (int, float, str)) and not isinstance(self.timeout_s, bool):
            try:
                timeout = float(self.timeout_s)  # YAML reads 1e3 (no dot) as a string
            except (ValueError, OverflowError):
                pass
        # at most 1e9 s (31 years): a queue's wait and the doubled timedelta of the executor's groups overflow above
        if not 0 < timeout <= 1e9:  # NaN: False
            raise ValueError(f"parallel.timeout_s must be a number of seconds in (0, 1e9], got {self.timeout_s!r}")
        object.__setattr__(self, "timeout_s", timeout)

    def _check_owners(self) -> None:
        """Here ``owners`` is the policy; each step's owners are chosen by the trainer (:meth:`schedule` has
        none). Raises ``ValueError`` (``ScheduleConfig``'s validation prefixes ``parallel.``)."""
        if not isinstance(self.owners, str) or self.owners not in OWNER_POLICIES:
            raise ValueError(f"owners must be one of {OWNER_POLICIES}, got {self.owners!r}")
        if self.owners == "balanced" and self.overflow != "full":
            raise ValueError(f"owners 'balanced' needs overflow 'full' (mode 'min' fixes its owners), got overflow "
                             f"{self.overflow!r}")

    @property
    def assignment(self) -> None:
        """No fixed owners: :attr:`owners` names a policy, and the trainer gives each step its owners."""
        return None

    def schedule(self) -> ScheduleConfig:
        """The schedule part alone (``owners``: none; the policy lives on in :attr:`owners`)."""
        return ScheduleConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ScheduleConfig)
                                 if f.name != "owners"})


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

    def total_steps(self, steps_per_epoch: float) -> int:
        """``max_steps``, or ``ceil(num_train_epochs * steps_per_epoch)`` when it is -1."""
        return self.max_steps if self.max_steps > 0 else max(1, math.ceil(self.num_train_epochs * steps_per_epoch))

    def __post_init__(self):
        if not isinstance(self.max_steps, int) or isinstance(self.max_steps, bool) or (
                self.max_steps < 1 and self.max_steps != -1):
            raise ValueError(f"train.max_steps must be an integer >= 1, or -1 (use num_train_epochs), got "
                             f"{self.max_steps!r}")
        if not isinstance(self.logging_steps, int) or isinstance(self.logging_steps, bool) or self.logging_steps < 1:
            raise ValueError(f"train.logging_steps must be an integer >= 1, got {self.logging_steps!r}")
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
        if not isinstance(self.warmup_steps, int) or isinstance(self.warmup_steps, bool) or self.warmup_steps < 0:
            raise ValueError(f"train.warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        from transformers import SchedulerType
        kinds = [k.value for k in SchedulerType]
        if self.lr_scheduler_type not in kinds:
            raise ValueError(f"train.lr_scheduler_type must be one of {kinds}, got {self.lr_scheduler_type!r}")
        for key in ("gradient_checkpointing", "bf16", "trace", "reset_optimizer"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"train.{key} must be true or false, got {getattr(self, key)!r}")
        if not isinstance(self.save_steps, int) or isinstance(self.save_steps, bool) or self.save_steps < 0:
            raise ValueError(f"train.save_steps must be an integer >= 0, got {self.save_steps!r}")
        if self.save_total_limit is not None and (not isinstance(self.save_total_limit, int) or isinstance(
                self.save_total_limit, bool) or self.save_total_limit < 1):
            raise ValueError(f"train.save_total_limit must be an integer >= 1 or null, got {self.save_total_limit!r}")
        if self.resume is not None and (not isinstance(self.resume, str) or (  # its training state: resolve_resume
                self.resume != "auto" and not os.path.isdir(self.resume))):
            raise ValueError(f"train.resume must be null, 'auto' or an existing checkpoint directory, got "
                             f"{self.resume!r}")
        if not isinstance(self.output_dir, str) or not self.output_dir or os.path.isfile(self.output_dir):
            raise ValueError(f"train.output_dir must be a directory path (a non-empty string, not a file), got "
                             f"{self.output_dir!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2 ** 32:
            raise ValueError(f"train.seed must be an integer in [0, 2**32), got {self.seed!r}")
        if not isinstance(self.eval_steps, int) or isinstance(self.eval_steps, bool) or self.eval_steps < 0:
            raise ValueError(f"train.eval_steps must be an integer >= 0, got {self.eval_steps!r}")
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS
        report_to = [self.report_to] if isinstance(self.report_to, str) else self.report_to
        if not isinstance(report_to, (list, tuple)) or any(not isinstance(t, str) or t not in LOGGER_TYPE_TO_CLASS
                                                           for t in report_to):  # a list item is unhashable
            raise ValueError(f"train.report_to must be a list of trackers from {sorted(LOGGER_TYPE_TO_CLASS)}, got "
                             f"{self.report_to!r}")
        object.__setattr__(self, "report_to", list(report_to))


@dataclass(frozen=True)
class LoraSection:
    """``lora:`` a LoRA adapter (Hu et al., 2021) put into the model with ``peft`` before it is split; only the
    adapter (and ``modules_to_save``) trains, the base weights stay frozen, with no gradient and no optimizer
    state (README, "LoRA"). The fields are ``peft.LoraConfig``'s.

    Attributes:
        r: the adapter's rank.
        lora_alpha: the scale numerator: the update is ``lora_alpha / r * B @ A`` (``/ sqrt(r)`` with
            ``use_rslora``).
        lora_dropout: dropout on the adapter's input, in ``[0, 1)``.
        target_modules: the linear layers to adapt: a list of module-name suffixes (``[q_proj, v_proj]``), one
            regex matched against the whole name, ``all-linear``, or ``null`` for peft's default of the model
            type. With ``parallel.preprocess: frozen`` no target may sit in the tower.
        exclude_modules: module-name suffixes or one regex that are never adapted.
        modules_to_save: modules trained and saved whole beside the adapter (the merger, ``lm_head``).
        use_rslora: rank-stabilised scaling.
        init_lora_weights: ``true`` (``A`` as ``nn.Linear``'s init, ``B = 0``), ``gaussian``, or ``false``
            (random ``B`` too; for tests).
        merge: besides the adapter checkpoint, write ``output_dir/merged``: the base with the adapter merged in,
            which ``from_pretrained`` loads.

    Raises:
        ValueError: an ``r`` that is not an integer >= 1; a ``lora_alpha`` that is not a finite number > 0; a
            ``lora_dropout`` outside ``[0, 1)``; a module list that is not a non-empty string or a list of them
            (or null); an ``init_lora_weights`` other than true, false or ``gaussian``; a flag that is not a
            boolean.
    """

    r: int = 8
    lora_alpha: float = 16
    lora_dropout: float = 0.0
    target_modules: list[str] | str | None = None
    exclude_modules: list[str] | str | None = None
    modules_to_save: list[str] | None = None
    use_rslora: bool = False
    init_lora_weights: bool | str = True
    merge: bool = False

    def __post_init__(self):
        if not isinstance(self.r, int) or isinstance(self.r, bool) or self.r < 1:
            raise ValueError(f"lora.r must be an integer >= 1, got {self.r!r}")
        for key, low, high in (("lora_alpha", 0.0, math.inf), ("lora_dropout", 0.0, 1.0)):
            value, number = getattr(self, key), math.nan
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                try:
                    number = float(value)
                except (ValueError, OverflowError):
                    pass
            ok = (number > low if key == "lora_alpha" else low <= number < high) and math.isfinite(number)
            if not ok:
                allowed = "a finite number > 0" if key == "lora_alpha" else "a number in [0, 1)"
                raise ValueError(f"lora.{key} must be {allowed}, got {value!r}")
            object.__setattr__(self, key, int(number) if key == "lora_alpha" and number == int(number) else number)
        for key in ("target_modules", "exclude_modules", "modules_to_save"):
            value = getattr(self, key)
            names = [value] if isinstance(value, str) and key != "modules_to_save" else value
            if value is not None and (not isinstance(names, (list, tuple)) or not names or any(
                    not isinstance(n, str) or not n for n in names)):
                kind = "a list of module names" if key == "modules_to_save" else \
                    "a list of module names, one regex string"
                raise ValueError(f"lora.{key} must be {kind} or null, got {value!r}")
            if isinstance(value, tuple):
                object.__setattr__(self, key, list(value))
        for key in ("use_rslora", "merge"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"lora.{key} must be true or false, got {getattr(self, key)!r}")
        if self.init_lora_weights not in (True, False, "gaussian") or (
                not isinstance(self.init_lora_weights, (bool, str))):
            raise ValueError(f"lora.init_lora_weights must be true, false or 'gaussian', got "
                             f"{self.init_lora_weights!r}")

    def peft_config(self):
        """The ``peft.LoraConfig`` of these fields."""
        from peft import LoraConfig
        return LoraConfig(r=self.r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
                          target_modules=self.target_modules, exclude_modules=self.exclude_modules,
                          modules_to_save=self.modules_to_save, use_rslora=self.use_rslora,
                          init_lora_weights=self.init_lora_weights)


SECTIONS = {"model": ModelSource, "data": DataSection, "parallel": ParallelSection, "train": TrainSection,
            "lora": LoraSection, "swap": SwapConfig}
RENAMED = {"steps": "train.max_steps", "lr": "train.learning_rate", "adam_eps": "train.adam_epsilon",
           "data": "data.path", "eval_data": "data.eval_path", "eval_dataset": "data.eval_path"}


@dataclass(frozen=True)
class Recipe:
    """What ``mpipe-hf train RECIPE.yaml`` runs, in four sections and the optional ``lora`` and ``swap`` (each
    validated on construction). Paths are relative to the working directory.

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
        raise ValueError(f"{where}: a recipe is a mapping of sections ({sorted(SECTIONS)}) to their keys")
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
    """Read and validate a recipe (sections ``model``, ``data``, ``parallel``, ``train``, ``lora``).

    Raises:
        ValueError: as :func:`parse_recipe`, with the file's name.
    """
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    return parse_recipe(raw, path)
