"""The Gemma models' split declarations (:class:`~mpipe_hf.models.family.Family`) and refusals.

- ``gemma3`` (and ``shieldgemma2``, Gemma 3's model class under its own config, whose checkpoints hold
  ``ShieldGemma2ForImageClassification``): the SigLIP tower and the pooling projector; bidirectional image blocks
  from ``token_type_ids`` (:func:`~.masks.model_class_masks`); images x the projector's pooled grid.
- ``paligemma``: the SigLIP tower and projector; the prefix one bidirectional block (:func:`~.masks.prefix_masks`),
  positions from one, logits soft-capped; one token a tower patch (no class token dropped).
- ``gemma3n`` (``Gemma3nForConditionalGeneration``): the timm MobileNet-V5 tower (``model.vision_tower``) and
  ``model.embed_vision`` in ``P``'s vision part; ``embed_vision``'s hard-token table is read by stage 0's front
  too (:class:`~.altup.MultimodalTokens`: the end-of-image token). The audio path is refused at load by name
  (``input_features``), so the audio tower never runs and ``model.embed_audio`` only ever embeds ids of the audio
  range, which only the audio path writes: both are ``unused`` (frozen, kept with stage 0), the front still
  applying ``embed_audio``'s table as the model's forward does. The text model runs AltUp, per-layer inputs and
  shared key/value layers across stage boundaries (:mod:`.altup`); the logits are soft-capped. Building the model
  needs timm (and torchvision): ``scripts/check/check_timm_families.py`` checks it where both import.
- ``gemma3n_text`` (``Gemma3nForCausalLM``): the same text model alone, which CI checks without timm.
- ``gemma4``: the Gemma 4 vision tower (``model.vision_tower`` and the ``model.embed_vision`` projector), and a
  text model with per-layer inputs and shared key/value layers, which cross stage boundaries as
  :mod:`.shared_kv` describes; masks from the model class (bidirectional image blocks on the sliding layers);
  logits soft-capped as ``Gemma4ForConditionalGeneration`` does. Audio and video inputs are refused by name.
- ``gemma4_unified``: encoder-free, the vision embedder alone over raw merged patches; Gemma 4's text model
  without per-layer inputs; bidirectional image blocks on every layer type (:func:`~.masks.unified_masks`).
- ``muse_glimmer``: a MoonViT-style tower (Qwen-style temporal patches, a resampled learned position grid, window
  and full attention blocks, a 2 x 2 pixel shuffle), its adapter, projection and weightless norm in the
  preprocess; a text model whose every fourth layer (counted from the last) has no rotary embedding
  (``layer_rope_theta[i] == 0``: its ``forward`` hands that layer ``position_embeddings=None``,
  :class:`NoRopeStage`) and attends globally, the others sliding; logits scaled by ``output_multiplier`` and
  soft-capped. ``muse_spark``: Muse Glimmer's image path and text attention (with experts); its audio tower is
  never run by the split (audio and video rows refused).
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from ...models.decoder import DecoderStage
from ...models.family import Family
from ...models.image_tokens import tower_tokens, validate_counted_micro
from ...models.micro_checks import all_checks, refuse_other_modalities
from .altup import EMBED_PARTS, HEAD_PARTS, altup_stage
from .masks import gemma4_masks, model_class_masks, prefix_masks, unified_masks
from .shared_kv import PER_LAYER_PARTS, shared_kv_stage


def pooled_tokens(model: nn.Module):
    """Gemma 3: images x the projector's pooled grid, ``(patches_per_image // kernel_size) ** 2`` (its average pool
    over the tower's patch grid; ``mm_tokens_per_image`` when that is a square dividing the grid)."""
    projector = model.model.multi_modal_projector
    per_image = (projector.patches_per_image // projector.kernel_size) ** 2
    return lambda raw: raw["pixel_values"].shape[0] * per_image


def gemma3n_tokens(model: nn.Module):
    """Gemma 3n: per image (``pixel_values`` ``(images, 3, H, W)``) the tower's output grid, which its multi-scale
    fusion adapter resizes to ``msfa.output_resolution`` whatever the image's size, one token a cell.

    Raises:
        ValueError: (from the count) the grid differs from ``vision_soft_tokens_per_image``, which
            ``get_image_features`` reshapes the tower's output to (it would fail there).
    """
    rows, cols = model.model.vision_tower.timm_model.msfa.output_resolution
    stated = model.config.vision_soft_tokens_per_image

    def count(raw) -> int:
        if rows * cols != stated:
            raise ValueError(f"gemma3n: the vision tower gives {rows} x {cols} tokens an image, but "
                             f"vision_soft_tokens_per_image is {stated}: get_image_features cannot reshape them")
        return raw["pixel_values"].shape[0] * rows * cols
    return count


def gemma4_tokens(model: nn.Module):
    """Gemma 4: each image's real patches (``image_position_ids`` not ``-1``) over ``pooling_kernel_size ** 2``."""
    pool = model.config.vision_config.pooling_kernel_size
    return lambda raw: int(((raw["image_position_ids"] != -1).all(-1).sum(-1) // pool ** 2).sum())


def unified_tokens(model: nn.Module):
    """Gemma 4 Unified: each image's real model patches (``image_position_ids`` not ``-1``); no pooling after."""
    return lambda raw: int((raw["image_position_ids"] != -1).all(-1).sum())


def muse_tokens(model: nn.Module):
    """Muse Glimmer: each image's patches (``image_grid_thw``'s product) over ``merge_size ** 2``."""
    merge = model.config.vision_config.merge_size
    return lambda raw: int(raw["image_grid_thw"].prod(-1).sum()) // merge ** 2


class NoRopeStage(DecoderStage):
    """A :class:`~mpipe_hf.models.decoder.DecoderStage` whose layers with ``layer_rope_theta == 0`` get
    ``position_embeddings = None``, as Muse's text model's ``forward`` hands them (the same on every CP rank's
    slice: nothing per token)."""

    hooks_cut_sequence = True  # layer_kwargs hands no per-token input (sequence_split.CUTS_WITH_SEQUENCE)

    def layer_kwargs(self, layer_id: int, state) -> dict:
        return {} if self.text_config.layer_rope_theta[layer_id] else {"position_embeddings": None}


TOWER = ("model.vision_tower", "model.multi_modal_projector")
GEMMA4_OTHER = {"pixel_values_videos": "video", "input_features": "audio"}  # raw key -> the modality refused
_ALTUP = dict(softcap=True, embed_parts=EMBED_PARTS, head_parts=HEAD_PARTS, stage=altup_stage)
GEMMA3 = Family(vision=TOWER, mask_inputs=("token_type_ids",), masks=model_class_masks,
                validate=validate_counted_micro(pooled_tokens))
MUSE_GLIMMER = Family(vision=("model.vision_tower", "model.vision_adapter", "model.vision_projection",
                              "model.perception_emb_norm"),
                      image_inputs=("pixel_values", "image_grid_thw"), softcap=True, logit_scale="output_multiplier",
                      stage=lambda model: NoRopeStage, validate=validate_counted_micro(muse_tokens))

FAMILIES: dict[str, Family] = {
    "gemma3": GEMMA3,
    "shieldgemma2": replace(GEMMA3, checkpoint=("ShieldGemma2ForImageClassification", "model")),
    "paligemma": Family(vision=TOWER, mask_inputs=("token_type_ids",), masks=prefix_masks, positions="arange1",
                        softcap=True, validate=validate_counted_micro(tower_tokens(drop_cls=False))),
    "gemma3n": Family(vision=("model.vision_tower", "model.embed_vision"),
                      unused=("model.audio_tower", "model.embed_audio"),
                      validate=all_checks(refuse_other_modalities({"input_features": "audio",
                                                                   "pixel_values_videos": "video"}),
                                          validate_counted_micro(gemma3n_tokens)), **_ALTUP),
    "gemma3n_text": Family(text="model", **_ALTUP),
    "gemma4": Family(vision=("model.vision_tower", "model.embed_vision"),
                     image_inputs=("pixel_values", "image_position_ids"), mask_inputs=("mm_token_type_ids",),
                     masks=gemma4_masks, softcap=True, embed_parts=PER_LAYER_PARTS, stage=shared_kv_stage,
                     validate=all_checks(refuse_other_modalities(GEMMA4_OTHER),
                                         validate_counted_micro(gemma4_tokens))),
    "gemma4_unified": Family(vision=("model.embed_vision",), image_inputs=("pixel_values", "image_position_ids"),
                             mask_inputs=("mm_token_type_ids",), masks=unified_masks, softcap=True,
                             stage=shared_kv_stage, validate=all_checks(refuse_other_modalities(GEMMA4_OTHER),
                                                                        validate_counted_micro(unified_tokens))),
    "muse_glimmer": MUSE_GLIMMER,
    "muse_spark": replace(MUSE_GLIMMER, unused=("model.audio_tower",), validate=all_checks(
        refuse_other_modalities({"input_values": "audio", "pixel_values_videos": "video"}), MUSE_GLIMMER.validate)),
}

REFUSED: dict[str, str] = {  # model_type -> why it cannot be split, in the user's terms
    "diffusion_gemma": "block diffusion: a Gemma encoder and a diffusion decoder that attends bidirectionally over "
                       "a noised block and reads the encoder's cache, trained by denoising, not a causal decoder "
                       "stack under a next-token loss",
}
