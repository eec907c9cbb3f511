"""Qwen3-VL (``Qwen3VLForConditionalGeneration``) with DeepStack, carved into a transposed preprocess and pipeline
stages (see :mod:`.vision_language` for the three choices of ``P``).

DeepStack (Meng et al. 2024, arXiv:2406.04334) adds features taken from ``K = len(deepstack_visual_indexes)``
layers of the vision tower to the residual stream at the image-token positions, after decoder layers
``0 .. K-1``. Here ``P``'s vision part returns them as ``deepstack_features`` ``(K, n_image_tokens, H)`` next to
``image_features``; the owner's host adds the image tokens' flat positions ``visual_pos_index`` ``(n,)`` at load
(a boolean mask on the device would read its count back at every use), and both are *relayed*:
every stage whose last layer is below ``K - 1`` passes them on with the hidden states, so the layers that consume
them may sit in any stage (or in ``P``, with ``text_layers``), and their gradient flows back along the same
path to ``P``. The code mirrors ``Qwen3VLModel.forward`` and ``Qwen3VLTextModel._deepstack_process``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..schedule import ScheduleConfig
from .base import SplitModel
from .decoder import DecoderStage
from .host_metadata import host_keys, qwen_host_inputs, vision_kwargs
from .qwen2_vl import LM, STAGE0_KEYS, VISION_KEYS, QwenVisionPreprocess, QwenVLFront, validate_qwen_micro
from .vision_language import VisionLanguageParts, layer_counts, split_vision_language

__all__ = ["layer_counts", "split"]  # the family protocol (registry.py); layer_counts is the shared one

DEEPSTACK_KEYS = ("deepstack_features", "visual_pos_index")


class DeepStackVisionPreprocess(QwenVisionPreprocess):
    """The visual tower with its DeepStack mergers: ``pixel_values``, ``image_grid_thw`` ->
    ``{"image_features": (n, H), "deepstack_features": (K, n, H)}``."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.num_deepstack = len(model.config.vision_config.deepstack_visual_indexes)

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "pixel_values" not in inputs:
            empty = self.empty()
            return {"image_features": empty, "deepstack_features": empty.new_zeros(self.num_deepstack, 0,
                                                                                      self.hidden_size)}
        out = self._image_features(inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True,
                                   **vision_kwargs(inputs))
        return {"image_features": torch.cat(out.pooler_output, dim=0),
                "deepstack_features": torch.stack([torch.cat(f, dim=0) for f in out.deepstack_features])}


def deepstack_host_inputs(model: nn.Module):
    """:func:`~.host_metadata.qwen_host_inputs`, and ``visual_pos_index``: the flat positions ``(n,)`` of the
    image tokens in ``(B * L)``, computed on the host (a boolean index on the device reads its count back)."""
    qwen, image_token_id = qwen_host_inputs(model), model.config.image_token_id

    def host(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        index = (raw["input_ids"] == image_token_id).flatten().nonzero().squeeze(1)
        return {**qwen(raw), "visual_pos_index": index}
    return host


class DeepStackFront(QwenVLFront):
    """:class:`~.qwen2_vl.QwenVLFront` that also hands on the DeepStack features and the image-token mask."""

    def extras(self, feats: dict[str, torch.Tensor], image_mask: torch.Tensor,
               inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"deepstack_features": feats["deepstack_features"], "visual_pos_index": inputs["visual_pos_index"]}


class DeepStackStage(DecoderStage):
    """A :class:`~.decoder.DecoderStage` that adds ``deepstack_features[i]`` at the image-token positions after
    decoder layer ``i < K``, as ``Qwen3VLTextModel._deepstack_process``."""

    def after_layer(self, layer_id: int, hidden: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        features = state.get("deepstack_features")  # carried up to the stage that holds layer K - 1
        if features is None or layer_id >= features.shape[0]:
            return hidden
        index = state["visual_pos_index"]  # the image tokens' flat positions, from the host: a mask would sync
        flat = hidden.clone().view(-1, hidden.shape[-1])
        flat[index] = flat[index] + features[layer_id].to(hidden.device, hidden.dtype)
        return flat.view_as(hidden)



def split(model: nn.Module, cfg: ScheduleConfig, rank: int, layers_per_stage: list[int] | None = None,
          text_layers: int = 0) -> SplitModel:
    """Carve ``model`` (a ``Qwen3VLForConditionalGeneration``) for pipeline rank ``rank`` of ``cfg``.

    Args:
        model: the HF model (e.g. from ``from_pretrained``).
        cfg: the schedule configuration; ``cfg.preprocess`` sets whether ``P`` trains (``identity``: the tower
            runs frozen in stage 0).
        rank: this process's pipeline rank.
        layers_per_stage: decoder layers per stage (``R * V`` entries); balanced when ``None``.
        text_layers: ``T``, the decoder layers ``P`` takes from stage 0 (with the tower and the embedding).

    Raises:
        ValueError: as :func:`~.vision_language.layer_counts`.
    """
    num_deepstack = len(model.config.vision_config.deepstack_visual_indexes)
    parts = VisionLanguageParts(
        vision_fqns=["model.visual"], text_prefix=LM, text_model=model.model.language_model,
        text_config=model.config.text_config, vision=DeepStackVisionPreprocess(model),
        front=lambda vision: DeepStackFront(model, vision, ("image_features", "deepstack_features")),
        stage0_keys=STAGE0_KEYS + ("visual_pos_index",), vision_keys=VISION_KEYS,
        validate_micro=validate_qwen_micro(model),
        stage_cls=DeepStackStage, carry=lambda last: DEEPSTACK_KEYS if last < num_deepstack - 1 else (),
        host=deepstack_host_inputs(model), host_keys=host_keys(model.model.visual))
    return split_vision_language(model, cfg, rank, layers_per_stage, text_layers, parts)
