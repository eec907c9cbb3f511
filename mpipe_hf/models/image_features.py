"""The image features of a vision family's split: ``P``'s vision part (:class:`ImageFeatures`, the model's own
``get_image_features`` / ``get_video_features`` called on the raw vision keys) and stage 0's front
(:class:`ImageFront`: the token embedding with the features put at the image and video tokens, their count checked
by :func:`check_count`). The generic splitter (:mod:`.generic`) builds both from a family's declaration
(:class:`~.family.Family`); every vision family shares them.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn

Tensors = dict[str, torch.Tensor]
FEATURE_CONFIG_ARGS = ("vision_feature_layer", "vision_feature_select_strategy", "vision_aspect_ratio")


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
            ``P``'s parameters are theirs); image_inputs: as :attr:`.Family.image_inputs`;
        extra: ``extra(inputs) -> kwargs`` added to the call (Qwen-VL's host metadata).
        video_inputs: as :attr:`.Family.video_inputs` (empty: no video call); video_extra: as ``extra``, for the
            video call.
        lists: as :attr:`.Family.list_inputs`.
        division: the family's ``tower_division(model)`` (:mod:`.tower_division`), or ``None``: under context
            parallelism the tower runs whole on every CP rank.
    """

    def __init__(self, model: nn.Module, parts: dict[str, nn.Module | nn.Parameter], image_inputs: tuple[str, ...],
                 deepstack: int = 0, extra: Callable[[Tensors], dict] | None = None,
                 video_inputs: tuple[str, ...] = (), video_extra: Callable[[Tensors], dict] | None = None,
                 lists: tuple[str, ...] = (), division=None):
        super().__init__()
        self.parts = nn.ModuleDict({k.replace(".", "/"): v for k, v in parts.items() if isinstance(v, nn.Module)})
        self.params = nn.ParameterDict({k.replace(".", "/"): v for k, v in parts.items()
                                        if isinstance(v, nn.Parameter)})
        self.hidden_size = model.config.get_text_config().hidden_size
        self.image_inputs, self.deepstack, self.extra = image_inputs, deepstack, extra
        self.video_inputs, self.video_extra, self.lists = video_inputs, video_extra, lists
        self.division, self.model_type = division, model.config.model_type
        self.tower = None  # a DividedTower under context parallelism (.tower_division); None: the tower runs whole
        inner = getattr(model, "model", model)  # Llama 4's own class computes them (it has no inner model)
        self.__dict__["_image_features"] = inner.get_image_features  # runs the modules above; not a submodule
        self.config_kwargs = _config_kwargs(model.config, inner.get_image_features)
        if video_inputs:
            self.__dict__["_video_features"] = inner.get_video_features
            self.video_config_kwargs = _config_kwargs(model.config, inner.get_video_features)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def empty_part(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """No image: features ``(0, H)`` and, with DeepStack, ``(K, 0, H)``."""
        zeros = next(self.parameters()).new_zeros(0, self.hidden_size)
        return zeros, zeros.new_zeros(self.deepstack, 0, self.hidden_size) if self.deepstack else None

    def _call(self, features: Callable, keys: tuple[str, ...], config_kwargs: dict,
              extra: Callable[[Tensors], dict] | None, inputs: Tensors):
        dtype = next(self.parameters()).dtype  # every floating input (the pixels of each view) in the model's dtype
        kwargs = {k: inputs[k].tolist() if k in self.lists else inputs[k].type(dtype)
                  if inputs[k].is_floating_point() else inputs[k] for k in keys if k in inputs}
        return features(**kwargs, **config_kwargs, **(extra(inputs) if extra else {}), return_dict=True)

    def _part(self, out) -> tuple[torch.Tensor, torch.Tensor | None]:
        deep = torch.stack([flat_features(f) for f in out.deepstack_features]) if self.deepstack else None
        return flat_features(out.pooler_output), deep

    def images(self, inputs: Tensors) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The images' features ``(n, H)`` and DeepStack features ``(K, n, H)`` (``None`` without DeepStack)."""
        if "pixel_values" not in inputs:
            return self.empty_part()
        return self._part(self._call(self._image_features, self.image_inputs, self.config_kwargs, self.extra,
                                     inputs))

    def videos(self, inputs: Tensors) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The videos' features and DeepStack features, as :meth:`images` (the tower's second call)."""
        return self._part(self._call(self._video_features, self.video_inputs, self.video_config_kwargs,
                                     self.video_extra, inputs))

    def join(self, images, videos, inputs: Tensors) -> Tensors:
        """The outputs from :meth:`images`' and :meth:`videos`' (``None``: no video) results: with DeepStack, the
        image and video DeepStack features joined in the tokens' order (.deepstack)."""
        feats = {"image_features": images[0]}
        if self.deepstack:
            feats["deepstack_features"] = images[1]
        if videos is not None:
            feats["video_features"] = videos[0]
            if self.deepstack:
                joint = torch.cat([images[1], videos[1].to(images[1].dtype)], 1)
                feats["deepstack_features"] = joint[:, inputs["deepstack_order"]]
        return feats

    def forward(self, inputs: Tensors) -> Tensors:
        if self.tower is not None:  # this CP rank's share, the features gathered over the CP group
            return self.tower.run(self, inputs)
        images = self.images(inputs)
        videos = self.videos(inputs) if self.video_inputs and self.video_inputs[0] in inputs else None
        return self.join(images, videos, inputs)


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
