"""Qwen-like families whose stock image processor exists in transformers only with a torchvision backend; their
model code needs neither torchvision nor timm, so they split as any other family (the tests build their vision
inputs directly, with the stock processor's layout):

- ``kimi_k25``: Kimi K2.5, a MoonViT tower (NaViT patches with a bicubically resampled learned position grid,
  2-D rotary, 2 x 2 patch merge) and its projector before a DeepSeek-V3 text model (multi-head latent attention,
  routed and shared experts); 1-D positions; ``get_image_features(pixel_values, image_grid_thw)``.
- ``minicpm_ocr``: MiniCPM-OCR, MiniCPM-V 4.6's model code under another name (a SigLIP-style tower, its window
  merger skipped in the default ``4x`` downsample mode, the merger, a Qwen3.5 text model), its head tied; declared
  beside MiniCPM-V 4.6 (:mod:`.families_qwen_like`), its tiny config here.
"""

from __future__ import annotations

from torch import nn

from .families import validate_counted_micro
from .family import Family
from .tiny import qwen_special_ids, text_keys
from .tiny import VISION


def _kimi_tokens(model: nn.Module):
    """Kimi K2.5: each image's patches (``image_grid_thw``'s ``h * w``) over the merge kernel's area."""
    kernel = model.config.vision_config.merge_kernel_size
    return lambda raw: int(raw["image_grid_thw"][:, 1:].prod(-1).sum()) // (kernel[0] * kernel[1])


FAMILIES: dict[str, Family] = {
    "kimi_k25": Family(vision=("model.vision_tower", "model.mm_projector"),
                       image_inputs=("pixel_values", "image_grid_thw"), validate=validate_counted_micro(_kimi_tokens)),
}


def tiny_kimi_k25_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Kimi_K25Config``: a 2-layer MoonViT tower of width 32 (14-px patches, a 4 x 4 learned position grid
    resampled per image, 2 x 2 merge) and its projector; a DeepSeek-V3 text model (multi-head latent attention with
    query rank 32 and key-value rank 16, 8 rotary + 8 plain query/key dims; the first layer dense, then 4 routed
    experts of width 32, 2 active, and one shared), untied embeddings as DeepSeek-V3's. Images are
    ``<|image_pad|>`` x (patches / 4) between ``<|vision_start|>`` and ``<|vision_end|>``."""
    from transformers import Kimi_K25Config
    text = text_keys(tokenizer, num_layers, hidden_size, moe_intermediate_size=hidden_size // 2, n_shared_experts=1,
                 n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=32,
                 qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, first_k_dense_replace=1)
    text.update(model_type="deepseek_v3", num_key_value_heads=text["num_attention_heads"])
    vision = dict(patch_size=14, pos_emb_height=4, pos_emb_width=4, merge_kernel_size=[2, 2], **VISION)
    ids = qwen_special_ids(tokenizer)
    return Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=VISION["hidden_size"],
                          tie_word_embeddings=False, image_token_id=ids["image_token_id"],
                          video_token_id=ids["video_token_id"], vision_start_token_id=ids["vision_start_token_id"],
                          vision_end_token_id=ids["vision_end_token_id"])


def tiny_minicpm_ocr_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56):
    """A ``MiniCPMOcrConfig``: :func:`~.families_qwen_like_lfm.tiny_minicpmv4_6_config`'s tower and Qwen3.5 text
    model under MiniCPM-OCR's classes, in its default ``4x`` downsample mode, the head tied as the real model's."""
    from transformers import MiniCPMOcrConfig

    from .families_qwen_like_lfm import tiny_minicpmv4_6_config
    raw = tiny_minicpmv4_6_config(tokenizer, num_layers, hidden_size, image_size).to_dict()
    raw.pop("model_type")
    raw["vision_config"]["model_type"] = "minicpm_ocr_vision"
    for key in ("image_size", "drop_vision_last_layer"):  # MiniCPM-V 4.6's own keys
        raw.pop(key, None)
    return MiniCPMOcrConfig(**{**raw, "downsample_mode": "4x", "tie_word_embeddings": True})


TINY: dict = {"kimi_k25": tiny_kimi_k25_config, "minicpm_ocr": tiny_minicpm_ocr_config}
TYPES = tuple(TINY)  # the qwen_like types whose stock image processor needs torchvision
