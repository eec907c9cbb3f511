"""Packed micro-batches on the model side: per-row positions, attention within a row, linear-attention
state reset at row boundaries.

A packed micro-batch (:func:`mpipe_hf.data.packing.pack_micro`) is one sequence ``(1, N)``: its rows'
tokens one after another, no padding. The model must see each row as the unpacked model sees it alone, so the
owner's host computes at load (``DATA_LOAD``, :func:`packed_host`):

- ``position_ids``: each row's own positions. 1-D families: an ``arange`` per row (from one for PaliGemma),
  ``(1, N)``. M-RoPE families: the family's ``get_rope_index`` over the rows (unpacked to a padded batch, as
  the unpacked model computes them) and, in front, the text-position row ``(4, 1, N)`` that transformers' Qwen-VL
  text models split off for their mask builders (``text_position_ids``);
- ``packed_lengths`` ``(rows,)`` int64, on the host: each row's tokens, read back from the text-position row by
  transformers' own ``find_packed_sequence_indices`` (a position that does not follow its predecessor starts a
  row). The positions are the one source of the row boundaries, as they are in transformers; the lengths travel
  to the other stages in the transfers' headers, on the host (:data:`~mpipe_hf.runtime.wire.HEADER_KEYS`).

Every stage then runs a packed micro in one pass (:meth:`~.decoder.DecoderStage.run_layers`), each row as the
unpacked model sees it alone: transformers' mask builders AND in its ``packed_sequence_mask_function`` over the
rows' ids (:func:`row_ids`, from the host lengths: no search of the positions on the device), one block-causal
mask, so attention never crosses a row (with FlashAttention the varlen kernel takes ``cu_seq_lens`` instead,
:func:`flash_kwargs`); a recurrent layer's (Gated DeltaNet's, LFM2's short convolution's) state starts from zero
at every row (:func:`per_row`). Each GEMM is as tall as the whole micro (row by row, a third as tall,
lost packing's gain to per-call overhead). A family whose masks cannot take the rows (:data:`ROW_BLIND`: Gemma's
token-type blocks, PaliGemma's prefix) runs its rows one by one.
The labels were cut at the row boundaries when the micro was packed (a row's first token
is no target).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from transformers.masking_utils import (LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING, create_recurrent_attention_mask,
                                        find_packed_sequence_indices)

Tensors = dict[str, torch.Tensor]
PACKED_KEYS = ("packed_lengths",)  # host integers (runtime.wire.HEADER_KEYS)
LINEAR = "linear_attention"
# the layer types that carry a state along the sequence (Gated DeltaNet's linear attention, LFM2's short
# convolution): those transformers masks with create_recurrent_attention_mask; a packed micro runs them per row
RECURRENT = frozenset(t for t, build in LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING.items()
                      if build is create_recurrent_attention_mask)
ROW_BLIND = "row_blind"  # set True on a mask builder that cannot see packed rows from the positions
GRID_KEYS = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")  # what get_rope_index reads of the visuals


def row_blind(masks) -> bool:
    """Whether ``masks`` (a stage's mask builder, or a family's ``masks(model)`` factory of them) cannot see
    packed rows, so that a packed micro runs row by row (:data:`ROW_BLIND`)."""
    return bool(getattr(masks, ROW_BLIND, False))


def is_packed(raw: Tensors) -> bool:
    """Whether ``raw`` is a packed micro-batch (it has ``packed_lengths``)."""
    return "packed_lengths" in raw


def row_positions(lengths: list[int], start: int = 0) -> torch.Tensor:
    """``(1, N)`` int64: ``start, start + 1, ...`` afresh for every row of ``lengths`` (``N = sum(lengths)``)."""
    return torch.cat([torch.arange(n) + start for n in lengths]).unsqueeze(0)


def unpad_rows(tokens: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(padded (B, Lmax), attention_mask (B, Lmax))`` from a packed ``(1, N)`` per-token tensor: each row on the
    left of its own line, right padding 0, as the collator padded it before packing."""
    rows = tokens[0].split(lengths)
    width = max(lengths)
    padded = tokens.new_zeros(len(lengths), width)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, row in enumerate(rows):
        padded[i, :row.numel()] = row
        mask[i, :row.numel()] = 1
    return padded, mask


def gather_rows(padded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(..., B, Lmax)`` -> ``(..., 1, N)``: the entries under ``mask`` row by row (the inverse of
    :func:`unpad_rows`)."""
    flat = padded.reshape(*padded.shape[:-2], -1)[..., mask.reshape(-1).bool()]
    return flat.unsqueeze(-2)


def mrope_positions(rope_index: Callable, raw: Tensors) -> torch.Tensor:
    """``(4, 1, N)``: the text-position row (:func:`row_positions`) and the 3 M-RoPE rows of ``rope_index`` (a
    Qwen-VL model's ``get_rope_index``, given the micro's image and video grids and Qwen2.5-VL's
    ``second_per_grid_ts``, each where it has them) computed over the packed rows unpacked to a padded batch with
    its mask, exactly as the unpacked model computes them; without images and videos an ``arange`` per row on all
    three axes."""
    lengths = raw["packed_lengths"].tolist()
    text = row_positions(lengths)
    grids = {k: raw[k] for k in GRID_KEYS if raw.get(k) is not None}
    if not grids:
        return torch.cat([text, text.expand(3, -1)]).unsqueeze(1)
    ids, mask = unpad_rows(raw["input_ids"], lengths)
    types, _ = unpad_rows(raw["mm_token_type_ids"], lengths)
    positions, _ = rope_index(ids, mm_token_type_ids=types, attention_mask=mask, **grids)
    return torch.cat([text.unsqueeze(0), gather_rows(positions, mask)])


def lengths_from(position_ids: torch.Tensor) -> torch.Tensor:
    """``(rows,)`` int64: the rows' lengths, read from the text-position row of ``position_ids`` (``(1, N)`` or
    ``(4, 1, N)``) by transformers' ``find_packed_sequence_indices`` (one row when nothing restarts)."""
    text = position_ids[0] if position_ids.dim() == 3 else position_ids
    found = find_packed_sequence_indices(text)
    if found is None:
        return torch.tensor([text.shape[-1]])
    return torch.bincount(found[0])


def packed_host(host: Callable[[Tensors], Tensors] | None, positions: str) -> Callable[[Tensors], Tensors]:
    """``host(raw) -> more raw inputs`` for ``DATA_LOAD`` (module docstring): the family's ``host`` as it is for
    an unpacked micro; for a packed one, also the 1-D families' per-row ``position_ids`` (``positions``:
    ``"arange"`` or ``"arange1"``; a ``"host"`` family's own host computes them, :func:`mrope_positions`),
    ``packed_lengths`` read back from them (:func:`lengths_from`). ``raw`` is on the host."""
    def run(raw: Tensors) -> Tensors:
        out = dict(host(raw)) if host is not None else {}
        if not is_packed(raw):
            return out
        if positions != "host":
            out["position_ids"] = row_positions(raw["packed_lengths"].tolist(), 1 if positions == "arange1" else 0)
        out["packed_lengths"] = lengths_from(out["position_ids"])
        return out
    return run


def row_ids(lengths: list[int], device: torch.device) -> torch.Tensor:
    """``(1, N)`` int64: each token's row of a packed micro of ``lengths`` rows (``0 0 1 1 1 2 ...``), made on the
    host and copied without a wait: what transformers' ``packed_sequence_mask_function`` compares."""
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).unsqueeze(0)
    return ids.to(device, non_blocking=True)


def row_lengths(state: Tensors) -> list[int] | None:
    """The packed rows' lengths when ``state`` is a packed micro of more than one row, else ``None`` (on the host,
    where the transfers' headers bring them: no device read)."""
    lengths = state.get("packed_lengths")
    if lengths is None or lengths.numel() < 2:
        return None
    return lengths.tolist()


def row_slice(state: Tensors, start: int, length: int) -> Tensors:
    """Packed row ``[start, start + length)`` of a stage's ``state``: every per-token tensor (``(..., 1, N)``:
    position ids, token types) cut to the row; the packing keys and anything else left out, except the
    tensors of other shapes (MoE running sums), which stay whole."""
    n = state["position_ids"].shape[-1]
    out = {}
    for key, value in state.items():
        if key in PACKED_KEYS or key == "hidden_states" or not isinstance(value, torch.Tensor):
            continue
        if value.dim() >= 2 and value.shape[-1] == n and value.shape[-2] == 1:
            value = value[..., start:start + length]
        out[key] = value
    return out


def uses_flash(text_config) -> bool:
    """Whether the text model runs FlashAttention (its varlen kernel takes a packed micro in one pass)."""
    return "flash" in str(getattr(text_config, "_attn_implementation", "") or "")


def per_row(layer: nn.Module, hidden: torch.Tensor, lengths: list[int], rotary, text_positions, **kwargs):
    """``layer`` (a decoder layer of a :data:`RECURRENT` type) run once per packed row of ``hidden`` ``(1, N, H)`` and
    the outputs joined: its causal convolution and recurrent state start from zero at every row, as for the row
    alone (the rest of the layer is per token). ``rotary``: the ``(cos, sin)`` pair ``(1, N, d)``, cut the same
    way; ``text_positions``: ``(1, N)`` or ``None``."""
    outs, start = [], 0
    for n in lengths:
        cut = slice(start, start + n)
        emb = tuple(t[:, cut] for t in rotary) if rotary is not None else None
        pos = text_positions[:, cut] if text_positions is not None else None
        outs.append(layer(hidden[:, cut], position_embeddings=emb, position_ids=pos, **kwargs))
        start += n
    return torch.cat(outs, dim=1)


def flash_kwargs(text_config, lengths: list[int] | None, device: torch.device) -> dict:
    """FlashAttention's varlen keyword arguments for a packed micro (``cu_seq_lens_q/k`` int32 ``(rows + 1,)``,
    ``max_length_q/k``), which transformers' ``_flash_attention_forward`` takes from the layer's kwargs; ``{}``
    for another attention implementation or one row."""
    if lengths is None or not uses_flash(text_config):
        return {}
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32).to(device, non_blocking=True)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max(lengths), "max_length_k": max(lengths)}

