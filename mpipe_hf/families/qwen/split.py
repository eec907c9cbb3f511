"""The split declarations of the Qwen group, and the Qwen presets other groups build on.

:data:`QWEN_VL`: the tower ``model.visual`` over ``pixel_values`` and ``image_grid_thw``, its metadata
(:mod:`mpipe_hf.models.host_metadata`) and the M-RoPE positions computed on the host; :data:`QWEN_VIDEO` adds the
videos (the tower's second call); :data:`DEEPSTACK` and :data:`DEEPSTACK_VIDEO` relay Qwen3-VL's DeepStack
features (:mod:`mpipe_hf.models.deepstack`). The Omni thinkers' image path lives in :mod:`.omni`.
"""

from __future__ import annotations

from ...models.deepstack import deepstack_host_inputs
from ...models.family import Family
from ...models.host_metadata import VIDEO_META_KEYS, VISION_META_KEYS, host_keys, qwen_host_inputs
from ...models.image_tokens import grid_tokens, grid_video_tokens, validate_counted_micro
from .omni import QWEN2_5_OMNI, QWEN3_OMNI
from .tower_share import QwenTowerShare

QWEN_VL = dict(vision=("model.visual",), image_inputs=("pixel_values", "image_grid_thw"),
               image_meta=VISION_META_KEYS, stage0_inputs=("position_ids",), positions="host",
               host=qwen_host_inputs, host_keys=lambda model: host_keys(model.model.visual),
               validate=validate_counted_micro(grid_tokens))
# Qwen2-VL, Qwen2.5-VL: videos through the tower's second call (get_video_features), their grids and
# second_per_grid_ts into get_rope_index on the host (host_metadata)
QWEN_VIDEO = dict(QWEN_VL, video_inputs=("pixel_values_videos", "video_grid_thw"), video_meta=VIDEO_META_KEYS,
                  validate=validate_counted_micro(grid_tokens, grid_video_tokens))
DEEPSTACK = dict(QWEN_VL, stage0_inputs=("position_ids", "visual_pos_index"), host=deepstack_host_inputs,
                 deepstack=True)
# Qwen3-VL(-MoE): videos as Qwen2's, their DeepStack features joined to the images' in the tokens' order
# (deepstack.deepstack_order, a host key P's vision part reads); Qwen3.5(-MoE): no DeepStack. Their processors
# write per-frame timestamps, and get_rope_index splits each video into one grid per temporal patch
DEEPSTACK_VIDEO = dict(DEEPSTACK, video_inputs=QWEN_VIDEO["video_inputs"],
                       video_meta=VIDEO_META_KEYS + ("deepstack_order",), validate=QWEN_VIDEO["validate"])

# under context parallelism these towers divide their images and temporal patches over the CP ranks
# (.tower_share: each temporal patch attends within itself); the presets above, which other groups build on, and
# the Omni thinkers run their towers whole on every CP rank
DIVIDED = dict(tower_division=QwenTowerShare)
FAMILIES: dict[str, Family] = {
    "qwen2_vl": Family(**QWEN_VIDEO, **DIVIDED), "qwen2_5_vl": Family(**QWEN_VIDEO, **DIVIDED),
    "qwen3_vl": Family(**DEEPSTACK_VIDEO, **DIVIDED), "qwen3_vl_moe": Family(**DEEPSTACK_VIDEO, **DIVIDED),
    "qwen3_5": Family(**QWEN_VIDEO, **DIVIDED), "qwen3_5_moe": Family(**QWEN_VIDEO, **DIVIDED),
    "qwen2_5_omni_thinker": QWEN2_5_OMNI, "qwen3_omni_moe_thinker": QWEN3_OMNI,
}
REFUSED: dict[str, str] = {
    "qwen4_exp": "not declared yet: a gated hyper-connection mixer in place of the final norm, and DSA indexed "
                 "attention beside Gated DeltaNet layers",
}
