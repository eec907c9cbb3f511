"""Scaled-down real configs of the Gemma models, for the tests and the demo: ``TINY[model_type](tokenizer,
num_layers=8, hidden_size=64, ...)``.

Each builder takes the Qwen2 tokenizer of :func:`mpipe_hf.data.qwen2_tokenizer` and keeps its real vocabulary
(``len(tokenizer)``); the image markers are Qwen2 special tokens already in it (no token is added), as the
family's :class:`~mpipe_hf.data.family_data.FamilyData` names them for the processor: the image token is
``<|image_pad|>``, the begin and end of an image ``<|vision_start|>`` / ``<|vision_end|>``.
"""

from __future__ import annotations

from ...models.tiny import HEADS, VISION, lm_keys, qwen_special_ids, text_keys, token_id


def gemma3_layer_types(num_layers: int, period: int = 3) -> list[str]:
    """Gemma 3's interleaving scaled down: every ``period``-th layer global (``full_attention``), the others local
    (``sliding_attention``); the hub checkpoints use ``period`` 6. The last layer is global when no other is."""
    types = ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(num_layers)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    return types


def tiny_gemma3_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56,
                       sliding_window: int = 16, cls: type | None = None):
    """A ``Gemma3Config``: a 2-layer SigLIP tower on ``image_size``-px images in 14-px patches, pooled to 4 tokens
    per image (``mm_tokens_per_image``), and a Gemma 3 text model whose layers mix ``sliding_window``-token local
    attention and global attention (:func:`gemma3_layer_types`). Images are ``<|vision_start|>`` (begin of image),
    ``<|image_pad|>`` x 4, ``<|vision_end|>`` (end of image). ``cls``: the config class (ShieldGemma 2's is Gemma 3
    under another name)."""
    from transformers import Gemma3Config
    cls = cls or Gemma3Config
    head = hidden_size // HEADS
    text = lm_keys(tokenizer, "gemma3_text", num_layers, hidden_size, head_dim=head, query_pre_attn_scalar=head,
                   sliding_window=sliding_window, layer_types=gemma3_layer_types(num_layers))
    vision = dict(model_type="siglip_vision_model", image_size=image_size, patch_size=14, **VISION)
    return cls(text_config=text, vision_config=vision, mm_tokens_per_image=4,
               boi_token_index=token_id(tokenizer, "<|vision_start|>"),
               eoi_token_index=token_id(tokenizer, "<|vision_end|>"),
               image_token_index=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=False)


def tiny_paligemma_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56):
    """A ``PaliGemmaConfig``: a 2-layer SigLIP tower on ``image_size``-px images in 14-px patches (16 tokens an
    image, ``<|image_pad|>``) and a Gemma text model."""
    from transformers import PaliGemmaConfig
    text = lm_keys(tokenizer, "gemma", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    vision = dict(model_type="siglip_vision_model", image_size=image_size, patch_size=14,
                  projection_dim=hidden_size, **VISION)
    return PaliGemmaConfig(text_config=text, vision_config=vision,
                           image_token_index=token_id(tokenizer, "<|image_pad|>"),
                           vocab_size=len(tokenizer), projection_dim=hidden_size, hidden_size=hidden_size,
                           tie_word_embeddings=False)


def tiny_shieldgemma2_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56,
                             sliding_window: int = 16):
    """A ``ShieldGemma2Config``: :func:`tiny_gemma3_config`'s shape (ShieldGemma 2 is Gemma 3)."""
    from transformers import ShieldGemma2Config
    return tiny_gemma3_config(tokenizer, num_layers, hidden_size, image_size, sliding_window, ShieldGemma2Config)


def tiny_gemma3n_text_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, sliding_window: int = 16):
    """A ``Gemma3nTextConfig`` (as gemma-3n-E2B's, scaled down): ``num_layers`` layers (every third global, the
    others ``sliding_window``-token local; 16-wide heads, 2 key-value heads), AltUp over 4 streams, Laurel blocks of
    rank 8, per-layer inputs of width 8 from a table of the ids below ``<|vision_end|>`` (the real table stops where
    the image tokens start), the last third of the layers reusing the keys and values of the last earlier layer of
    their type, the first quarter's MLPs 95% sparse (the real model's first 10 of 35), logits soft-capped at 30, the
    head tied to the embedding."""
    from transformers import Gemma3nTextConfig
    types = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(num_layers)]
    types[-1] = "full_attention"
    sparse = num_layers // 4
    text = text_keys(tokenizer, num_layers, hidden_size, tie=True, head_dim=hidden_size // 4,
                     sliding_window=sliding_window, layer_types=types, hidden_size_per_layer_input=8,
                     vocab_size_per_layer_input=token_id(tokenizer, "<|vision_end|>"),
                     num_kv_shared_layers=num_layers // 3, laurel_rank=8, altup_num_inputs=4,
                     final_logit_softcapping=30.0,
                     activation_sparsity_pattern=[0.95] * sparse + [0.0] * (num_layers - sparse))
    text["intermediate_size"] = [text["intermediate_size"]] * num_layers
    return Gemma3nTextConfig(**text)


def tiny_gemma3n_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Gemma3nConfig`` (gemma-3n-E2B's layout, scaled down): :func:`tiny_gemma3n_text_config`'s text model; the
    timm MobileNet-V5 encoder (``mobilenetv5_300m_enc`` at 1/16 of its channels) whose multi-scale fusion adapter
    gives a 2 x 2 grid of 2048 channels (4 soft tokens an image; 16 x 16 on the hub), its blocks' layer scales
    starting at 1 (at timm's 1e-5 a random tower passes its attention blocks gradients of 1e-8 of its largest: a
    degenerate test); a one-layer audio conformer of width 32 that the split never runs. The token ranges follow the
    real vocabulary's: ``<|vision_start|>`` is the start-of-image text token, the 4 ids from ``<|vision_end|>`` (the
    end-of-image token, then the image token ``<|image_pad|>``) are ``embed_vision``'s hard tokens, the 8 after them
    ``embed_audio``'s. Building the model needs timm (and so torchvision); the config does not."""
    from transformers import Gemma3nConfig
    text = tiny_gemma3n_text_config(tokenizer, num_layers, hidden_size).to_dict()
    vision_offset = token_id(tokenizer, "<|vision_end|>")
    vision = dict(architecture="mobilenetv5_300m_enc", hidden_size=2048, vocab_size=4, vocab_offset=vision_offset,
                  model_args={"channel_multiplier": 0.0625, "msfa_output_resolution": 2,
                              "layer_scale_init_value": 1.0})
    audio = dict(hidden_size=32, vocab_size=8, vocab_offset=vision_offset + 4, conf_num_hidden_layers=1,
                 conf_num_attention_heads=2, input_feat_size=16, sscp_conv_channel_size=[8, 8])
    return Gemma3nConfig(text_config=text, vision_config=vision, audio_config=audio, vision_soft_tokens_per_image=4,
                         image_token_id=token_id(tokenizer, "<|image_pad|>"),
                         boi_token_id=token_id(tokenizer, "<|vision_start|>"), eoi_token_id=vision_offset,
                         audio_token_id=vision_offset + 5, boa_token_id=token_id(tokenizer, "<|box_start|>"),
                         eoa_token_id=vision_offset + 4, tie_word_embeddings=True)


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
                        image_token_id=token_id(tokenizer, "<|image_pad|>"),
                        video_token_id=token_id(tokenizer, "<|video_pad|>"),
                        boi_token_id=token_id(tokenizer, "<|vision_start|>"),
                        eoi_token_id=token_id(tokenizer, "<|vision_end|>"))


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


def tiny_muse_glimmer_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``MuseGlimmerConfig``: a 2-layer tower of width 32 (14-px patches, 2 frames a patch, a 4 x 4 learned
    position grid, window attention then full attention, 2 x 2 pixel shuffle to 128), the adapter (128 -> 64) and
    projection; a text model of ``num_layers`` (4 heads of 16, 2 key-value heads; every fourth from the last
    global without rotary embedding, the others 16-token sliding), logits times ``output_multiplier`` soft-capped
    at 20; untied embeddings, as the real model. Images are ``<|image_pad|>`` x (patches / 4).

    ``qk_scale_factor`` 1.0 (the real model's 3.87): the queries and keys are RMS-normalised without a learned
    scale, so this factor alone sets the attention's temperature, and a random model at 3.87 has logits spread
    by 3.87, each softmax nearly one-hot over near-ties: one AdamW step's fp32 rounding (a split's sums in another
    order) then moved the step-2 gradients by 2e-4 of their largest (Muse Spark's by 6.7e-3), against 8e-6 (4e-5)
    at 1.0 (:func:`~mpipe_hf.models.tiny.usual_temperature` gives Gemma 4 the same start)."""
    from transformers import MuseGlimmerConfig
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // 4, sliding_window=16,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, qk_scale_factor=1.0)
    vision = dict(patch_size=14, pos_emb_height=4, pos_emb_width=4, max_position_embeddings=16, patch_temporal=2,
                  merge_size=2, layer_types=["window_attention", "full_attention"], **VISION)
    ids = qwen_special_ids(tokenizer)
    return MuseGlimmerConfig(text_config=text, vision_config=vision, out_hidden_size=4 * VISION["hidden_size"],
                             projector_hidden_size=hidden_size, tie_word_embeddings=False,
                             image_token_id=ids["image_token_id"], video_token_id=ids["video_token_id"])


def tiny_muse_spark_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``MuseSparkConfig``: :func:`tiny_muse_glimmer_config`'s tower, adapter and text attention, every MLP but
    the first a mixture of 4 experts (2 active, sigmoid routing) of width 32 between a projection to 32 and back,
    residual gates; a 2-stage audio tower (the split leaves it unused: audio rows are refused)."""
    from transformers import MuseSparkConfig
    glimmer = tiny_muse_glimmer_config(tokenizer, num_layers, hidden_size).to_dict()
    text = {k: v for k, v in glimmer["text_config"].items() if k not in ("model_type", "layer_types",
                                                                         "layer_rope_theta")}
    text.update(moe_intermediate_size=hidden_size // 2, moe_hidden_size=hidden_size // 2, num_local_experts=4,
                num_experts_per_tok=2, mlp_layer_types=["dense"] + ["sparse"] * (num_layers - 1))
    vision = {k: v for k, v in glimmer["vision_config"].items() if k != "model_type"}
    audio = dict(patch_sizes=[4, 2], hidden_sizes=[16, 32], depths=[1, 1], num_hidden_layers=2,
                 out_hidden_size=hidden_size)
    return MuseSparkConfig(text_config=text, vision_config=vision, audio_config=audio,
                           out_hidden_size=glimmer["out_hidden_size"], projector_hidden_size=hidden_size,
                           tie_word_embeddings=False, image_token_id=glimmer["image_token_id"],
                           video_token_id=glimmer["video_token_id"],
                           audio_token_id=tokenizer.convert_tokens_to_ids("<|quad_start|>"))


TINY: dict = {"gemma3": tiny_gemma3_config, "paligemma": tiny_paligemma_config,
              "shieldgemma2": tiny_shieldgemma2_config, "gemma3n": tiny_gemma3n_config,
              "gemma3n_text": tiny_gemma3n_text_config, "gemma4": tiny_gemma4_config,
              "gemma4_unified": tiny_gemma4_unified_config, "muse_glimmer": tiny_muse_glimmer_config,
              "muse_spark": tiny_muse_spark_config}
"""``model_type`` -> ``tiny_<type>_config(tokenizer, num_layers=8, hidden_size=64, ...)``."""
