"""The split declarations of the LLaVA group (:class:`~mpipe_hf.models.family.Family`) and its refusals.

Each declaration is read from transformers' own surface: where the model keeps its tower and projector
(:data:`TOWER` for LLaVA's layout), the keys its ``get_image_features`` takes, and what its ``forward`` adds
around the decoder layers. The load-time check counts each micro-batch's image tokens from its vision keys as the
tower and projector size their output (:mod:`.image_counts`).

- LLaVA, VipLLaVA: a CLIP tower's patches (VipLLaVA: several layers' features concatenated, CLS dropped).
  LLaVA-NeXT: anyres grids of tiles with ``model.image_newline`` after each line.
- LLaVA-NeXT-Video and Video-LLaVA are split on their image path; their video inputs are refused at load
  (:func:`refuse_modalities`), and Video-LLaVA's video tower is a part the split never runs (``Family.unused``:
  frozen, saved with stage 0).
- LLaVA-OneVision takes videos: its ``get_video_features`` (the tower per frame, the projector, ``apply_pooling``
  2 x 2 and ``image_newline`` after each video) is ``P``'s second vision call, as its ``forward`` makes it, and
  the load-time check counts its image tokens (``get_image_features``' anyres packing) and video tokens
  (docs/video.md).
- Aya Vision's conditional model scales its logits by the text config's ``logit_scale`` (``Family.logit_scale``);
  Cohere2-Vision's does not. Both pixel-shuffle a SigLIP tower's tiles by ``downsample_factor``.
- Aria: each crop pooled by the projector's cross-attention to a fixed number of queries.
- FastVLM and Perception-LM are LLaVA's layout around a timm tower (``TimmWrapperModel``): FastVLM's FastViT-HD
  gives one token per cell of its 64 x downsampled feature map; Perception-LM's ViT gives each tile's patches
  (CLS dropped), average-pooled ``projector_pooling_ratio`` x on each side; its video inputs are refused at load.
  Building their model needs timm and torchvision, which CI's CPU torch cannot import:
  ``scripts/check/check_timm_families.py`` checks their split where both import.
- Llama 4: the tower and projector at the top of the model (``vision_model``, ``multi_modal_projector``), the text
  model and head under ``language_model``.
- LFM2-VL: a SigLIP 2 tower over each image's own patch grid (``spatial_shapes``), pixel-unshuffled by
  ``downsample_factor``; its LFM2 text model mixes short-convolution and full attention layers (one rotary
  embedding for all) and ends in ``embedding_norm``.
- Step3p7: the tower (``model.vision_model``) runs the global views and, separately, the local crops
  (``pixel_values_local``, ``num_local_patches`` per image); each image's features are its crops' then its global
  view's. Its text model's rotary embedding is per layer type (full, sliding), as the shared loop reads it.
- MiniMax-M3-VL: a Qwen2-VL-style tower over ``image_grid_thw``; every layer of its text model, dense or
  block-sparse (``minimax_m3_sparse``: a lightning indexer picks key blocks inside the layer), takes the one causal
  mask ``MiniMaxM3VLTextModel.forward`` builds (:func:`causal_for_all`).
- Molmo2: its own decoder stage and masks (:mod:`.molmo2`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from ...models.decoder import layer_type_masks
from ...models.family import Family
from ...models.image_tokens import grid_tokens, tower_tokens, validate_counted_micro
from . import image_counts as counts
from .molmo2 import Molmo2Stage, molmo2_masks

Tensors = dict
TOWER = ("model.vision_tower", "model.multi_modal_projector")
VIDEOS = {"pixel_values_videos": "video"}


def refuse_modalities(keys: dict[str, str], inner=None):
    """``Family.validate`` that refuses a micro-batch carrying any of ``keys`` (``{raw key: modality}``, e.g.
    ``{"pixel_values_videos": "video"}``) with a ``ValueError`` naming the modality, then runs ``inner`` (another
    ``validate``) when given: the family's image path is what is split."""
    def build(model):
        check = inner(model) if inner is not None else None
        model_type = model.config.model_type

        def validate_micro(raw: Tensors) -> None:
            for key, modality in keys.items():
                if key in raw:
                    raise ValueError(f"{model_type}: {modality} inputs ({key!r}) are not supported; only its image "
                                     f"path is split (send images as 'pixel_values')")
            if check is not None:
                check(raw)
        return validate_micro
    return build


def causal_for_all(model):
    """Masks for a text model whose every layer type takes the one causal mask (MiniMax-M3's dense and
    block-sparse layers): transformers' full-attention builder
    (:func:`~mpipe_hf.models.decoder.layer_type_masks`), by type."""
    def masks(text_config, hidden, padding, text_row, state, types) -> dict:
        full = layer_type_masks(text_config, hidden, padding, text_row, state, {"full_attention"})["full_attention"]
        return {t: full for t in types}
    return masks


_NEXT = Family(vision=TOWER + ("model.image_newline",), image_inputs=("pixel_values", "image_sizes"),
               validate=validate_counted_micro(counts.anyres_tokens))
FAMILIES: dict[str, Family] = {
    "llava": Family(vision=TOWER, validate=validate_counted_micro(tower_tokens())),
    "llava_next": _NEXT,
    "llava_next_video": replace(_NEXT, validate=refuse_modalities(VIDEOS, _NEXT.validate)),
    "llava_onevision": Family(vision=TOWER + ("model.image_newline",),
                              image_inputs=("pixel_values", "image_sizes", "batch_num_images"),
                              video_inputs=("pixel_values_videos",),
                              validate=validate_counted_micro(counts.onevision_images, counts.onevision_videos)),
    "vipllava": Family(vision=TOWER, validate=validate_counted_micro(tower_tokens(drop_cls=True))),
    "video_llava": Family(vision=("model.image_tower", "model.multi_modal_projector"), unused=("model.video_tower",),
                          validate=refuse_modalities(VIDEOS, validate_counted_micro(
                              tower_tokens("model.image_tower")))),
    "aya_vision": Family(vision=TOWER, logit_scale=True,
                         validate=validate_counted_micro(counts.shuffled_tile_tokens)),
    "cohere2_vision": Family(vision=TOWER, validate=validate_counted_micro(counts.shuffled_tiles)),
    "aria": Family(vision=TOWER, image_inputs=("pixel_values", "pixel_mask"),
                   validate=validate_counted_micro(counts.aria_tokens)),
    # timm towers (TimmWrapperModel): declared without importing timm; building the model needs it
    "fast_vlm": Family(vision=TOWER, validate=validate_counted_micro(counts.fastvit_tokens)),
    "perception_lm": Family(vision=TOWER, validate=refuse_modalities(VIDEOS,
                                                                     validate_counted_micro(counts.pe_tokens))),
    "llama4": Family(text="language_model.model", vision=("vision_model", "multi_modal_projector"),
                     head="language_model.lm_head", validate=validate_counted_micro(counts.llama4_tokens)),
    "lfm2_vl": Family(vision=TOWER, image_inputs=("pixel_values", "spatial_shapes", "pixel_attention_mask"),
                      norm="embedding_norm", validate=validate_counted_micro(counts.unshuffled_grids)),
    "step3p7": Family(vision=("model.vision_model", "model.multi_modal_projector"),
                      image_inputs=("pixel_values", "pixel_values_local", "num_local_patches"),
                      validate=validate_counted_micro(counts.step3p7_tokens)),
    "minimax_m3_vl": Family(vision=TOWER, image_inputs=("pixel_values", "image_grid_thw"), masks=causal_for_all,
                            validate=validate_counted_micro(grid_tokens)),
    "molmo2": Family(vision=TOWER, image_inputs=("pixel_values", "image_token_pooling", "image_grids",
                                                 "image_num_crops"),
                     mask_inputs=("mm_token_type_ids",), masks=molmo2_masks,
                     stage=lambda model: partial(Molmo2Stage, text_model=model.model.language_model),
                     validate=validate_counted_micro(counts.pooled_patch_tokens)),
}
REFUSED: dict[str, str] = {  # model_type -> why it cannot be split, in the user's terms
    "ovis2": "its front puts the visual embedding table's indicator embeddings at the visual indicator tokens besides "
             "the image features at the image tokens; the split's stage-0 front places image features only",
    "fuyu": "it has no vision tower: image patches are embedded by a linear layer and gathered into each row at "
            "'image_patches_indices', and its Persimmon text model ends in 'final_layernorm', not 'norm'",
}
