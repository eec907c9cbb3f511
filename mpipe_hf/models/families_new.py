"""The new families added in issue 38: declarations (:class:`~.family.Family`), tiny configs, and the model types
refused with their reason.

- ``gemma4``: a Gemma 4 vision tower (``model.vision_tower`` and the ``model.embed_vision`` projector), and a text
  model with per-layer inputs and shared key/value layers, which cross stage boundaries as
  :mod:`mpipe_hf.families.gemma.shared_kv` describes; masks from the model class (bidirectional image blocks on the sliding layers);
  the logits soft-capped as ``Gemma4ForConditionalGeneration`` does. Audio and video inputs are refused by name.
- ``mistral4``: transformers maps it to ``Mistral4ForCausalLM``, a decoder-only LM (multi-head latent attention,
  DeepSeek-style routed and shared experts, YaRN rotary): ``Family(text="model")``; ``output_router_logits``
  off, as ``Mistral4ForCausalLM``'s loss adds no load-balancing term.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from .families import validate_counted_micro
from .families_gemma3n import GEMMA3N_TEXT, tiny_gemma3n_text_config
from ..families.inkling.split import INKLING
from ..families.inkling.tiny import tiny_inkling_config
from .families_muse import MUSE_GLIMMER, tiny_muse_glimmer_config, tiny_muse_spark_config
from ..families.nemotron.split import NEMOTRON_H_OMNI
from ..families.nemotron.tiny import tiny_nemotron_h_omni_config
from .family import Family
from ..families.gemma.masks import gemma4_masks, unified_masks
from ..families.gemma.shared_kv import PER_LAYER_PARTS, shared_kv_stage
from .micro_checks import refuse_other_modalities
from .tiny import text_keys
from .tiny import token_id


def _gemma4_tokens(model: nn.Module):
    """Gemma 4: each image's real patches (``image_position_ids`` not ``-1``) over ``pooling_kernel_size ** 2``."""
    pool = model.config.vision_config.pooling_kernel_size
    return lambda raw: int(((raw["image_position_ids"] != -1).all(-1).sum(-1) // pool ** 2).sum())


def _both(*checks):
    """One ``Family.validate`` running each of ``checks`` (each ``check(model) -> (raw -> None)``)."""
    def build(model: nn.Module):
        built = [check(model) for check in checks]

        def validate_micro(raw) -> None:
            for check in built:
                check(raw)
        return validate_micro
    return build


def _unified_tokens(model: nn.Module):
    """Gemma 4 Unified: each image's real model patches (``image_position_ids`` not ``-1``); no pooling after."""
    return lambda raw: int((raw["image_position_ids"] != -1).all(-1).sum())


def _llama4_tokens(model: nn.Module):
    """Llama 4: each tile's patches (its pixels over ``patch_size``, both sides) times ``pixel_shuffle_ratio **
    2``, over the tiles of ``pixel_values`` ``(tiles, 3, H, W)``."""
    vision = model.config.vision_config
    return lambda raw: int(raw["pixel_values"].shape[0] * (raw["pixel_values"].shape[-2] // vision.patch_size)
                           * (raw["pixel_values"].shape[-1] // vision.patch_size) * vision.pixel_shuffle_ratio ** 2)


GEMMA4_OTHER = {"pixel_values_videos": "video", "input_features": "audio"}

FAMILIES: dict[str, Family] = {
    "gemma4": Family(vision=("model.vision_tower", "model.embed_vision"),
                     image_inputs=("pixel_values", "image_position_ids"), mask_inputs=("mm_token_type_ids",),
                     masks=gemma4_masks, softcap=True, embed_parts=PER_LAYER_PARTS, stage=shared_kv_stage,
                     validate=_both(refuse_other_modalities(GEMMA4_OTHER),
                                    validate_counted_micro(_gemma4_tokens))),
    "mistral4": Family(text="model"),
    "gemma4_unified": Family(vision=("model.embed_vision",), image_inputs=("pixel_values", "image_position_ids"),
                             mask_inputs=("mm_token_type_ids",), masks=unified_masks, softcap=True,
                             stage=shared_kv_stage, validate=_both(refuse_other_modalities(GEMMA4_OTHER),
                                                                   validate_counted_micro(_unified_tokens))),
    "llama4": Family(text="language_model.model", vision=("vision_model", "multi_modal_projector"),
                     head="language_model.lm_head", validate=validate_counted_micro(_llama4_tokens)),
}


def tiny_gemma4_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, sliding_window: int = 16):
    """A ``Gemma4Config`` (as gemma-4-E2B/E4B, scaled down): a 2-layer Gemma 4 vision tower of width 32 in 4-px
    patches pooled 2 x 2 (at most 70 soft tokens an image), no audio tower; a text model of ``num_layers`` (every
    third global, the others ``sliding_window``-token local; 16-wide local heads, 32-wide global heads with keys
    as values and one key-value head), per-layer inputs of width 8, the last third of the layers reusing the keys
    and values of the last earlier layer of their type, bidirectional image blocks on the local layers, logits
    soft-capped at 30; dense MLPs (the MoE variants' ``top_k_experts`` has no load-balancing loss to carry).
    Images are ``<|vision_start|>`` ``<|image_pad|>`` x n ``<|vision_end|>``."""
    from transformers import Gemma4Config
    types = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(num_layers)]
    types[-1] = "full_attention"
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // 4, global_head_dim=hidden_size // 2,
                 sliding_window=sliding_window, layer_types=types, hidden_size_per_layer_input=8,
                 vocab_size_per_layer_input=len(tokenizer), num_kv_shared_layers=num_layers // 3,
                 attention_k_eq_v=True, num_global_key_value_heads=1, use_bidirectional_attention="vision",
                 final_logit_softcapping=30.0)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, patch_size=4, pooling_kernel_size=2,
                  position_embedding_size=256)
    return Gemma4Config(text_config=text, vision_config=vision, audio_config=None, tie_word_embeddings=False,
                        image_token_id=token_id(tokenizer, "<|image_pad|>"), video_token_id=token_id(tokenizer, "<|video_pad|>"),
                        boi_token_id=token_id(tokenizer, "<|vision_start|>"), eoi_token_id=token_id(tokenizer, "<|vision_end|>"))


def tiny_gemma4_unified_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, sliding_window: int = 16):
    """A ``Gemma4UnifiedConfig`` (encoder-free, scaled down): the vision embedder over raw 8-px model patches (4-px
    patches merged 2 x 2 by the processor; layer norms, a dense layer to ``hidden_size``, a factorized 16-entry
    position table, the multimodal projection), no audio; :func:`tiny_gemma4_config`'s text model without
    per-layer inputs (every third layer global, 32-wide heads with keys as values and one key-value head; the last
    third reusing earlier layers' keys and values; bidirectional image blocks), logits soft-capped at 30, the head
    tied as the real model's. Images are ``<|vision_start|>`` ``<|image_pad|>`` x patches ``<|vision_end|>``."""
    from transformers import Gemma4UnifiedConfig
    types = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(num_layers)]
    types[-1] = "full_attention"
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // 4, global_head_dim=hidden_size // 2,
                 sliding_window=sliding_window, layer_types=types, num_kv_shared_layers=num_layers // 3,
                 attention_k_eq_v=True, num_global_key_value_heads=1, use_bidirectional_attention="vision",
                 final_logit_softcapping=30.0)
    vision = dict(patch_size=4, pooling_kernel_size=2, mm_embed_dim=hidden_size, mm_posemb_size=16,
                  output_proj_dims=hidden_size)
    return Gemma4UnifiedConfig(text_config=text, vision_config=vision, audio_config=None, tie_word_embeddings=True,
                               image_token_id=token_id(tokenizer, "<|image_pad|>"),
                               video_token_id=token_id(tokenizer, "<|video_pad|>"),
                               boi_token_id=token_id(tokenizer, "<|vision_start|>"),
                               eoi_token_id=token_id(tokenizer, "<|vision_end|>"))


def tiny_llama4_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Llama4Config`` (Llama 4 Scout, scaled down): a 2-layer Llama 4 vision tower of width 32 over 56-px
    tiles in 14-px patches (a class token, 2-D rotary), pixel-shuffled 2 x 2 to 4 tokens a tile by its 2-layer
    adapter, the projector into the text model; a text model whose every fourth layer has no rotary embedding
    (full attention, its queries scaled by the temperature tuning of ``floor_scale`` 4) and whose other layers
    attend in chunks of 8 tokens, every other layer a mixture of 4 experts (1 active, a shared expert beside it);
    untied embeddings, as the real models. The LM head is ``language_model.lm_head``. Images are
    ``<|image_pad|>`` x 4 per tile."""
    from transformers import Llama4Config
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // 4, intermediate_size_mlp=2 * hidden_size,
                 num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layer_interval=4,
                 attention_chunk_size=8, floor_scale=4, attn_scale=0.1, rope_parameters={"rope_type": "default",
                                                                                       "rope_theta": 10000.0})
    vision = dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=56,
                  patch_size=14, vision_output_dim=hidden_size, projector_input_dim=hidden_size,
                  projector_output_dim=hidden_size, pixel_shuffle_ratio=0.5, rope_parameters={
                      "rope_type": "default", "rope_theta": 10000.0})
    return Llama4Config(text_config=text, vision_config=vision, tie_word_embeddings=False,
                        image_token_index=token_id(tokenizer, "<|image_pad|>"),
                        boi_token_index=token_id(tokenizer, "<|vision_start|>"),
                        eoi_token_index=token_id(tokenizer, "<|vision_end|>"))


def tiny_mistral4_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Mistral4Config`` (Mistral Small 4, scaled down): multi-head latent attention (query rank 32, key-value
    rank 16, 8 rotary + 8 plain query/key dims, 16-wide values, 4 heads), the first layer dense, then 4 routed
    experts of width 32 (2 active) and one shared; YaRN rotary (factor 4 over 1,024 positions), untied
    embeddings."""
    from transformers import Mistral4Config
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": 0.1, "partial_rotary_factor": 0.5}
    text = text_keys(tokenizer, num_layers, hidden_size, moe_intermediate_size=hidden_size // 2, n_shared_experts=1,
                 n_routed_experts=4, num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                 qk_nope_head_dim=8, v_head_dim=16, first_k_dense_replace=1, rope_parameters=rope)
    text["num_key_value_heads"] = text["num_attention_heads"]  # latent attention: one key and value per head
    return Mistral4Config(**text)


# model_type -> tiny_<type>_config(tokenizer, num_layers=8, ...)
TINY: dict = {"gemma4": tiny_gemma4_config, "mistral4": tiny_mistral4_config, "llama4": tiny_llama4_config,
              "gemma4_unified": tiny_gemma4_unified_config, "muse_glimmer": tiny_muse_glimmer_config,
              "muse_spark": tiny_muse_spark_config}
FAMILIES["muse_glimmer"] = MUSE_GLIMMER
# Inkling: no rotary embedding, a hidden-state-conditioned relative-position bias and short-convolution masks
FAMILIES["inkling_mm_model"], TINY["inkling_mm_model"] = INKLING, tiny_inkling_config
# Gemma 3n's language model alone (its image-text model has a timm tower: families_llava_like.TIMM_FAMILIES)
FAMILIES["gemma3n_text"], TINY["gemma3n_text"] = GEMMA3N_TEXT, tiny_gemma3n_text_config
# Muse Spark: Muse Glimmer's image path and text attention (with experts); its audio tower is never run by the split
FAMILIES["muse_spark"] = replace(MUSE_GLIMMER, unused=("model.audio_tower",), validate=_both(
    refuse_other_modalities({"input_values": "audio", "pixel_values_videos": "video"}), MUSE_GLIMMER.validate))
# Nemotron-H Omni: Mamba-2, attention, MLP and MoE blocks, no rotary embedding (families/nemotron)
FAMILIES["nemotron_h_omni"], TINY["nemotron_h_omni"] = NEMOTRON_H_OMNI, tiny_nemotron_h_omni_config
REFUSED: dict[str, str] = {  # model_type -> why it cannot be split, in the user's terms
    "diffusion_gemma": "block diffusion: a Gemma encoder and a diffusion decoder that attends bidirectionally over "
                       "a noised block and reads the encoder's cache, trained by denoising, not a causal decoder "
                       "stack under a next-token loss",
    "glm5_next": "not declared yet: multi-stream hyper-connections (hidden states (B, L, hc_mult, H) between layers, "
                 "collapsed by hc_head before the norm) and DSA indexed attention whose top-k indices pass from "
                 "layer to layer",
    "hy_v4_vl": "not declared yet: multi-stream hyper-connections (hc_head collapses the streams before the norm) "
                "and DSA indexed attention",
    "qwen4_exp": "not declared yet: a gated hyper-connection mixer in place of the final norm, and DSA indexed "
                 "attention beside Gated DeltaNet layers",
}
