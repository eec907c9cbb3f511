"""The Qwen-like group's tiny configs: each family's real config class scaled down (the Qwen2 vocabulary and its
special tokens standing in for the family's markers, 2-layer towers of width 32, text models of hidden 64 with 4
heads of 16 and 2 key-value heads). ``TINY[t](tokenizer, num_layers=8, hidden_size=64, ...)`` -> the config."""

from __future__ import annotations

from typing import Callable

from transformers import CONFIG_MAPPING

from ...models.tiny import VISION, mrope_keys, qwen_special_ids, text_keys
from ..qwen.tiny import tiny_qwen3_5_config, tiny_qwen3_vl_config


def tiny_cosmos3_omni_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Cosmos3OmniConfig``: the Qwen group's tiny Qwen3-VL text model and 3-layer tower with DeepStack features
    from every tower block (Cosmos3-Omni builds ``qwen3_vl_text`` and ``qwen3_vl_vision``), under Cosmos3-Omni's
    config class."""
    raw = tiny_qwen3_vl_config(tokenizer, num_layers, hidden_size=hidden_size).to_dict()
    raw.pop("model_type", None)
    return CONFIG_MAPPING["cosmos3_omni"](**raw)


def _mrope_text(tokenizer, model_type: str, num_layers: int, hidden_size: int, **extra) -> dict:
    """A text config dict of ``model_type`` with M-RoPE sections over the 16-wide heads
    (:func:`~mpipe_hf.models.tiny.mrope_keys`)."""
    return {"model_type": model_type, **text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // 4,
                                                  rope_parameters=mrope_keys(hidden_size), **extra)}


def tiny_paddleocr_vl_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``PaddleOCRVLConfig``: a 2-layer NaViT-style SigLIP tower (width 32, 14-px patches, a 4 x 4 learned
    position grid interpolated per image), the 2 x 2 projector, an Ernie-4.5 text model with M-RoPE; the head tied
    to the embeddings, as PaddleOCR-VL's (``PaddleOCRVLConfig``'s default, its ERNIE-4.5-0.3B text model's)."""
    from transformers import PaddleOCRVLConfig
    vision = dict(model_type="paddleocr_vl_vision", image_size=56, patch_size=14, spatial_merge_size=2, **VISION)
    return PaddleOCRVLConfig(text_config=_mrope_text(tokenizer, "paddleocr_vl_text", num_layers, hidden_size, tie=True),
                             vision_config=vision, tie_word_embeddings=True, **qwen_special_ids(tokenizer))


def tiny_cosmos3_edge_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Cosmos3EdgeConfig``: a 2-layer packed SigLIP2 tower (width 32, 16-px patches, a 4 x 4 learned position
    grid), the 2 x 2 patch merger (hidden 64), and Cosmos3-Edge's text model (squared-ReLU MLP, M-RoPE)."""
    from transformers import Cosmos3EdgeConfig
    vision = dict(model_type="cosmos3_edge_vision", patch_size=16, num_patches=16, spatial_merge_size=2, **VISION)
    return Cosmos3EdgeConfig(text_config=_mrope_text(tokenizer, "cosmos3_edge_text", num_layers, hidden_size),
                             vision_config=vision, projector_hidden_size=hidden_size, tie_word_embeddings=False,
                             **qwen_special_ids(tokenizer))


def tiny_exaone4_5_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, sliding_window: int = 16):
    """An ``Exaone4_5_Config``: a 2-layer Qwen2.5-VL-style tower with grouped key-value heads (width 32, 14-px
    patches, windowed attention but in the last block), and an EXAONE 4.0 text model: three ``sliding_window``-token
    local layers to one global, 1-D positions."""
    from transformers import Exaone4_5_Config
    vision = dict(model_type="exaone4_5_vision", depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                  num_key_value_heads=1, patch_size=14, temporal_patch_size=2, spatial_merge_size=2,
                  window_size=56, out_hidden_size=hidden_size, fullatt_block_indexes=[1])
    text = {"model_type": "exaone4", **text_keys(tokenizer, num_layers, hidden_size, sliding_window=sliding_window,
                                                 sliding_window_pattern=4)}
    ids = qwen_special_ids(tokenizer)
    return Exaone4_5_Config(text_config=text, vision_config=vision, tie_word_embeddings=False,
                            image_token_id=ids["image_token_id"], video_token_id=ids["video_token_id"])


def tiny_llava_onevision1_5_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``LlavaOnevision15Config`` (LLaVA-OneVision-1.5): a 2-layer RICE-ViT tower (width 32, 14-px patches, a
    class token, 2-D rotary), the 2 x 2 patch merger, and a Qwen3 text model with 1-D positions."""
    from transformers import LlavaOnevision15Config
    vision = dict(model_type="llava_onevision1_5_vision", depth=2, hidden_size=32, intermediate_size=64,
                  num_heads=2, patch_size=14, spatial_merge_size=2, out_hidden_size=hidden_size)
    text = {"model_type": "qwen3", **text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // 4)}
    return LlavaOnevision15Config(text_config=text, vision_config=vision, tie_word_embeddings=False,
                                  **qwen_special_ids(tokenizer))


def tiny_video_llama_3_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``VideoLlama3Config``: a 2-layer SigLIP-NaViT tower (width 32, 14-px patches, 2-D rotary), the MLP
    projector, and a Qwen2 text model with 1-D positions; images merged 2 x 2 (``image_merge_sizes``)."""
    from transformers import VideoLlama3Config
    vision = dict(model_type="video_llama_3_vision", patch_size=14, **VISION)
    text = {"model_type": "qwen2", **text_keys(tokenizer, num_layers, hidden_size)}
    ids = qwen_special_ids(tokenizer)
    return VideoLlama3Config(text_config=text, vision_config=vision, tie_word_embeddings=False,
                             image_token_id=ids["image_token_id"], video_token_id=ids["video_token_id"])


def tiny_ernie4_5_vl_moe_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """An ``Ernie4_5_VLMoeConfig`` (ERNIE-4.5-VL-28B-A3B's shape scaled down): a 2-layer tower (width 32, 14-px
    patches), the spatial 2 x 2 resampler, and an ERNIE 4.5 MoE text model: the first and (from 3 layers) the last
    layer dense, the others 4 text and 4 vision experts (intermediate 64 and 32), 2 active per token, one shared
    expert, M-RoPE sections ``[3, 3, 2]`` of the 16-wide heads' half, the load-balancing loss on and weighted
    0.01. Image markers: the Qwen2 vision tokens (video start/end: ``<|box_start|>``/``<|box_end|>``). The last
    layer is dense because its vision experts would read only image tokens and their markers, whose outputs no
    label reads: their gradient is zero by design, which would make every gradient check of them compare zero
    with zero."""
    from transformers import Ernie4_5_VLMoeConfig
    text = text_keys(tokenizer, num_layers, hidden_size,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2]},
                     moe_intermediate_size=[hidden_size, hidden_size // 2], moe_k=2, moe_num_experts=4,
                     moe_num_shared_experts=1, output_router_logits=True, router_aux_loss_coef=0.01,
                     mlp_layer_types=["dense"] + ["sparse"] * max(num_layers - 2, 1) + ["dense"] * (num_layers > 2))
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14, spatial_merge_size=2)
    ids, specials = tokenizer.convert_tokens_to_ids, qwen_special_ids(tokenizer)
    return Ernie4_5_VLMoeConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=False,
        image_token_id=specials["image_token_id"], video_token_id=specials["video_token_id"],
        image_start_token_id=specials["vision_start_token_id"], image_end_token_id=specials["vision_end_token_id"],
        video_start_token_id=ids("<|box_start|>"), video_end_token_id=ids("<|box_end|>"))


def tiny_hunyuan_vl_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``HunYuanVLConfig``: a 2-layer tower (width 32, 16-px patches, the 2 x 2 convolutional merger with its
    row separator and begin/end embeddings) and a HunYuan text model with 4-axis XD-RoPE (``mrope_section`` ``[2,
    2, 2, 2]`` of the 16-wide heads' half, as the hub's 4 sections). Image markers: ``<|vision_start|>``,
    ``<|image_pad|>``, ``<|vision_end|>``; the row separator: ``<|vision_pad|>``. The head is tied to the
    embeddings, as HunyuanOCR's (``HunYuanVLConfig``'s default)."""
    from transformers import HunYuanVLConfig
    text = text_keys(tokenizer, num_layers, hidden_size, tie=True, head_dim=hidden_size // 4,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 2, 2]})
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=16,
                  spatial_merge_size=2, out_hidden_size=hidden_size, text_hidden_size=hidden_size)
    ids = qwen_special_ids(tokenizer)
    return HunYuanVLConfig(text_config=text, vision_config=vision, image_token_id=ids["image_token_id"],
                           im_start_id=ids["vision_start_token_id"], im_end_id=ids["vision_end_token_id"],
                           im_newline_id=tokenizer.convert_tokens_to_ids("<|vision_pad|>"), tie_word_embeddings=True)


def tiny_lfm3_vl_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, sliding_window: int = 16):
    """An ``Lfm3VlConfig``: a 2-layer tower (width 32, 16-px patches, a 2 x 2 merge), the MLP projector, and an
    LFM3 text model in its real layer pattern (``conv`` layers, every fourth a full attention layer with half its
    16-wide heads rotated, ``sliding_window``-token sliding layers between), untied embeddings."""
    from transformers import Lfm3VlConfig
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // 4, sliding_window=sliding_window)
    text.pop("max_position_embeddings")
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, patch_size=16, spatial_merge_size=2)
    ids = qwen_special_ids(tokenizer)
    return Lfm3VlConfig(text_config={"model_type": "lfm3", **text}, vision_config=vision,
                        projector_hidden_size=hidden_size, tie_word_embeddings=False, **ids)


def tiny_hyperclovax_vision_v2_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``HyperCLOVAXVisionV2Config``: a 2-layer Qwen2.5-VL tower (width 32, 14-px patches, windowed attention but
    in the last block), the linear projector, and a HyperCLOVAX text model with its muP multipliers away from 1
    (embeddings x 2, residual branches x 0.5, logits x 0.25, attention scale 0.2), so that each is checked."""
    from transformers import HyperCLOVAXVisionV2Config
    vision = dict(model_type="qwen2_5_vl_vision", depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                  patch_size=14, temporal_patch_size=2, spatial_merge_size=2, window_size=56,
                  out_hidden_size=32, fullatt_block_indexes=[1])
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // 4, embedding_multiplier=2.0,
                     residual_multiplier=0.5, logits_scaling=0.25, attention_multiplier=0.2)
    ids = qwen_special_ids(tokenizer)
    return HyperCLOVAXVisionV2Config(text_config={"model_type": "hyperclovax", **text}, vision_config=vision,
                                     tie_word_embeddings=False, image_token_id=ids["image_token_id"],
                                     video_token_id=ids["video_token_id"])


def tiny_minicpmv4_6_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56):
    """A ``MiniCPMV4_6Config``: a 2-layer SigLIP-style tower (width 32, 14-px patches, a learned ``image_size /
    14``-side position grid) with its 2 x 2 window merger after the first block, the merger into the text model,
    and the Qwen group's tiny Qwen3.5 text model (Gated DeltaNet and gated full attention)."""
    from transformers import MiniCPMV4_6Config
    text = tiny_qwen3_5_config(tokenizer, num_layers, hidden_size).text_config.to_dict()
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=image_size, patch_size=14, insert_layer_id=0)
    ids = qwen_special_ids(tokenizer)
    return MiniCPMV4_6Config(text_config=text, vision_config=vision, image_size=image_size, insert_layer_id=0,
                             image_token_id=ids["image_token_id"], video_token_id=ids["video_token_id"],
                             tie_word_embeddings=False)


def _minicpm_v4_6_as(tokenizer, num_layers: int, hidden_size: int, image_size: int, vision_type: str) -> dict:
    """:func:`tiny_minicpmv4_6_config`'s keys with no ``model_type``, its tower re-typed to ``vision_type``."""
    raw = tiny_minicpmv4_6_config(tokenizer, num_layers, hidden_size, image_size).to_dict()
    raw.pop("model_type")
    raw["vision_config"]["model_type"] = vision_type
    return raw


def tiny_minicpmv4_7_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56):
    """A ``MiniCPMV4_7Config``: :func:`tiny_minicpmv4_6_config`'s shape, with the canvas M-RoPE's markers on the
    Qwen2 tokens that stand in for them (``<|vision_start|>``/``<|vision_end|>`` for ``<image>``/``</image>``,
    ``<|quad_start|>``/``<|quad_end|>`` for ``<slice>``/``</slice>``) and the newline."""
    from transformers import MiniCPMV4_7Config
    raw = _minicpm_v4_6_as(tokenizer, num_layers, hidden_size, image_size, "minicpmv4_7_vision")
    ids = tokenizer.convert_tokens_to_ids
    return MiniCPMV4_7Config(**raw, image_start_id=ids("<|vision_start|>"), image_end_id=ids("<|vision_end|>"),
                             slice_start_id=ids("<|quad_start|>"), slice_end_id=ids("<|quad_end|>"),
                             newline_id=tokenizer.encode("\n")[0])


def tiny_minicpm_ocr_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56):
    """A ``MiniCPMOcrConfig``: :func:`tiny_minicpmv4_6_config`'s tower and Qwen3.5 text model under MiniCPM-OCR's
    classes, in its default ``4x`` downsample mode, the head tied as the real model's."""
    from transformers import MiniCPMOcrConfig
    raw = _minicpm_v4_6_as(tokenizer, num_layers, hidden_size, image_size, "minicpm_ocr_vision")
    for key in ("image_size", "drop_vision_last_layer"):  # MiniCPM-V 4.6's own keys
        raw.pop(key, None)
    return MiniCPMOcrConfig(**{**raw, "downsample_mode": "4x", "tie_word_embeddings": True})


def tiny_kimi_k25_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Kimi_K25Config``: a 2-layer MoonViT tower of width 32 (14-px patches, a 4 x 4 learned position grid
    resampled per image, 2 x 2 merge) and its projector; a DeepSeek-V3 text model (multi-head latent attention with
    query rank 32 and key-value rank 16, 8 rotary + 8 plain query/key dims; the first layer dense, then 4 routed
    experts of width 32, 2 active, and one shared), untied embeddings as DeepSeek-V3's. Images are
    ``<|image_pad|>`` x (patches / 4) between ``<|vision_start|>`` and ``<|vision_end|>``."""
    from transformers import Kimi_K25Config
    text = text_keys(tokenizer, num_layers, hidden_size, moe_intermediate_size=hidden_size // 2, n_shared_experts=1,
                     n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=16,
                     q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, first_k_dense_replace=1)
    text.update(model_type="deepseek_v3", num_key_value_heads=text["num_attention_heads"])
    vision = dict(patch_size=14, pos_emb_height=4, pos_emb_width=4, merge_kernel_size=[2, 2], **VISION)
    ids = qwen_special_ids(tokenizer)
    return Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=VISION["hidden_size"],
                          tie_word_embeddings=False, image_token_id=ids["image_token_id"],
                          video_token_id=ids["video_token_id"], vision_start_token_id=ids["vision_start_token_id"],
                          vision_end_token_id=ids["vision_end_token_id"])


TINY: dict[str, Callable] = {
    "cosmos3_omni": tiny_cosmos3_omni_config, "paddleocr_vl": tiny_paddleocr_vl_config,
    "cosmos3_edge": tiny_cosmos3_edge_config, "exaone4_5": tiny_exaone4_5_config,
    "llava_onevision1_5": tiny_llava_onevision1_5_config, "video_llama_3": tiny_video_llama_3_config,
    "ernie4_5_vl_moe": tiny_ernie4_5_vl_moe_config, "hunyuan_vl": tiny_hunyuan_vl_config,
    "lfm3_vl": tiny_lfm3_vl_config, "hyperclovax_vision_v2": tiny_hyperclovax_vision_v2_config,
    "minicpmv4_6": tiny_minicpmv4_6_config, "minicpmv4_7": tiny_minicpmv4_7_config,
    "minicpm_ocr": tiny_minicpm_ocr_config, "kimi_k25": tiny_kimi_k25_config,
}
"""``model_type`` -> ``tiny_<type>_config(tokenizer, num_layers=8, hidden_size=64, ...)``."""
