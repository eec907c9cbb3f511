"""Molmo2's decoder stage: the adapter's features are ADDED to the image tokens' embeddings
(``Molmo2Model.forward``), every image-related token (``mm_token_type_ids`` 1) attends to the others of its row
(the model class's ``create_masks_for_generate``), and each layer takes the scaled or the unscaled rotary
embedding (``rope_scaling_layers``): :class:`Molmo2Stage` with :func:`molmo2_masks`."""

from __future__ import annotations

import torch
from torch import nn

from ...models.decoder import DecoderStage, model_class_masks
from ...models.packed import ROW_BLIND


def molmo2_masks(model: nn.Module):
    """Molmo2's one mask (its image tokens a bidirectional block, the model class's ``create_masks_for_generate``
    over ``mm_token_type_ids``) for both of :class:`Molmo2Stage`'s rotary kinds."""
    build = model_class_masks(model, "mm_token_type_ids")

    def masks(text_config, hidden, padding, text_row, state, types) -> dict:
        out = build(text_config, hidden, padding, text_row, state, {"full_attention"})
        return {t: out["full_attention"] for t in types}
    setattr(masks, ROW_BLIND, True)  # the token-type block is looked up by position: a packed micro row by row
    return masks


setattr(molmo2_masks, ROW_BLIND, True)  # every builder it makes is (the launch check reads the family's factory)


class _ScaledOrNot(nn.Module):
    """Molmo2's two rotary embeddings as one ``rotary(x, position_ids, kind)``, ``kind`` ``"scaled"`` or
    ``"unscaled"`` (``Molmo2TextModel.rope_types``). Holds no parameter or persistent buffer."""

    def __init__(self, text_model: nn.Module):
        super().__init__()
        self.scaled, self.unscaled = text_model.rotary_emb, text_model.rotary_emb_unscaled

    def forward(self, x, position_ids, kind):
        return (self.scaled if kind == "scaled" else self.unscaled)(x, position_ids)


class Molmo2Stage(DecoderStage):
    """A :class:`~mpipe_hf.models.decoder.DecoderStage` for Molmo2: each layer's "layer type" is its rotary kind
    (one mask serves both, :func:`molmo2_masks`), and the front adds the token embeddings back at the image
    tokens, whose rows it replaced by the features (``Molmo2Model.forward`` adds the features to them)."""

    def __init__(self, front, layers, layer_ids, layer_types, rotary_emb, *args, text_model=None, **kwargs):
        kinds = [text_model.rope_types[i] for i in layer_ids]
        super().__init__(front, layers, layer_ids, kinds, _ScaledOrNot(text_model), *args, **kwargs)
        self.per_type_rotary = True
        if front is not None:
            front.register_forward_hook(self._add_embeddings)

    @staticmethod
    def _add_embeddings(front, args, out: dict) -> dict:
        ids = args[0]["input_ids"]
        image = (ids == front.image_token_id).unsqueeze(-1)
        added = torch.where(image, front.embed_tokens(ids), 0.0)
        return {**out, "hidden_states": out["hidden_states"] + added}
