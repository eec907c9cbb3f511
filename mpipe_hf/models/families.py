"""Every model family the splitter takes, as a short declaration (:class:`~.family.Family`; issue 29).

Paths and keys are read from transformers' own surface: where each ``...Model`` keeps its parts (``visual``,
``vision_tower``, ``multi_modal_projector``, ``image_newline``, ``vision_model``/``connector``,
``language_model``/``text_model``), the argument names of its ``get_image_features``, and the extra inputs its
``forward`` reads (``mm_token_type_ids`` for the M-RoPE index, ``token_type_ids`` for the bidirectional image
blocks of Gemma 3 and PaliGemma's prefix). What differs beyond data lives in small functions here (the load-time
checks, the two token-type mask builders) or in its own module (:mod:`.host_metadata`, :mod:`.deepstack`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from .deepstack import deepstack_host_inputs
from .family import Family
from .image_tokens import (grid_tokens as _qwen_tokens, grid_video_tokens as _qwen_video_tokens, patch_grid,
                           pixel_shuffled_tokens, real_tiles, tokens_per_image, tower_tokens, validate_counted_micro)
from .host_metadata import VIDEO_META_KEYS, VISION_META_KEYS, host_keys, qwen_host_inputs
from .packed import ROW_BLIND

Tensors = dict[str, torch.Tensor]


_llava_tokens = tower_tokens()


def anyres_tokens(model: nn.Module):
    """LLaVA-NeXT(-Video)'s image tokens, as ``get_image_features`` packs each image (``image_sizes``): the base
    tile's :func:`tokens_per_image`, then its anyres grid of tiles (transformers' ``get_anyres_image_grid_shape``)
    unpadded to the image's aspect (``unpad_image``, on the meta device), with ``image_newline`` after each line
    of it; ``None`` when the tower does not say."""
    from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image
    config = model.config
    per_tile, tile = tokens_per_image(config, model.model.vision_tower), config.vision_config.image_size
    side = tile // config.vision_config.patch_size
    newline = int(getattr(model.model, "image_newline", None) is not None)

    def image(height: int, width: int) -> int:
        rows, cols = get_anyres_image_grid_shape((height, width), config.image_grid_pinpoints, tile)
        h, w = unpad_image(torch.empty(1, rows * side, cols * side, device="meta"), [height, width]).shape[1:]
        return per_tile + h * (w + newline)
    return None if per_tile is None else (lambda raw: sum(image(h, w) for h, w in raw["image_sizes"].tolist()))


def _pooled_tokens(model: nn.Module):
    """Gemma 3: images x the projector's pooled grid, ``(patches_per_image // kernel_size) ** 2`` (its average pool
    over the tower's patch grid; ``mm_tokens_per_image`` when that is a square dividing the grid)."""
    projector = model.model.multi_modal_projector
    per_image = (projector.patches_per_image // projector.kernel_size) ** 2
    return lambda raw: raw["pixel_values"].shape[0] * per_image


def _idefics_tokens(model: nn.Module):
    """Real tiles (:func:`real_tiles`) x tokens per tile."""
    config = model.config
    side = config.vision_config.image_size // config.vision_config.patch_size
    per_tile = side * side // config.scale_factor ** 2
    return lambda raw: real_tiles(raw) * per_tile


def _pixtral_tokens(model: nn.Module):
    """Mistral 3: ``(h // (patch * merge)) * (w // (patch * merge))`` [IMG] tokens per image (``image_sizes``)."""
    step = model.config.vision_config.patch_size * model.config.spatial_merge_size
    return lambda raw: int(((raw["image_sizes"] // step).prod(-1)).sum())


def model_class_masks(model: nn.Module, key: str = "token_type_ids"):
    """Masks from the model class's own ``create_masks_for_generate`` with the token types under ``key`` (Gemma 3's
    ``token_type_ids``: full attention OR a bidirectional block per image, the sliding layers AND their window;
    transformers' ``create_masks_for_vision_model``; Gemma 4's ``mm_token_type_ids``), as its ``forward`` builds
    them for a first (uncached) pass."""
    build, config = type(model).create_masks_for_generate, model.config

    def masks(text_config, hidden, padding, text_row, state, types) -> dict:
        out = build(config, inputs_embeds=hidden, attention_mask=padding, cache=None, position_ids=text_row,
                    is_first_iteration=True, **{key: state.get(key)})
        return out if isinstance(out, dict) else {t: out for t in types}
    # transformers remaps a packed micro's indices to positions before the token-type overlay reads them: the
    # image blocks would be looked up at the wrong tokens, so a packed micro runs row by row
    setattr(masks, ROW_BLIND, True)
    return masks


def prefix_masks(model: nn.Module):
    """PaliGemma's masks, as ``PaliGemmaModel.forward`` builds them: causal, with the prefix (``token_type_ids
    == 0``) one bidirectional block, from the positions (which start at one); the sliding layers of a Gemma 2
    text model get the same block under their window."""
    sliding = getattr(model.config.get_text_config(), "sliding_window", None) is not None

    def masks(text_config, hidden, padding, text_row, state, types) -> dict:
        # no position_ids: with the all-ones mask dropped at load (padding None) transformers would search them
        # for packed sequences on the device (a host read per stage and micro); PaliGemma's own call has the
        # mask, so never searches, and the positions (arange from one) hold no packing to find
        kwargs = dict(config=text_config, inputs_embeds=hidden, attention_mask=padding, cache=None,
                      position_ids=None)
        if state.get("token_type_ids") is not None:
            kwargs["block_sequence_ids"] = torch.where(state["token_type_ids"] == 0, 0, -1)
        out = {"full_attention": create_causal_mask(**kwargs)}
        if sliding:
            out["sliding_attention"] = create_sliding_window_causal_mask(**kwargs)
        return {t: out.get(t, out["full_attention"]) for t in types}
    setattr(masks, ROW_BLIND, True)  # it cannot see packed rows: a packed micro runs row by row
    return masks


QWEN_VL = dict(vision=("model.visual",), image_inputs=("pixel_values", "image_grid_thw"),
               image_meta=VISION_META_KEYS, stage0_inputs=("position_ids",), positions="host",
               host=qwen_host_inputs, host_keys=lambda model: host_keys(model.model.visual),
               validate=validate_counted_micro(_qwen_tokens))
# Qwen2-VL, Qwen2.5-VL: videos through the tower's second call (get_video_features), their grids and
# second_per_grid_ts into get_rope_index on the host (.host_metadata)
QWEN_VIDEO = dict(QWEN_VL, video_inputs=("pixel_values_videos", "video_grid_thw"), video_meta=VIDEO_META_KEYS,
                  validate=validate_counted_micro(_qwen_tokens, _qwen_video_tokens))
DEEPSTACK = dict(QWEN_VL, stage0_inputs=("position_ids", "visual_pos_index"), host=deepstack_host_inputs,
                 deepstack=True)
# Qwen3-VL(-MoE): videos as Qwen2's, their DeepStack features joined to the images' in the tokens' order
# (.deepstack.deepstack_order, a host key P's vision part reads); Qwen3.5(-MoE): no DeepStack. Their processors
# write per-frame timestamps, and get_rope_index splits each video into one grid per temporal patch
DEEPSTACK_VIDEO = dict(DEEPSTACK, video_inputs=QWEN_VIDEO["video_inputs"],
                       video_meta=VIDEO_META_KEYS + ("deepstack_order",), validate=QWEN_VIDEO["validate"])


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
    """:func:`~.host_metadata.qwen_host_inputs` for GLM-4.xV, and for a micro with videos ``input_ids`` with each
    video token (the image token where ``mm_token_type_ids`` is 2) as ``config.video_token_id``: stage 0 then puts
    the video features at the video tokens (:class:`~.family.ImageFront`). The features replace these tokens'
    embeddings in both models, so the id they are looked up under changes neither the loss nor a gradient."""
    host, config = qwen_host_inputs(model), model.config

    def run(raw: Tensors) -> Tensors:
        out = host(raw)
        if "pixel_values_videos" in raw:
            video = (raw["input_ids"] == config.image_token_id) & (raw["mm_token_type_ids"] == 2)
            out["input_ids"] = raw["input_ids"].masked_fill(video, config.video_token_id)
        return out
    return run


# GLM-4.1V / 4.5V / 4.6V: videos as Qwen2's (the tower's second call), each temporal patch its own grid in
# get_rope_index; a video's tokens are image tokens, told apart on the host (glm_host_inputs), and a micro-batch
# never holds both images and videos (validate_glm_micro): the loader plans image and video rows apart
GLM_VIDEO = dict(QWEN_VIDEO, host=glm_host_inputs, validate=validate_glm_micro, media_apart=True)
TOWER = ("model.vision_tower", "model.multi_modal_projector")
DECODER_ONLY = Family(text="model")

FAMILIES: dict[str, Family] = {
    "qwen2_vl": Family(**QWEN_VIDEO), "qwen2_5_vl": Family(**QWEN_VIDEO), "qwen3_vl": Family(**DEEPSTACK_VIDEO),
    "qwen3_vl_moe": Family(**DEEPSTACK_VIDEO), "qwen3_5": Family(**QWEN_VIDEO),
    "qwen3_5_moe": Family(**QWEN_VIDEO),
    "glm4v": Family(**GLM_VIDEO), "glm4v_moe": Family(**GLM_VIDEO),
    "llava": Family(vision=TOWER, validate=validate_counted_micro(_llava_tokens)),
    "llava_next": Family(vision=TOWER + ("model.image_newline",), image_inputs=("pixel_values", "image_sizes"),
                         validate=validate_counted_micro(anyres_tokens)),
    "llava_onevision": Family(vision=TOWER + ("model.image_newline",),
                              image_inputs=("pixel_values", "image_sizes", "batch_num_images")),
    "mistral3": Family(vision=TOWER, image_inputs=("pixel_values", "image_sizes"),
                        validate=validate_counted_micro(_pixtral_tokens)),
    "internvl": Family(vision=TOWER, validate=validate_counted_micro(pixel_shuffled_tokens)),
    "gemma3": Family(vision=TOWER, mask_inputs=("token_type_ids",), masks=model_class_masks,
                     validate=validate_counted_micro(_pooled_tokens)),
    "paligemma": Family(vision=TOWER, mask_inputs=("token_type_ids",), masks=prefix_masks, positions="arange1",
                        softcap=True,
                        validate=validate_counted_micro(tower_tokens(drop_cls=False))),
    "idefics3": Family(text="model.text_model", vision=("model.vision_model", "model.connector"),
                       image_inputs=("pixel_values", "pixel_attention_mask"),
                       validate=validate_counted_micro(_idefics_tokens)),
    "smolvlm": Family(text="model.text_model", vision=("model.vision_model", "model.connector"),
                      image_inputs=("pixel_values", "pixel_attention_mask"),
                      validate=validate_counted_micro(_idefics_tokens)),
    "llama": DECODER_ONLY, "qwen2": DECODER_ONLY, "qwen3": DECODER_ONLY,
}
