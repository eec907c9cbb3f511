"""What a splitter returns, and the layout helpers every family shares (SPEC.md, "The job")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..runtime import Preprocess
from ..schedule import ScheduleConfig
from ..schedule.layout import balanced_layers, check_layers_per_stage, cost_balanced_layers


def plan_layers(num_layers: int, cfg: ScheduleConfig, layers_per_stage: list[int] | None,
                text_layers: int, costs: tuple[float | list[float], float] | None = None) -> list[int]:
    """Decoder layers per stage, with ``text_layers`` checked against stage 0's first chunk: ``P`` takes the first
    ``T`` layers out of stage 0 (SPEC.md, "Terms"). ``layers_per_stage`` when given; else balanced by cost
    (:func:`~mpipe_hf.schedule.layout.cost_balanced_layers`) with ``costs = (decoder layer, LM head)`` per token
    (the layer's cost one for all, or each layer's: :func:`~.costs.layer_costs`), or by count when ``costs`` is
    ``None``.

    Raises:
        ValueError: more stages than layers, a bad ``layers_per_stage``, a negative ``text_layers``, one larger
            than stage 0's chunk, or ``text_layers > 0`` with an identity preprocess.
    """
    if not isinstance(text_layers, int) or isinstance(text_layers, bool) or text_layers < 0:
        raise ValueError(f"text_layers must be an integer >= 0, got {text_layers!r}")
    if layers_per_stage is None and costs is not None and cfg.num_stages <= num_layers:
        counts = cost_balanced_layers(num_layers, cfg.pp_size, cfg.vpp, costs[0], 0.0, costs[1],
                                      min(text_layers, max(0, num_layers - cfg.num_stages + 1)))
    elif layers_per_stage is None:
        counts = balanced_layers(num_layers, cfg.num_stages)
    else:
        counts = check_layers_per_stage(layers_per_stage, num_layers, cfg.num_stages)
    if text_layers and not cfg.transposed:
        raise ValueError(f"text_layers = {text_layers} needs preprocess 'frozen' or 'trainable'; preprocess "
                         f"'identity' is T = 0 (set text_layers: 0)")
    if text_layers > counts[0]:
        raise ValueError(f"text_layers = {text_layers} exceeds stage 0's first chunk of {counts[0]} decoder layers "
                         f"(layers_per_stage[0] of {counts}); lower text_layers to at most {counts[0]} or give "
                         f"stage 0 more layers with layers_per_stage")
    return counts


def stage_layer_ids(counts: list[int], text_layers: int) -> tuple[list[int], list[list[int]]]:
    """``(P's layer ids, [layer ids of stage s])``: stage 0 gives its first ``text_layers`` layers to ``P``."""
    starts = [sum(counts[:s]) for s in range(len(counts))]
    ids = [list(range(starts[s], starts[s] + counts[s])) for s in range(len(counts))]
    return ids[0][:text_layers], [ids[0][text_layers:]] + ids[1:]


def tied_lm_head(model: nn.Module, cfg: ScheduleConfig, embed_fqn: str, frozen: list[str],
                 head_fqn: str = "lm_head") -> list[tuple[str, str]]:
    """Untie ``lm_head`` from the input embedding ``embed_fqn`` when the two live on different ranks.

    With tied embeddings (``lm_head.weight is embed_tokens.weight``) and ``pp_size > 1``, the embedding (stage 0
    or ``P``: rank 0) and ``lm_head`` (the last stage: rank ``R - 1``) each get a copy of the one weight; the
    executor sums their gradients after every step, so both copies see the unsplit model's gradient and take the
    same optimizer update (the embedding group of Megatron-LM, Shoeybi et al. 2019). When the embedding is
    frozen, ``lm_head`` is frozen too (appended to ``frozen``), as the shared weight is in the unsplit model.

    Returns:
        ``[(embedding weight name, lm_head weight name)]``, or ``[]`` when nothing is tied or ``pp_size == 1``.
    """
    embed, head = model.get_submodule(embed_fqn), model.get_submodule(head_fqn)  # head_fqn: the LM head's FQN
    if cfg.pp_size == 1 or head.weight is not embed.weight:
        return []
    head.weight = nn.Parameter(embed.weight.detach().clone(), requires_grad=embed.weight.requires_grad)
    if embed_fqn in frozen:
        frozen.append(head_fqn)
    return [(f"{embed_fqn}.weight", f"{head_fqn}.weight")]


def freeze(model: nn.Module, fqns: list[str]) -> None:
    """``requires_grad_(False)`` on each of ``fqns``: a module, or a bare parameter (LLaVA-Next's
    ``image_newline``). A one-process reference freezes a split's ``frozen`` with it."""
    params = dict(model.named_parameters())
    for fqn in fqns:
        (params[fqn] if fqn in params else model.get_submodule(fqn)).requires_grad_(False)


def assemble(model: nn.Module, cfg: ScheduleConfig, rank: int, layout: list[list[str]],
             stage: Callable[[int], nn.Module], preprocess: Preprocess, preprocess_fqns: list[str],
             frozen: list[str], validate_micro: Callable[[dict[str, torch.Tensor]], None],
             tied: list[tuple[str, str]]) -> "SplitModel":
    """The part of a split every family shares: freeze ``frozen``, build ``stage(s)`` for this rank's stages,
    and replace every module of ``layout`` and ``preprocess_fqns`` that this rank never runs by ``nn.Identity``
    (``P`` stays everywhere: every rank holds a replica)."""
    params = dict(model.named_parameters())
    freeze(model, frozen)
    stages = {s: stage(s) for s in range(rank, cfg.num_stages, cfg.pp_size)}
    keep = {fqn for s in stages for fqn in layout[s]} | set(preprocess_fqns)
    for fqn in [fqn for fqns in layout for fqn in fqns]:
        if fqn not in keep and fqn not in params:  # a bare parameter is small: it stays
            model.set_submodule(fqn, nn.Identity())
    return SplitModel(model, stages, preprocess, layout, preprocess_fqns, frozen, validate_micro, tied)


@dataclass
class SplitModel:
    """A Hugging Face model carved for one pipeline rank.

    Attributes:
        model: the HF model; modules this rank does not hold are replaced by ``nn.Identity``.
        stages: ``{stage index: module}`` of this rank.
        preprocess: the transposed block ``P`` (a full replica on every rank).
        layout: module FQNs of every stage, all ranks (``layout[s]``).
        preprocess_fqns: module FQNs of ``P`` in ``model`` (empty for an identity ``P``).
        frozen: module FQNs whose parameters the split froze (``requires_grad=False``); a single-process reference
            freezes the same ones.
        validate_micro: raises ``ValueError`` when a micro-batch's raw inputs do not fit the model.
        tied: ``[(embedding weight name, lm_head weight name)]``, weights tied in the unsplit model and held as
            two copies on rank 0 and rank ``R - 1`` (see :func:`tied_lm_head`).
        peft: the ``peft.PeftModel`` wrapping ``model`` when an adapter was put in before the split
            (:mod:`.adapters`), else ``None``.
    """

    model: nn.Module
    stages: dict[int, nn.Module]
    preprocess: Preprocess
    layout: list[list[str]]
    preprocess_fqns: list[str]
    frozen: list[str]
    validate_micro: Callable[[dict[str, torch.Tensor]], None]
    tied: list[tuple[str, str]]
    peft: object | None = None

    def owned_prefixes(self, cfg: ScheduleConfig, rank: int) -> list[str]:
        """FQN prefixes whose parameters ``rank`` trains and saves; rank 0 owns ``P``."""
        prefixes = [fqn for s in range(rank, cfg.num_stages, cfg.pp_size) for fqn in self.layout[s]]
        return prefixes + (list(self.preprocess_fqns) if rank == 0 else [])

    def _owned(self, cfg: ScheduleConfig, rank: int, name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in self.owned_prefixes(cfg, rank))

    def trainable_parameters(self, cfg: ScheduleConfig, rank: int) -> dict[str, nn.Parameter]:
        """``{name: parameter}`` this rank optimises (``P``'s only on rank 0, and only when trainable)."""
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad and self._owned(cfg, rank, n)}

    def tied_parameters(self, cfg: ScheduleConfig, rank: int) -> list[tuple[nn.Parameter, int]]:
        """``[(parameter, peer rank)]``: this rank's trainable copies of tied weights, and the rank holding the
        other copy (pass to :class:`~mpipe_hf.runtime.PipelineExecutor` as ``tied``)."""
        last = (cfg.num_stages - 1) % cfg.pp_size
        params = self.trainable_parameters(cfg, rank)
        out = []
        for embed, head in self.tied:
            if rank == 0 and embed in params:
                out.append((params[embed], last))
            if rank == last and head in params:
                out.append((params[head], 0))
        return out

    def state_dict(self, cfg: ScheduleConfig, rank: int) -> dict[str, torch.Tensor]:
        """This rank's share of the model's ``state_dict`` (the names ``from_pretrained`` accepts)."""
        return {n: t for n, t in self.model.state_dict().items() if self._owned(cfg, rank, n)}
