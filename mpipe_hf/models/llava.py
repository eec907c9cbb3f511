"""LLaVA (``LlavaForConditionalGeneration``) carved into a transposed preprocess and pipeline stages (see
:mod:`.vision_language` for the three choices of ``P``).

``P``'s vision part is the vision tower plus the multimodal projector (Liu et al. 2023, arXiv:2304.08485),
through the model's own ``get_image_features``: the hidden states of ``config.vision_feature_layer`` (one index,
or a list whose layers are concatenated on the channel axis), without the CLS token when
``config.vision_feature_select_strategy`` is ``"default"`` and with it when ``"full"``, then the projector.
Stage 0 puts one feature per image token; positions are ``arange(L)``. The decoder is any text model HF builds
from ``config.text_config`` with ``layers``, ``norm`` and ``rotary_emb`` (Llama, Qwen2, Qwen3, Mistral).
"""

from __future__ import annotations

import torch
from torch import nn

from ..schedule import ScheduleConfig
from .base import SplitModel
from .vision_language import ImageFront, VisionLanguageParts, layer_counts, split_vision_language

__all__ = ["layer_counts", "split"]  # the family protocol (registry.py); layer_counts is the shared one

STAGE0_KEYS = ("input_ids", "attention_mask", "labels")
VISION_KEYS = ("pixel_values",)
LM = "model.language_model"


class LlavaVisionPreprocess(nn.Module):
    """Vision tower and projector: ``{"pixel_values": (images, C, h, w)}`` -> ``{"image_features":
    (images * tokens per image, H)}`` (``(0, H)`` without images)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.vision_tower, self.multi_modal_projector = model.model.vision_tower, model.model.multi_modal_projector
        self.hidden_size = model.config.text_config.hidden_size
        self.layer, self.strategy = model.config.vision_feature_layer, model.config.vision_feature_select_strategy
        self.__dict__["_image_features"] = model.model.get_image_features  # uses the two modules above

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "pixel_values" not in inputs:
            return {"image_features": next(self.vision_tower.parameters()).new_zeros(0, self.hidden_size)}
        pixels = inputs["pixel_values"].type(next(self.vision_tower.parameters()).dtype)
        out = self._image_features(pixel_values=pixels, vision_feature_layer=self.layer,
                                   vision_feature_select_strategy=self.strategy, return_dict=True)
        return {"image_features": torch.cat([f.reshape(-1, f.shape[-1]) for f in out.pooler_output], dim=0)}


def tokens_per_image(config, vision_tower: nn.Module) -> int | None:
    """Image tokens one image expands to (``num_positions`` of the tower's embeddings, less the CLS token with
    strategy ``"default"``); ``None`` when the tower does not say."""
    embeddings = getattr(getattr(vision_tower, "vision_model", vision_tower), "embeddings", None)
    positions = getattr(embeddings, "num_positions", None)
    if positions is None:
        return None
    return positions - (1 if config.vision_feature_select_strategy == "default" else 0)


def _validator(model: nn.Module):
    image_token_id = model.config.image_token_id
    per_image = tokens_per_image(model.config, model.model.vision_tower)

    def validate_micro(raw: dict[str, torch.Tensor]) -> None:
        """Raise ``ValueError`` when the image-token count differs from images x tokens per image."""
        n_tokens = int((raw["input_ids"] == image_token_id).sum())
        n_images = raw["pixel_values"].shape[0] if "pixel_values" in raw else 0
        if per_image is not None and n_tokens != n_images * per_image:
            raise ValueError(f"image-token count {n_tokens} (id {image_token_id} in input_ids) differs from "
                             f"{n_images} images x {per_image} tokens per image")
    return validate_micro



def split(model: nn.Module, cfg: ScheduleConfig, rank: int, layers_per_stage: list[int] | None = None,
          text_layers: int = 0) -> SplitModel:
    """Carve ``model`` (a ``LlavaForConditionalGeneration``) for pipeline rank ``rank`` of ``cfg``.

    Args:
        model: the HF model (e.g. from ``from_pretrained``).
        cfg: the schedule configuration; ``cfg.preprocess`` sets whether ``P`` trains (``identity``: the tower
            and projector run frozen in stage 0).
        rank: this process's pipeline rank.
        layers_per_stage: decoder layers per stage (``R * V`` entries); balanced when ``None``.
        text_layers: ``T``, the decoder layers ``P`` takes from stage 0 (with the tower, the projector and the
            embedding).

    Raises:
        ValueError: as :func:`~.vision_language.layer_counts`.
    """
    lm = model.model.language_model
    parts = VisionLanguageParts(
        vision_fqns=["model.vision_tower", "model.multi_modal_projector"], text_prefix=LM, text_model=lm,
        text_config=model.config.text_config, vision=LlavaVisionPreprocess(model),
        front=lambda vision: ImageFront(lm.embed_tokens, model.config.image_token_id, vision),
        stage0_keys=STAGE0_KEYS, vision_keys=VISION_KEYS, validate_micro=_validator(model))
    return split_vision_language(model, cfg, rank, layers_per_stage, text_layers, parts)
