"""The one splitter: a Hugging Face model carved into ``P`` and pipeline stages from its family's declaration
(:class:`~.family.Family`; SPEC.md, "The job", "Terms").

``P`` is one of:

- the vision part (``text_layers = 0``): raw vision inputs -> ``{"image_features": (n_image_tokens, H), ...}``
  (and ``"video_features"`` for a micro with videos, where the family declares ``video_inputs``); stage 0 embeds
  the tokens, puts the features at the image- and video-token positions and takes the position ids;
- the vision part (if any), the embedding and the first ``T = text_layers`` decoder layers: ``P`` returns hidden
  states and position ids, and stage 0 runs only what is left of its chunk (a decoder-only LM: ``T >= 1``);
- an identity (preprocess ``identity``): stage 0 runs the (frozen) vision part and the embedding itself, and
  only raw data moves.

Every stage rebuilds its masks and rotary embeddings from the padding mask, the position ids and the family's
mask inputs, which travel with the hidden states; a layer's recurrent state (Gated DeltaNet) lives within its
layer, so no state crosses a stage boundary. The last stage holds the final norm, ``lm_head`` and the summed loss
(with the MoE load-balancing loss from the routers' running sums, :mod:`.moe`).

The functions here take the family's declaration (``family``: a :class:`~.family.Family`, whose ``split`` and
``layer_counts`` call them) and read its fields; ``P``'s vision part and stage 0's front are
:mod:`.image_features`' modules.
"""

from __future__ import annotations

import torch
from torch import nn

from ..runtime import Preprocess
from ..schedule import ScheduleConfig
from .base import SplitModel, assemble, plan_layers, stage_layer_ids, tied_lm_head
from .costs import layer_costs, matmul_costs
from .decoder import CARRIED_KEYS, DecoderStage, LMHead, decoder_stage, layer_type_masks
from .deepstack import DEEPSTACK_KEYS, DeepStackStage, deepstack_layers
from .host_metadata import video_kwargs, vision_kwargs
from .image_features import ImageFeatures, ImageFront
from .moe import router_spec
from .packed import PACKED_KEYS, packed_host

RAW_KEYS = ("input_ids", "attention_mask", "position_ids") + PACKED_KEYS  # positions: packed 1-D families


def layer_counts(family, config, cfg: ScheduleConfig, layers_per_stage: list[int] | None = None,
                 text_layers: int = 0) -> list[int]:
    """Decoder layers per stage for ``config`` (its text config holds the decoder), balanced by the layers' and
    the LM head's matmul cost when ``layers_per_stage`` is ``None``; the layout and ``text_layers`` are checked.

    Raises:
        ValueError: as :func:`~.base.plan_layers`; a decoder-only LM with ``text_layers = 0`` and a frozen or
            trainable preprocess (that is preprocess ``identity``).
    """
    if not family.vision and cfg.transposed and text_layers < 1:
        raise ValueError(f"a decoder-only LM transposes the embedding and the first text_layers decoder layers: "
                         f"text_layers must be >= 1 with preprocess {cfg.preprocess!r}, or use preprocess "
                         f"'identity' (T = 0)")
    text = config.get_text_config()  # each layer's own cost: linear and full attention, dense and MoE differ
    return plan_layers(text.num_hidden_layers, cfg, layers_per_stage, text_layers,
                       (layer_costs(text), matmul_costs(text)[1]))


def _positions(family):
    if family.positions == "host":
        return _host_positions

    def arange(inputs):
        if "packed_lengths" in inputs:  # a packed micro: each row's own, from the host (.packed)
            return inputs["position_ids"]
        ids = inputs["input_ids"]
        return torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) + start
    start = 1 if family.positions == "arange1" else 0  # PaliGemma's positions start at one
    return arange


def _host_positions(inputs):
    """The position ids the owner's host computed at load (:mod:`.host_metadata`)."""
    if "position_ids" not in inputs:
        raise ValueError("the micro-batch has no position_ids: this family's positions are computed on the host at "
                         "load (split.preprocess.with_host(raw), as DATA_LOAD does); run raw micro-batches through it")
    return inputs["position_ids"]


def _present(model: nn.Module, fqn: str) -> bool:
    """Whether ``model`` has a module at ``fqn`` (an optional part the config left out is ``None`` there)."""
    try:
        model.get_submodule(fqn)
    except AttributeError:
        return False
    return True


def _part(model: nn.Module, fqn: str) -> nn.Module | nn.Parameter:
    try:
        return model.get_submodule(fqn)
    except AttributeError:
        return model.get_parameter(fqn)  # a bare parameter of P (LLaVA-Next's image_newline)


class _Pieces:
    """What one split reads from the model and its declaration (kept together so the helpers stay short)."""

    def __init__(self, family, model: nn.Module, cfg: ScheduleConfig):
        self.family, self.model, self.cfg = family, model, cfg
        self.text_model = model.get_submodule(family.text)
        self.text_config = model.config.get_text_config()
        self.embed = f"{family.text}.{family.embed}"
        self.embeds = [self.embed] + [f"{family.text}.{part}" for part in family.embed_parts
                                      if hasattr(self.text_model, part)]  # a model may lack one (no PLE)
        self.router = router_spec(self.text_model, self.text_config)
        self.masks = family.masks(model) if family.masks is not None else layer_type_masks
        self.image_token_id = getattr(model.config, "image_token_id", None) if family.vision else None
        self.video_token_id = model.config.video_token_id if family.video_inputs else None
        self.host = packed_host(family.host(model) if family.host is not None else None, family.positions)
        keys = family.host_keys(model) if family.host_keys is not None else frozenset()
        self.host_keys = keys | set(PACKED_KEYS)  # Python integers for the owner's own stages (.packed)
        self.num_deepstack = deepstack_layers(model.config) if family.deepstack else 0
        self.cls = family.stage(model) if family.stage else DeepStackStage if family.deepstack else DecoderStage
        self.stage0_keys = RAW_KEYS + family.stage0_inputs + family.mask_inputs + ("labels",)
        self.vision_keys = (family.image_inputs + family.image_meta + family.video_inputs + family.video_meta
                            if family.vision else ())

    def carry(self, last: int) -> tuple[str, ...]:
        """Keys a stage whose layers end at ``last`` passes on besides the hidden states and positions."""
        deep = DEEPSTACK_KEYS if last < self.num_deepstack - 1 else ()
        return CARRIED_KEYS + self.family.mask_inputs + deep

    def vision(self) -> ImageFeatures | None:
        if not self.family.vision:
            return None
        parts = {fqn: _part(self.model, fqn) for fqn in self.family.vision}
        extra = vision_kwargs if self.family.image_meta else None
        video_extra = video_kwargs if self.family.video_meta else None
        division = self.family.tower_division(self.model) if self.family.tower_division is not None else None
        return ImageFeatures(self.model, parts, self.family.image_inputs, self.num_deepstack, extra,
                             self.family.video_inputs, video_extra, self.family.list_inputs, division)

    def front(self, vision: nn.Module | None) -> ImageFront:
        extras = DEEPSTACK_KEYS if self.family.deepstack else ()
        embed = self.text_model.get_submodule(self.family.embed)
        return ImageFront(embed, self.image_token_id, vision, _positions(self.family), extras,
                          self.video_token_id)

    def stage(self, ids: list[int], front=None, head=None, carry=None) -> nn.Module:
        return decoder_stage(self.text_model, self.text_config, ids, front, head,
                             self.carry(ids[-1] if ids else -1) if carry is None else carry, self.cls, self.masks,
                             self.router)

    def head(self) -> LMHead:
        cap = getattr(self.text_config, "final_logit_softcapping", None) if self.family.softcap else None
        router = (self.router[2], self.router[4]) if self.router is not None else None
        scale = getattr(self.text_config, self.family.logit_scale if isinstance(self.family.logit_scale, str)
                        else "logit_scale") if self.family.logit_scale else None
        norm = self.text_model.get_submodule(self.family.norm)
        return LMHead(self.model, norm, self.text_config.vocab_size, cap, router, scale,
                      self.model.get_submodule(self.family.head))

    def preprocess(self, text_layers: int, p_ids: list[int]) -> tuple[Preprocess, list[str], ImageFront | None]:
        """``(P, P's FQNs, stage 0's front)`` for ``cfg.preprocess`` and ``T = text_layers``."""
        family, cfg, vision = self.family, self.cfg, self.vision()
        vision_fqns = list(family.vision)
        if not cfg.transposed:
            keys = tuple(dict.fromkeys(self.stage0_keys + self.vision_keys))
            return Preprocess(None, (), keys, self.host, self.host_keys), [], self.front(vision)
        if not text_layers:
            return (Preprocess(vision, self.vision_keys, self.stage0_keys, self.host, self.host_keys), vision_fqns,
                    self.front(None))
        front_keys = tuple(dict.fromkeys([k for k in self.stage0_keys if k != "labels"] + list(self.vision_keys)))
        deep = DEEPSTACK_KEYS if text_layers - 1 < self.num_deepstack - 1 else ()  # stage 0 reads the rest raw
        block = self.stage(p_ids, self.front(vision), carry=deep)
        p_fqns = vision_fqns + self.embeds + [f"{family.text}.layers.{i}" for i in p_ids]
        return (Preprocess(block, front_keys, CARRIED_KEYS + family.mask_inputs, self.host, self.host_keys), p_fqns,
                None)


def split_family(family, model: nn.Module, cfg: ScheduleConfig, rank: int,
                 layers_per_stage: list[int] | None = None, text_layers: int = 0) -> SplitModel:
    """Carve ``model`` for pipeline rank ``rank`` of ``cfg`` by ``family``'s declaration (module docstring).

    Args:
        family: the model type's :class:`~.family.Family`.
        model: the HF model (``...ForConditionalGeneration`` or ``...ForCausalLM``, e.g. from
            ``from_pretrained``).
        cfg: the schedule configuration; ``cfg.preprocess`` sets whether ``P`` trains (``identity``: the vision
            part runs frozen in stage 0).
        rank: this process's pipeline rank.
        layers_per_stage: decoder layers per stage (``R * V`` entries); balanced by cost when ``None``.
        text_layers: ``T``, the decoder layers ``P`` takes from stage 0 (with the vision part and the embedding).

    Raises:
        ValueError: as :func:`layer_counts`.
    """
    pieces = _Pieces(family, model, cfg)
    counts = layer_counts(family, model.config, cfg, layers_per_stage, text_layers)
    p_ids, ids = stage_layer_ids(counts, text_layers)
    layout = [[f"{family.text}.layers.{i}" for i in ids[s]] for s in range(cfg.num_stages)]
    layout[-1] += [f"{family.text}.{part}" for part in (family.norm,) + family.head_parts] + [family.head]
    preprocess, p_fqns, front = pieces.preprocess(text_layers, p_ids)
    if not cfg.transposed:
        layout[0][:0] = list(family.vision) + pieces.embeds
        frozen = list(family.vision)
    else:
        if not text_layers:
            layout[0][:0] = pieces.embeds
        frozen = list(p_fqns) if cfg.preprocess == "frozen" else []
    unused = [fqn for fqn in family.unused if _present(model, fqn)]  # a config may leave one out (no audio tower)
    layout[0][:0] = unused
    frozen += unused
    head = pieces.head()
    ends = [sum(counts[:s + 1]) - 1 for s in range(cfg.num_stages)]  # the last layer id each stage reaches

    def stage(s):
        return pieces.stage(ids[s], front if s == 0 else None, head if s == cfg.num_stages - 1 else None,
                            pieces.carry(ends[s]))
    tied = tied_lm_head(model, cfg, pieces.embed, frozen, family.head)
    validate = micro_check(family, model)
    return assemble(model, cfg, rank, layout, stage, preprocess, p_fqns, frozen, validate, tied)


def micro_check(family, model: nn.Module):
    """The load-time check of a raw micro-batch for ``model`` (``SplitModel.validate_micro``): ``raw -> None``,
    raising ``ValueError`` when the micro-batch does not fit the model (the family's ``validate``, e.g. its
    image-token count), or holds videos (``pixel_values_videos``) for a family that declares no ``video_inputs``
    (its video path is not split: docs/video.md). It reads only the model's config and module attributes, so a
    model on the meta device serves (``mpipe-hf check-data``'s, :func:`mpipe_hf.train.sources.micro_validator`)."""
    check = family.validate(model) if family.validate is not None else _no_check
    if family.video_inputs:
        return check
    model_type = model.config.model_type

    def no_videos(raw: dict[str, torch.Tensor]) -> None:
        check(raw)  # the family's own refusal first, where it has one (refuse_modalities)
        if "pixel_values_videos" in raw:
            raise ValueError(f"{model_type}: video inputs ('pixel_values_videos') are not supported; its video path "
                             f"is not split (docs/video.md lists the families that take videos)")
    return no_videos


def _no_check(raw: dict[str, torch.Tensor]) -> None:
    """No load-time check beyond stage 0's image-token count (:func:`~.image_features.check_count`)."""
