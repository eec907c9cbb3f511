"""What every vision-language family shares: a vision preprocess, the output consumer that injects its features
at the image-token positions, and the split into ``P`` and pipeline stages (SPEC.md, "The job", "Terms").

A family module (``qwen2_vl.py``, ``qwen3_vl.py``, ``llava.py``) fills a :class:`VisionLanguageParts` and calls
:func:`split_vision_language`. ``P`` is then one of:

- the vision tower (``text_layers = 0``): raw vision inputs -> ``{"image_features": (n_image_tokens, H), ...}``;
  stage 0 embeds the tokens, puts the features at the image-token positions and computes the position ids;
- the vision tower, the embedding and the first ``T = text_layers`` decoder layers: ``P`` returns hidden states
  and position ids, and stage 0 runs only what is left of its chunk;
- an identity (preprocess ``identity``): stage 0 runs the (frozen) tower and the embedding itself, and only raw
  data moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ..runtime import Preprocess
from ..schedule import ScheduleConfig
from .base import SplitModel, assemble, plan_layers, stage_layer_ids, tied_lm_head
from .decoder import CARRIED_KEYS, DecoderStage, LMHead, decoder_stage, matmul_costs

Tensors = dict[str, torch.Tensor]


class ImageFront(nn.Module):
    """The output consumer: token embedding, image features at the image-token positions, position ids.

    Inputs: ``input_ids``/``attention_mask`` ``(B, L)``, the family's position keys, and either the vision
    outputs (``image_features`` ``(n, H)`` and any extra feature keys) or, with ``vision``, the raw vision keys.
    Output: ``{"hidden_states": (B, L, H), "position_ids": ..., **self.extras(...)}``.

    Subclasses give :meth:`positions` (default: ``arange(L)``, shape ``(1, L)``) and :meth:`extras`.

    Raises:
        ValueError: the image-token count differs from the number of image features.
    """

    def __init__(self, embed_tokens: nn.Module, image_token_id: int, vision: nn.Module | None,
                 feature_keys: tuple[str, ...] = ("image_features",)):
        super().__init__()
        self.embed_tokens, self.image_token_id, self.vision = embed_tokens, image_token_id, vision
        self.feature_keys = feature_keys

    def positions(self, inputs: Tensors) -> torch.Tensor:
        ids = inputs["input_ids"]
        return torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)

    def extras(self, feats: Tensors, image_mask: torch.Tensor, inputs: Tensors) -> Tensors:
        """Keys the later layers read besides the hidden states (Qwen3-VL's DeepStack features)."""
        return {}

    def forward(self, inputs: Tensors) -> Tensors:
        ids = inputs["input_ids"]
        hidden = self.embed_tokens(ids)
        if self.vision is not None:
            feats = self.vision(inputs)
        else:
            feats = {k: inputs[k] for k in self.feature_keys if k in inputs}
        image_mask = ids == self.image_token_id
        n_feats = feats["image_features"].shape[0] if feats else 0
        check_count(image_mask, n_feats, self.image_token_id)
        if n_feats:
            mask = image_mask.unsqueeze(-1).expand_as(hidden)
            hidden = hidden.masked_scatter(mask, feats["image_features"].to(hidden.device, hidden.dtype))
        return {"hidden_states": hidden, "position_ids": self.positions(inputs),
                **self.extras(feats, image_mask, inputs)}


def check_count(image_mask: torch.Tensor, n_feats: int, image_token_id: int) -> None:
    """Check that ``image_mask`` (the image-token positions of ``input_ids``) holds ``n_feats`` tokens. On the host
    exactly (``ValueError``); on a device without reading the count back (a device-side assert, which ends the
    run: a host read here would stall the device once per micro-batch, and the loaders check the same count on
    the host before the step, ``validate_micro``)."""
    message = f"image tokens and features differ: {{}} image tokens (id {image_token_id}) in input_ids, {n_feats} " \
              f"image features"
    if image_mask.device == torch.device("cpu"):
        n_tokens = int(image_mask.sum())
        if n_tokens != n_feats:
            raise ValueError(message.format(n_tokens))
    else:
        torch._assert_async(image_mask.sum() == n_feats, message.format("a different number of"))


@dataclass
class VisionLanguageParts:
    """What a vision-language family hands to :func:`split_vision_language`.

    Attributes:
        vision_fqns: the vision modules of ``P`` (tower, projector), as FQNs of the HF model.
        text_prefix: FQN of the text model (with ``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``).
        text_model, text_config: that module and its config.
        vision: raw vision keys -> ``{"image_features": (n, H), ...}``; a micro without images gives ``(0, H)``.
        front: ``front(vision or None) -> ImageFront``.
        stage0_keys: raw keys stage 0 reads (labels included); vision_keys: raw keys the vision part reads.
        validate_micro: raises ``ValueError`` when a micro-batch's raw inputs do not fit the model.
        stage_cls: the :class:`DecoderStage` class (a subclass feeds the residual stream between layers).
        carry: ``carry(last layer id) -> keys`` a stage whose layers end there passes on besides
            ``CARRIED_KEYS`` (features a later layer still reads).
        host, host_keys: metadata computed on the host at load and the raw keys kept there for the owner's own
            ``P`` (:class:`~mpipe_hf.runtime.Preprocess`; Qwen-VL's :mod:`.host_metadata`).
    """

    vision_fqns: list[str]
    text_prefix: str
    text_model: nn.Module
    text_config: object
    vision: nn.Module
    front: Callable[[nn.Module | None], ImageFront]
    stage0_keys: tuple[str, ...]
    vision_keys: tuple[str, ...]
    validate_micro: Callable[[Tensors], None]
    stage_cls: type[DecoderStage] = DecoderStage
    carry: Callable[[int], tuple[str, ...]] = field(default=lambda last: ())
    host: Callable[[Tensors], Tensors] | None = None
    host_keys: frozenset[str] = frozenset()


def layer_counts(config, cfg: ScheduleConfig, layers_per_stage: list[int] | None = None,
                 text_layers: int = 0) -> list[int]:
    """Decoder layers per stage for a vision-language ``config`` (its ``text_config`` holds the decoder), balanced
    by the layers' and the LM head's matmul cost when ``layers_per_stage`` is ``None``; the layout and
    ``text_layers`` are checked against the model.

    Raises:
        ValueError: as :func:`~.base.plan_layers`.
    """
    return plan_layers(config.text_config.num_hidden_layers, cfg, layers_per_stage, text_layers,
                       matmul_costs(config.text_config))


def split_vision_language(model: nn.Module, cfg: ScheduleConfig, rank: int, layers_per_stage: list[int] | None,
                          text_layers: int, parts: VisionLanguageParts) -> SplitModel:
    """Carve a vision-language ``model`` for pipeline rank ``rank`` of ``cfg`` (see the module docstring).

    Raises:
        ValueError: as :func:`~.base.plan_layers`.
    """
    text, lm, prefix = parts.text_config, parts.text_model, parts.text_prefix
    counts = layer_counts(model.config, cfg, layers_per_stage, text_layers)
    p_ids, ids = stage_layer_ids(counts, text_layers)
    layout = [[f"{prefix}.layers.{i}" for i in ids[s]] for s in range(cfg.num_stages)]
    layout[-1] += [f"{prefix}.norm", "lm_head"]
    front_keys = tuple(dict.fromkeys([k for k in parts.stage0_keys if k != "labels"] + list(parts.vision_keys)))
    embed = f"{prefix}.embed_tokens"
    if not cfg.transposed:
        layout[0][:0] = parts.vision_fqns + [embed]
        p_fqns, frozen, front = [], list(parts.vision_fqns), parts.front(parts.vision)
        preprocess = Preprocess(None, (), tuple(dict.fromkeys(parts.stage0_keys + parts.vision_keys)), parts.host,
                                parts.host_keys)
    elif not text_layers:
        layout[0].insert(0, embed)
        p_fqns, front = list(parts.vision_fqns), parts.front(None)
        preprocess = Preprocess(parts.vision, parts.vision_keys, parts.stage0_keys, parts.host, parts.host_keys)
    else:
        p_fqns, front = parts.vision_fqns + [embed] + [f"{prefix}.layers.{i}" for i in p_ids], None
        block = decoder_stage(lm, text, p_ids, parts.front(parts.vision), carry=parts.carry(text_layers - 1),
                              cls=parts.stage_cls)
        preprocess = Preprocess(block, front_keys, CARRIED_KEYS, parts.host, parts.host_keys)
    if cfg.transposed:
        frozen = list(p_fqns) if cfg.preprocess == "frozen" else []
    head = LMHead(model, lm.norm, text.vocab_size)
    ends = [sum(counts[:s + 1]) - 1 for s in range(cfg.num_stages)]  # the last layer id each stage reaches

    def stage(s):
        return decoder_stage(lm, text, ids[s], front if s == 0 else None, head if s == cfg.num_stages - 1 else None,
                             CARRIED_KEYS + parts.carry(ends[s]), parts.stage_cls)
    tied = tied_lm_head(model, cfg, embed, frozen)
    return assemble(model, cfg, rank, layout, stage, preprocess, p_fqns, frozen, parts.validate_micro, tied)
