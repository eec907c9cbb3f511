"""Scaled-down real Hugging Face configs of the non-Qwen vision-language families (Gemma 3, PaliGemma, InternVL,
Mistral 3, LLaVA-NeXT, LLaVA-OneVision, Idefics3, SmolVLM), for the tests and the demo.

Each builder takes the Qwen2 tokenizer of :func:`mpipe_hf.data.qwen2_tokenizer` and keeps its real vocabulary
(``len(tokenizer)``); the family's image markers are Qwen2 special tokens that already exist in it (no token is
added), as :data:`mpipe_hf.data.processors_vlm.FAMILY_TOKENS` names them for the processor: the image token is
``<|image_pad|>`` and, where the family has more markers, ``<|vision_start|>`` / ``<|vision_end|>`` /
``<|vision_pad|>`` stand in (Gemma 3's begin/end of image, InternVL's ``<img>``/``</img>``, Pixtral's
``[IMG_END]``/``[IMG_BREAK]``). Vision towers have 2 layers of width 32 on 28-64 px images, the text model 4 heads of
``hidden_size / 4`` and 2 key-value heads; embeddings are untied.
"""

from __future__ import annotations

from transformers import (CLIPVisionConfig, Gemma3Config, Idefics3Config, InternVLConfig, LlavaNextConfig,
                          LlavaOnevisionConfig, Mistral3Config, PaliGemmaConfig, SmolVLMConfig)

from .tiny import HEADS, VISION, lm_keys, text_keys, token_id

def gemma3_layer_types(num_layers: int, period: int = 3) -> list[str]:
    """Gemma 3's interleaving scaled down: every ``period``-th layer global (``full_attention``), the others local
    (``sliding_attention``); the hub checkpoints use ``period`` 6. The last layer is global when no other is."""
    types = ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(num_layers)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    return types


def tiny_gemma3_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56,
                       sliding_window: int = 16, cls: type = Gemma3Config) -> Gemma3Config:
    """A ``Gemma3Config``: a 2-layer SigLIP tower on ``image_size``-px images in 14-px patches, pooled to 4 tokens
    per image (``mm_tokens_per_image``), and a Gemma 3 text model whose layers mix ``sliding_window``-token local
    attention and global attention (:func:`gemma3_layer_types`). Images are ``<|vision_start|>`` (begin of image),
    ``<|image_pad|>`` x 4, ``<|vision_end|>`` (end of image). ``cls``: the config class (ShieldGemma 2's is Gemma 3
    under another name)."""
    head = hidden_size // HEADS
    text = lm_keys(tokenizer, "gemma3_text", num_layers, hidden_size, head_dim=head, query_pre_attn_scalar=head,
               sliding_window=sliding_window, layer_types=gemma3_layer_types(num_layers))
    vision = dict(model_type="siglip_vision_model", image_size=image_size, patch_size=14, **VISION)
    return cls(text_config=text, vision_config=vision, mm_tokens_per_image=4,
               boi_token_index=token_id(tokenizer, "<|vision_start|>"), eoi_token_index=token_id(tokenizer, "<|vision_end|>"),
               image_token_index=token_id(tokenizer, "<|image_pad|>"), tie_word_embeddings=False)


def tiny_paligemma_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56
                          ) -> PaliGemmaConfig:
    """A ``PaliGemmaConfig``: a 2-layer SigLIP tower on ``image_size``-px images in 14-px patches (16 tokens an
    image, ``<|image_pad|>``) and a Gemma text model."""
    text = lm_keys(tokenizer, "gemma", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    vision = dict(model_type="siglip_vision_model", image_size=image_size, patch_size=14,
                  projection_dim=hidden_size, **VISION)
    return PaliGemmaConfig(text_config=text, vision_config=vision, image_token_index=token_id(tokenizer, "<|image_pad|>"),
                           vocab_size=len(tokenizer), projection_dim=hidden_size, hidden_size=hidden_size,
                           tie_word_embeddings=False)


def tiny_internvl_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56
                         ) -> InternVLConfig:
    """An ``InternVLConfig``: a 2-layer InternViT on ``image_size``-px tiles in 14-px patches, pixel-shuffled by
    ``downsample_ratio`` 0.5 to 4 tokens a tile, and a Qwen2 text model (as InternVL3's)."""
    vision = dict(model_type="internvl_vision", image_size=[image_size, image_size], patch_size=[14, 14], **VISION)
    seq = (image_size // 14) ** 2 // 4
    return InternVLConfig(vision_config=vision, text_config=lm_keys(tokenizer, "qwen2", num_layers, hidden_size),
                          image_token_id=token_id(tokenizer, "<|image_pad|>"), image_seq_length=seq,
                          downsample_ratio=0.5, tie_word_embeddings=False)


def tiny_mistral3_config(tokenizer, num_layers: int = 8, hidden_size: int = 64) -> Mistral3Config:
    """A ``Mistral3Config``: a 2-layer Pixtral tower in 8-px patches (images up to 64 px, any aspect ratio), the
    2 x 2 patch merger, and a Mistral text model. Images are ``<|image_pad|>`` rows split by ``<|vision_pad|>``
    (Pixtral's ``[IMG_BREAK]``) and closed by ``<|vision_end|>`` (``[IMG_END]``)."""
    vision = dict(model_type="pixtral", image_size=64, patch_size=8, head_dim=16, **VISION)
    text = lm_keys(tokenizer, "mistral", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    return Mistral3Config(vision_config=vision, text_config=text, image_token_index=token_id(tokenizer, "<|image_pad|>"),
                          spatial_merge_size=2, vision_feature_layer=-1, tie_word_embeddings=False)


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


def _idefics_like(cls, vision_type: str, tokenizer, num_layers: int, hidden_size: int, image_size: int):
    vision = dict(model_type=vision_type, image_size=image_size, patch_size=8, **VISION)
    text = lm_keys(tokenizer, "llama", num_layers, hidden_size, head_dim=hidden_size // HEADS)
    return cls(vision_config=vision, text_config=text, image_token_id=token_id(tokenizer, "<|image_pad|>"),
               scale_factor=2, tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id)


def tiny_idefics3_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 32
                         ) -> Idefics3Config:
    """An ``Idefics3Config``: a 2-layer SigLIP-like tower on ``image_size``-px tiles in 8-px patches, pixel-shuffled
    by ``scale_factor`` 2 to 4 tokens a tile, and a Llama text model."""
    return _idefics_like(Idefics3Config, "idefics3_vision", tokenizer, num_layers, hidden_size, image_size)


def tiny_smolvlm_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 32
                        ) -> SmolVLMConfig:
    """A ``SmolVLMConfig``: as :func:`tiny_idefics3_config` (SmolVLM is Idefics3 with another text model and
    prompt)."""
    return _idefics_like(SmolVLMConfig, "smolvlm_vision", tokenizer, num_layers, hidden_size, image_size)


TINY_VLMS = {
    "gemma3": tiny_gemma3_config,
    "paligemma": tiny_paligemma_config,
    "internvl": tiny_internvl_config,
    "mistral3": tiny_mistral3_config,
    "llava_next": tiny_llava_next_config,
    "llava_onevision": tiny_llava_onevision_config,
    "idefics3": tiny_idefics3_config,
    "smolvlm": tiny_smolvlm_config,
}
