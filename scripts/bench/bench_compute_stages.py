"""The compute-dominated shape of ``scripts/bench/bench_compute.py``: a real ``Qwen2_5_VLConfig`` scaled to hidden 768
(text: 8 decoder layers, MLP 4128, 8 heads of 96 with 2 key-value heads, M-RoPE; vision: 6 blocks of 768 wide,
MLP 2052, 8 heads, Qwen2.5-VL's window attention and merger), the pipeline stages built from its real layers for
``bench_schedules_stages.run_ours`` and ``run_torch``, the cost of each part timed on one thread, and the
matmul share of a step by ``torch.profiler``.

The widths keep Qwen2.5-VL-7B's ratios where they matter for the arithmetic (MLP 5.4x the hidden size in the text
model, 2.7x in the tower; 4 query heads per key-value head); the vocabulary is the demo's (the Qwen2 BPE cut to
5,120 ranks, ``scripts/make/make_demo.py``), so the LM head costs about a third of a decoder layer. At hidden 768
the matmuls take over 80% of a layer's forward and backward on this CPU (hidden 512: about 75%).
"""

from __future__ import annotations

import time

import torch
from torch import nn

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 768, 4128, 8, 8, 2
VISION_HIDDEN, VISION_INTERMEDIATE, VISION_DEPTH, VISION_HEADS = 768, 2052, 6, 8
TOKENS, GRID = 128, (1, 16, 16)  # a pipeline micro-batch: 128 tokens, 64 of them one image's (256 patches)
# torch.profiler op names counted as matmul arithmetic (self CPU time): GEMMs, convolutions, attention kernels
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_convolution",
            "aten::mkldnn_convolution", "aten::slow_conv3d_forward", "aten::convolution_backward")
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu",
                 "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                 "aten::_scaled_dot_product_efficient_attention", "aten::_efficient_attention_backward")


def compute_config(tokenizer, layers: int = LAYERS, vision_depth: int = VISION_DEPTH, hidden: int = HIDDEN):
    """The benchmark's ``Qwen2_5_VLConfig`` (module docstring) over ``tokenizer``'s vocabulary and special
    tokens; ``layers``, ``vision_depth`` and ``hidden`` shrink it for a smoke run."""
    from transformers import Qwen2_5_VLConfig
    ids = tokenizer.convert_tokens_to_ids
    head = hidden // HEADS
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=INTERMEDIATE * hidden // HIDDEN,
                num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                max_position_embeddings=4096, tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                 "mrope_section": [head // 4, head // 8, head // 8]})
    vision = dict(depth=vision_depth, hidden_size=hidden * VISION_HIDDEN // HIDDEN,
                  intermediate_size=VISION_INTERMEDIATE * hidden // HIDDEN, num_heads=VISION_HEADS, patch_size=14,
                  temporal_patch_size=2, spatial_merge_size=2, window_size=112, out_hidden_size=hidden,
                  fullatt_block_indexes=[vision_depth - 1])
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False,
                              image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
                              vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))
    for part in (config, config.text_config, config.vision_config):
        part._attn_implementation = "sdpa"
    return config


class Tower(nn.Module):
    """The real Qwen2.5-VL vision tower on one fixed image grid: pixel patches ``(patches, 1176)`` -> merged
    features ``(patches / 4, hidden)``."""

    def __init__(self, config, grid=GRID):
        super().__init__()
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
        self.visual = Qwen2_5_VisionTransformerPretrainedModel._from_config(config.vision_config)
        self.register_buffer("grid", torch.tensor([grid]), persistent=False)

    def forward(self, pixels):
        return self.visual(pixels, self.grid).pooler_output


class Chunk(nn.Module):
    """Stage ``index`` of the pipeline as a module of real layers: on stage 0 the token embedding (and the tower
    when ``tower`` is given: ``P`` inside stage 0), ``count`` decoder layers, and on the last stage the final norm,
    the LM head and the loss (the cross-entropy summed over the micro-batch's tokens against ``labels``)."""

    def __init__(self, config, first: int, count: int, index: int, last: bool, tower: Tower | None = None):
        super().__init__()
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (Qwen2_5_VLDecoderLayer,
                                                                        Qwen2_5_VLRotaryEmbedding)
        text = config.text_config
        self.index, self.last, self.tower = index, last, tower
        self.embed = nn.Embedding(text.vocab_size, text.hidden_size) if index == 0 else None
        self.layers = nn.ModuleList(Qwen2_5_VLDecoderLayer(text, first + i) for i in range(count))
        self.rotary = Qwen2_5_VLRotaryEmbedding(config=text)
        self.norm = nn.RMSNorm(text.hidden_size, eps=text.rms_norm_eps) if last else None
        self.head = nn.Linear(text.hidden_size, text.vocab_size, bias=False) if last else None

    def body(self, hidden, ids=None, feats=None):
        """The stage's work on hidden states ``(1, L, H)`` (stage 0: token ids ``(1, L)`` and image features
        ``(n, H)``, which replace the first ``n`` embeddings); returns the hidden states or, last, the logits."""
        if self.index == 0:
            hidden = self.embed(ids)
            if feats is not None:
                hidden = torch.cat([feats[None].to(hidden.dtype), hidden[:, feats.shape[0]:]], dim=1)
        positions = torch.arange(hidden.shape[1]).expand(3, hidden.shape[0], -1)
        rope = self.rotary(hidden, positions)
        for layer in self.layers:
            hidden = layer(hidden, position_embeddings=rope, position_ids=positions)
        return self.head(self.norm(hidden)) if self.last else hidden

    def forward(self, *args):  # torch's runtime: tensors in, a tensor out
        if self.index == 0:
            ids, pixels = args
            return self.body(None, ids, self.tower(pixels) if self.tower is not None else None)
        return self.body(args[0])


def labels_loss(logits, labels):
    """The cross-entropy of ``logits (B, L, vocab)`` against ``labels (B, L)``, summed over tokens."""
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")


class DictChunk(nn.Module):
    """Our executor's interface over a :class:`Chunk` (MPipe rows: ``P`` transposed): reads ``input_ids`` and
    ``image_features`` (stage 0) or ``hidden_states``; the last stage returns the loss."""

    def __init__(self, chunk: Chunk, labels: torch.Tensor):
        super().__init__()
        self.chunk, self.labels = chunk, labels

    def forward(self, inputs):
        if self.chunk.index == 0:
            out = self.chunk.body(None, inputs["input_ids"], inputs["image_features"])
        else:
            out = self.chunk.body(inputs["hidden_states"])
        if self.chunk.last:
            return {"loss": labels_loss(out, self.labels), "num_tokens": torch.tensor(self.labels.numel())}
        return {"hidden_states": out}


class DictTower(nn.Module):
    """The transposed ``P``: ``pixels -> image_features``."""

    def __init__(self, tower: Tower):
        super().__init__()
        self.tower = tower

    def forward(self, inputs):
        return {"image_features": self.tower(inputs["pixels"])}


class ComputeStages:
    """The set of stages of ``bench_schedules_stages`` (its module docstring) over real Qwen2.5-VL layers: R = 2,
    V = 2, ``layout`` decoder layers per stage, a tower frozen or trained (``mode``), fixed micro-batches of
    :data:`TOKENS` tokens (one image of :data:`GRID`). Every rank builds the same weights (seed 0)."""

    pp, vpp = 2, 2
    p_keys, stage0_keys, raw_keys = ("pixels",), ("input_ids",), ("input_ids", "pixels")

    def __init__(self, config, mode: str, layout: list[int], tokens: int = TOKENS, grid=GRID):
        self.config, self.mode, self.layout, self.grid = config, mode, layout, grid
        gen = torch.Generator().manual_seed(0)
        vocab = config.text_config.vocab_size
        self.ids = torch.randint(vocab, (1, tokens), generator=gen)
        self.labels = torch.randint(vocab, (1, tokens), generator=gen)
        patch = 3 * 2 * 14 * 14
        self.pixels = torch.randn(grid[0] * grid[1] * grid[2], patch, generator=gen)

    def tower(self) -> Tower:
        """A fresh tower (seed 1), trained only in ``trainable`` mode."""
        torch.manual_seed(1)
        tower = Tower(self.config, self.grid)
        return tower.requires_grad_(self.mode == "trainable")

    def chunk(self, s: int, tower: bool) -> Chunk:
        """Stage ``s`` (seed ``100 + s``), with the tower inside when ``tower`` and ``s == 0``."""
        torch.manual_seed(100 + s)
        first = sum(self.layout[:s])
        return Chunk(self.config, first, self.layout[s], s, s == len(self.layout) - 1,
                     self.tower() if tower and s == 0 else None)

    def stage(self, s, last):
        return DictChunk(self.chunk(s, tower=False), self.labels)

    def preprocess(self):
        return DictTower(self.tower())

    def load(self, m):
        return {"input_ids": self.ids, "pixels": self.pixels}

    def torch_stage(self, s):
        return self.chunk(s, tower=True)

    def torch_inputs(self, num_micro):
        return ([self.ids.expand(num_micro, -1).contiguous(), self.pixels.repeat(num_micro, 1)],
                self.labels.expand(num_micro, -1).contiguous())

    @staticmethod
    def loss(out, target):
        return labels_loss(out, target)


def best_of(fn, tries: int = 3) -> float:
    """The fastest of ``tries`` runs of ``fn`` (seconds), after one untimed run."""
    fn()
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def part_costs(stages: ComputeStages) -> dict:
    """Seconds per micro-batch on this thread: a decoder layer's forward and backward (``layer_f``, ``layer_b``),
    the last stage's norm, LM head and loss (``head_f``, ``head_b``) and the tower's (``tower_f``; ``tower_b``
    when trained, else 0)."""
    cfg = stages.config
    hidden = torch.randn(1, stages.ids.shape[1], cfg.text_config.hidden_size, requires_grad=True)
    one = Chunk(cfg, 1, 1, 1, False)
    last = Chunk(cfg, 1, 0, 1, True)
    tower = stages.tower()

    def fwd_bwd(module, loss):
        def run():
            out = module(hidden)
            loss(out).backward()
        return run
    out = {"layer_f": best_of(lambda: one(hidden).detach()),
           "head_f": best_of(lambda: last(hidden).detach()),
           "tower_f": best_of(lambda: tower(stages.pixels).detach())}
    out["layer_b"] = best_of(fwd_bwd(one, lambda o: o.sum())) - out["layer_f"]
    out["head_b"] = best_of(fwd_bwd(last, lambda o: labels_loss(o, stages.labels))) - out["head_f"]
    out["tower_b"], out["tower_params"] = 0.0, sum(p.numel() for p in tower.parameters())
    if stages.mode == "trainable":
        out["tower_b"] = best_of(lambda: tower(stages.pixels).sum().backward()) - out["tower_f"]
    return out


def matmul_share(step, repeats: int = 1) -> dict:
    """Run ``step()`` ``repeats`` times under ``torch.profiler`` (CPU); ``{"wall": seconds, "gemm": share of the
    wall time in GEMM and convolution kernels, "attention": in attention kernels, "top": the 6 costliest ops}``
    (self CPU time, one thread)."""
    from torch.profiler import ProfilerActivity, profile
    step()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    self_us = {e.key: e.self_cpu_time_total for e in events}
    gemm = sum(self_us.get(k, 0.0) for k in GEMM_OPS) / 1e6
    attention = sum(self_us.get(k, 0.0) for k in ATTENTION_OPS) / 1e6
    top = sorted(self_us.items(), key=lambda kv: -kv[1])[:6]
    return {"wall": wall, "gemm": gemm / wall, "attention": attention / wall,
            "top": [(k, v / 1e6 / wall) for k, v in top]}
