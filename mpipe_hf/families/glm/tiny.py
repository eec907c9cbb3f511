"""Scaled-down real configs of the GLM group (the same config classes as the hub checkpoints): a GLM-4.1V text
model and 2-layer tower, the image and video markers mapped onto the Qwen2 vision tokens; GLM-4.6V, Glmga and
GLM-OCR recast from it."""

from __future__ import annotations

import functools
from typing import Callable

from ...models.tiny import HEADS, text_keys


def tiny_glm4v_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, moe: bool = False):
    """A ``Glm4vConfig`` (``moe``: ``Glm4vMoeConfig``, GLM-4.5V: the first layer dense, then 4 routed experts, 2
    active, one shared, the load-balancing loss on and weighted 0.01): 14-px patches on a 56-px position grid,
    M-RoPE sections ``[4, 2, 2]`` of the 16-wide heads' half (``[2, 1, 1]`` with GLM-4.5V's half-rotary heads),
    the image markers mapped onto the Qwen2 vision tokens."""
    from transformers import Glm4vConfig, Glm4vMoeConfig
    head_dim = hidden_size // HEADS
    half = head_dim // (4 if moe else 2)  # GLM-4.5V rotates half of each head (partial_rotary_factor 0.5)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [half - 2 * (half // 3), half // 3,
                                                                              half // 3]}
    if moe:
        rope["partial_rotary_factor"] = 0.5
    text = text_keys(tokenizer, num_layers, hidden_size, rope_parameters=rope)
    if moe:
        text.update(moe_intermediate_size=hidden_size, num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1,
                    first_k_dense_replace=1, n_group=1, topk_group=1, router_aux_loss_coef=0.01, head_dim=head_dim,
                    output_router_logits=True)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14, image_size=56,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=hidden_size)
    ids = tokenizer.convert_tokens_to_ids
    return (Glm4vMoeConfig if moe else Glm4vConfig)(
        text_config=text, vision_config=vision, tie_word_embeddings=False, image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"), image_start_token_id=ids("<|vision_start|>"),
        image_end_token_id=ids("<|vision_end|>"), video_start_token_id=ids("<|box_start|>"),
        video_end_token_id=ids("<|box_end|>"))


def recast(config, model_type: str, text_type: str | None = None, vision_type: str | None = None):
    """``config`` (a tiny config) as the real config class of ``model_type``: the same keys, the sub-configs
    re-typed to ``text_type`` / ``vision_type`` where the family has classes of its own."""
    from transformers import CONFIG_MAPPING
    raw = config.to_dict()
    for key, sub_type in (("text_config", text_type), ("vision_config", vision_type)):
        if sub_type is not None:
            raw[key]["model_type"] = sub_type
    raw.pop("model_type", None)
    return CONFIG_MAPPING[model_type](**raw)


def tiny_glm46v_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Glm46VConfig`` (GLM-4.6V): :func:`tiny_glm4v_config`'s GLM-4.1V text model and 2-layer tower (the
    classes ``Glm46VModel`` builds: ``glm4v_text``, ``glm4v_vision``), the image markers on the Qwen2 vision
    tokens."""
    return recast(tiny_glm4v_config(tokenizer, num_layers, hidden_size), "glm46v")


def tiny_glmga_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``GlmgaConfig``: :func:`tiny_glm46v_config` under Glmga's config class (its model is GLM-4.6V's)."""
    return recast(tiny_glm4v_config(tokenizer, num_layers, hidden_size), "glmga")


def tiny_glm_ocr_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``GlmOcrConfig``: :func:`tiny_glm4v_config`'s shapes under GLM-OCR's own text and tower classes
    (``glm_ocr_text``, ``glm_ocr_vision``)."""
    return recast(tiny_glm4v_config(tokenizer, num_layers, hidden_size), "glm_ocr", "glm_ocr_text", "glm_ocr_vision")


TINY: dict[str, Callable] = {
    "glm4v": tiny_glm4v_config, "glm4v_moe": functools.partial(tiny_glm4v_config, moe=True),
    "glm46v": tiny_glm46v_config, "glmga": tiny_glmga_config, "glm_ocr": tiny_glm_ocr_config,
}
