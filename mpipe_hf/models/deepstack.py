"""Qwen3-VL's DeepStack across pipeline stages (Qwen3-VL, Qwen3-VL-MoE).

DeepStack (Meng et al. 2024, arXiv:2406.04334) adds features taken from ``K = len(deepstack_visual_indexes)``
layers of the vision tower to the residual stream at the image-token positions, after decoder layers
``0 .. K-1``. ``P``'s vision part returns them as ``deepstack_features`` ``(K, n_image_tokens, H)`` next to
``image_features`` (a micro's videos' features joined to them in the tokens' order: ``Qwen3VLModel.forward``'s
joint features, :func:`deepstack_order`); the owner's host adds the visual tokens' flat positions
``visual_pos_index`` ``(n,)`` at load
(a boolean mask on the device would read its count back at every use), and both are *relayed*: every stage whose
last layer is below ``K - 1`` passes them on with the hidden states, so the layers that consume them may sit in
any stage (or in ``P``, with ``text_layers``), and their gradient flows back along the same path to ``P``. The
code mirrors ``Qwen3VLModel.forward`` and ``Qwen3VLTextModel._deepstack_process``.
"""

from __future__ import annotations

import torch
from torch import nn

from .decoder import DecoderStage
from .host_metadata import qwen_host_inputs
from .sequence_split import SPLIT_KEY, add_at_tokens

DEEPSTACK_KEYS = ("deepstack_features", "visual_pos_index")


def deepstack_layers(config) -> int:
    """``K``: the decoder layers that take DeepStack features (0 when the tower has none)."""
    return len(getattr(config.vision_config, "deepstack_visual_indexes", None) or ())


def deepstack_order(ids: torch.Tensor, video_token_id: int) -> torch.Tensor:
    """``(n,)`` int64: for each visual token of ``ids`` (the image and video tokens at ``visual_pos_index``, in
    order), its row in ``cat(image DeepStack features, video DeepStack features)``: what ``Qwen3VLModel.forward``
    writes into its joint features (``embed_joint[image_mask_joint] = image``, ``[video_mask_joint] = video``), as
    an index gathered on the device (a mask would read its count back)."""
    is_video = ids == video_token_id
    images = int((~is_video).sum())
    return torch.where(is_video, images + is_video.long().cumsum(0) - 1, (~is_video).long().cumsum(0) - 1)


def deepstack_host_inputs(model: nn.Module):
    """:func:`~.host_metadata.qwen_host_inputs`, and ``visual_pos_index``: the flat positions ``(n,)`` of the
    image and video tokens in ``(B * L)``, computed on the host (a boolean index on the device reads its count
    back); for a micro with videos, also ``deepstack_order`` (:func:`deepstack_order`)."""
    qwen, image_token_id = qwen_host_inputs(model), model.config.image_token_id
    video_token_id = getattr(model.config, "video_token_id", None)

    def host(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        flat = raw["input_ids"].flatten()
        visual = flat == image_token_id
        if "pixel_values_videos" in raw:
            visual |= flat == video_token_id
        index = visual.nonzero().squeeze(1)
        out = {**qwen(raw), "visual_pos_index": index}
        if "pixel_values_videos" in raw:
            out["deepstack_order"] = deepstack_order(flat[index], video_token_id)
        return out
    return host


class DeepStackStage(DecoderStage):
    """A :class:`~.decoder.DecoderStage` that adds ``deepstack_features[i]`` at the image-token positions after
    decoder layer ``i < K``, as ``Qwen3VLTextModel._deepstack_process``.

    Under context parallelism (:mod:`.sequence_split`) the features and the visual positions still travel whole
    (``(K, n, H)`` and ``(n,)``: small beside the hidden states), and each CP rank adds only the rows of the image
    tokens in its slice (:func:`~.sequence_split.add_at_tokens`); the rows another rank adds get no gradient here,
    and the tower's gradients from the CP ranks are summed with the other weights'."""

    hooks_cut_sequence = True  # after_layer cuts the features with the sequence (.sequence_split.CUTS_WITH_SEQUENCE)

    def after_layer(self, layer_id: int, hidden: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        features = state.get("deepstack_features")  # carried up to the stage that holds layer K - 1
        if features is None or layer_id >= features.shape[0]:
            return hidden
        index = state["visual_pos_index"]  # the image tokens' flat positions, from the host: a mask would sync
        if state.get(SPLIT_KEY) is not None:  # hidden is this rank's slice; the index counts the whole sequence
            return add_at_tokens(hidden, index, features[layer_id], state[SPLIT_KEY])
        where = torch.unravel_index(index, hidden.shape[:-1])  # one index tensor per leading dimension
        added = hidden[where] + features[layer_id].to(hidden.device, hidden.dtype)
        # out of place, and no view of a flattened copy: a stage's output may be an FSDP2 unit's, whose pre-backward
        # hook an in-place op on a returned view would drop
        return hidden.index_put(where, added)
