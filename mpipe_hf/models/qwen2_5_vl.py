"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``) carved into a transposed preprocess and pipeline stages.

The preprocess ``P`` is one of (SPEC.md, "Terms"):

- the visual tower (``text_layers = 0``): pixels and grids -> image features ``(n_image_tokens, H)``; stage 0
  embeds the tokens, puts the features at the ``<|image_pad|>`` positions (the output consumer) and computes the
  3-D M-RoPE position ids;
- the visual tower, the embedding and the first ``T = text_layers`` decoder layers: ``P`` returns the hidden
  states and M-RoPE ids, and stage 0 runs only what is left of its chunk;
- an identity (preprocess ``identity``): stage 0 runs the (frozen) tower and the embedding itself, and only raw
  data moves.

The position ids travel down the pipeline with the attention mask and labels; every stage rebuilds its causal
mask and rotary embeddings from them. The last stage holds the final norm, ``lm_head`` and the loss (summed over
tokens; the executor divides by the step's label-token count). The code mirrors ``Qwen2_5_VLModel.forward`` and
``Qwen2_5_VLTextModel.forward`` of transformers step by step, so the loss and gradients equal the unsplit model's.
"""

from __future__ import annotations

import torch
from torch import nn

from ..runtime import Preprocess
from ..schedule import ScheduleConfig
from .base import SplitModel, assemble, plan_layers, stage_layer_ids
from .decoder import CARRIED_KEYS, LMHead, decoder_stage

STAGE0_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "image_grid_thw", "labels")
VISION_KEYS = ("pixel_values", "image_grid_thw")
FRONT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw")
LM = "model.language_model"


class VisionPreprocess(nn.Module):
    """The visual tower. ``{"pixel_values": (patches, C*T*p*p), "image_grid_thw": (images, 3)}`` ->
    ``{"image_features": (image tokens, H)}``; a micro-batch without images gives a ``(0, H)`` tensor."""

    def __init__(self, visual: nn.Module, hidden_size: int):
        super().__init__()
        self.visual = visual
        self.hidden_size = hidden_size

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "pixel_values" not in inputs:
            weight = next(self.visual.parameters())
            return {"image_features": weight.new_zeros(0, self.hidden_size)}
        pixels = inputs["pixel_values"].type(self.visual.dtype)
        return {"image_features": self.visual(pixels, grid_thw=inputs["image_grid_thw"]).pooler_output}


class Qwen2_5_VLFront(nn.Module):
    """Embedding, image-feature injection and M-RoPE ids: ``input_ids``/``attention_mask``/``mm_token_type_ids``
    ``(B, L)``, ``image_grid_thw`` ``(images, 3)`` and either ``image_features`` ``(n, H)`` or, with ``vision``,
    ``pixel_values`` -> ``(hidden (B, L, H), position_ids (3, B, L))``.

    Raises:
        ValueError: the ``<|image_pad|>`` count differs from the number of image features.
    """

    def __init__(self, model: nn.Module, vision: VisionPreprocess | None):
        super().__init__()
        self.embed_tokens = model.model.language_model.embed_tokens
        self.vision = vision
        self.image_token_id = model.config.image_token_id
        self.__dict__["_rope_index"] = model.model.get_rope_index  # reads only the config; not a submodule

    def forward(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = inputs["input_ids"]
        hidden = self.embed_tokens(ids)
        feats = inputs.get("image_features")
        if feats is None and self.vision is not None:
            feats = self.vision(inputs)["image_features"]
        image_mask = ids == self.image_token_id
        n_tokens = int(image_mask.sum())
        if n_tokens != (0 if feats is None else feats.shape[0]):
            raise ValueError(f"image tokens and features differ: {n_tokens} <|image_pad|> tokens in input_ids, "
                             f"{0 if feats is None else feats.shape[0]} image features")
        if n_tokens:
            mask = image_mask.unsqueeze(-1).expand_as(hidden)
            hidden = hidden.masked_scatter(mask, feats.to(hidden.device, hidden.dtype))
        if "image_grid_thw" in inputs:
            position_ids, _ = self._rope_index(ids, mm_token_type_ids=inputs["mm_token_type_ids"],
                                               image_grid_thw=inputs["image_grid_thw"],
                                               attention_mask=inputs["attention_mask"])
        else:  # what Qwen2_5_VLTextModel does when no M-RoPE index can be built
            position_ids = torch.arange(ids.shape[1], device=ids.device).view(1, 1, -1).expand(3, ids.shape[0], -1)
        return hidden, position_ids


def _check_micro(model: nn.Module):
    merge = model.config.vision_config.spatial_merge_size
    image_token_id = model.config.image_token_id

    def validate_micro(raw: dict[str, torch.Tensor]) -> None:
        """Raise ``ValueError`` when the ``<|image_pad|>`` count differs from the features the grids give."""
        n_tokens = int((raw["input_ids"] == image_token_id).sum())
        grid = raw.get("image_grid_thw")
        n_feats = 0 if grid is None else int(grid.prod(-1).sum()) // merge ** 2
        if n_tokens != n_feats:
            raise ValueError(f"image-token count {n_tokens} (<|image_pad|> id {image_token_id} in input_ids) "
                             f"differs from the {n_feats} image features that image_grid_thw gives")
    return validate_micro


def layer_counts(config, cfg: ScheduleConfig, layers_per_stage: list[int] | None = None,
                 text_layers: int = 0) -> list[int]:
    """Decoder layers per stage for ``config`` (a ``Qwen2_5_VLConfig``); checks the layout against the model.

    Raises:
        ValueError: as :func:`~.base.plan_layers`, or tied input/output embeddings split over two ranks.
    """
    if config.tie_word_embeddings and cfg.pp_size > 1:
        raise ValueError("tie_word_embeddings=True ties lm_head (last stage) to embed_tokens (stage 0), which live "
                         "on different ranks; use a checkpoint with untied embeddings or pp_size=1")
    return plan_layers(config.text_config.num_hidden_layers, cfg, layers_per_stage, text_layers)


def split(model: nn.Module, cfg: ScheduleConfig, rank: int, layers_per_stage: list[int] | None = None,
          text_layers: int = 0) -> SplitModel:
    """Carve ``model`` for pipeline rank ``rank`` of ``cfg``.

    Args:
        model: a ``Qwen2_5_VLForConditionalGeneration`` (e.g. from ``from_pretrained``).
        cfg: the schedule configuration; ``cfg.preprocess`` sets whether ``P`` trains (``identity``: the tower
            runs frozen in stage 0).
        rank: this process's pipeline rank.
        layers_per_stage: decoder layers per stage (``R * V`` entries); balanced when ``None``.
        text_layers: ``T``, the decoder layers ``P`` takes from stage 0 (with the tower and the embedding).

    Raises:
        ValueError: as :func:`layer_counts`.
    """
    text = model.config.text_config
    counts = layer_counts(model.config, cfg, layers_per_stage, text_layers)
    p_ids, ids = stage_layer_ids(counts, text_layers)
    lm = model.model.language_model
    layout = [[f"{LM}.layers.{i}" for i in ids[s]] for s in range(cfg.num_stages)]
    layout[-1] += [f"{LM}.norm", "lm_head"]
    vision = VisionPreprocess(model.model.visual, text.hidden_size)
    if not cfg.transposed:
        layout[0][:0] = ["model.visual", f"{LM}.embed_tokens"]
        p_fqns, frozen, front = [], ["model.visual"], Qwen2_5_VLFront(model, vision)
        preprocess = Preprocess(None, (), STAGE0_KEYS + ("pixel_values",))
    elif not text_layers:
        layout[0].insert(0, f"{LM}.embed_tokens")
        p_fqns, front = ["model.visual"], Qwen2_5_VLFront(model, None)
        preprocess = Preprocess(vision, VISION_KEYS, STAGE0_KEYS)
    else:
        p_fqns, front = ["model.visual", f"{LM}.embed_tokens"] + [f"{LM}.layers.{i}" for i in p_ids], None
        block = decoder_stage(lm, text, p_ids, Qwen2_5_VLFront(model, vision), carry=())
        preprocess = Preprocess(block, FRONT_KEYS, CARRIED_KEYS)
    if cfg.transposed:
        frozen = p_fqns if cfg.preprocess == "frozen" else []
    head = LMHead(model, lm.norm, text.vocab_size)

    def stage(s):
        return decoder_stage(lm, text, ids[s], front if s == 0 else None, head if s == cfg.num_stages - 1 else None)
    return assemble(model, cfg, rank, layout, stage, preprocess, p_fqns, frozen, _check_micro(model))
