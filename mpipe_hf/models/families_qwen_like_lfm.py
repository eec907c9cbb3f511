"""LFM3-VL and HyperCLOVAX-Vision (issue 38's qwen_like group): what their text models do outside the shared loop.

LFM3-VL (``lfm3_vl``): an LFM3 text model of short-convolution, sliding and full attention layers.
``Lfm3Model.forward`` differs from the shared decoder loop in two places, both read here from transformers' own
code: it builds rotary embeddings only for the attention layer types its rotary module knows
(``rotary_emb.layer_types``) and hands the short-convolution (``conv``) layers ``None``; and its final norm is
``embedding_norm`` (the family's ``norm``). The ``conv`` layers' mask is transformers' builder for that type, and a
convolution's state lives within its layer, so no state crosses a stage boundary.

HyperCLOVAX-Vision v2 (``hyperclovax_vision_v2``): a HyperCLOVAX text model with muP scalings (:class:`MupStage`).
"""

from __future__ import annotations

from torch import nn

from .decoder import DecoderStage
from .tiny import qwen_special_ids, text_keys


class _KnownTypesRotary(nn.Module):
    """``rotary_emb(x, position_ids, layer_type)`` for the types ``rotary`` knows, ``None`` for the others (as
    ``Lfm3Model.forward``'s ``position_embeddings.get(layer_type)``). Holds no parameter or persistent buffer."""

    def __init__(self, rotary: nn.Module):
        super().__init__()
        self.rotary = rotary

    def forward(self, x, position_ids, layer_type):
        if layer_type not in self.rotary.layer_types:
            return None
        return self.rotary(x, position_ids, layer_type=layer_type)


class Lfm3Stage(DecoderStage):
    """A :class:`~.decoder.DecoderStage` whose short-convolution layers get no rotary embedding."""

    def __init__(self, front, layers, layer_ids, layer_types, rotary_emb, *args, **kwargs):
        super().__init__(front, layers, layer_ids, layer_types, _KnownTypesRotary(rotary_emb), *args, **kwargs)
        self.per_type_rotary = True


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


class MupStage(DecoderStage):
    """A :class:`~.decoder.DecoderStage` for HyperCLOVAX's muP scalings, which ``HyperCLOVAXModel.forward`` and the
    conditional model's head apply outside the decoder layers: the embeddings (image features in place) times
    ``embedding_multiplier`` as they enter the first layer, and the logits times ``logits_scaling`` (the head's
    ``scale``). The residual and attention multipliers are inside the layers."""

    def __init__(self, front, *args, **kwargs):
        super().__init__(front, *args, **kwargs)
        if front is not None:
            front.register_forward_hook(self._scale_embeddings)
        if self.head is not None:
            self.head.scale = float(self.text_config.logits_scaling)

    def _scale_embeddings(self, _module, _inputs, out: dict) -> dict:
        return {**out, "hidden_states": out["hidden_states"] * self.text_config.embedding_multiplier}


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
    and :func:`~.tiny.tiny_qwen3_5_config`'s Qwen3.5 text model (Gated DeltaNet and gated full attention)."""
    from transformers import MiniCPMV4_6Config

    from .tiny import tiny_qwen3_5_config
    text = tiny_qwen3_5_config(tokenizer, num_layers, hidden_size).text_config.to_dict()
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=image_size, patch_size=14, insert_layer_id=0)
    ids = qwen_special_ids(tokenizer)
    return MiniCPMV4_6Config(text_config=text, vision_config=vision, image_size=image_size, insert_layer_id=0,
                             image_token_id=ids["image_token_id"], video_token_id=ids["video_token_id"],
                             tie_word_embeddings=False)


def tiny_minicpmv4_7_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, image_size: int = 56):
    """A ``MiniCPMV4_7Config``: :func:`tiny_minicpmv4_6_config`'s shape, with the canvas M-RoPE's markers on the
    Qwen2 tokens that stand in for them (``<|vision_start|>``/``<|vision_end|>`` for ``<image>``/``</image>``,
    ``<|quad_start|>``/``<|quad_end|>`` for ``<slice>``/``</slice>``) and the newline."""
    from transformers import MiniCPMV4_7Config
    raw = tiny_minicpmv4_6_config(tokenizer, num_layers, hidden_size, image_size).to_dict()
    raw.pop("model_type")
    raw["vision_config"]["model_type"] = "minicpmv4_7_vision"
    ids = tokenizer.convert_tokens_to_ids
    return MiniCPMV4_7Config(**raw, image_start_id=ids("<|vision_start|>"), image_end_id=ids("<|vision_end|>"),
                             slice_start_id=ids("<|quad_start|>"), slice_end_id=ids("<|quad_end|>"),
                             newline_id=tokenizer.encode("\n")[0])
