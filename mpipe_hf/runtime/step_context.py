"""What one rank's schedule run holds for a step: :class:`StepContext`, the stores the action handlers
(:mod:`.handlers`) read and write, keyed by micro (and stage), with the step's running sums; and
:class:`Preprocess`, the transposed block ``P`` and the raw keys it and stage 0 read. A failed step is cleaned by
clearing the context (:meth:`StepContext.clear`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ..schedule import ScheduleConfig
from .p2p import P2P
from .placement import on_device
from .watchdog import Watchdog
from .zero_bubble import WeightWork

Tensors = dict[str, torch.Tensor]


@dataclass
class Preprocess:
    """The transposed block ``P`` and the raw keys it and stage 0 read.

    Attributes:
        module: ``forward(inputs: dict) -> dict`` of tensors, e.g. pixels -> ``{"image_features": (n, H)}``;
            ``None`` for an identity ``P`` (``T = 0``).
        input_keys: raw keys ``P`` reads; ``GRAPH_SEND`` ships these (trainable ``P`` only).
        stage0_keys: raw keys stage 0 reads; ``DATA_SEND`` ships only these, so keys read by ``P`` alone (pixels)
            never reach rank 0 when ``P`` is frozen.
        host: ``host(raw) -> more raw inputs``, run by ``DATA_LOAD`` on the host copy of a micro: the metadata
            library code would otherwise read back from the device (e.g. Qwen-VL's rope index and grids,
            :mod:`mpipe_hf.models.host_metadata`); ``None``: nothing.
        host_keys: raw keys that ``DATA_LOAD`` keeps on the host; those of :data:`~.wire.HEADER_KEYS` stay
            there through every transfer (in its header), so no stage reads them back from the device.
    """

    module: nn.Module | None
    input_keys: tuple[str, ...]
    stage0_keys: tuple[str, ...]
    host: Callable[[Tensors], Tensors] | None = None
    host_keys: frozenset[str] = frozenset()

    def trainable_parameters(self) -> list[nn.Parameter]:
        """``P``'s parameters that take a gradient (none for a frozen or identity ``P``)."""
        return [] if self.module is None else [p for p in self.module.parameters() if p.requires_grad]

    def with_host(self, raw: Tensors) -> Tensors:
        """``raw`` (a micro-batch on the host) with what ``host`` computes from it, as ``DATA_LOAD`` adds it."""
        return {**raw, **self.host(raw)} if self.host is not None else raw

    def inputs(self, raw: Tensors) -> Tensors:
        return {k: raw[k] for k in self.input_keys if k in raw}

    def stage0_inputs(self, raw: Tensors) -> Tensors:
        return {k: raw[k] for k in self.stage0_keys if k in raw}


@dataclass
class StepContext:
    """Everything one rank's schedule run reads and writes. Stores are emptied when the step ends or fails."""

    cfg: ScheduleConfig
    rank: int
    stages: dict[int, nn.Module]
    preprocess: Preprocess
    p2p: P2P
    group: dist.ProcessGroup
    watchdog: Watchdog
    load: Callable[[int], Tensors]
    micro_seed: Callable[[int], int] = lambda m: m   # the RNG seed ``P`` runs micro ``m`` under
    data: dict[int, Tensors] = field(default_factory=dict)        # stage-0 inputs per micro
    pin: dict[int, Tensors] = field(default_factory=dict)         # P's inputs per micro
    feats: dict[int, Tensors] = field(default_factory=dict)       # P's outputs per micro
    kept: dict[int, Tensors] = field(default_factory=dict)        # P's outputs with their graph (owner-backward)
    feat_grad: dict[int, Tensors] = field(default_factory=dict)   # gradient on P's outputs, for TRANSPOSE_BWD
    act: dict[tuple[int, int], Tensors] = field(default_factory=dict)   # (stage, m) -> output for stage + 1
    grad: dict[tuple[int, int], Tensors] = field(default_factory=dict)  # (stage, m) -> grad of stage's inputs
    saved: dict[tuple[int, int], tuple[Tensors, Tensors]] = field(default_factory=dict)  # for the backward
    loss_sum: float | torch.Tensor = 0.0   # summed token loss (float64, on the device once a micro added to it)
    num_tokens: int | torch.Tensor = 0     # label tokens (on the device once a micro added to it)
    per_micro: bool = False   # each micro's loss divided by its own label tokens (the micro-batch mean)
    micro_mean_sum: float | torch.Tensor = 0.0
    aux_sum: float | torch.Tensor = 0.0    # the MoE load-balancing loss, weighted as it is backpropagated
    aux_micros: int = 0       # micros whose last stage returned an aux_loss (a model with one, even when it is 0)
    busy_s: float = 0.0       # seconds the compute actions took on the host (perf_counter; CPU runs)
    gpu_events: list | None = None  # CUDA: (start, end) events of every compute action, read once per step
    swap: object = None  # this rank's SwapManager (activation swap, :mod:`.swap`), or None
    split: frozenset = frozenset()  # (stage, m) whose backward runs as a B and a W (zero bubble)
    weight_work: dict[tuple[int, int], WeightWork] = field(default_factory=dict)  # what each split B left for W
    strict: bool = False  # strict device mode: every tensor a transfer or collective is handed must be on the device
    votes: dist.ProcessGroup | None = None  # a gloo group over the pipeline for host values (``None``: ``group``)

    def check(self, tensors: Tensors, what) -> Tensors:
        """``tensors``, after checking (strict device mode) that each is on this rank's device.

        Raises:
            RuntimeError: one is elsewhere (NCCL would fail on it or copy it through the host); names it."""
        if self.strict:
            on_device(tensors, self.p2p.device, what)
        return tensors

    def clear(self) -> None:
        for store in (self.data, self.pin, self.feats, self.kept, self.feat_grad, self.act, self.grad, self.saved,
                      self.weight_work):
            store.clear()

    def sums(self, device: torch.device) -> torch.Tensor:
        """``[loss_sum, num_tokens, micro_mean_sum, aux_sum, aux_micros]`` as float64 on ``device``; reading it is
        the step's one host synchronisation for them."""
        return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in (
            self.loss_sum, self.num_tokens, self.micro_mean_sum, self.aux_sum, self.aux_micros)])

    def last_stage(self, stage: int) -> bool:
        return stage == self.cfg.num_stages - 1
