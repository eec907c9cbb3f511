"""HunYuan-VL (``hunyuan_vl``, issue 38's qwen_like group): XD-RoPE over ``len(mrope_section)`` axes.

``HunYuanVLModel`` is an M-RoPE family whose ``get_rope_index`` gives ``(A, B, L)`` positions, ``A =
len(rope_parameters["mrope_section"])`` (4 in the hub checkpoints: the sequence, then the image's width, height and
index), so its stages split position ids by ``A`` (:attr:`~.decoder.DecoderStage.rope_axes`, :class:`XdRopeStage`)
rather than Qwen's 3. The positions are computed on the owner's host as ``HunYuanVLModel.forward`` computes them
(:func:`xdrope_host_inputs`). Each image's features hold a separator after every row of merged patches and the
image's begin and end embeddings, all at image tokens: ``h * (w + 1) + 2`` tokens for ``h x w`` merged patches.
"""

from __future__ import annotations

import torch

from .decoder import DecoderStage
from .families import validate_counted_micro
from .family import Family
from .packed import gather_rows, is_packed, row_positions, unpad_rows
from .tiny import qwen_special_ids, text_keys


def _axes(model) -> int:
    return len(model.config.text_config.rope_parameters.get("mrope_section") or [])


def xdrope_host_inputs(model):
    """``host(raw) -> {"position_ids": ...}``: ``get_rope_index``'s ``(A, B, L)`` with images; ``arange`` on all
    ``A`` axes without (the text model's own, as ``compute_3d_position_ids`` returns ``None`` then); a packed micro's
    ``(A + 1, 1, N)``: the text-position row, then its rows' own positions, unpacked to a padded batch with its
    mask."""
    rope_index, axes = model.model.get_rope_index, _axes(model)

    def host(raw):
        ids, grid = raw["input_ids"], raw.get("image_grid_thw")
        if is_packed(raw):
            lengths = raw["packed_lengths"].tolist()
            rows, mask = unpad_rows(ids, lengths)
            types, _ = unpad_rows(raw["mm_token_type_ids"], lengths)
            found, _ = rope_index(rows, mm_token_type_ids=types, image_grid_thw=grid, attention_mask=mask)
            return {"position_ids": torch.cat([row_positions(lengths).unsqueeze(0), gather_rows(found, mask)])}
        if grid is None:
            return {"position_ids": torch.arange(ids.shape[1]).view(1, 1, -1).expand(axes, ids.shape[0], -1)}
        positions, _ = rope_index(ids, mm_token_type_ids=raw["mm_token_type_ids"], image_grid_thw=grid,
                                  attention_mask=raw.get("attention_mask"))
        return {"position_ids": positions}
    return host


def xdrope_stage(model) -> type:
    """A :class:`~.decoder.DecoderStage` subclass whose ``rope_axes`` is the model's ``A``."""
    return type("XdRopeStage", (DecoderStage,), {"rope_axes": _axes(model)})


def _hunyuan_tokens(model):
    """Image tokens per image: ``h * (w + 1) + 2`` for the ``h x w`` merged patches of ``image_grid_thw``."""
    merge = model.config.vision_config.spatial_merge_size

    def count(raw):
        merged = raw["image_grid_thw"][:, 1:] // merge
        return int((merged[:, 0] * (merged[:, 1] + 1) + 2).sum())
    return count


HUNYUAN_VL = Family(vision=("model.vision_tower",), image_inputs=("pixel_values", "image_grid_thw"),
                    stage0_inputs=("position_ids",), positions="host", host=xdrope_host_inputs, stage=xdrope_stage,
                    validate=validate_counted_micro(_hunyuan_tokens))


def tiny_hunyuan_vl_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``HunYuanVLConfig``: a 2-layer tower (width 32, 16-px patches, the 2 x 2 convolutional merger with its
    row separator and begin/end embeddings) and a HunYuan text model with 4-axis XD-RoPE (``mrope_section`` ``[2,
    2, 2, 2]`` of the 16-wide heads' half, as the hub's 4 sections). Image markers: ``<|vision_start|>``,
    ``<|image_pad|>``, ``<|vision_end|>``; the row separator: ``<|vision_pad|>``. The head is tied to the
    embeddings, as HunyuanOCR's (``HunYuanVLConfig``'s default)."""
    from transformers import HunYuanVLConfig
    text = text_keys(tokenizer, num_layers, hidden_size, tie=True, head_dim=hidden_size // 4,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 2, 2]})
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=16,
                  spatial_merge_size=2, out_hidden_size=hidden_size, text_hidden_size=hidden_size)
    ids = qwen_special_ids(tokenizer)
    return HunYuanVLConfig(text_config=text, vision_config=vision, image_token_id=ids["image_token_id"],
                           im_start_id=ids["vision_start_token_id"], im_end_id=ids["vision_end_token_id"],
                           im_newline_id=tokenizer.convert_tokens_to_ids("<|vision_pad|>"), tie_word_embeddings=True)
