"""Scaled-down real Hugging Face configs of the llava_like families of issue 38 (VipLLaVA, Aya Vision, GOT-OCR2,
PP-Chart2Table, ShieldGemma 2, Qianfan-OCR, LLaVA-NeXT-Video, LightOnOCR, DeepSeek-VL and its hybrid, Janus,
Video-LLaVA, Idefics2, DeepSeek-OCR-2), for the tests.

As :mod:`.tiny_vlms`: the Qwen2 tokenizer's real vocabulary (``len(tokenizer)``), the family's image token
``<|image_pad|>`` (other markers the Qwen2 special tokens named in :mod:`mpipe_hf.data.processors_llava_like`; no
token is added), vision towers of 2 layers of width 32 on 28-64 px images, text models of ``num_layers`` layers of
``hidden_size`` with 4 heads of ``hidden_size / 4`` and 2 key-value heads, untied embeddings.
"""

from __future__ import annotations

from transformers import (AriaConfig, AyaVisionConfig, DeepseekOcr2Config, DeepseekVLConfig, DeepseekVLHybridConfig,
                          GotOcr2Config, Idefics2Config, JanusConfig, LightOnOcrConfig, LlavaNextVideoConfig,
                          PPChart2TableConfig, QianfanOCRConfig, ShieldGemma2Config, VideoLlavaConfig, VipLlavaConfig)

from .tiny import HEADS, text_keys
from .tiny import VISION, lm_keys, token_id
from .tiny_vlms import tiny_gemma3_config

CLIP = dict(model_type="clip_vision_model", projection_dim=32, **VISION)


def _cohere2(tokenizer, num_layers: int, hidden_size: int, sliding_window: int = 16) -> dict:
    """A Cohere 2 text model: sliding-window layers with rotary positions and, every 4th, a global layer
    without them (``layer_types``, as Command R7B / A), its logits scaled by ``logit_scale`` 0.0625."""
    types = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(num_layers)]
    return lm_keys(tokenizer, "cohere2", num_layers, hidden_size, head_dim=hidden_size // HEADS, layer_types=types,
               sliding_window=sliding_window, logit_scale=0.0625)


def tiny_vipllava_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56
                         ) -> VipLlavaConfig:
    """A ``VipLlavaConfig``: a 3-layer CLIP tower on ``image_size``-px images in 14-px patches whose hidden states
    of layers ``(-2, -3, 1)`` are concatenated (VipLLaVA's multi-layer features; the hub's five of 24), the
    layer-normed projector, and a Llama text model."""
    vision = dict(CLIP, image_size=image_size, patch_size=14, num_hidden_layers=3)
    return VipLlavaConfig(vision_config=vision, text_config=lm_keys(tokenizer, "llama", num_layers, hidden_size),
                          image_token_index=token_id(tokenizer, "<|image_pad|>"), vision_feature_layer=[-2, -3, 1],
                          image_seq_length=(image_size // 14) ** 2, tie_word_embeddings=False)


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


def _sam(image_size: int) -> dict:
    """A 2-layer SAM-style (GOT-OCR2) tower: 8-px patches, windowed attention in layer 0, global in layer 1, a neck
    to 16 channels; weights drawn at ``initializer_range`` 0.02 (the config's default 1e-10 leaves a random tower's
    gradients at zero)."""
    return dict(hidden_size=32, mlp_dim=64, num_hidden_layers=2, num_attention_heads=2, image_size=image_size,
                patch_size=8, window_size=2, global_attn_indexes=[1], output_channels=16, initializer_range=0.02)


def tiny_got_ocr2_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 64,
                         cls=GotOcr2Config):
    """A ``GotOcr2Config`` (``cls``: ``PPChart2TableConfig``, the same model): the SAM-style tower of
    :func:`_sam` on ``image_size``-px tiles, two stride-2 convolutions to ``(image_size / 32)**2`` tokens a tile,
    and a Qwen2 text model."""
    return cls(vision_config=_sam(image_size), text_config=lm_keys(tokenizer, "qwen2", num_layers, hidden_size),
               image_token_index=token_id(tokenizer, "<|image_pad|>"), image_seq_length=(image_size // 32) ** 2,
               tie_word_embeddings=False)


def tiny_pp_chart2table_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 64
                               ) -> PPChart2TableConfig:
    """A ``PPChart2TableConfig``: :func:`tiny_got_ocr2_config`'s shape (the same model class)."""
    return tiny_got_ocr2_config(tokenizer, num_layers, hidden_size, image_size, cls=PPChart2TableConfig)


def tiny_shieldgemma2_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56,
                             sliding_window: int = 16) -> ShieldGemma2Config:
    """A ``ShieldGemma2Config``: :func:`~.tiny_vlms.tiny_gemma3_config`'s shape (ShieldGemma 2 is Gemma 3)."""
    return tiny_gemma3_config(tokenizer, num_layers, hidden_size, image_size, sliding_window, ShieldGemma2Config)


def tiny_qianfan_ocr_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56
                            ) -> QianfanOCRConfig:
    """A ``QianfanOCRConfig``: a 2-layer InternViT-style tower on ``image_size``-px tiles in 14-px patches,
    pixel-shuffled by ``downsample_ratio`` 0.5 to 4 tokens a tile, and a Qwen3 text model. The tower's stochastic
    depth is off (``drop_path_rate`` 0; the hub config's 0.1 drops residual branches at random in training)."""
    vision = dict(image_size=[image_size, image_size], patch_size=[14, 14], drop_path_rate=0.0, **VISION)
    text = lm_keys(tokenizer, "qwen3", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    return QianfanOCRConfig(vision_config=vision, text_config=text, image_token_id=token_id(tokenizer, "<|image_pad|>"),
                            image_seq_length=(image_size // 14) ** 2 // 4, downsample_ratio=0.5,
                            tie_word_embeddings=False)


def tiny_llava_next_video_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 28
                                 ) -> LlavaNextVideoConfig:
    """A ``LlavaNextVideoConfig``: :func:`~.tiny_vlms.tiny_llava_next_config`'s image path (a 2-layer CLIP tower,
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


def tiny_lighton_ocr_config(tokenizer, num_layers: int = 8, hidden_size: int = 64) -> LightOnOcrConfig:
    """A ``LightOnOcrConfig``: a 2-layer Pixtral tower in 8-px patches (images up to 64 px, any aspect ratio), the
    2 x 2 patch merger, and a Qwen3 text model."""
    vision = dict(model_type="pixtral", image_size=64, patch_size=8, head_dim=16, **VISION)
    text = lm_keys(tokenizer, "qwen3", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    return LightOnOcrConfig(vision_config=vision, text_config=text, image_token_id=token_id(tokenizer, "<|image_pad|>"),
                            spatial_merge_size=2, tie_word_embeddings=False)


def tiny_deepseek_vl_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56
                            ) -> DeepseekVLConfig:
    """A ``DeepseekVLConfig``: a 2-layer SigLIP tower on ``image_size``-px images in 14-px patches, the MLP aligner,
    and a Llama text model."""
    return DeepseekVLConfig(vision_config=_siglip(image_size), text_config=lm_keys(tokenizer, "llama", num_layers,
                                                                               hidden_size),
                            image_token_id=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=False)


def tiny_deepseek_vl_hybrid_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56,
                                   high_res_size: int = 64) -> DeepseekVLHybridConfig:
    """A ``DeepseekVLHybridConfig``: :func:`tiny_deepseek_vl_config`'s low-resolution SigLIP tower beside a 2-layer
    SAM tower on ``high_res_size``-px images (8-px patches, layer 1 global; its features interpolated to the
    SigLIP grid), the hybrid aligner, and a Llama text model."""
    sam = dict(model_type="sam_vision_model", **_sam(high_res_size))
    return DeepseekVLHybridConfig(vision_config=_siglip(image_size), high_res_vision_config=sam,
                                  text_config=lm_keys(tokenizer, "llama", num_layers, hidden_size),
                                  image_token_id=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=False)


def tiny_janus_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 64) -> JanusConfig:
    """A ``JanusConfig``: a 2-layer SigLIP-like tower on ``image_size``-px images in 16-px patches (16 tokens an
    image), the aligner, a Llama text model, and a small VQ-VAE generation head (unused for understanding)."""
    vision = dict(image_size=image_size, patch_size=16, projection_dim=hidden_size, depth=2,
                  num_image_tokens=(image_size // 16) ** 2, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=2, mlp_ratio=2.0)
    vq = dict(embed_dim=8, num_embeddings=64, latent_channels=32, base_channels=32, channel_multiplier=[1, 2],
              num_res_blocks=1, num_patches=image_size // 16, projection_dim=hidden_size,
              image_token_embed_dim=hidden_size)
    return JanusConfig(vision_config=vision, vq_config=vq, text_config=lm_keys(tokenizer, "llama", num_layers, hidden_size),
                       image_token_id=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=False)


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


def tiny_idefics2_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 64
                         ) -> Idefics2Config:
    """An ``Idefics2Config``: a 2-layer SigLIP-like tower on images of up to ``image_size`` px in 8-px patches (any
    aspect ratio, padded), the connector's MLP and a 2-layer Perceiver resampler to 8 latents an image
    (``resampler_n_latents``; the hub's 64), and a Mistral text model."""
    vision = dict(image_size=image_size, patch_size=8, **VISION)
    perceiver = dict(hidden_size=hidden_size, resampler_n_latents=8, resampler_depth=2, resampler_n_heads=2,
                     resampler_head_dim=16, num_key_value_heads=1)
    text = lm_keys(tokenizer, "mistral", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    return Idefics2Config(vision_config=vision, perceiver_config=perceiver, text_config=text,
                          image_token_id=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=False)


def tiny_deepseek_ocr2_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 128
                              ) -> DeepseekOcr2Config:
    """A ``DeepseekOcr2Config`` scaled as the hub's 1,024-px global view and 768-px tiles are: :func:`_sam`'s tower
    in 2-px patches (windows of 4 in layer 0, global attention in layer 1, as the hub's tower mixes them) on
    ``image_size``-px global views (a 64 x 64 grid, downsampled 4 x to the 256 queries of
    ``query_1024_resolution``) and ``image_size * 3 / 4``-px tiles (the 144 of ``query_768_resolution``). The grids
    cannot shrink: the processor counts a view's tokens as its grid / 4 squared, which must equal the 256 or 144
    queries the tower returns, and a tile is 3/4 of the global view. Then a 2-layer Qwen2-style encoder of width 32
    over patches and queries, and a DeepSeek-V2 text model with plain multi-head attention: the first layer dense,
    then 4 routed experts of width ``hidden_size / 2`` (2 active) and one shared."""
    sam = dict(_sam(image_size), patch_size=2, window_size=4, downsample_channels=[32, VISION["hidden_size"]])
    text = lm_keys(tokenizer, "deepseek_ocr2_text", num_layers, hidden_size, moe_intermediate_size=hidden_size // 2,
               n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
               mlp_layer_types=["dense"] + ["sparse"] * (num_layers - 1))
    return DeepseekOcr2Config(vision_config=dict(sam_config=sam, encoder_config=dict(VISION, num_key_value_heads=1)),
                              text_config=text, image_token_id=token_id(tokenizer, "<|image_pad|>"),
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
                        image_token_id=token_id(tokenizer, "<|image_pad|>"), downsample_factor=2, tie_word_embeddings=True)


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
                      layer_types=["full_attention" if i % 2 == 0 else "minimax_m3_sparse" for i in range(num_layers)],
                      mlp_layer_types=["dense"] + ["sparse"] * (num_layers - 1), num_local_experts=4,
                      num_experts_per_tok=2, shared_intermediate_size=hidden_size // 2,
                      dense_intermediate_size=2 * hidden_size, index_n_heads=2, index_head_dim=head // 2,
                      index_block_size=4, index_topk_blocks=2, index_local_blocks=1),
                intermediate_size=hidden_size // 2)
    return MiniMaxM3VLConfig(vision_config=vision, text_config=text, projector_hidden_size=hidden_size,
                             image_token_index=token_id(tokenizer, "<|image_pad|>"),
                             video_token_index=token_id(tokenizer, "<|video_pad|>"), tie_word_embeddings=False)


def tiny_unlimited_ocr_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 64,
                              sliding_window: int = 16):
    """An ``UnlimitedOcrConfig`` scaled as the hub's global view and tiles are: :func:`_sam`'s tower in 4-px
    patches on ``image_size``-px global views (a 16 x 16 grid, two stride-2 convolutions to 4 x 4 queries, a
    newline after each row of them) and ``image_size * 3 / 4``-px tiles (3 x 3 queries each), a 2-layer CLIP-style
    encoder over the SAM features, and a DeepSeek-V2-style text model with plain multi-head attention whose layers
    are reference sliding-window (``sliding_window`` tokens once decoding; the whole prompt in training) but every
    fourth full: the first dense, then 4 routed experts of width ``hidden_size / 2`` (2 active) and one shared."""
    from transformers import UnlimitedOcrConfig
    sam = dict(_sam(image_size), patch_size=4, window_size=4, global_attn_indexes=[1],
               downsample_channels=[32, VISION["hidden_size"]])
    encoder = dict(VISION, image_size=56, patch_size=14)
    text = dict(text_keys(tokenizer, num_layers, hidden_size, sliding_window=sliding_window,
                      layer_types=["full_attention" if i % 4 == 3 else "reference_sliding_attention"
                                   for i in range(num_layers)],
                      mlp_layer_types=["dense"] + ["sparse"] * (num_layers - 1), n_routed_experts=4,
                      num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=hidden_size // 2),
                num_key_value_heads=HEADS)
    return UnlimitedOcrConfig(vision_config=dict(sam_config=sam, encoder_config=encoder), text_config=text,
                              image_token_id=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=False)


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
                         image_token_index=token_id(tokenizer, "<|image_pad|>"), image_seq_length=(image_size // 64) ** 2,
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
