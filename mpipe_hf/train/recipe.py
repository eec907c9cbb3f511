"""A training recipe: one YAML file with every knob, validated before any process group exists."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import yaml

from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..schedule import ScheduleConfig

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
        ValueError: not exactly one of ``name_or_path`` and ``config``; a path that does not exist; a checkpoint
            without ``config.json`` or weights; a ``tokenizer`` that is not a directory (and, from
            :meth:`check_tokenizer`, a tokenizer directory without tokenizer files).
    """

    name_or_path: str | None = None
    config: str | None = None
    tokenizer: str | None = None

    def __post_init__(self):
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


@dataclass(frozen=True, kw_only=True)
class Recipe(ScheduleConfig):
    """What ``mpipe-hf train RECIPE.yaml`` runs: the schedule's fields (inherited, validated on construction)
    plus the model, data and training knobs. Paths are relative to the working directory.

    Attributes:
        model: a :class:`ModelSource`; in YAML a checkpoint path, or ``{name_or_path: DIR}``, or
            ``{config: FILE, tokenizer: DIR}`` for random initialisation.
        data: a JSONL file: ``{"image", "prompt", "caption"}`` rows for a vision-language model (image paths
            relative to the file), ``{"text"}`` rows for a decoder-only LM.
        pp_size, vpp, num_micro, preprocess, overflow, owner_backward, less_memory: the schedule (see
            :class:`ScheduleConfig`).
        text_layers: ``T``, decoder layers the transposed preprocess takes from stage 0 with the tower and the
            embedding (0: the tower alone; must be 0 with preprocess ``identity``).
        micro_batch_size: rows per micro-batch.
        steps: optimizer steps; lr, weight_decay, adam_eps: AdamW's (``adam_eps`` is torch's ``eps``).
        layers_per_stage: decoder layers per stage, ``pp_size * vpp`` entries; balanced when ``None``.
        min_pixels, max_pixels: image resize bounds of the processor, in pixels.
        output_dir: where the metrics log and the final checkpoint go.
        timeout_s: the longest any transfer may wait, in seconds.
        seed: for anything random.
        trace: record every action's start and end on every rank and write ``output_dir/trace.json`` (Chrome
            trace; ``mpipe-hf plot --trace`` draws it).
        profile: a cost profile (``mpipe-hf profile``): placement ``fill`` places the transposed forwards by it,
            and the default layout is balanced by its costs; unit costs and a layout balanced by the config's
            matmul sizes when ``None``.
        gradient_checkpointing: recompute each decoder layer (and vision block) in the backward instead of
            keeping its activations, through HF's ``gradient_checkpointing_enable`` (non-reentrant); a stage then
            holds only its layers' inputs per micro-batch in flight.
    """

    model: ModelSource
    data: str
    text_layers: int = 0
    micro_batch_size: int = 1
    steps: int = 10
    lr: float = 1e-4
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    layers_per_stage: list[int] | None = None
    min_pixels: int = 56 * 56
    max_pixels: int = 112 * 112
    output_dir: str = "outputs/run"
    timeout_s: float = 300.0
    seed: int = 0
    trace: bool = False
    profile: str | None = None
    gradient_checkpointing: bool = False

    def __post_init__(self):
        object.__setattr__(self, "model", ModelSource.parse(self.model))
        if self.profile is not None and not os.path.isfile(self.profile):
            raise ValueError(f"profile {self.profile!r} is not a file (mpipe-hf profile RECIPE.yaml writes one)")
        super().__post_init__()

    def schedule(self) -> ScheduleConfig:
        """The schedule part alone."""
        return ScheduleConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ScheduleConfig)})


def load_recipe(path: str) -> Recipe:
    """Read and validate a recipe.

    Raises:
        ValueError: unknown or missing keys, or a bad value; the message names the field and what it allows.
    """
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a recipe is a mapping of keys to values")
    fields = {f.name: f for f in dataclasses.fields(Recipe)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"{path}: unknown recipe keys {unknown}; allowed keys: {sorted(fields)}")
    missing = [n for n, f in fields.items() if f.default is dataclasses.MISSING and n not in raw]
    if missing:
        raise ValueError(f"{path}: missing required recipe keys {missing}")
    for key in ("steps", "micro_batch_size", "min_pixels", "max_pixels"):
        if key in raw and (not isinstance(raw[key], int) or raw[key] < 1):
            raise ValueError(f"{path}: {key} must be an integer >= 1, got {raw[key]!r}")
    for key in ("trace", "gradient_checkpointing"):
        if key in raw and not isinstance(raw[key], bool):
            raise ValueError(f"{path}: {key} must be true or false, got {raw[key]!r}")
    for key in ("lr", "weight_decay", "adam_eps", "timeout_s"):
        if key in raw:
            raw[key] = float(raw[key])
    return Recipe(**raw)  # validates the schedule fields too
