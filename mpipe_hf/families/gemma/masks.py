"""The attention masks of the Gemma models, as each model's ``forward`` builds them for a first (uncached) pass:
bidirectional blocks over an image's tokens (Gemma 3, Gemma 4, Gemma 4 Unified: ``token_type_ids`` /
``mm_token_type_ids``) or over PaliGemma's prefix, on top of the causal and sliding-window masks. Each builder
reads the blocks by position, so a packed micro-batch runs row by row (``ROW_BLIND``). The model class's own
builder with a token-type overlay is :func:`~mpipe_hf.models.decoder.model_class_masks`, which Molmo2 shares."""

from __future__ import annotations

import torch
from torch import nn
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from ...models.decoder import model_class_masks
from ...models.packed import ROW_BLIND


def prefix_masks(model: nn.Module):
    """PaliGemma's masks, as ``PaliGemmaModel.forward`` builds them: causal, with the prefix (``token_type_ids
    == 0``) one bidirectional block, from the positions (which start at one); the sliding layers of a Gemma 2
    text model get the same block under their window."""
    sliding = getattr(model.config.get_text_config(), "sliding_window", None) is not None

    def masks(text_config, hidden, padding, text_row, state, types) -> dict:
        # no position_ids: with the all-ones mask dropped at load (padding None) transformers would search them
        # for packed sequences on the device (a host read per stage and micro); PaliGemma's own call has the
        # mask, so never searches, and the positions (arange from one) hold no packing to find
        kwargs = dict(config=text_config, inputs_embeds=hidden, attention_mask=padding, cache=None,
                      position_ids=None)
        if state.get("token_type_ids") is not None:
            kwargs["block_sequence_ids"] = torch.where(state["token_type_ids"] == 0, 0, -1)
        out = {"full_attention": create_causal_mask(**kwargs)}
        if sliding:
            out["sliding_attention"] = create_sliding_window_causal_mask(**kwargs)
        return {t: out.get(t, out["full_attention"]) for t in types}
    setattr(masks, ROW_BLIND, True)  # it cannot see packed rows: a packed micro runs row by row
    return masks


def gemma4_masks(model: nn.Module):
    """Gemma 4's masks as its ``forward`` builds them (:func:`model_class_masks` with
    ``mm_token_type_ids``): causal on the global layers; on the sliding layers the window AND (causal OR one
    bidirectional block per image) when the text config sets ``use_bidirectional_attention = "vision"``."""
    return model_class_masks(model, "mm_token_type_ids")


def unified_masks(model: nn.Module):
    """Gemma 4 Unified's masks as its ``forward`` builds them for training: transformers'
    ``create_masks_for_generate`` per layer type with, when the text config sets ``use_bidirectional_attention =
    "vision"``, one bidirectional block per run of image tokens (``get_block_sequence_ids_for_mask`` over
    ``mm_token_type_ids``; every token its own causal block without them) on every layer type, the sliding layers
    under their window (the forward does not call the class's ``create_masks_for_generate``, whose global layers
    stay causal)."""
    from transformers.masking_utils import create_masks_for_generate
    from transformers.models.gemma4_unified.modeling_gemma4_unified import get_block_sequence_ids_for_mask
    config = model.config.get_text_config()
    blocks = config.use_bidirectional_attention == "vision"

    def masks(text_config, hidden, padding, text_row, state, types) -> dict:
        kwargs = {}
        if blocks:
            token_types = state.get("mm_token_type_ids")
            kwargs["block_sequence_ids"] = (get_block_sequence_ids_for_mask(token_types, hidden.device)
                                            if token_types is not None
                                            else torch.full(hidden.shape[:-1], -1, device=hidden.device))
        out = create_masks_for_generate(config=config, inputs_embeds=hidden, attention_mask=padding, cache=None,
                                        position_ids=text_row, **kwargs)
        return out if isinstance(out, dict) else {t: out for t in types}
    setattr(masks, ROW_BLIND, True)  # the blocks are read by position: a packed micro runs row by row
    return masks


# every builder these factories make runs a packed micro row by row (the launch check reads the family's factory)
for _factory in (prefix_masks, gemma4_masks, unified_masks):
    setattr(_factory, ROW_BLIND, True)
