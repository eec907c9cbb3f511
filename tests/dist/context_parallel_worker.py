"""torchrun worker of tests/test_context_parallel.py: real transformers decoder layers (scaled-down Qwen2 and
Gemma 3 text configs, non-degenerate weights) run forward and backward with the sequence split over the CP group
(each rank its contiguous slice of the hidden states; positions and masks built on the whole sequence), against the
same layers on the whole sequence in this one process. Writes ``OUT/rank<r>.json``: per case the largest
differences of the output, the input gradient and each parameter gradient (summed over the group), and the
negative controls' differences."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from transformers import Gemma3TextConfig, Qwen2Config
from transformers.masking_utils import create_causal_mask
from transformers.models.gemma3.modeling_gemma3 import (Gemma3TextModel, create_masks_for_vision_model,
                                                        get_block_sequence_ids_for_mask)
from transformers.models.qwen2.modeling_qwen2 import Qwen2Model

sys.path.insert(0, os.path.dirname(__file__))
from common import run_cases  # noqa: E402

from mpipe_hf.models.tiny import non_degenerate  # noqa: E402
from mpipe_hf.runtime.context_parallel import SequenceSplit, use_ulysses  # noqa: E402

HIDDEN = 96  # a multiple of 4 and of 6 heads
SMALL = dict(hidden_size=HIDDEN, intermediate_size=96, num_attention_heads=4, head_dim=16, num_hidden_layers=2,
             vocab_size=32, attention_dropout=0.0, initializer_range=0.1)  # logits of O(1): positions matter


def build(case: dict) -> torch.nn.Module:
    """The case's text model (its decoder layers and rotary embedding used), the same weights on every rank."""
    torch.manual_seed(0)
    if case["family"] == "qwen2":  # 2 KV heads: a block of them per rank
        config = Qwen2Config(**SMALL, num_key_value_heads=2)
        model = Qwen2Model(config)
    else:  # 6 heads on 3 KV heads, which 2 ranks cannot split: each repeated twice; a sliding-window layer, then
        # a global one
        config = Gemma3TextConfig(**(SMALL | dict(num_attention_heads=6)), num_key_value_heads=3, sliding_window=5,
                                  query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"])
        model = Gemma3TextModel(config)
    config._attn_implementation = case["attn"]
    return non_degenerate(model).train()


def inputs(case: dict) -> dict:
    """The whole sequence's hidden states ``(B, L, HIDDEN)``, positions ``(B, L)``, padding mask, token types and
    the output weights of the loss."""
    gen = torch.Generator().manual_seed(1)
    batch, length = (1, 24) if case.get("rows") else (2, 24)
    out = dict(hidden=torch.randn(batch, length, HIDDEN, generator=gen), weights=torch.randn(batch, length, HIDDEN,
                                                                                       generator=gen))
    if case.get("rows"):  # a packed micro-batch: each row's own positions, no padding mask
        out["positions"] = torch.cat([torch.arange(n) for n in case["rows"]]).unsqueeze(0)
    else:
        out["positions"] = torch.arange(length).expand(batch, -1)
    if case.get("padded"):  # the second row's last 5 tokens padding
        out["padding"] = torch.ones(batch, length, dtype=torch.long)
        out["padding"][1, -5:] = 0
    types = torch.zeros(batch, length, dtype=torch.long)
    if case["family"] == "gemma3":  # image blocks, bidirectional within each; the first crosses the split
        types[0, 8:16] = 1
        types[1, 2:7] = 1
        types[1, 14:21] = 1
    out["types"] = types
    return out


def masks(model, data: dict, skip: bool = True) -> dict:
    """``{layer type: mask}`` built by transformers' own builders over ``data`` (whole or a slice), under the
    model's current attention implementation (``skip``: a causal sdpa mask may be ``None``)."""
    config, embeds = model.config, data["hidden"]
    kwargs = dict(config=config, inputs_embeds=embeds, attention_mask=data.get("padding"), cache=None,
                  position_ids=data["positions"])
    if isinstance(model, Gemma3TextModel):
        blocks = get_block_sequence_ids_for_mask(data["types"])
        return create_masks_for_vision_model(**kwargs, block_sequence_ids=blocks)
    return {"full_attention": create_causal_mask(**kwargs, allow_is_causal_skip=skip)}


def run_layers(model, data: dict, split: SequenceSplit | None, positions: torch.Tensor | None = None):
    """Forward and backward of the model's decoder layers on this rank's slice (``split``; ``None``: all of
    ``data``), with ``data``'s masks and the rotary embedding of ``data``'s positions sliced like the hidden
    states (``positions``: those of the slice instead, a negative control). Returns ``(output, input grad)``."""
    layer_masks = masks(model, data)
    cut = split.local if split else (lambda t, dim=1: t)
    hidden = cut(data["hidden"]).clone().requires_grad_()
    out = hidden
    for i, layer in enumerate(model.layers):
        kind = model.config.layer_types[i] if isinstance(model, Gemma3TextModel) else "full_attention"
        args = (data["hidden"], data["positions"]) + ((kind,) if isinstance(model, Gemma3TextModel) else ())
        cos, sin = model.rotary_emb(*args)
        if positions is not None:
            cos, sin = model.rotary_emb(*(cut(data["hidden"]), positions) + args[2:])
        else:
            cos, sin = cut(cos), cut(sin)
        extra = {"sequence_split": split} if split else {}
        out = layer(out, attention_mask=layer_masks[kind], position_embeddings=(cos, sin), **extra)
    (out * cut(data["weights"])).sum().backward()
    return out.detach(), hidden.grad


def half_of(data: dict, split: SequenceSplit) -> dict:
    """This rank's slice of ``data`` as if it were the whole sequence, its positions counted from 0: what
    computing positions and masks after the split would give."""
    out = {k: split.local(v) for k, v in data.items()}
    out["positions"] = torch.arange(split.lengths[split.rank]).expand(data["hidden"].shape[0], -1)
    return out


def diff(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    return [float(b.abs().max()), float((a - b).abs().max())]


def run_case(case: dict) -> dict:
    group, rank = dist.group.WORLD, dist.get_rank()
    model, data = build(case), inputs(case)
    length = data["hidden"].shape[1]
    split = SequenceSplit(group, tuple(case["lengths"]), rank) if case.get("lengths") \
        else SequenceSplit.even(group, length)
    ref_out, ref_in = run_layers(model, data, None)
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    name = use_ulysses(model.config)
    out, in_grad = run_layers(model, data, split)
    grads = {}
    for n, p in model.named_parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)  # each rank's tokens' share: summed over the group
            grads[n] = diff(p.grad, ref_grads[n])
    res = dict(attn=name, lengths=list(split.lengths), out=diff(out, split.local(ref_out)),
               masks={k: m is not None for k, m in masks(model, data).items()},
               in_grad=diff(in_grad, split.local(ref_in)), grads=grads, missing=sorted(set(ref_grads) - set(grads)))
    return res | controls(model, data, split, ref_out)


def controls(model, data: dict, split: SequenceSplit, ref_out: torch.Tensor) -> dict:
    """The negative controls, each this rank's largest output difference from one process: ``half``, each rank's
    slice run alone with masks and positions built from it; ``positions_after_split``, the split attention with
    the whole sequence's masks but the rotary embedding of positions counted from 0 on every rank. And
    ``half_mask_error``: what the split attention raises when given the slice's masks."""
    want, half = split.local(ref_out), half_of(data, split)
    half_out, _ = run_layers(model, half, None)
    moved_out, _ = run_layers(model, data, split, positions=half["positions"])
    kind = "sliding_attention" if isinstance(model, Gemma3TextModel) else "full_attention"
    cos, sin = model.rotary_emb(half["hidden"], half["positions"], *([kind] if kind == "sliding_attention" else []))
    mask, error = masks(model, half, skip=False)[kind], "no mask on some rank"
    every = torch.tensor(int(mask is not None))
    dist.all_reduce(every, op=dist.ReduceOp.MIN)  # all ranks call the layer or none: it may reach a collective
    try:
        if every:
            model.layers[0](half["hidden"], attention_mask=mask, position_embeddings=(cos, sin), sequence_split=split)
    except ValueError as exc:
        error = str(exc)
    return dict(half=diff(half_out, want), positions_after_split=diff(moved_out, want), half_mask_error=error)


def main() -> None:
    out_dir, cases = sys.argv[1], json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    run_cases(cases, run_case, out_dir, dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
