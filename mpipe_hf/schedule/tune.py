"""Predict a step's time from a cost profile, and rank the schedule's knobs by it (``mpipe-hf simulate --auto``).

A :class:`Profile` holds what one micro-batch costs on the user's model: a decoder layer's forward and backward,
the preprocess (tower) forward and backward, the embedding and the LM head, and the bytes each transfer carries.
``mpipe-hf profile RECIPE.yaml`` measures one; it can also be written by hand. :func:`costs_for` turns it into
the simulator's :class:`~.simulate.Costs` for one choice of ``V``, ``T``, layer layout and mode, and
:func:`tune` simulates every choice.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import yaml

from .config import ScheduleConfig
from .layout import balanced_layers, cost_balanced_layers, stage0_layers
from .mpipe import build_schedule
from .simulate import Costs, simulate


@dataclass(frozen=True)
class Profile:
    """Costs of one micro-batch on one model, in seconds and bytes.

    Attributes:
        num_layers: decoder layers of the model.
        layer_forward_s, layer_backward_s: one decoder layer.
        preprocess_forward_s, preprocess_backward_s: the transposed block without text layers (the vision tower;
            0 for a text LM); the backward counts only when ``P`` is trainable.
        embed_s, embed_backward_s: the embedding and the output consumer (image-feature injection, position ids),
            forward and backward (stage 0, or ``P`` when ``T > 0``).
        stage_forward_s: what every stage pays once per micro besides its layers (causal masks, rotary tables).
        head_forward_s, head_backward_s: final norm, ``lm_head`` and loss.
        activation_bytes: hidden states of one micro (a body ``F``/``B`` message, and ``P``'s output when
            ``T > 0``).
        feature_bytes: the tower's output for one micro (``P``'s output when ``T = 0``).
        data_bytes: the raw inputs stage 0 reads; graph_bytes: ``P``'s raw inputs (trainable ``P`` only).
        preprocess_param_bytes: the tower's parameters (broadcast or reduced when ``P`` is trainable).
        layer_param_bytes: one decoder layer's parameters.
        layer_activation_bytes, head_activation_bytes: what one decoder layer, and the head with its loss, save
            for their backward for one micro-batch (the memory plan's activation unit).
        preprocess_activation_bytes: what the tower saves for its backward for one micro-batch (held by a
            trainable ``P``'s graph).
        latency_s, bandwidth_bytes_per_s: the links between ranks.
        dispatch_s: the runtime's own time per action (see :class:`~.simulate.Costs`); small next to GPU
            compute, but it adds up over the step's actions when the micro-batches are small.
    """

    num_layers: int
    layer_forward_s: float
    layer_backward_s: float
    preprocess_forward_s: float = 0.0
    preprocess_backward_s: float = 0.0
    embed_s: float = 0.0
    embed_backward_s: float = 0.0
    stage_forward_s: float = 0.0
    head_forward_s: float = 0.0
    head_backward_s: float = 0.0
    activation_bytes: float = 0.0
    feature_bytes: float = 0.0
    data_bytes: float = 0.0
    graph_bytes: float = 0.0
    preprocess_param_bytes: float = 0.0
    layer_param_bytes: float = 0.0
    layer_activation_bytes: float = 0.0
    head_activation_bytes: float = 0.0
    preprocess_activation_bytes: float = 0.0
    latency_s: float = 5e-5
    bandwidth_bytes_per_s: float = 1e10
    dispatch_s: float = 0.0

    @classmethod
    def load(cls, path: str) -> "Profile":
        """Read a profile YAML. Raises ``ValueError`` on unknown or missing keys (naming them)."""
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(names))
        missing = [n for n, f in names.items() if f.default is dataclasses.MISSING and n not in raw]
        if unknown or missing:
            raise ValueError(f"{path}: unknown profile keys {unknown}, missing {missing}; allowed: {sorted(names)}")
        return cls(**raw)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            yaml.safe_dump(dataclasses.asdict(self), f, sort_keys=False)


@dataclass(frozen=True)
class Candidate:
    """One choice of knobs and its predicted step time (seconds) and bubble."""

    cfg: ScheduleConfig
    layers_per_stage: tuple[int, ...]
    text_layers: int
    step_s: float
    bubble: float

    def describe(self) -> str:
        c = self.cfg
        mode = c.preprocess + (f" T={self.text_layers}" if self.text_layers else "")
        flags = [f for f, on in (("min", c.overflow == "min"), ("owner-backward", c.owner_backward),
                                 ("zero-bubble", c.zero_bubble)) if on]
        return f"V={c.vpp} {mode}{' ' + ' '.join(flags) if flags else ''} layers={list(self.layers_per_stage)}"


def costs_for(profile: Profile, cfg: ScheduleConfig, layers_per_stage: list[int], text_layers: int = 0) -> Costs:
    """The simulator's costs for ``cfg`` with ``layers_per_stage`` (stage 0's count includes the ``T`` layers
    that move into ``P``). With preprocess ``identity`` the (frozen) tower runs inside stage 0's forward."""
    p, last = profile, len(layers_per_stage) - 1
    counts = list(layers_per_stage)
    counts[0] -= text_layers
    forward = [n * p.layer_forward_s + p.stage_forward_s for n in counts]
    backward = [n * p.layer_backward_s for n in counts]
    forward[last] += p.head_forward_s
    backward[last] += p.head_backward_s
    if text_layers == 0:
        forward[0] += p.embed_s
        backward[0] += p.embed_backward_s
    if not cfg.transposed:
        forward[0] += p.preprocess_forward_s
    pre_f = p.preprocess_forward_s + (p.embed_s + text_layers * p.layer_forward_s if text_layers else 0.0)
    pre_b = (p.preprocess_backward_s + text_layers * p.layer_backward_s
             + (p.embed_backward_s if text_layers else 0.0)) if cfg.trains_preprocess else 0.0
    if cfg.trains_preprocess and not cfg.owner_backward:
        pre_b += pre_f  # rank 0 recomputes P's forward before its backward
    out_bytes = p.activation_bytes if text_layers else p.feature_bytes
    params = p.preprocess_param_bytes + text_layers * p.layer_param_bytes
    return Costs(forward=tuple(forward), backward=tuple(backward), preprocess_forward=pre_f,
                 preprocess_backward=pre_b, latency=p.latency_s, bandwidth=p.bandwidth_bytes_per_s,
                 dispatch=p.dispatch_s,
                 message_bytes={"F": p.activation_bytes, "B": p.activation_bytes, "DATA": p.data_bytes,
                                "FWD": out_bytes, "GRAD": out_bytes, "GRAPH": p.graph_bytes, "PARAM": params,
                                "REDUCE": params})


def profile_layers(profile: Profile, cfg: ScheduleConfig, text_layers: int = 0) -> list[int]:
    """Layers per stage balanced by ``profile``'s costs (:func:`~.layout.cost_balanced_layers`): a layer's forward
    and backward; on stage 0 the embedding (when ``T = 0``) and, with preprocess ``identity``, the tower; on the
    last stage the head and loss."""
    first = (profile.embed_s + profile.embed_backward_s if text_layers == 0 else 0.0) + (
        0.0 if cfg.transposed else profile.preprocess_forward_s)
    return cost_balanced_layers(profile.num_layers, cfg.pp_size, cfg.vpp,
                                profile.layer_forward_s + profile.layer_backward_s, first,
                                profile.head_forward_s + profile.head_backward_s, text_layers)


def predict(profile: Profile, cfg: ScheduleConfig, layers_per_stage: list[int] | None = None,
            text_layers: int = 0) -> Candidate:
    """Simulate ``cfg`` on ``profile`` (layers balanced by the profile's costs when ``layers_per_stage`` is
    ``None``)."""
    layout = layers_per_stage or profile_layers(profile, cfg, text_layers)
    costs = costs_for(profile, cfg, layout, text_layers)
    sim = simulate(build_schedule(cfg, costs), costs)
    return Candidate(cfg, tuple(layout), text_layers, sim.makespan, sim.mean_bubble)


def tune(profile: Profile, pp_size: int, num_micro: int, preprocess: str, vpps=(1, 2, 3, 4),
         max_text_layers: int = 2) -> list[Candidate]:
    """Every valid combination of ``V``, ``T`` (0 .. ``max_text_layers``), overflow mode, owner-backward
    (trainable ``P``), zero bubble (a layer's weight gradient taken as half its backward), and layout (stage 0's layer count with the rest balanced, and the layout balanced by the
    profile's costs), plus the baseline with the preprocess inside stage 0 (``identity``),
    simulated on ``profile``; fastest first.

    Raises:
        ValueError: ``preprocess`` is not ``frozen`` or ``trainable``.
    """
    if preprocess not in ("frozen", "trainable"):
        raise ValueError(f"preprocess must be 'frozen' or 'trainable' to tune, got {preprocess!r}")
    out = []
    for vpp in vpps:
        stages = pp_size * vpp
        if stages > profile.num_layers:
            continue
        base = balanced_layers(profile.num_layers, stages)
        by_cost = profile_layers(profile, ScheduleConfig(pp_size, vpp, num_micro, preprocess))
        layouts = [stage0_layers(profile.num_layers, stages, keep) for keep in range(1, base[0])] + [base]
        for layout in layouts + ([by_cost] if by_cost not in layouts else []):
            keep = layout[0]
            for zero_bubble in (False, True):
                out.append(predict(profile, ScheduleConfig(pp_size, vpp, num_micro, "identity",
                                                           zero_bubble=zero_bubble), layout))
            backward = (False, True) if preprocess == "trainable" else (False,)
            for overflow, owner_bwd, zero_bubble in itertools.product(("full", "min"), backward, (False, True)):
                cfg = ScheduleConfig(pp_size, vpp, num_micro, preprocess, overflow, owner_bwd,
                                     zero_bubble=zero_bubble)
                for text_layers in range(0, min(max_text_layers, keep) + 1):
                    out.append(predict(profile, cfg, layout, text_layers))
    return sorted(out, key=lambda c: c.step_s)
