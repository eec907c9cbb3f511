"""The image path of the Qwen Omni thinkers (``qwen2_5_omni_thinker``, ``qwen3_omni_moe_thinker``).

A thinker (``Qwen2_5OmniThinkerForConditionalGeneration``, ``Qwen3OmniMoeThinkerForConditionalGeneration``) is a
Qwen-VL model with an audio tower beside the vision tower: ``model.visual``, ``model.audio_tower``,
``model.language_model`` and a top-level ``lm_head``. Its image path is split as Qwen2.5-VL's (Qwen3-Omni's as
Qwen3-VL-MoE's: DeepStack and the MoE load-balancing loss relayed); the audio tower never runs (an ``unused``
part, frozen and kept with stage 0), and micro-batches with audio or video inputs are refused by name at load
(:func:`refuse_audio_video`). The thinker's ``get_rope_index`` differs from Qwen-VL's: positional arguments, no
``mm_token_type_ids``, and positions from the padding mask even without an image (``cumsum - 1``, padding at 1),
which :func:`omni_host_inputs` computes on the host as the thinker's ``forward`` does.
"""

from __future__ import annotations

import torch

from ...models.family import Family
from ...models.image_tokens import grid_tokens, validate_counted_micro
from ...models.packed import gather_rows, is_packed, row_positions, unpad_rows

AUDIO_VIDEO_KEYS = ("input_features", "feature_attention_mask", "audio_feature_lengths", "pixel_values_videos",
                    "video_grid_thw", "video_second_per_grid", "use_audio_in_video")


def refuse_audio_video(model):
    """``family.validate``: :func:`~mpipe_hf.models.image_tokens.validate_counted_micro`'s image-token count check,
    after refusing a micro-batch with audio or video inputs.

    Raises:
        ValueError: the micro-batch has one of :data:`AUDIO_VIDEO_KEYS` (the message names it), or its image-token
            count differs from its images'.
    """
    count = validate_counted_micro(grid_tokens)(model)

    def validate_micro(raw) -> None:
        found = [key for key in AUDIO_VIDEO_KEYS if key in raw]
        if found:
            kind = "audio" if any("feature" in key or "audio" in key for key in found) else "video"
            raise ValueError(f"{model.config.model_type}: {kind} inputs ({', '.join(found)}) are not supported: "
                             f"only the thinker's image path is split (its audio tower and video inputs are not)")
        count(raw)
    return validate_micro


def omni_host_inputs(model, deepstack: bool = False):
    """``host(raw) -> {"position_ids": ...}`` for a thinker: ``get_rope_index(input_ids, image_grid_thw, None,
    attention_mask)`` ``(3, B, L)``, as the thinker's ``forward`` calls it (with an all-ones mask where the loader
    dropped one); a packed micro's ``(4, 1, N)``: its rows' own, unpacked to a padded batch with its mask, after
    the text-position row. ``deepstack``: also ``visual_pos_index``, the image tokens' flat positions ``(n,)``
    (:mod:`mpipe_hf.models.deepstack`)."""
    rope_index, image_token_id = model.model.get_rope_index, model.config.image_token_id

    def positions(raw):
        ids, grid, mask = raw["input_ids"], raw.get("image_grid_thw"), raw.get("attention_mask")
        if is_packed(raw):
            lengths = raw["packed_lengths"].tolist()
            rows, row_mask = unpad_rows(ids, lengths)
            found, _ = rope_index(rows, grid, None, row_mask)
            return torch.cat([row_positions(lengths).unsqueeze(0), gather_rows(found, row_mask)])
        if mask is None:  # no padding: the loader dropped the all-ones mask the model was given
            mask = torch.ones_like(ids)
        return rope_index(ids, grid, None, mask)[0]

    def host(raw):
        out = {"position_ids": positions(raw)}
        if deepstack:
            out["visual_pos_index"] = (raw["input_ids"] == image_token_id).flatten().nonzero().squeeze(1)
        return out
    return host


THINKER = dict(vision=("model.visual",), image_inputs=("pixel_values", "image_grid_thw"),
               stage0_inputs=("position_ids",), positions="host", unused=("model.audio_tower",),
               validate=refuse_audio_video)
QWEN2_5_OMNI = Family(host=omni_host_inputs, **THINKER)
QWEN3_OMNI = Family(host=lambda model: omni_host_inputs(model, deepstack=True), deepstack=True,
                    stage0_inputs=("position_ids", "visual_pos_index"),
                    **{k: v for k, v in THINKER.items() if k != "stage0_inputs"})
