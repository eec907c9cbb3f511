"""What the families' scaled-down real configs share (each group's ``tiny.py``, for the demo and the tests: the
same config classes as the real checkpoints): the text keys over the Qwen2 tokenizer's vocabulary, the small vision
tower, the Qwen2 special tokens standing in for each family's markers, and the weights made non-degenerate."""

from __future__ import annotations

import zlib

import torch

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


def qwen_vision_keys(hidden_size: int, depth: int = 2, **extra) -> dict:
    """A 2-block Qwen3-style vision tower (16-px patches, an 8 x 8 learned position grid) feeding ``hidden_size``."""
    return dict(depth=depth, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, temporal_patch_size=2,
                spatial_merge_size=2, out_hidden_size=hidden_size, num_position_embeddings=64, **extra)


def moe_keys(num_experts: int = 4, top_k: int = 2, hidden_size: int = 64) -> dict:
    return dict(moe_intermediate_size=hidden_size, num_experts_per_tok=top_k, router_aux_loss_coef=0.01,
                output_router_logits=True, num_experts=num_experts)


def non_degenerate(model: torch.nn.Module, std: float = 0.02) -> torch.nn.Module:
    """``model`` with every floating-point parameter that its initialisation left all zeros drawn afresh from
    ``N(0, std^2)`` (a generator seeded by the parameter's name), in place, for the tests' models and
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
