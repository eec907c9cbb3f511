"""The model families of the sync-debug rows: tiny Qwen2.5-VL, Qwen3-VL and Qwen3.5 from real HF config classes
(:mod:`mpipe_hf.models.tiny`), random weights, and micro-batches their own processors made from synthetic photos
(rows with an image next to rows without), padded, unpadded (one row) or packed (:func:`~mpipe_hf.data.packing.
pack_micro`). Every case is split for ``R = 1, V = 2`` and run by the executor in strict device mode; on CUDA a
warm-up step, then a step whose every action runs under ``torch.cuda.set_sync_debug_mode("error")``."""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from .common import NA, Row, Setup, closing, drop_grads, executor_for, pinned, sync_debug_step

LAYERS = 4          # decoder layers: Qwen3.5's 3 linear-attention layers and 1 full; Qwen3-VL's 3 DeepStack adds
VOCAB_RANKS = 1024  # the Qwen2 BPE cut to its first ranks (the special tokens follow): a small embedding


@dataclass
class Case:
    """One sync-debug row: a family (``tiny`` builder name), ``P``, how its micro-batches are shaped, the
    attention implementation and the precision."""

    check: str
    builder: str
    preprocess: str
    shape: str = "padded"   # padded: 2 rows, one without an image; unpadded: 1 row each; packed: 3 rows in one
    attn: str = "sdpa"
    bf16: bool = False


CASES = (
    Case("sync-debug qwen2.5-vl identity", "tiny_qwen2_5_vl_config", "identity"),
    Case("sync-debug qwen2.5-vl frozen", "tiny_qwen2_5_vl_config", "frozen"),
    Case("sync-debug qwen2.5-vl trainable", "tiny_qwen2_5_vl_config", "trainable"),
    Case("sync-debug qwen3-vl frozen", "tiny_qwen3_vl_config", "frozen"),
    Case("sync-debug qwen3.5 unpadded", "tiny_qwen3_5_config", "frozen", shape="unpadded"),
    Case("sync-debug qwen2.5-vl packed", "tiny_qwen2_5_vl_config", "trainable", shape="packed"),
    Case("sync-debug flash_attention_2", "tiny_qwen2_5_vl_config", "frozen", attn="flash_attention_2", bf16=True),
)


@lru_cache(maxsize=1)
def tokenizer():
    """The Qwen2 tokenizer cut to :data:`VOCAB_RANKS` ranks (built once)."""
    from mpipe_hf.data import qwen2_tokenizer
    return qwen2_tokenizer(VOCAB_RANKS)


def photo(seed: int, side: int):
    """A synthetic ``side`` x ``side`` RGB photo (smooth gradients and noise; no data set needed)."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, side)
    base = np.stack([np.add.outer(ramp, ramp) / 2, np.tile(ramp, (side, 1)), np.tile(ramp[:, None], (1, side))], -1)
    return Image.fromarray(np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8))


def row(i: int, with_image: bool) -> dict:
    """A one-turn conversation (``i`` varies its length and photo), in the conversation collator's form."""
    prompt = [{"type": "text", "text": "Describe the image." + " Briefly." * (i % 3)}]
    return {"messages": [{"role": "user", "content": ([{"type": "image"}] if with_image else []) + prompt},
                         {"role": "assistant", "content": [{"type": "text", "text": f"Picture number {i}."}]}],
            "images": [photo(i, 56 + 28 * (i % 2))] if with_image else []}


def micro_batches(config, shape: str) -> list[dict]:
    """Two micro-batches for ``config`` made by its own processor, shaped as :class:`Case` says."""
    from mpipe_hf.data import ConversationCollator, build_processor
    from mpipe_hf.data.packing import pack_micro
    collate = ConversationCollator(build_processor(config, tokenizer()), None, model_type=config.model_type)
    if shape == "unpadded":
        return [collate([row(0, True)]), collate([row(1, True)])]
    if shape == "packed":
        return [pack_micro(collate([row(0, True), row(1, False), row(2, True)])),
                pack_micro(collate([row(3, False), row(4, True)]))]
    return [collate([row(0, True), row(1, False)]), collate([row(2, True)])]


def build_model(builder: str, attn: str = "sdpa"):
    """The tiny model of ``builder`` (a :mod:`mpipe_hf.families.qwen.tiny` function), random weights (seed 0)."""
    from transformers import AutoModelForImageTextToText
    from mpipe_hf.families.qwen import tiny
    config = getattr(tiny, builder)(tokenizer(), num_layers=LAYERS)
    torch.manual_seed(0)
    return AutoModelForImageTextToText.from_config(config, attn_implementation=attn)


def flash_attention() -> str | None:
    """Why FlashAttention 2 cannot run here, or ``None`` when ``flash_attn`` imports."""
    if importlib.util.find_spec("flash_attn") is None:
        return "flash_attn is not installed"
    try:
        import flash_attn  # noqa: F401
    except Exception as err:  # noqa: BLE001 - an install that does not import is the reason
        return f"flash_attn does not import: {type(err).__name__}"
    return None


def split_case(case: Case, device: torch.device, model=None):
    """``(split, cfg, micro-batches)`` of ``case`` on ``device`` (``model``: a copy of one built already)."""
    from mpipe_hf.models import split
    from mpipe_hf.schedule import ScheduleConfig
    model = build_model(case.builder, case.attn) if model is None else copy.deepcopy(model)
    micros = [pinned(mb, device) for mb in micro_batches(model.config, case.shape)]
    cfg = ScheduleConfig(1, 2, len(micros), case.preprocess)
    carved = split(model.to(device).train(), cfg, 0)
    for mb in micros:
        carved.validate_micro(mb)
    return carved, cfg, micros


def case_row(setup: Setup, case: Case) -> Row:
    """``case`` through the executor: on CUDA a warm-up step, then a step with every action under sync-debug
    mode ``"error"`` (PASS, or the first line that synchronised); on the CPU one step (n/a: the case builds and
    runs, the sync check needs CUDA)."""
    if case.attn == "flash_attention_2" and (not setup.cuda or flash_attention() is not None):
        return Row(case.check, "n/a", NA if not setup.cuda else flash_attention())
    carved, cfg, micros = split_case(case, setup.device)
    with closing(executor_for(carved, cfg, setup.device, bf16=case.bf16)[0]) as ex:
        params = carved.trainable_parameters(cfg, 0)
        warm = ex.step(micros.__getitem__)
        drop_grads(params)
        shape = f"{case.shape}, {case.attn}{', bf16' if case.bf16 else ''}, P {case.preprocess}"
        if not setup.cuda:
            return Row(case.check, "n/a", f"{NA} (the step ran: loss {warm.loss:.4f}; {shape})",
                       {"loss": warm.loss})
        hook = None
        if setup.broken(case.check):  # a host read of a device tensor in every stage-0 forward
            hook = carved.stages[0].register_forward_pre_hook(
                lambda module, args: torch.ones(1, device=setup.device).item() and None)
        where, stats = sync_debug_step(ex, micros.__getitem__)
        drop_grads(params)
        if hook is not None:
            hook.remove()
    if where is not None:
        return Row(case.check, "FAIL", where, {"error": where})
    return Row(case.check, "PASS", f"every action under sync-debug 'error'; loss {stats.loss:.4f}; {shape}",
               {"loss": stats.loss})


def rows() -> tuple:
    """``(check, measure)`` of every family row, in the table's order."""
    return tuple((case.check, lambda setup, case=case: case_row(setup, case)) for case in CASES)
