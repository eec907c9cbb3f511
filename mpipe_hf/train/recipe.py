"""A training recipe: one YAML file with every knob, validated before any process group exists."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import yaml

from ..schedule import ScheduleConfig


@dataclass(frozen=True, kw_only=True)
class Recipe(ScheduleConfig):
    """What ``mpipe-hf train RECIPE.yaml`` runs: the schedule's fields (inherited, validated on construction)
    plus the model, data and training knobs. Paths are relative to the working directory.

    Attributes:
        model: a Hugging Face checkpoint directory (config, safetensors, tokenizer, preprocessor config).
        data: a JSONL file of ``{"image", "prompt", "caption"}`` rows; image paths relative to the file.
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
    """

    model: str
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
    for key in ("lr", "weight_decay", "adam_eps", "timeout_s"):
        if key in raw:
            raw[key] = float(raw[key])
    return Recipe(**raw)  # validates the schedule fields too
