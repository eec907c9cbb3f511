"""The split declarations of the GLM group: GLM-4.1V / 4.5V / 4.6V take videos as Qwen2-VL's (the tower's second
call), each temporal patch its own grid in ``get_rope_index``; a video's tokens are image tokens, told apart on the
host (:func:`glm_host_inputs`), and a micro-batch never holds both images and videos (:func:`validate_glm_micro`):
the loader plans image and video rows apart. GLM-OCR and Glmga: Qwen-VL's image path."""

from __future__ import annotations

import torch
from torch import nn

from ...models.family import Family
from ...models.host_metadata import qwen_host_inputs
from ..qwen.split import QWEN_VIDEO, QWEN_VL

Tensors = dict[str, torch.Tensor]


def validate_glm_micro(model: nn.Module):
    """``family.validate`` for GLM-4.1V / 4.5V / 4.6V: ``validate_micro(raw)`` raises ``ValueError`` for a
    micro-batch that holds both images and videos (their model writes a video's tokens as image tokens and finds
    both with one mask, ``get_placeholder_mask``'s ``special_video_mask = special_image_mask``, so its forward
    raises on such a micro-batch: images and videos must go in different micro-batches), or whose image (video)
    tokens, ``mm_token_type_ids`` 1 (2), differ in number from the features ``image_grid_thw``
    (``video_grid_thw``) gives."""
    config, merge = model.config, model.config.vision_config.spatial_merge_size
    ids = (config.image_token_id, config.video_token_id)  # the video tokens before and after glm_host_inputs

    def validate_micro(raw: Tensors) -> None:
        if "pixel_values" in raw and "pixel_values_videos" in raw:
            raise ValueError(f"{config.model_type}: a micro-batch holds both images and videos; the model finds a "
                             f"video's tokens with the image tokens' mask (they share the image token), so its "
                             f"forward cannot take both at once: put images and videos in different micro-batches "
                             f"(docs/video.md)")
        visual = torch.isin(raw["input_ids"], torch.tensor(ids))
        types = raw.get("mm_token_type_ids")
        types = torch.ones_like(raw["input_ids"]) if types is None else types  # none: every token an image's
        for kind, type_id, grid in (("image", 1, "image_grid_thw"), ("video", 2, "video_grid_thw")):
            n_tokens = int((visual & (types == type_id)).sum())
            n_feats = int(raw[grid].prod(-1).sum()) // merge ** 2 if raw.get(grid) is not None else 0
            if n_tokens != n_feats:
                raise ValueError(f"{kind}-token count {n_tokens} (id {ids[0]}, mm_token_type_ids {type_id}) differs "
                                 f"from the {n_feats} {kind} features the micro-batch's {kind}s give")
    return validate_micro


def glm_host_inputs(model: nn.Module):
    """:func:`~mpipe_hf.models.host_metadata.qwen_host_inputs` for GLM-4.xV, and for a micro with videos
    ``input_ids`` with each video token (the image token where ``mm_token_type_ids`` is 2) as
    ``config.video_token_id``: stage 0 then puts the video features at the video tokens
    (:class:`~mpipe_hf.models.image_features.ImageFront`). The features replace these tokens' embeddings in both
    models, so the id they are looked up under changes neither the loss nor a gradient."""
    host, config = qwen_host_inputs(model), model.config

    def run(raw: Tensors) -> Tensors:
        out = host(raw)
        if "pixel_values_videos" in raw:
            video = (raw["input_ids"] == config.image_token_id) & (raw["mm_token_type_ids"] == 2)
            out["input_ids"] = raw["input_ids"].masked_fill(video, config.video_token_id)
        return out
    return run


GLM_VIDEO = dict(QWEN_VIDEO, host=glm_host_inputs, validate=validate_glm_micro, media_apart=True)

FAMILIES: dict[str, Family] = {
    "glm4v": Family(**GLM_VIDEO), "glm4v_moe": Family(**GLM_VIDEO), "glm46v": Family(**GLM_VIDEO),
    "glmga": Family(**QWEN_VL), "glm_ocr": Family(**QWEN_VL),
}
REFUSED: dict[str, str] = {
    "glm5_next": "not declared yet: multi-stream hyper-connections (hidden states (B, L, hc_mult, H) between layers, "
                 "collapsed by hc_head before the norm) and DSA indexed attention whose top-k indices pass from "
                 "layer to layer",
}
