"""A model family as data: the short declaration the generic splitter (:mod:`.generic`) reads (issue 29).

A :class:`Family` names where a Hugging Face model keeps its parts and which of transformers' own functions
compute what the model's ``forward`` computes around its decoder layers: the vision call
(``get_image_features`` with the family's input keys and config arguments), the positions (1-D, 1-D from one, or
the family's ``get_rope_index`` computed on the host), the masks (transformers' builder per layer type, or the
model class's ``create_masks_for_generate`` with its token-type overlay), the rotary embedding per layer type,
the MoE routers (:mod:`.moe`). Family code exists only where an architecture truly differs (Qwen-VL's host
metadata, DeepStack).

This module also holds the two modules every vision family shares: :class:`ImageFeatures` (``P``'s vision part)
and :class:`ImageFront` (stage 0's embedding with the features put at the image tokens).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

Tensors = dict[str, torch.Tensor]
FEATURE_CONFIG_ARGS = ("vision_feature_layer", "vision_feature_select_strategy", "vision_aspect_ratio")


@dataclass(frozen=True)
class Family:
    """How the generic splitter reads one family of HF models (see the module docstring).

    Attributes:
        text: FQN of the text model (``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``).
        vision: FQNs of ``P``'s vision part (tower, projector, bare parameters such as LLaVA-Next's
            ``model.image_newline``); empty for a decoder-only LM, whose ``P`` is the embedding and ``T >= 1``
            decoder layers.
        image_inputs: raw keys ``get_image_features`` takes, under its own argument names (``pixel_values``,
            ``image_grid_thw``, ``image_sizes``, ``pixel_attention_mask``, ``batch_num_images``).
        list_inputs: keys of ``image_inputs`` that ``get_image_features`` takes as Python lists (Unlimited-OCR's
            ``num_local_patches`` and ``patches_grid``): a micro-batch carries them as int64 tensors, handed over
            as ``tolist()``.
        image_meta: raw keys ``P``'s vision part reads that ``host`` computed (the tower's precomputed keyword
            arguments, :mod:`.host_metadata`).
        video_inputs: raw keys ``get_video_features`` takes, under its own argument names (``pixel_values_videos``,
            ``video_grid_thw``); empty: the family takes no video, and a micro-batch with ``pixel_values_videos``
            is refused at load naming the model type (:func:`.generic.micro_check`).
        video_meta: raw keys of the tower's precomputed keyword arguments for the video call, computed by ``host``
            from ``video_grid_thw`` (:data:`~.host_metadata.VIDEO_META_KEYS`).
        mask_inputs: raw keys every stage's masks read (``token_type_ids``); they travel with the hidden states.
        stage0_inputs: raw keys stage 0 reads besides ``input_ids``, ``attention_mask`` and ``labels``.
        positions: ``"arange"`` (``(1, L)``), ``"arange1"`` (from one, PaliGemma) or ``"host"`` (``position_ids``
            computed at load by ``host``).
        host: ``host(model) -> (raw -> more raw inputs)`` run on the owner's host at load, or ``None``;
            host_keys: ``host_keys(model) -> keys`` kept on the host for the owner's own ``P``.
        masks: ``masks(model) -> builder`` (:func:`~.decoder.layer_type_masks`'s signature), or ``None`` for
            transformers' builder per layer type.
        deepstack: Qwen3-VL's DeepStack features are added after the first decoder layers (:mod:`.deepstack`).
        softcap: the head applies ``final_logit_softcapping`` (PaliGemma).
        logit_scale: the head multiplies the logits by the text config's ``logit_scale`` (Aya Vision), or by the
            text config field it names (Muse Glimmer's ``"output_multiplier"``), before any soft-capping.
        unused: FQNs of modules the split never runs (Video-LLaVA's video tower, Janus's image-generation
            head): frozen (they get no gradient in the unsplit model either) and kept with stage 0, whose rank
            saves them.
        validate: ``validate(model) -> (raw -> None)`` raising ``ValueError`` for a micro-batch that does not fit,
            checked at load; ``None``: stage 0's image-token count check alone.
        embed_parts: children of the text model that go wherever its ``embed_tokens`` goes (Gemma 4's per-layer
            embedding and projection).
        head_parts: children of the text model that go wherever its final norm goes (Gemma 3n's AltUp
            unembedding projections).
        stage: ``stage(model) -> cls``, a :class:`~.decoder.DecoderStage` subclass (or a callable taking its
            arguments) for every stage and ``P``'s text block; ``None``: ``DecoderStage`` (``DeepStackStage`` with
            ``deepstack``).
        norm: the text model's final norm, under ``text`` (LFM3's is ``embedding_norm``).
        checkpoint: ``(class name, attribute)``: the family's checkpoints hold transformers' class ``name``, whose
            ``attribute`` is this model (ShieldGemma 2's are ``ShieldGemma2ForImageClassification``'s), so their
            names are read through that class's conversion mapping; ``None``: this model's own.
        media_apart: the model cannot take images and videos in one forward (GLM-4.xV finds a video's tokens with
            the image tokens' mask): the loader's planner and packer put image rows and video rows in different
            micro-batches (:mod:`mpipe_hf.data.apart`), and ``validate`` refuses a micro-batch holding both.
        head: FQN of the LM head (Llama 4's is ``language_model.lm_head``, inside its causal LM).
        embed: the text model's token embedding, under ``text`` (Nemotron-H's is ``embeddings``).
    """

    text: str = "model.language_model"
    vision: tuple[str, ...] = ()
    image_inputs: tuple[str, ...] = ("pixel_values",)
    list_inputs: tuple[str, ...] = ()
    image_meta: tuple[str, ...] = ()
    video_inputs: tuple[str, ...] = ()
    video_meta: tuple[str, ...] = ()
    mask_inputs: tuple[str, ...] = ()
    stage0_inputs: tuple[str, ...] = ()
    positions: str = "arange"
    host: Callable | None = None
    host_keys: Callable | None = None
    masks: Callable | None = None
    deepstack: bool = False
    softcap: bool = False
    logit_scale: bool | str = False
    unused: tuple[str, ...] = ()
    validate: Callable | None = None
    embed_parts: tuple[str, ...] = ()
    head_parts: tuple[str, ...] = ()
    stage: Callable | None = None
    norm: str = "norm"
    checkpoint: tuple[str, str] | None = None
    media_apart: bool = False
    head: str = "lm_head"
    embed: str = "embed_tokens"

    def layer_counts(self, config, cfg, layers_per_stage=None, text_layers: int = 0) -> list[int]:
        """Decoder layers per stage (the registry protocol; :func:`.generic.layer_counts`)."""
        from .generic import layer_counts
        return layer_counts(self, config, cfg, layers_per_stage, text_layers)

    def split(self, model, cfg, rank, layers_per_stage=None, text_layers: int = 0):
        """Carve ``model`` for ``rank`` (the registry protocol; :func:`.generic.split_family`)."""
        from .generic import split_family
        return split_family(self, model, cfg, rank, layers_per_stage, text_layers)


def flat_features(pooled) -> torch.Tensor:
    """``get_image_features``'s pooled output as one row per image token ``(n, H)``: a tensor ``(images,
    tokens, H)`` or ``(n, H)``, or a list of per-image tensors, concatenated in order."""
    parts = pooled if isinstance(pooled, (list, tuple)) else [pooled]
    return torch.cat([p.reshape(-1, p.shape[-1]) for p in parts], dim=0)


class ImageFeatures(nn.Module):
    """``P``'s vision part: the raw vision keys -> ``{"image_features": (n_image_tokens, H)}`` through the model's
    own ``get_image_features`` (with DeepStack, also ``"deepstack_features"`` ``(K, n, H)``) and, for a micro with
    videos, ``"video_features"`` ``(n_video_tokens, H)`` through its ``get_video_features``: a second tower call,
    as the model's ``forward`` makes it (with DeepStack, the videos' DeepStack features joined to the images' in the
    tokens' order, by the host's ``deepstack_order``). A micro without ``pixel_values`` gives ``image_features``
    ``(0, H)``.
    Floating-point inputs (``pixel_values``, ``pixel_values_videos``, and any other view's pixels such as
    DeepSeek-OCR-2's ``pixel_values_local``) are cast to the parameters' dtype, as the processor writes fp32.

    Args:
        model: the HF model; parts: ``{fqn: module or parameter}`` of ``P``'s vision part (held here, so that
            ``P``'s parameters are theirs); image_inputs: as :attr:`Family.image_inputs`;
        extra: ``extra(inputs) -> kwargs`` added to the call (Qwen-VL's host metadata).
        video_inputs: as :attr:`Family.video_inputs` (empty: no video call); video_extra: as ``extra``, for the
            video call.
        lists: as :attr:`Family.list_inputs`.
    """

    def __init__(self, model: nn.Module, parts: dict[str, nn.Module | nn.Parameter], image_inputs: tuple[str, ...],
                 deepstack: int = 0, extra: Callable[[Tensors], dict] | None = None,
                 video_inputs: tuple[str, ...] = (), video_extra: Callable[[Tensors], dict] | None = None,
                 lists: tuple[str, ...] = ()):
        super().__init__()
        self.parts = nn.ModuleDict({k.replace(".", "/"): v for k, v in parts.items() if isinstance(v, nn.Module)})
        self.params = nn.ParameterDict({k.replace(".", "/"): v for k, v in parts.items()
                                        if isinstance(v, nn.Parameter)})
        self.hidden_size = model.config.get_text_config().hidden_size
        self.image_inputs, self.deepstack, self.extra = image_inputs, deepstack, extra
        self.video_inputs, self.video_extra, self.lists = video_inputs, video_extra, lists
        inner = getattr(model, "model", model)  # Llama 4's own class computes them (it has no inner model)
        self.__dict__["_image_features"] = inner.get_image_features  # runs the modules above; not a submodule
        self.config_kwargs = _config_kwargs(model.config, inner.get_image_features)
        if video_inputs:
            self.__dict__["_video_features"] = inner.get_video_features
            self.video_config_kwargs = _config_kwargs(model.config, inner.get_video_features)

    def empty(self) -> Tensors:
        zeros = next(self.parameters()).new_zeros(0, self.hidden_size)
        out = {"image_features": zeros}
        if self.deepstack:
            out["deepstack_features"] = zeros.new_zeros(self.deepstack, 0, self.hidden_size)
        return out

    def _call(self, features: Callable, keys: tuple[str, ...], config_kwargs: dict,
              extra: Callable[[Tensors], dict] | None, inputs: Tensors):
        dtype = next(self.parameters()).dtype  # every floating input (the pixels of each view) in the model's dtype
        kwargs = {k: inputs[k].tolist() if k in self.lists else inputs[k].type(dtype)
                  if inputs[k].is_floating_point() else inputs[k] for k in keys if k in inputs}
        return features(**kwargs, **config_kwargs, **(extra(inputs) if extra else {}), return_dict=True)

    def forward(self, inputs: Tensors) -> Tensors:
        if "pixel_values" not in inputs:
            feats = self.empty()
        else:
            out = self._call(self._image_features, self.image_inputs, self.config_kwargs, self.extra, inputs)
            feats = {"image_features": flat_features(out.pooler_output)}
            if self.deepstack:
                feats["deepstack_features"] = torch.stack([flat_features(f) for f in out.deepstack_features])
        if self.video_inputs and self.video_inputs[0] in inputs:
            out = self._call(self._video_features, self.video_inputs, self.video_config_kwargs, self.video_extra,
                             inputs)
            feats["video_features"] = flat_features(out.pooler_output)
            if self.deepstack:  # image and video DeepStack features in the tokens' order (.deepstack)
                video = torch.stack([flat_features(f) for f in out.deepstack_features])
                joint = torch.cat([feats["deepstack_features"], video.to(feats["deepstack_features"].dtype)], 1)
                feats["deepstack_features"] = joint[:, inputs["deepstack_order"]]
        return feats


def _config_kwargs(config, features: Callable) -> dict:
    """The config's values of :data:`FEATURE_CONFIG_ARGS` that ``features`` (``get_image_features`` or
    ``get_video_features``) takes as arguments."""
    names = inspect.signature(features).parameters
    return {k: getattr(config, k) for k in FEATURE_CONFIG_ARGS if k in names and getattr(config, k, None) is not None}


def check_count(image_mask: torch.Tensor, n_feats: int, image_token_id: int, kind: str = "image") -> None:
    """Check that ``image_mask`` (the image-token positions of ``input_ids``; ``kind`` ``video``: the video
    tokens') holds ``n_feats`` tokens. On the host exactly (``ValueError``); on a device without reading the count
    back (a device-side assert, which ends the run: a host read here would stall the device once per micro-batch,
    and the loaders check the same count on the host before the step, ``validate_micro``)."""
    message = f"{kind} tokens and features differ: {{}} {kind} tokens (id {image_token_id}) in input_ids, " \
              f"{n_feats} {kind} features"
    if image_mask.device == torch.device("cpu"):
        n_tokens = int(image_mask.sum())
        if n_tokens != n_feats:
            raise ValueError(message.format(n_tokens))
    else:
        torch._assert_async(image_mask.sum() == n_feats, message.format("a different number of"))


class ImageFront(nn.Module):
    """The output consumer: token embedding, image features at the image-token positions (and video features at
    the video-token positions, with ``video_token_id``), position ids.

    Inputs: ``input_ids``/``attention_mask`` ``(B, L)``, the family's position keys, and either the vision
    outputs (``image_features`` ``(n, H)``, ``video_features`` ``(n_video, H)`` for a micro with videos, and any
    extra feature keys) or, with ``vision``, the raw vision keys.
    Output: ``{"hidden_states": (B, L, H), "position_ids": ..., **extras}``; ``extras``: keys read from the
    features and inputs that later layers need (DeepStack's). An image token id beyond the embedding (Gemma 3,
    PaliGemma checkpoints) is looked up as id 0, as those models do, before its row is replaced. The features are
    put in place as the HF model's ``forward`` puts them (``masked_scatter`` at the placeholder tokens).

    Raises:
        ValueError: the image-token (video-token) count differs from the number of image (video) features.
    """

    def __init__(self, embed_tokens: nn.Module, image_token_id: int | None, vision: nn.Module | None,
                 positions: Callable[[Tensors], torch.Tensor], extras: tuple[str, ...] = (),
                 video_token_id: int | None = None):
        super().__init__()
        self.embed_tokens, self.image_token_id, self.vision = embed_tokens, image_token_id, vision
        self.positions, self.extras, self.video_token_id = positions, extras, video_token_id

    def forward(self, inputs: Tensors) -> Tensors:
        ids = inputs["input_ids"]
        if self.image_token_id is None:  # a decoder-only LM
            return {"hidden_states": self.embed_tokens(ids), "position_ids": self.positions(inputs)}
        image_mask = ids == self.image_token_id
        lookup = ids.masked_fill(image_mask, 0) if self.image_token_id >= self.embed_tokens.num_embeddings else ids
        hidden = self.embed_tokens(lookup)
        feats = self.vision(inputs) if self.vision is not None else inputs
        hidden = _place(hidden, image_mask, feats.get("image_features"), self.image_token_id, "image")
        if self.video_token_id is not None:
            hidden = _place(hidden, ids == self.video_token_id, feats.get("video_features"), self.video_token_id,
                            "video")
        extras = {k: feats[k] if k in feats else inputs[k] for k in self.extras}
        return {"hidden_states": hidden, "position_ids": self.positions(inputs), **extras}


def _place(hidden: torch.Tensor, mask: torch.Tensor, features: torch.Tensor | None, token_id: int,
           kind: str) -> torch.Tensor:
    """``hidden`` ``(B, L, H)`` with ``features`` ``(n, H)`` (``None``: none) at the ``n`` positions of ``mask``
    ``(B, L)``, in order (:func:`check_count` first)."""
    n_feats = features.shape[0] if features is not None else 0
    check_count(mask, n_feats, token_id, kind)
    if not n_feats:
        return hidden
    return hidden.masked_scatter(mask.unsqueeze(-1).expand_as(hidden), features.to(hidden.device, hidden.dtype))
