"""The qwen_like families added in issue 38: declarations (:class:`~.family.Family`) and tiny configs.

- Families whose ``...Model`` is, module for module, one already declared (:data:`~.families.QWEN_VL`, with
  ``get_rope_index`` on the host): GLM-4.6V (videos too, :data:`~.families.GLM_VIDEO`) and Glmga
  (``Glm46VModel``, GLM-4.1V's code under another name), GLM-OCR (GLM-4.1V's structure with its own tower and
  text classes), Cosmos3-Omni (``Qwen3VLModel`` with DeepStack under another name);
- M-RoPE families with towers of their own, positions from their ``get_rope_index`` on the host
  (:func:`rope_family`): PaddleOCR-VL, Cosmos3-Edge, ERNIE 4.5 VL (:mod:`.families_qwen_like_moe`), MiniCPM-V 4.7
  (:func:`canvas_host_inputs`), HunYuan-VL (:mod:`.families_qwen_like_hunyuan`), the Qwen Omni thinkers
  (:mod:`.families_qwen_like_omni`);
- 1-D families: EXAONE 4.5, LLaVA-OneVision-1.5, VideoLLaMA3, MiniCPM-V 4.6, LFM3-VL and HyperCLOVAX-Vision
  (:mod:`.families_qwen_like_lfm`).

Each tiny config is the family's real config class scaled down (the Qwen2 vocabulary and special tokens, 2-layer
towers of width 32, text models of hidden 64 with 4 heads of 16 and 2 key-value heads).
"""

from __future__ import annotations

import torch
from transformers import CONFIG_MAPPING

from .families import DEEPSTACK, GLM_VIDEO, QWEN_VL, _qwen_tokens, validate_counted_micro
from .families_qwen_like_hunyuan import HUNYUAN_VL, tiny_hunyuan_vl_config
from .families_qwen_like_lfm import (Lfm3Stage, MupStage, tiny_hyperclovax_vision_v2_config, tiny_lfm3_vl_config,
                                     tiny_minicpmv4_6_config, tiny_minicpmv4_7_config)
from .families_qwen_like_moe import MOE_TYPES, TokenTypeStage, tiny_ernie4_5_vl_moe_config
from .families_qwen_like_tv import FAMILIES as TV_FAMILIES
from .families_qwen_like_tv import TINY as TV_TINY
from .families_qwen_like_omni import (QWEN2_5_OMNI, QWEN3_OMNI, tiny_qwen2_5_omni_thinker_config,
                                      tiny_qwen3_omni_moe_thinker_config)
from .family import Family
from .packed import is_packed, mrope_positions
from .tiny import mrope_keys, qwen_special_ids, text_keys, tiny_glm4v_config, tiny_qwen3_vl_config
from .tiny import VISION

FAMILIES: dict[str, Family] = {}
TINY: dict = {}  # model_type -> tiny_<type>_config(tokenizer, num_layers=8, ...)
REFUSED: dict[str, str] = {}  # model_type -> why it cannot be split, in the user's terms


def _recast(config, model_type: str, text_type: str | None = None, vision_type: str | None = None):
    """``config`` (a tiny config of :mod:`.tiny`) as the real config class of ``model_type``: the same keys, the
    sub-configs re-typed to ``text_type`` / ``vision_type`` where the family has classes of its own."""
    raw = config.to_dict()
    for key, sub_type in (("text_config", text_type), ("vision_config", vision_type)):
        if sub_type is not None:
            raw[key]["model_type"] = sub_type
    raw.pop("model_type", None)
    return CONFIG_MAPPING[model_type](**raw)


def tiny_glm46v_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Glm46VConfig`` (GLM-4.6V): :func:`~.tiny.tiny_glm4v_config`'s GLM-4.1V text model and 2-layer tower
    (the classes ``Glm46VModel`` builds: ``glm4v_text``, ``glm4v_vision``), the image markers on the Qwen2 vision
    tokens."""
    return _recast(tiny_glm4v_config(tokenizer, num_layers, hidden_size), "glm46v")


def tiny_glmga_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``GlmgaConfig``: :func:`tiny_glm46v_config` under Glmga's config class (its model is GLM-4.6V's)."""
    return _recast(tiny_glm4v_config(tokenizer, num_layers, hidden_size), "glmga")


def tiny_glm_ocr_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``GlmOcrConfig``: :func:`~.tiny.tiny_glm4v_config`'s shapes under GLM-OCR's own text and tower
    classes (``glm_ocr_text``, ``glm_ocr_vision``)."""
    return _recast(tiny_glm4v_config(tokenizer, num_layers, hidden_size), "glm_ocr", "glm_ocr_text",
                   "glm_ocr_vision")


def tiny_cosmos3_omni_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Cosmos3OmniConfig``: :func:`~.tiny.tiny_qwen3_vl_config`'s Qwen3-VL text model and 3-layer tower with
    DeepStack features from every tower block (Cosmos3-Omni builds ``qwen3_vl_text`` and ``qwen3_vl_vision``)."""
    return _recast(tiny_qwen3_vl_config(tokenizer, num_layers, hidden_size=hidden_size), "cosmos3_omni")


def rope_host_inputs(model):
    """``host(raw) -> {"position_ids": ...}`` for an M-RoPE family whose tower is not Qwen-VL's (it computes its
    own metadata on the device): ``get_rope_index``'s ``(3, B, L)`` positions, ``arange`` on all three axes for a
    micro without an image (as the text model does), a packed micro's ``(4, 1, N)``
    (:func:`~.packed.mrope_positions`). ``raw`` is on the host."""
    rope_index = model.model.get_rope_index

    def host(raw):
        ids, grid = raw["input_ids"], raw.get("image_grid_thw")
        if is_packed(raw):
            return {"position_ids": mrope_positions(rope_index, raw)}
        if grid is None:
            return {"position_ids": torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, ids.shape[0], -1)}
        positions, _ = rope_index(ids, mm_token_type_ids=raw["mm_token_type_ids"], image_grid_thw=grid,
                                  attention_mask=raw.get("attention_mask"))
        return {"position_ids": positions}
    return host


def rope_family(vision: tuple[str, ...], **extra) -> Family:
    """An M-RoPE family (positions from ``get_rope_index`` on the host, :func:`rope_host_inputs`) whose
    ``get_image_features(pixel_values, image_grid_thw)`` runs ``vision``; the grid goes to the device with the
    pixels (the tower builds its positions from it there, as in the unsplit model)."""
    return Family(vision=vision, image_inputs=("pixel_values", "image_grid_thw"), stage0_inputs=("position_ids",),
                  positions="host", host=rope_host_inputs, validate=validate_counted_micro(_qwen_tokens), **extra)


def _mrope_text(tokenizer, model_type: str, num_layers: int, hidden_size: int, **extra) -> dict:
    """A text config dict of ``model_type`` with M-RoPE sections over the 16-wide heads (:func:`~.tiny.mrope_keys`)."""
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


def _merged_tokens(model):
    """VideoLLaMA3: each image's patches over its own ``image_merge_sizes ** 2``."""
    return lambda raw: int((raw["image_grid_thw"].prod(-1) // raw["image_merge_sizes"] ** 2).sum())


def _minicpm_tokens(model):
    """MiniCPM-V 4.6 / 4.7: each image's patch grid (``target_sizes``, in patches) halved on each side by the
    tower's window merger (not with ``downsample_mode`` ``"4x"``, as ``get_image_features`` skips it), then
    divided by ``merge_kernel_size`` ``merger_times`` times by the merger (each round's floor, as its views)."""
    config = model.config
    halve, (merge_h, merge_w) = config.downsample_mode != "4x", config.merge_kernel_size

    def image(height: int, width: int) -> int:
        if halve:
            height, width = height // 2, width // 2
        for _ in range(config.merger_times):
            height, width = height // merge_h, width // merge_w
        return height * width
    return lambda raw: sum(image(h, w) for h, w in raw["target_sizes"].tolist())


def canvas_host_inputs(model):
    """``host(raw) -> {"position_ids": (3, B, L)}`` for MiniCPM-V 4.7: its canvas M-RoPE (``get_rope_index`` over
    ``mm_token_type_ids`` and ``target_sizes``) for a micro with images; ``arange`` on all three axes without, as
    its text model does. Packed micro-batches are refused.

    Raises:
        ValueError: a packed micro-batch (its rows' canvases are not computed here).
    """
    rope_index = model.model.get_rope_index

    def host(raw):
        if is_packed(raw):
            raise ValueError("minicpmv4_7: packed micro-batches are not supported (set data.packing: false)")
        ids, sizes = raw["input_ids"], raw.get("target_sizes")
        if sizes is None:
            return {"position_ids": torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, ids.shape[0], -1)}
        positions, _ = rope_index(ids, mm_token_type_ids=raw["mm_token_type_ids"], target_sizes=sizes,
                                  attention_mask=raw.get("attention_mask"))
        return {"position_ids": positions}
    return host


FAMILIES.update({"glm46v": Family(**GLM_VIDEO), "glmga": Family(**QWEN_VL), "glm_ocr": Family(**QWEN_VL),
                 "cosmos3_omni": Family(**DEEPSTACK)})
TINY.update({"glm46v": tiny_glm46v_config, "glmga": tiny_glmga_config, "glm_ocr": tiny_glm_ocr_config,
             "cosmos3_omni": tiny_cosmos3_omni_config})
FAMILIES["paddleocr_vl"] = rope_family(("model.visual", "model.projector"))
FAMILIES["cosmos3_edge"] = rope_family(("model.visual", "model.projector"))
TINY.update({"paddleocr_vl": tiny_paddleocr_vl_config, "cosmos3_edge": tiny_cosmos3_edge_config})
GRID_1D = dict(image_inputs=("pixel_values", "image_grid_thw"), validate=validate_counted_micro(_qwen_tokens))
FAMILIES["exaone4_5"] = Family(vision=("model.visual",), **GRID_1D)  # 1-D positions: the tower's 2-D rotary only
FAMILIES["llava_onevision1_5"] = Family(vision=("model.visual",), **GRID_1D)
FAMILIES["video_llama_3"] = Family(vision=("model.vision_model", "model.projector"),
                                   image_inputs=("pixel_values", "image_grid_thw", "image_merge_sizes"),
                                   validate=validate_counted_micro(_merged_tokens))
TINY.update({"exaone4_5": tiny_exaone4_5_config, "llava_onevision1_5": tiny_llava_onevision1_5_config,
             "video_llama_3": tiny_video_llama_3_config})
FAMILIES["ernie4_5_vl_moe"] = rope_family(("model.vision_tower", "model.resampler_model"), mask_inputs=(MOE_TYPES,),
                                          stage=lambda model: TokenTypeStage)
TINY["ernie4_5_vl_moe"] = tiny_ernie4_5_vl_moe_config
FAMILIES.update({"qwen2_5_omni_thinker": QWEN2_5_OMNI, "qwen3_omni_moe_thinker": QWEN3_OMNI})
TINY.update({"qwen2_5_omni_thinker": tiny_qwen2_5_omni_thinker_config,
             "qwen3_omni_moe_thinker": tiny_qwen3_omni_moe_thinker_config})
FAMILIES["lfm3_vl"] = Family(vision=("model.vision_tower", "model.multi_modal_projector"), norm="embedding_norm",
                             stage=lambda model: Lfm3Stage, **GRID_1D)
TINY["lfm3_vl"] = tiny_lfm3_vl_config
FAMILIES["hyperclovax_vision_v2"] = Family(vision=("model.vision_model", "model.projector"),
                                           stage=lambda model: MupStage, **GRID_1D)
TINY["hyperclovax_vision_v2"] = tiny_hyperclovax_vision_v2_config
FAMILIES["minicpmv4_6"] = Family(vision=("model.vision_tower", "model.merger"),
                                 image_inputs=("pixel_values", "target_sizes"),
                                 validate=validate_counted_micro(_minicpm_tokens))
TINY["minicpmv4_6"] = tiny_minicpmv4_6_config
FAMILIES["minicpm_ocr"] = Family(vision=("model.vision_tower", "model.merger"),  # MiniCPM-V 4.6's model code
                                 image_inputs=("pixel_values", "target_sizes"),
                                 validate=validate_counted_micro(_minicpm_tokens))
FAMILIES["minicpmv4_7"] = Family(vision=("model.vision_tower", "model.merger"),
                                 image_inputs=("pixel_values", "target_sizes"), stage0_inputs=("position_ids",),
                                 positions="host", host=canvas_host_inputs,
                                 validate=validate_counted_micro(_minicpm_tokens))
TINY["minicpmv4_7"] = tiny_minicpmv4_7_config
FAMILIES["hunyuan_vl"] = HUNYUAN_VL
TINY["hunyuan_vl"] = tiny_hunyuan_vl_config

REFUSED.update({
    "ovis2_5": "Ovis2.5 puts learned indicator embeddings from its projector's visual vocabulary at each image's "
               "start and end tokens besides the image features at the image tokens (Ovis2_5Model."
               "_merge_visual_features); the split's stage-0 front places features at image tokens only, so those "
               "two embeddings (and their gradient to the projector) have no path across the preprocess boundary",
})
FAMILIES.update(TV_FAMILIES)  # Kimi K2.5, MiniCPM-OCR: their stock image processors need torchvision, not their models
TINY.update(TV_TINY)
