"""Qwen2-VL and Qwen2.5-VL (``Qwen2VLForConditionalGeneration``, ``Qwen2_5_VLForConditionalGeneration``) carved
into a transposed preprocess and pipeline stages (see :mod:`.vision_language` for the three choices of ``P``).

``P``'s vision part is ``model.visual``: pixels and grids -> image features ``(n_image_tokens, H)`` through the
model's own ``get_image_features``. Stage 0 embeds the tokens, puts the features at the ``<|image_pad|>``
positions and computes the 3-D M-RoPE position ids with the model's ``get_rope_index``; the ids travel down the
pipeline with the attention mask and labels, and every stage rebuilds its causal mask and rotary embeddings from
them. The code mirrors ``Qwen2VLModel.forward`` / ``Qwen2_5_VLModel.forward`` and their text models step by step,
so the loss and gradients equal the unsplit model's.
"""

from __future__ import annotations

import torch
from torch import nn

from ..schedule import ScheduleConfig
from .base import SplitModel
from .host_metadata import VISION_META_KEYS, host_keys, qwen_host_inputs, vision_kwargs
from .vision_language import ImageFront, VisionLanguageParts, layer_counts, split_vision_language

__all__ = ["layer_counts", "split"]  # the family protocol (registry.py); layer_counts is the shared one

# the M-RoPE position ids are computed on the host at load (:mod:`.host_metadata`): stage 0 reads them, not the grid
STAGE0_KEYS = ("input_ids", "attention_mask", "position_ids", "labels")
VISION_KEYS = ("pixel_values", "image_grid_thw", *VISION_META_KEYS)
LM = "model.language_model"


class QwenVisionPreprocess(nn.Module):
    """The visual tower: ``{"pixel_values": (patches, C*T*p*p), "image_grid_thw": (images, 3)}`` ->
    ``{"image_features": (image tokens, H)}`` (a micro without images gives ``(0, H)``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.visual = model.model.visual
        self.hidden_size = model.config.text_config.hidden_size
        self.__dict__["_image_features"] = model.model.get_image_features  # uses self.visual; not a submodule

    def empty(self) -> torch.Tensor:
        return next(self.visual.parameters()).new_zeros(0, self.hidden_size)

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "pixel_values" not in inputs:
            return {"image_features": self.empty()}
        out = self._image_features(inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True,
                                   **vision_kwargs(inputs))
        return {"image_features": torch.cat(out.pooler_output, dim=0)}


class QwenVLFront(ImageFront):
    """:class:`ImageFront` with the M-RoPE position ids ``(3, B, L)`` of ``get_rope_index`` (``arange`` on all
    three axes when the micro has no image, as the text model does)."""

    def __init__(self, model: nn.Module, vision: nn.Module | None, feature_keys=("image_features",)):
        super().__init__(model.model.language_model.embed_tokens, model.config.image_token_id, vision, feature_keys)
        self.__dict__["_rope_index"] = model.model.get_rope_index  # reads only the config; not a submodule

    def positions(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if "position_ids" in inputs:  # computed on the host at load, as below (:mod:`.host_metadata`)
            return inputs["position_ids"]
        ids = inputs["input_ids"]
        if "image_grid_thw" not in inputs:
            return torch.arange(ids.shape[1], device=ids.device).view(1, 1, -1).expand(3, ids.shape[0], -1)
        position_ids, _ = self._rope_index(ids, mm_token_type_ids=inputs["mm_token_type_ids"],
                                           image_grid_thw=inputs["image_grid_thw"],
                                           attention_mask=inputs.get("attention_mask"))
        return position_ids


def validate_qwen_micro(model: nn.Module):
    """``validate_micro(raw)``: raises ``ValueError`` when the ``<|image_pad|>`` count differs from the features
    ``image_grid_thw`` gives."""
    merge = model.config.vision_config.spatial_merge_size
    image_token_id = model.config.image_token_id

    def validate_micro(raw: dict[str, torch.Tensor]) -> None:
        n_tokens = int((raw["input_ids"] == image_token_id).sum())
        grid = raw.get("image_grid_thw")
        n_feats = 0 if grid is None else int(grid.prod(-1).sum()) // merge ** 2
        if n_tokens != n_feats:
            raise ValueError(f"image-token count {n_tokens} (<|image_pad|> id {image_token_id} in input_ids) "
                             f"differs from the {n_feats} image features that image_grid_thw gives")
    return validate_micro



def split(model: nn.Module, cfg: ScheduleConfig, rank: int, layers_per_stage: list[int] | None = None,
          text_layers: int = 0) -> SplitModel:
    """Carve ``model`` for pipeline rank ``rank`` of ``cfg``.

    Args:
        model: a ``Qwen2VLForConditionalGeneration`` or ``Qwen2_5_VLForConditionalGeneration``.
        cfg: the schedule configuration; ``cfg.preprocess`` sets whether ``P`` trains (``identity``: the tower
            runs frozen in stage 0).
        rank: this process's pipeline rank.
        layers_per_stage: decoder layers per stage (``R * V`` entries); balanced when ``None``.
        text_layers: ``T``, the decoder layers ``P`` takes from stage 0 (with the tower and the embedding).

    Raises:
        ValueError: as :func:`~.vision_language.layer_counts`.
    """
    parts = VisionLanguageParts(
        vision_fqns=["model.visual"], text_prefix=LM, text_model=model.model.language_model,
        text_config=model.config.text_config, vision=QwenVisionPreprocess(model),
        front=lambda vision: QwenVLFront(model, vision), stage0_keys=STAGE0_KEYS, vision_keys=VISION_KEYS,
        validate_micro=validate_qwen_micro(model), host=qwen_host_inputs(model),
        host_keys=host_keys(model.model.visual))
    return split_vision_language(model, cfg, rank, layers_per_stage, text_layers, parts)
