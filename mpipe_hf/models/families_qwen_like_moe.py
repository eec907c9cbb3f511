"""ERNIE 4.5 VL (``ernie4_5_vl_moe``, issue 38's qwen_like group): modality-isolated MoE layers across stages.

``Ernie4_5_VLMoeModel`` is an M-RoPE family (``get_rope_index`` on the host, :func:`.families_qwen_like.
rope_family`) whose decoder layers also read ``moe_mm_token_type_ids`` ``(B, L)``: each sparse layer routes text
tokens (0) to its text experts and image tokens and their start/end markers (1) to its vision experts
(``Ernie4_5_VLMoeMoeBlock``). The ids are a raw key that travels with the hidden states to every stage (a mask
input), and :class:`TokenTypeStage` hands them to each of its layers as ``Ernie4_5_VLMoeTextModel.forward`` does.
The load-balancing loss over every layer's router logits is relayed across stages as Qwen3-VL-MoE's
(:mod:`.moe`; the block's ``router_logits`` output, recorded by transformers, is its index 1).
"""

from __future__ import annotations

import torch

from .decoder import DecoderStage
from .tiny import qwen_special_ids, text_keys

MOE_TYPES = "moe_mm_token_type_ids"


class TokenTypeStage(DecoderStage):
    """A :class:`~.decoder.DecoderStage` whose layers each get ``moe_mm_token_type_ids=`` the micro's (or, packed,
    the row's) ids from the stage's state (``None`` when the micro has none: every token is text), through a
    keyword pre-hook on each layer (the layer call itself is the shared loop's)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.__dict__["_types"] = None
        for layer in self.layers:
            layer.register_forward_pre_hook(self._with_types, with_kwargs=True)

    def _with_types(self, _module, args, kwargs):
        return args, {**kwargs, MOE_TYPES: self.__dict__["_types"]}

    def _layers(self, hidden: torch.Tensor, state: dict, padding, lengths, search: bool = True) -> torch.Tensor:
        self.__dict__["_types"] = state.get(MOE_TYPES)
        try:
            return super()._layers(hidden, state, padding, lengths, search)
        finally:
            self.__dict__["_types"] = None


def tiny_ernie4_5_vl_moe_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """An ``Ernie4_5_VLMoeConfig`` (ERNIE-4.5-VL-28B-A3B's shape scaled down): a 2-layer tower (width 32, 14-px
    patches), the spatial 2 x 2 resampler, and an ERNIE 4.5 MoE text model: the first and (from 3 layers) the last
    layer dense, the others 4 text and 4 vision experts (intermediate 64 and 32), 2 active per token, one shared
    expert, M-RoPE sections ``[3, 3, 2]`` of the 16-wide heads' half, the load-balancing loss on and weighted
    0.01. Image markers: the Qwen2 vision tokens (video start/end: ``<|box_start|>``/``<|box_end|>``). The last
    layer is dense because its vision experts would read only image tokens and their markers, whose outputs no
    label reads: their gradient is zero by design, which would make every gradient check of them compare zero
    with zero."""
    from transformers import Ernie4_5_VLMoeConfig
    text = text_keys(tokenizer, num_layers, hidden_size,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2]},
                 moe_intermediate_size=[hidden_size, hidden_size // 2], moe_k=2, moe_num_experts=4,
                 moe_num_shared_experts=1, output_router_logits=True, router_aux_loss_coef=0.01,
                 mlp_layer_types=["dense"] + ["sparse"] * max(num_layers - 2, 1) + ["dense"] * (num_layers > 2))
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                  spatial_merge_size=2)
    ids, specials = tokenizer.convert_tokens_to_ids, qwen_special_ids(tokenizer)
    return Ernie4_5_VLMoeConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=False,
        image_token_id=specials["image_token_id"], video_token_id=specials["video_token_id"],
        image_start_token_id=specials["vision_start_token_id"], image_end_token_id=specials["vision_end_token_id"],
        video_start_token_id=ids("<|box_start|>"), video_end_token_id=ids("<|box_end|>"))

