"""Scaled-down real Hugging Face configs of the LLaVA group, for the tests and the demo: ``TINY[model_type](tokenizer,
num_layers=8, hidden_size=64, ...)``.

Each builder takes the Qwen2 tokenizer of :func:`mpipe_hf.data.qwen2_tokenizer` and keeps its real vocabulary
(``len(tokenizer)``); the family's image markers are Qwen2 special tokens that already exist in it (no token is
added), as the family's :class:`~mpipe_hf.data.family_data.FamilyData` names them for the processor (the image
token ``<|image_pad|>``). Vision towers have 2 or 3 layers of width 32 on 28-128 px images, text models
``num_layers`` layers of ``hidden_size`` with 4 heads of ``hidden_size / 4`` and 2 key-value heads; embeddings are
untied unless the hub's are tied. FastVLM's and Perception-LM's towers are timm models: building their model needs
timm (and so torchvision); their configs do not.
"""

from __future__ import annotations

from transformers import (AriaConfig, AyaVisionConfig, CLIPVisionConfig, LlavaConfig, LlavaNextConfig,
                          LlavaNextVideoConfig, LlavaOnevisionConfig, VideoLlavaConfig, VipLlavaConfig)

from ...models.tiny import HEADS, VISION, lm_keys, text_keys, token_id

CLIP = dict(model_type="clip_vision_model", projection_dim=32, **VISION)


def tiny_llava_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56,
                      vision_feature_layer: int | list[int] = -2, strategy: str = "default") -> LlavaConfig:
    """A ``LlavaConfig``: a 3-layer CLIP vision tower on ``image_size``-px images in 14-px patches, a Qwen2 text
    model with the real vocabulary, and ``<|image_pad|>`` as the image token."""
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                              image_size=image_size, patch_size=14, projection_dim=32)
    return LlavaConfig(vision_config=vision.to_dict(), text_config={"model_type": "qwen2",
                                                                    **text_keys(tokenizer, num_layers, hidden_size)},
                       image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
                       vision_feature_layer=vision_feature_layer, vision_feature_select_strategy=strategy,
                       tie_word_embeddings=False)


def tiny_llava_next_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 28
                           ) -> LlavaNextConfig:
    """A ``LlavaNextConfig``: a 2-layer CLIP tower on ``image_size``-px crops in 14-px patches, "anyres" grids of
    up to 2 x 2 crops, and a Mistral text model (as llava-v1.6-mistral's)."""
    vision = CLIPVisionConfig(image_size=image_size, patch_size=14, projection_dim=32, **VISION)
    side = image_size
    text = lm_keys(tokenizer, "mistral", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    return LlavaNextConfig(vision_config=vision.to_dict(), text_config=text,
                           image_token_index=token_id(tokenizer, "<|image_pad|>"),
                           image_grid_pinpoints=[[side, 2 * side], [2 * side, side], [2 * side, 2 * side]],
                           vision_feature_select_strategy="default", vision_feature_layer=-2,
                           image_seq_length=(image_size // 14) ** 2, tie_word_embeddings=False)


def tiny_llava_onevision_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 28
                                ) -> LlavaOnevisionConfig:
    """A ``LlavaOnevisionConfig``: a 2-layer SigLIP tower on ``image_size``-px crops in 14-px patches, "anyres"
    grids of up to 2 x 2 crops (``anyres_max_9``), and a Qwen2 text model; videos are ``<|video_pad|>``."""
    side = image_size
    vision = dict(model_type="siglip_vision_model", image_size=image_size, patch_size=14, **VISION)
    grid = [[h * side, w * side] for h in (1, 2) for w in (1, 2)]
    return LlavaOnevisionConfig(vision_config=vision, text_config=lm_keys(tokenizer, "qwen2", num_layers, hidden_size),
                                image_token_index=token_id(tokenizer, "<|image_pad|>"),
                                video_token_index=token_id(tokenizer, "<|video_pad|>"), image_grid_pinpoints=grid,
                                vision_feature_select_strategy="full", vision_feature_layer=-1,
                                tie_word_embeddings=False)


def tiny_vipllava_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56
                         ) -> VipLlavaConfig:
    """A ``VipLlavaConfig``: a 3-layer CLIP tower on ``image_size``-px images in 14-px patches whose hidden states
    of layers ``(-2, -3, 1)`` are concatenated (VipLLaVA's multi-layer features; the hub's five of 24), the
    layer-normed projector, and a Llama text model."""
    vision = dict(CLIP, image_size=image_size, patch_size=14, num_hidden_layers=3)
    return VipLlavaConfig(vision_config=vision, text_config=lm_keys(tokenizer, "llama", num_layers, hidden_size),
                          image_token_index=token_id(tokenizer, "<|image_pad|>"), vision_feature_layer=[-2, -3, 1],
                          image_seq_length=(image_size // 14) ** 2, tie_word_embeddings=False)


def tiny_llava_next_video_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 28
                                 ) -> LlavaNextVideoConfig:
    """A ``LlavaNextVideoConfig``: :func:`tiny_llava_next_config`'s image path (a 2-layer CLIP tower,
    anyres grids of up to 2 x 2 crops) and a Llama text model; videos are ``<|video_pad|>`` (refused)."""
    side = image_size
    return LlavaNextVideoConfig(vision_config=dict(CLIP, image_size=image_size, patch_size=14),
                                text_config=lm_keys(tokenizer, "llama", num_layers, hidden_size),
                                image_token_index=token_id(tokenizer, "<|image_pad|>"),
                                video_token_index=token_id(tokenizer, "<|video_pad|>"),
                                image_grid_pinpoints=[[side, 2 * side], [2 * side, side], [2 * side, 2 * side]],
                                vision_feature_select_strategy="default", vision_feature_layer=-2,
                                image_seq_length=(image_size // 14) ** 2, tie_word_embeddings=False)


def tiny_video_llava_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56
                            ) -> VideoLlavaConfig:
    """A ``VideoLlavaConfig``: 2-layer CLIP image and video towers on ``image_size``-px images in 14-px patches and a
    Llama text model; videos are ``<|video_pad|>`` (refused)."""
    return VideoLlavaConfig(vision_config=dict(CLIP, image_size=image_size, patch_size=14),
                            text_config=lm_keys(tokenizer, "llama", num_layers, hidden_size),
                            image_token_index=token_id(tokenizer, "<|image_pad|>"),
                            video_token_index=token_id(tokenizer, "<|video_pad|>"),
                            image_seq_length=(image_size // 14) ** 2, tie_word_embeddings=False)


def _cohere2(tokenizer, num_layers: int, hidden_size: int, sliding_window: int = 16) -> dict:
    """A Cohere 2 text model: sliding-window layers with rotary positions and, every 4th, a global layer
    without them (``layer_types``, as Command R7B / A), its logits scaled by ``logit_scale`` 0.0625."""
    types = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(num_layers)]
    return lm_keys(tokenizer, "cohere2", num_layers, hidden_size, head_dim=hidden_size // HEADS, layer_types=types,
                   sliding_window=sliding_window, logit_scale=0.0625)


def _siglip(image_size: int, patch_size: int = 14) -> dict:
    return dict(model_type="siglip_vision_model", image_size=image_size, patch_size=patch_size,
                vision_use_head=False, **VISION)


def tiny_aya_vision_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56
                           ) -> AyaVisionConfig:
    """An ``AyaVisionConfig``: a 2-layer SigLIP tower on ``image_size``-px tiles in 14-px patches, pixel-shuffled
    by ``downsample_factor`` 2 to 4 tokens a tile, the SwiGLU projector, and a Cohere 2 text model
    (:func:`_cohere2`)."""
    return AyaVisionConfig(vision_config=_siglip(image_size), text_config=_cohere2(tokenizer, num_layers, hidden_size),
                           image_token_index=token_id(tokenizer, "<|image_pad|>"), downsample_factor=2,
                           tie_word_embeddings=False)


def tiny_cohere2_vision_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56):
    """A ``Cohere2VisionConfig``: a 2-layer SigLIP tower on ``image_size``-px tiles in 14-px patches, pixel-shuffled
    by ``downsample_factor`` 2 to 4 tokens a tile, the SwiGLU projector, and a Cohere 2 text model
    (:func:`_cohere2`); embeddings tied, as the hub's."""
    from transformers import Cohere2VisionConfig
    text = dict(_cohere2(tokenizer, num_layers, hidden_size), tie_word_embeddings=True)
    return Cohere2VisionConfig(vision_config=_siglip(image_size), text_config=text, downsample_factor=2,
                               alignment_intermediate_size=2 * hidden_size,
                               image_token_id=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=True)


def tiny_aria_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 490) -> AriaConfig:
    """An ``AriaConfig``: a 2-layer Idefics3-style tower on ``image_size``-px images in 14-px patches (490 px, the
    smaller of the two crop sides Aria's image processor accepts), the cross-attention projector pooling the patches
    to 4 queries (``projector_patch_to_query_dict``), and an Aria text model with 4 routed experts (2 active) and
    one shared expert."""
    vision = dict(model_type="idefics3_vision", image_size=image_size, patch_size=14, **VISION)
    text = lm_keys(tokenizer, "aria_text", num_layers, hidden_size, head_dim=hidden_size // HEADS, moe_num_experts=4,
                   moe_topk=2, moe_num_shared_experts=1)
    return AriaConfig(vision_config=vision, text_config=text, image_token_index=token_id(tokenizer, "<|image_pad|>"),
                      projector_patch_to_query_dict={(image_size // 14) ** 2: 4}, tie_word_embeddings=False)


def tiny_fast_vlm_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 128):
    """A ``FastVlmConfig``: its timm FastViT-HD tower (``fastvit_mci3``, reparameterised: ``inference_mode``) at
    one block a stage and widths 8 to 32, whose five stages downsample ``image_size``-px images 64 x (a 2 x 2
    grid of tokens at 128 px), a final 1 x 1 convolution to ``hidden_size`` 64 channels, the two-layer projector,
    and a Qwen2 text model. Its blocks' layer scales start at 1 and its weights are drawn at ``initializer_range``
    0.2: with timm's 1e-5 and the config's 0.02, a random tower this small passes gradients of 1e-10 to 1e-26 to its
    early stages (a degenerate test). Building the model needs timm (and so torchvision); the config does not."""
    from transformers import FastVlmConfig
    vision = dict(model_type="timm_wrapper", architecture="fastvit_mci3", do_pooling=False, global_pool="avg",
                  hidden_size=64, initializer_range=0.2,
                  model_args={"inference_mode": True, "layers": [1] * 5, "embed_dims": [8, 16, 16, 32, 32],
                              "mlp_ratios": [2] * 5, "layer_scale_init_value": 1.0})
    return FastVlmConfig(vision_config=vision, text_config=lm_keys(tokenizer, "qwen2", num_layers, hidden_size),
                         image_token_index=token_id(tokenizer, "<|image_pad|>"),
                         image_seq_length=(image_size // 64) ** 2,
                         tie_word_embeddings=False)


def tiny_perception_lm_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, tile_size: int = 32):
    """A ``PerceptionLMConfig``: its timm Perception Encoder ViT (``vit_pe_core_*``: a CLS token, 2-D rotary
    positions) of 2 blocks of width 32 on ``tile_size``-px tiles in 8-px patches (a 4 x 4 grid, CLS dropped),
    average-pooled 2 x 2 by the projector (``projector_pooling_ratio``, as the hub's 2: 4 tokens a tile), and a Llama
    text model whose head is tied to its embedding (as Perception-LM-1B's Llama 3.2). Building the model needs timm
    (and so torchvision); the config does not."""
    from transformers import PerceptionLMConfig
    vision = dict(model_type="timm_wrapper", architecture="vit_pe_core_tiny_patch16_384", do_pooling=False,
                  initializer_range=0.02,
                  model_args={"embed_dim": 32, "depth": 2, "num_heads": 2, "img_size": [tile_size, tile_size],
                              "patch_size": 8, "global_pool": "", "ref_feat_shape": [tile_size // 8] * 2})
    text = dict(lm_keys(tokenizer, "llama", num_layers, hidden_size), tie_word_embeddings=True)
    return PerceptionLMConfig(vision_config=vision, text_config=text, vision_use_cls_token=True,
                              projector_pooling_ratio=2, image_token_id=token_id(tokenizer, "<|image_pad|>"),
                              video_token_id=token_id(tokenizer, "<|video_pad|>"), tie_word_embeddings=True)


def tiny_llama4_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Llama4Config`` (Llama 4 Scout, scaled down): a 2-layer Llama 4 vision tower of width 32 over 56-px
    tiles in 14-px patches (a class token, 2-D rotary), pixel-shuffled 2 x 2 to 4 tokens a tile by its 2-layer
    adapter, the projector into the text model; a text model whose every fourth layer has no rotary embedding
    (full attention, its queries scaled by the temperature tuning of ``floor_scale`` 4) and whose other layers
    attend in chunks of 8 tokens, every other layer a mixture of 4 experts (1 active, a shared expert beside it);
    untied embeddings, as the real models. The LM head is ``language_model.lm_head``. Images are
    ``<|image_pad|>`` x 4 per tile."""
    from transformers import Llama4Config
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // 4,
                     intermediate_size_mlp=2 * hidden_size, num_local_experts=4, num_experts_per_tok=1,
                     interleave_moe_layer_step=2, no_rope_layer_interval=4, attention_chunk_size=8, floor_scale=4,
                     attn_scale=0.1, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    vision = dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=56,
                  patch_size=14, vision_output_dim=hidden_size, projector_input_dim=hidden_size,
                  projector_output_dim=hidden_size, pixel_shuffle_ratio=0.5, rope_parameters={
                      "rope_type": "default", "rope_theta": 10000.0})
    return Llama4Config(text_config=text, vision_config=vision, tie_word_embeddings=False,
                        image_token_index=token_id(tokenizer, "<|image_pad|>"),
                        boi_token_index=token_id(tokenizer, "<|vision_start|>"),
                        eoi_token_index=token_id(tokenizer, "<|vision_end|>"))


def tiny_lfm2_vl_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, patch_size: int = 8):
    """An ``Lfm2VlConfig``: a 2-layer SigLIP 2 tower (``patch_size``-px patches of images at their own aspect
    ratio, a learned 4 x 4 position grid resized to each image's), pixel-unshuffled by ``downsample_factor`` 2,
    the layer-normed projector, and an LFM2 text model in its real pattern (short-convolution layers, every third a
    full attention layer); embeddings tied, as the hub's."""
    from transformers import Lfm2VlConfig
    vision = dict(model_type="siglip2_vision_model", patch_size=patch_size, num_patches=16, **VISION)
    types = ["full_attention" if (i + 1) % 3 == 0 else "conv" for i in range(num_layers)]
    text = lm_keys(tokenizer, "lfm2", num_layers, hidden_size, layer_types=types, block_auto_adjust_ff_dim=False,
                   tie=True)
    return Lfm2VlConfig(vision_config=vision, text_config=text, projector_hidden_size=hidden_size,
                        image_token_id=token_id(tokenizer, "<|image_pad|>"), downsample_factor=2,
                        tie_word_embeddings=True)


def tiny_step3p7_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 96,
                        sliding_window: int = 16):
    """A ``Step3p7Config``: a 2-layer tower with 2-D rotary attention in 8-px patches (position table for
    ``image_size``-px global views, resized for the smaller local crops) and two stride-2 convolutions, the linear
    projector, and a Step 3.7 text model as the hub's: sliding-window layers between full ones (the first and
    every fourth), the first layer dense, then 4 routed experts of width ``hidden_size / 2`` (2 active) beside a
    shared one, each with its SwiGLU limits."""
    from transformers import Step3p7Config
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=image_size, patch_size=8,
                  mlp_ratio=2.0, max_position_embeddings=(image_size // 8) ** 2)
    types = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(num_layers)]
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // HEADS, layer_types=types,
                     sliding_window=sliding_window, mlp_layer_types=["dense"] + ["sparse"] * (num_layers - 1),
                     n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden_size // 2,
                     share_expert_dim=hidden_size // 2, swiglu_limits=[0] + [7.0] * (num_layers - 1),
                     swiglu_limits_shared=[0] + [16.0] * (num_layers - 1))
    return Step3p7Config(vision_config=vision, text_config=text, image_token_id=token_id(tokenizer, "<|image_pad|>"),
                         tie_word_embeddings=False)


def tiny_minimax_m3_vl_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``MiniMaxM3VLConfig``: a 2-layer tower with 3-D rotary attention over 8-px patches (2 frames deep) of
    images at their own size, merged 2 x 2 by the projector, and a MiniMax-M3 text model as the hub's: every other
    layer block-sparse (its lightning indexer keeps 2 blocks of 4 keys a query, the local one included), partial
    rotary embeddings, QK norms, the first layer dense, then 4 routed experts of width ``hidden_size / 2`` (2
    active) beside a shared one."""
    from transformers import MiniMaxM3VLConfig
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
                  image_size=64)
    head = hidden_size // HEADS
    text = dict(text_keys(tokenizer, num_layers, hidden_size, head_dim=head, rotary_dim=head // 2,
                          layer_types=["full_attention" if i % 2 == 0 else "minimax_m3_sparse"
                                       for i in range(num_layers)],
                          mlp_layer_types=["dense"] + ["sparse"] * (num_layers - 1), num_local_experts=4,
                          num_experts_per_tok=2, shared_intermediate_size=hidden_size // 2,
                          dense_intermediate_size=2 * hidden_size, index_n_heads=2, index_head_dim=head // 2,
                          index_block_size=4, index_topk_blocks=2, index_local_blocks=1),
                intermediate_size=hidden_size // 2)
    return MiniMaxM3VLConfig(vision_config=vision, text_config=text, projector_hidden_size=hidden_size,
                             image_token_index=token_id(tokenizer, "<|image_pad|>"),
                             video_token_index=token_id(tokenizer, "<|video_pad|>"), tie_word_embeddings=False)


def tiny_molmo2_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, crop_size: int = 32):
    """A ``Molmo2Config``: a 2-layer ViT on ``crop_size``-px crops in 8-px patches (the low-resolution view and
    the high-resolution crops), the adapter pooling each token's 2 x 2 patches of the concatenated features of ViT
    layers -1 and -2 by cross-attention, and a Molmo2 text model (QK norms, 8 more embedding rows than the vocabulary
    for the image markers) whose odd layers take the linearly scaled rotary embedding, the others the unscaled one
    (``rope_scaling_layers``)."""
    from transformers import Molmo2Config
    head = hidden_size // HEADS
    vision = dict(VISION, num_key_value_heads=2, head_dim=16, image_size=[crop_size, crop_size], patch_size=8)
    adapter = dict(vision_feature_layer=[-1, -2], hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                   head_dim=16, intermediate_size=64, text_hidden_size=hidden_size, initializer_range=0.2)
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=head, additional_vocab_size=8,
                     rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
                     rope_scaling_layers=list(range(1, num_layers, 2)))
    special = tokenizer.convert_tokens_to_ids
    return Molmo2Config(vision_config=vision, adapter_config=adapter, text_config=text,
                        image_patch_id=token_id(tokenizer, "<|image_pad|>"),
                        image_start_token_id=special("<|vision_start|>"),
                        low_res_image_start_token_id=special("<|quad_start|>"),
                        image_end_token_id=special("<|vision_end|>"), frame_start_token_id=special("<|box_start|>"),
                        frame_end_token_id=special("<|box_end|>"), tie_word_embeddings=False)


# model_type -> tiny_<type>_config(tokenizer, num_layers=8, hidden_size=64, ...)
TINY: dict = {
    "llava": tiny_llava_config,
    "llava_next": tiny_llava_next_config,
    "llava_onevision": tiny_llava_onevision_config,
    "vipllava": tiny_vipllava_config,
    "llava_next_video": tiny_llava_next_video_config,
    "video_llava": tiny_video_llava_config,
    "aya_vision": tiny_aya_vision_config,
    "cohere2_vision": tiny_cohere2_vision_config,
    "aria": tiny_aria_config,
    "fast_vlm": tiny_fast_vlm_config,
    "perception_lm": tiny_perception_lm_config,
    "llama4": tiny_llama4_config,
    "lfm2_vl": tiny_lfm2_vl_config,
    "step3p7": tiny_step3p7_config,
    "minimax_m3_vl": tiny_minimax_m3_vl_config,
    "molmo2": tiny_molmo2_config,
}
