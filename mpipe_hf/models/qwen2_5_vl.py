"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``) carved into a transposed visual tower and pipeline stages.

- ``P`` is ``model.visual`` (frozen or trainable): pixels and grids -> image features ``(n_image_tokens, H)``.
- Stage 0 embeds the tokens, puts the features at the ``<|image_pad|>`` positions (the output consumer) and
  computes the 3-D M-RoPE position ids, which travel down the pipeline with the attention mask and labels.
- Every stage runs its decoder layers with the causal mask and rotary embeddings rebuilt from those ids.
- The last stage holds the final norm, ``lm_head`` and the loss (summed over tokens; the executor divides by
  the step's label-token count).

The code mirrors ``Qwen2_5_VLModel.forward`` and ``Qwen2_5_VLTextModel.forward`` of transformers step by step,
so the loss and gradients equal the unsplit model's.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from ..runtime import Preprocess
from ..schedule import ScheduleConfig
from .base import SplitModel, balanced_layers, check_layers_per_stage

STAGE0_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "image_grid_thw", "labels")
VISION_KEYS = ("pixel_values", "image_grid_thw")
CARRIED_KEYS = ("attention_mask", "position_ids", "labels")


class VisionPreprocess(nn.Module):
    """``P``: the visual tower. ``{"pixel_values": (patches, C*T*p*p), "image_grid_thw": (images, 3)}`` ->
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


class Qwen2_5_VLStage(nn.Module):
    """One pipeline stage: optional embedding and feature injection, decoder layers, optional norm/head/loss.

    Inputs of stage 0: the micro-batch's ``input_ids``/``attention_mask``/``labels`` ``(B, L)``,
    ``mm_token_type_ids`` ``(B, L)``, ``image_grid_thw`` ``(images, 3)`` and ``image_features`` ``(n, H)``.
    Inputs of later stages: ``hidden_states`` ``(B, L, H)``, ``position_ids`` ``(3, B, L)``, ``attention_mask``
    and ``labels``. Outputs: the same keys for the next stage, or ``{"loss", "num_tokens"}`` on the last stage.
    """

    def __init__(self, model: nn.Module, index: int, layer_ids: list[int], first: bool, last: bool):
        super().__init__()
        lm = model.model.language_model
        self.index, self.first, self.last, self.layer_ids = index, first, last, layer_ids
        self.text_config = lm.config
        self.image_token_id = model.config.image_token_id
        self.embed_tokens = lm.embed_tokens if first else None
        self.layers = nn.ModuleList(lm.layers[i] for i in layer_ids)
        self.layer_types = [lm.config.layer_types[i] for i in layer_ids]
        self.rotary_emb = lm.rotary_emb
        self.norm = lm.norm if last else None
        self.lm_head = model.lm_head if last else None
        # Plain attributes (not submodules): functions of the HF model that read only its config.
        self.__dict__["_rope_index"] = model.model.get_rope_index
        self.__dict__["_loss_function"] = model.loss_function

    def _embed(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = inputs["input_ids"]
        hidden = self.embed_tokens(ids)
        feats = inputs.get("image_features")
        image_mask = ids == self.image_token_id
        n_tokens = int(image_mask.sum())
        if feats is not None and feats.shape[0] != n_tokens:
            raise ValueError(f"image tokens and features differ: {n_tokens} <|image_pad|> tokens in input_ids, "
                             f"{feats.shape[0]} image features")
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

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.first:
            hidden, position_ids = self._embed(inputs)
        else:
            hidden, position_ids = inputs["hidden_states"], inputs["position_ids"]
        attention_mask = inputs["attention_mask"]
        mask_kwargs = dict(config=self.text_config, inputs_embeds=hidden, attention_mask=attention_mask,
                           cache=None, position_ids=None)
        masks = {"full_attention": create_causal_mask(**mask_kwargs)}
        if "sliding_attention" in self.layer_types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_kwargs)
        position_embeddings = self.rotary_emb(hidden, position_ids)
        for layer, layer_type in zip(self.layers, self.layer_types):
            hidden = layer(hidden, attention_mask=masks[layer_type], position_embeddings=position_embeddings,
                           position_ids=None, cache=None, use_cache=False)
        if not self.last:
            return {"hidden_states": hidden, "position_ids": position_ids, "attention_mask": attention_mask,
                    "labels": inputs["labels"]}
        logits = self.lm_head(self.norm(hidden))
        labels = inputs["labels"]
        loss = self._loss_function(logits=logits, labels=labels, vocab_size=self.text_config.vocab_size,
                                   num_items_in_batch=1)  # reduction "sum"
        return {"loss": loss, "num_tokens": (labels[..., 1:] != -100).sum()}


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


def layer_counts(config, cfg: ScheduleConfig, layers_per_stage: list[int] | None = None) -> list[int]:
    """Decoder layers per stage for ``config`` (a ``Qwen2_5_VLConfig``); checks the layout against the model.

    Raises:
        ValueError: more stages than decoder layers, a bad ``layers_per_stage``, or tied input/output
            embeddings split over two ranks.
    """
    num_layers = config.text_config.num_hidden_layers
    if config.tie_word_embeddings and cfg.pp_size > 1:
        raise ValueError("tie_word_embeddings=True ties lm_head (last stage) to embed_tokens (stage 0), which live "
                         "on different ranks; use a checkpoint with untied embeddings or pp_size=1")
    if layers_per_stage is None:
        return balanced_layers(num_layers, cfg.num_stages)
    return check_layers_per_stage(layers_per_stage, num_layers, cfg.num_stages)


def split(model: nn.Module, cfg: ScheduleConfig, rank: int, layers_per_stage: list[int] | None = None) -> SplitModel:
    """Carve ``model`` for pipeline rank ``rank`` of ``cfg``.

    Args:
        model: a ``Qwen2_5_VLForConditionalGeneration`` (e.g. from ``from_pretrained``).
        cfg: the schedule configuration; ``cfg.preprocess`` sets whether the visual tower trains.
        rank: this process's pipeline rank.
        layers_per_stage: decoder layers per stage (``R * V`` entries); balanced when ``None``.

    Raises:
        ValueError: as :func:`layer_counts`.
    """
    text = model.config.text_config
    num_layers, num_stages = text.num_hidden_layers, cfg.num_stages
    counts = layer_counts(model.config, cfg, layers_per_stage)
    starts = [sum(counts[:s]) for s in range(num_stages)]
    ids = [list(range(starts[s], starts[s] + counts[s])) for s in range(num_stages)]
    prefix = "model.language_model"
    layout = [[f"{prefix}.layers.{i}" for i in ids[s]] for s in range(num_stages)]
    layout[0].insert(0, f"{prefix}.embed_tokens")
    layout[-1] += [f"{prefix}.norm", "lm_head"]

    mine = list(range(rank, num_stages, cfg.pp_size))
    stages = {s: Qwen2_5_VLStage(model, s, ids[s], s == 0, s == num_stages - 1) for s in mine}
    lm = model.model.language_model
    kept = {i for s in mine for i in ids[s]}
    for i in range(num_layers):  # free what this rank never runs
        if i not in kept:
            lm.layers[i] = nn.Identity()
    if 0 not in mine:
        lm.embed_tokens = nn.Identity()
    if num_stages - 1 not in mine:
        lm.norm, model.lm_head = nn.Identity(), nn.Identity()

    model.model.visual.requires_grad_(cfg.trainable)
    vision = VisionPreprocess(model.model.visual, text.hidden_size)
    preprocess = Preprocess(vision, VISION_KEYS, STAGE0_KEYS)
    return SplitModel(model, stages, preprocess, layout, "model.visual", _check_micro(model))
