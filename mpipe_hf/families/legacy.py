"""Transitional: the tables the group packages replace, read where a group does not declare a type yet."""

from __future__ import annotations

import functools


@functools.cache
def _split() -> tuple[dict, dict]:
    from ..models.families import FAMILIES as base
    from ..models.families_llava_like import FAMILIES as llava_like, REFUSED as r1, TIMM_FAMILIES as timm
    from ..models.families_new import FAMILIES as new, REFUSED as r3
    from ..models.families_qwen_like import FAMILIES as qwen_like, REFUSED as r2
    return {**base, **llava_like, **timm, **qwen_like, **new}, {**r1, **r2, **r3}


@functools.cache
def _tiny() -> dict:
    from ..models import tiny as t
    from ..models.tiny_all import TIMM_TINY, TINY_MODELS
    out = {k: v for k, v in TIMM_TINY.items() if v is not None}
    out.update(TINY_MODELS)
    out.update(qwen2_vl=t.tiny_qwen2_vl_config, qwen2_5_vl=t.tiny_qwen2_5_vl_config, qwen3_vl=t.tiny_qwen3_vl_config,
               qwen3_5=t.tiny_qwen3_5_config, qwen3_5_moe=functools.partial(t.tiny_qwen3_5_config, moe=True),
               qwen3_vl_moe=t.tiny_qwen3_vl_moe_config, glm4v=t.tiny_glm4v_config,
               glm4v_moe=functools.partial(t.tiny_glm4v_config, moe=True), llava=t.tiny_llava_config,
               **{m: functools.partial(t.tiny_causal_lm_config, model_type=m) for m in ("llama", "qwen2", "qwen3")})
    return out


@functools.cache
def _data() -> dict:
    from ..data import processor as P
    from ..data import processors_vlm as V
    from ..data import templates as T
    from ..data.family_data import FamilyData
    from ..data.more_families import MORE
    from ..data.video_processor import video_processor_from_image
    from .glm.video_processor import glm_video_processor_from_image
    from .qwen.qwen3_video_processor import qwen3_video_processor_from_image
    from dataclasses import replace
    from ..data.processors_torch_op_images import TORCH_OP_IMAGES
    out = {t: replace(d, no_torchvision_images=TORCH_OP_IMAGES.get(t)) for t, d in MORE.items()}
    repeated = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe", "qwen3_vl_moe", "glm4v", "glm4v_moe",
                "llava", "llava_next", "paligemma"}
    for t in [*P.QWEN_PROCESSORS, "llava", *V.FAMILY_TYPES]:
        qwen3 = t in V.QWEN3_LIKE
        snapshot = None
        if t in ("qwen2_vl", "qwen2_5_vl") or qwen3:
            derive = qwen3_video_processor_from_image if qwen3 else video_processor_from_image
            snapshot = (lambda d: lambda image, config, settings: d(image, settings))(derive)
        elif t in V.GLM_LIKE:
            snapshot = lambda image, config, settings: glm_video_processor_from_image(image, config.model_type, settings)
        out[t] = FamilyData(
            image_processor=P.legacy_image_processor, processor=P.legacy_processor, template=T._TEMPLATES[t],
            hub_image_token=T.HUB_IMAGE_TOKENS.get(t, "<image>"), tokens=V.FAMILY_TOKENS.get(t, {}),
            config_ids=V.CONFIG_TOKEN_IDS.get(t, {}), repeated=t in repeated,
            pixel_bounded=t in P.QWEN_PROCESSORS or qwen3 or t in V.GLM_LIKE,
            hub_video_token=T.HUB_VIDEO_TOKENS.get(t, "<|video|>"), videos=t not in V.VIDEO_FREE and t != "llava",
            video_from_snapshot=snapshot, snapshot_video_class="Qwen3VLVideoProcessor" if t == "qwen3_vl" else None,
            always_ours=t in V.FAMILY_TYPES,
            stock_classes={"qwen2_vl": ("Qwen2VLProcessor",), "qwen2_5_vl": ("Qwen2_5_VLProcessor",),
                           "qwen3_vl": ("Qwen3VLProcessor",), "llava": ("LlavaProcessor",)}.get(t, ()),
            template_owner=True)
    return out


def table(part: str, name: str) -> dict:
    if part == "split":
        return _split()[0 if name == "FAMILIES" else 1]
    return _data() if part == "data" else _tiny()
