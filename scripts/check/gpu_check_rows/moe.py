"""The MoE row of ``scripts/check/gpu_check.py``: fused experts under bf16 autocast on the bf16 grouped GEMM
(:mod:`mpipe_hf.models.expert_precision`) against transformers' own forward, which runs them in fp32 (on CUDA,
ATen's fallback loop, one host read of the offsets per grouped matmul), and against a dense MLP of the same active
width (``top_k`` experts' intermediate size), each timed per token over a forward and backward.

PASS when the bf16 path's grouped matmuls all take bf16, its output is within bf16's rounding of the fp32 path's,
and (on CUDA) it makes no synchronising call where the fp32 path makes some. The times are figures: on a CPU they
say nothing of a GPU's (the row runs there so that its logic is tested, ``tests/test_gpu_check.py``).
"""

from __future__ import annotations

import time
import warnings

import torch
from torch import nn

from .common import SYNC, Row, Setup

CHECK = "moe experts bf16 grouped gemm"
EXPERTS, TOP_K = 8, 2


def experts_module(hidden: int, device: torch.device) -> nn.Module:
    """A Qwen3-VL-MoE experts module (fused ``(E, 2 I, H)`` and ``(E, H, I)`` fp32 weights, ``I = H``) on
    ``device``, its implementation transformers' ``grouped_mm``."""
    from transformers import Qwen3VLMoeTextConfig
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextExperts
    config = Qwen3VLMoeTextConfig(hidden_size=hidden, moe_intermediate_size=hidden, num_experts=EXPERTS,
                                  num_experts_per_tok=TOP_K)
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    module = Qwen3VLMoeTextExperts(config).to(device)
    for p in module.parameters():
        nn.init.normal_(p, std=hidden ** -0.5)
    return module


def timed(fn, device: torch.device, reps: int) -> float:
    """Median seconds of ``fn()`` over ``reps`` runs after one warm-up (synchronised on CUDA)."""
    times = []
    for i in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def syncs(fn, device: torch.device) -> int:
    """The synchronising calls ``fn()`` makes on CUDA (``set_sync_debug_mode("warn")``); 0 elsewhere."""
    if device.type != "cuda":
        return 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum(SYNC in str(w.message) for w in caught)


def paths(setup: Setup, tokens: int):
    """``{name: a forward and backward over the tokens under bf16 autocast, returning the output}`` for the
    bf16 experts, transformers' fp32 experts and the dense MLP, and the grouped matmuls' operand dtypes seen."""
    from transformers.integrations import moe
    from mpipe_hf.models import expert_precision
    device, hidden = setup.device, setup.args.hidden
    experts = experts_module(hidden, device)
    dense = nn.Sequential(nn.Linear(hidden, 2 * TOP_K * hidden, bias=False), nn.SiLU(),
                          nn.Linear(2 * TOP_K * hidden, hidden, bias=False)).to(device)  # the same active width
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, hidden, generator=gen).to(device)
    routes = torch.rand(tokens, EXPERTS, generator=gen).topk(TOP_K, dim=-1)
    index, weights = routes.indices.to(device), routes.values.softmax(-1).to(device)
    seen = []
    grouped = torch._grouped_mm

    def spy(a, b, *args, **kwargs):
        seen.append((a.dtype, b.dtype))
        return grouped(a, b, *args, **kwargs)

    def run(forward):
        def go():
            h = x.clone().requires_grad_()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                out = forward(h)
            out.float().square().mean().backward()
            return out.detach().float()
        return go

    def bf16(h):
        torch._grouped_mm = spy
        try:
            return expert_precision.bf16_grouped_experts(experts, h, index, weights)
        finally:
            torch._grouped_mm = grouped
    return {"bf16": run(bf16), "fp32": run(lambda h: moe.grouped_mm_experts_forward(experts, h, index, weights)),
            "dense": run(dense)}, seen


def moe_row(setup: Setup) -> Row:
    """The experts per token: bf16 grouped GEMM, transformers' fp32 path, and a dense MLP (module docstring)."""
    tokens = max(64, setup.args.tokens * setup.args.micro * 8)
    runs, seen = paths(setup, tokens)
    outs = {name: fn() for name, fn in runs.items()}
    dtypes = set(seen)
    if setup.broken(CHECK):
        outs["bf16"] = outs["bf16"] * 1.1
    rel = float((outs["bf16"] - outs["fp32"]).norm() / outs["fp32"].norm())
    per_token = {name: timed(fn, setup.device, max(setup.args.steps, 2)) / tokens for name, fn in runs.items()}
    counted = {name: syncs(runs[name], setup.device) for name in ("bf16", "fp32")}
    ok = dtypes == {(torch.bfloat16, torch.bfloat16)} and rel < 2 ** -6 and (
        not setup.cuda or counted["bf16"] == 0 < counted["fp32"])
    figures = (f"per token: bf16 {per_token['bf16'] * 1e6:.2f} us, fp32 {per_token['fp32'] * 1e6:.2f} us, dense "
               f"{per_token['dense'] * 1e6:.2f} us; syncs bf16 {counted['bf16']}, fp32 {counted['fp32']}; "
               f"rel diff {rel:.2e}" + ("" if setup.cuda else " (CPU times: not a GPU's)"))
    values = {"tokens": tokens, "per_token_s": per_token, "syncs": counted, "rel_diff": rel,
              "dtypes": sorted({f"{a}/{b}" for a, b in dtypes})}
    return Row(CHECK, "PASS" if ok else "FAIL", figures, values)


def rows() -> tuple:
    """``(check, measure)`` of this module's row."""
    return ((CHECK, moe_row),)
