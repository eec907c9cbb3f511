"""Scaled-down real Hugging Face configs for the demo and the tests (same classes as the real checkpoints)."""

from __future__ import annotations

import zlib

import torch
from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, Qwen2_5_VLConfig, Qwen2Config, Qwen2VLConfig,
                          Qwen3Config, Qwen3VLConfig)

HEADS = 4


def text_keys(tokenizer, num_layers: int, hidden_size: int, tie: bool = False, **extra) -> dict:
    """Text-model keys shared by every tiny config: the real vocabulary, 4 heads of ``hidden_size / 4``, 2 key-value
    heads."""
    return dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                num_hidden_layers=num_layers, num_attention_heads=HEADS, num_key_value_heads=2,
                max_position_embeddings=4096, tie_word_embeddings=tie, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=None, eos_token_id=tokenizer.eos_token_id, **extra)


def mrope_keys(hidden_size: int) -> dict:
    half = hidden_size // HEADS // 2
    return {"rope_type": "default", "rope_theta": 10000.0,
            "mrope_section": [half - 2 * (half // 3), half // 3, half // 3]}


def qwen_special_ids(tokenizer) -> dict:
    ids = tokenizer.convert_tokens_to_ids
    return dict(image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
                vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))


VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)


def sam_keys(image_size: int) -> dict:
    """A 2-layer SAM-style vision config (GOT-OCR2's tower, also DeepSeek-OCR-2's and Unlimited-OCR's): 8-px
    patches, windowed attention in layer 0, global in layer 1, a neck to 16 channels; weights drawn at
    ``initializer_range`` 0.02 (the config's default 1e-10 leaves a random tower's gradients at zero)."""
    return dict(hidden_size=32, mlp_dim=64, num_hidden_layers=2, num_attention_heads=2, image_size=image_size,
                patch_size=8, window_size=2, global_attn_indexes=[1], output_channels=16, initializer_range=0.02)


def token_id(tokenizer, token: str) -> int:
    """The id of ``token`` in ``tokenizer``'s vocabulary (ValueError when it has none: no token is ever added)."""
    ids = tokenizer.get_vocab()
    if token not in ids:
        raise ValueError(f"the tokenizer has no {token!r}; the tiny configs use the Qwen2 special tokens")
    return ids[token]


def lm_keys(tokenizer, model_type: str, num_layers: int, hidden_size: int, **extra) -> dict:
    """A text config dict of ``model_type`` (the shared tiny keys of :func:`text_keys`)."""
    return {"model_type": model_type, **text_keys(tokenizer, num_layers, hidden_size, **extra)}


def tiny_qwen2_5_vl_config(tokenizer, num_layers: int = 8, vision_depth: int = 4, hidden_size: int = 64
                           ) -> Qwen2_5_VLConfig:
    """A ``Qwen2_5_VLConfig`` with the real vocabulary and special-token ids of ``tokenizer``, 4 heads of 16,
    ``mrope_section`` summing to ``head_dim / 2``, windowed vision attention, and untied embeddings."""
    return Qwen2_5_VLConfig(
        text_config=text_keys(tokenizer, num_layers, hidden_size, rope_parameters=mrope_keys(hidden_size)),
        vision_config=dict(depth=vision_depth, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                           temporal_patch_size=2, spatial_merge_size=2, window_size=112,
                           out_hidden_size=hidden_size, fullatt_block_indexes=[vision_depth - 1]),
        tie_word_embeddings=False, **qwen_special_ids(tokenizer))


def tiny_qwen2_vl_config(tokenizer, num_layers: int = 8, vision_depth: int = 2, hidden_size: int = 64
                         ) -> Qwen2VLConfig:
    """A ``Qwen2VLConfig``: as :func:`tiny_qwen2_5_vl_config`, with Qwen2-VL's vision tower (``embed_dim`` 32,
    LayerNorm blocks, no windows)."""
    return Qwen2VLConfig(
        text_config=text_keys(tokenizer, num_layers, hidden_size, rope_parameters=mrope_keys(hidden_size)),
        vision_config=dict(depth=vision_depth, embed_dim=32, hidden_size=hidden_size, mlp_ratio=2, num_heads=2,
                           patch_size=14, temporal_patch_size=2, spatial_merge_size=2),
        tie_word_embeddings=False, **qwen_special_ids(tokenizer))


def tiny_qwen3_vl_config(tokenizer, num_layers: int = 8, vision_depth: int = 3, hidden_size: int = 64,
                         deepstack_visual_indexes: tuple[int, ...] = (0, 1, 2)) -> Qwen3VLConfig:
    """A ``Qwen3VLConfig``: 16-px patches, a learned 8 x 8 position grid, interleaved M-RoPE, and DeepStack
    features from vision blocks ``deepstack_visual_indexes`` (added after decoder layers ``0 .. K-1``)."""
    rope = {**mrope_keys(hidden_size), "mrope_interleaved": True}
    return Qwen3VLConfig(
        text_config=text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // HEADS, rope_parameters=rope),
        vision_config=dict(depth=vision_depth, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=hidden_size,
                           num_position_embeddings=64, deepstack_visual_indexes=list(deepstack_visual_indexes)),
        tie_word_embeddings=False, **qwen_special_ids(tokenizer))


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


def tiny_causal_lm_config(tokenizer, model_type: str = "qwen2", num_layers: int = 8, hidden_size: int = 64,
                          tie_word_embeddings: bool = False):
    """A ``Qwen2Config``, ``LlamaConfig`` or ``Qwen3Config`` (``model_type``) with the real vocabulary of
    ``tokenizer``, 4 heads of ``hidden_size / 4`` and 2 key-value heads (Qwen3: with its q/k norms).

    Raises:
        ValueError: ``model_type`` is not ``"qwen2"``, ``"llama"`` or ``"qwen3"``.
    """
    classes = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3": Qwen3Config}
    if model_type not in classes:
        raise ValueError(f"model_type must be one of {sorted(classes)}, got {model_type!r}")
    extra = {"head_dim": hidden_size // HEADS} if model_type == "qwen3" else {}
    return classes[model_type](**text_keys(tokenizer, num_layers, hidden_size, tie_word_embeddings, **extra))


def qwen_vision_keys(hidden_size: int, depth: int = 2, **extra) -> dict:
    """A 2-block Qwen3-style vision tower (16-px patches, an 8 x 8 learned position grid) feeding ``hidden_size``."""
    return dict(depth=depth, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, temporal_patch_size=2,
                spatial_merge_size=2, out_hidden_size=hidden_size, num_position_embeddings=64, **extra)


def moe_keys(num_experts: int = 4, top_k: int = 2, hidden_size: int = 64) -> dict:
    return dict(moe_intermediate_size=hidden_size, num_experts_per_tok=top_k, router_aux_loss_coef=0.01,
                output_router_logits=True, num_experts=num_experts)


def tiny_qwen3_5_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, moe: bool = False):
    """A ``Qwen3_5Config`` (``moe``: ``Qwen3_5MoeConfig``): hybrid Gated DeltaNet / full attention layers (three
    ``linear_attention`` to one ``full_attention``, as the real checkpoints), gated full attention with a partial
    rotary of half the 32-wide head, interleaved M-RoPE, a Qwen3-style tower; ``moe``: 4 experts, 2 active per
    token, a shared expert, the router's load-balancing loss weighted 0.01."""
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig
    head_dim = 2 * hidden_size // HEADS
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "mrope_section": [head_dim // 8, head_dim // 16, head_dim // 16], "mrope_interleaved": True}
    types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(num_layers)]
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=head_dim, rope_parameters=rope, layer_types=types,
                 linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                 linear_num_value_heads=4)
    if moe:
        text.update(moe_keys(hidden_size=hidden_size), shared_expert_intermediate_size=hidden_size)
        text.pop("intermediate_size")
    cls = Qwen3_5MoeConfig if moe else Qwen3_5Config
    return cls(text_config=text, vision_config=qwen_vision_keys(hidden_size), tie_word_embeddings=False,
               **qwen_special_ids(tokenizer))


def tiny_qwen3_vl_moe_config(tokenizer, num_layers: int = 8, hidden_size: int = 64,
                             deepstack_visual_indexes: tuple[int, ...] = (0, 1)):
    """A ``Qwen3VLMoeConfig``: :func:`tiny_qwen3_vl_config`'s shape with sparse MoE blocks (4 experts, 2 active,
    ``decoder_sparse_step`` 1), DeepStack features from 2 vision blocks, the load-balancing loss weighted 0.01."""
    from transformers import Qwen3VLMoeConfig
    rope = {**mrope_keys(hidden_size), "mrope_interleaved": True}
    moe = moe_keys(hidden_size=hidden_size)
    moe["num_local_experts"] = moe.pop("num_experts")
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // HEADS, rope_parameters=rope,
                 decoder_sparse_step=1, mlp_only_layers=[], **moe)
    return Qwen3VLMoeConfig(text_config=text, tie_word_embeddings=False, **qwen_special_ids(tokenizer),
                            vision_config=qwen_vision_keys(hidden_size, depth=2,
                                                       deepstack_visual_indexes=list(deepstack_visual_indexes)))


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


def non_degenerate(model: torch.nn.Module, std: float = 0.02) -> torch.nn.Module:
    """``model`` with every floating-point parameter that its initialisation left all zeros drawn afresh from
    ``N(0, std^2)`` (a generator seeded by the parameter's name), in place (issue 38), for the tests' models and
    the tiny folders of ``scripts/make/make_tiny_models.py``. transformers zero-initialises
    some weights (Gemma 3's ``mm_input_projection_weight``, biases, (1 + w) norms): with a zero projection the image
    features are exactly 0, every tower gradient is 0 on both sides, and a gradient check compares zero with zero.
    Gated DeltaNet's decay rates ``A_log`` (Qwen3.5), initialised to ``log U(0.01, 16)``, are drawn from
    ``log U(0.05, 0.5)``: with rates up to 16 the decay saturates over a token, and the gradients of ``A_log`` and
    ``dt_bias`` fall to 1e-8, under fp32's noise in them. A text attention that scales its logits by 1.0 starts at
    the usual temperature (:func:`usual_temperature`). Parameters are visited once (tied weights stay tied)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            if name.endswith("A_log"):
                param.copy_(torch.rand(param.shape, generator=gen).mul(0.45).add(0.05).log())
            elif param.is_floating_point() and param.numel() and not param.any():
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * std)
        usual_temperature(model)
    return model


def usual_temperature(model: torch.nn.Module) -> None:
    """In place: each text attention of ``model`` whose logits are ``q . k`` unscaled (``scaling == 1.0``: Gemma 4,
    Gemma 4 Unified, Gemma 3n), its queries and keys RMS-normalised with learned scales (``q_norm``, ``k_norm``),
    gets both scales times ``head_dim ** -0.25``: its logits start at ``q . k / sqrt(head_dim)``, as any
    randomly initialised attention. The real models learn these scales, and with them their temperature; left at
    their initial 1.0, a random model's logits have a spread of ``sqrt(head_dim)`` (4 to 5.7 in the tiny
    configs), each softmax nearly one-hot over near-ties, and its gradients so sensitive to the parameters that
    the fp32 rounding of one AdamW step (a split's sums in another order) moved the tiny Gemma 4's step-2 gradients
    by 2.9e-4 of their largest, 27 times Gemma 3's 1.1e-5; with these scales, 1.9e-5. A layer that reuses
    another's keys (shared key/value layers) has only ``q_norm``."""
    for module in model.modules():
        if type(module).__name__.endswith("TextAttention") and getattr(module, "scaling", None) == 1.0:
            for norm in (getattr(module, "q_norm", None), getattr(module, "k_norm", None)):
                if getattr(norm, "weight", None) is not None:
                    norm.weight.mul_(module.head_dim ** -0.25)
