"""Fused MoE experts under ``train.bf16`` (:mod:`mpipe_hf.models.expert_precision`), one process, no launch.

Under autocast with fp32 master weights the experts' two grouped matmuls per layer run on bf16 operands with a
bf16 output (the grouped GEMM's fast path on CUDA), their fp32 weights keep fp32 gradients, and the cast is made
once per step (:func:`~mpipe_hf.runtime.casts.step_casts`) with the same losses and gradients, bit for bit, as a
cast per call (what the unsplit model under ``torch.autocast`` does: the reference of the pipelined bf16 MoE cases
of ``tests/test_ep.py`` and ``tests/test_numerics.py``). With LoRA on the fused experts the cast is of the adapted
weight. Host reads are counted on the CPU's device model (``tests/device_model.py``), which also models ATen's CUDA
dispatch of the grouped GEMM: anything but bf16 operands and output takes its fallback, which copies the offsets
to the host once per call (``offs.cpu()``). Transformers' own forward (the negative control, kept here) reads
them twice per MoE layer forward; the bf16 one never. With expert parallelism the split sizes of the all-to-all
are read once per MoE layer (docs/gpus.md says why that one remains)."""

from __future__ import annotations

import contextlib
import sys
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from transformers import AutoModelForImageTextToText
from transformers.integrations import moe

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.models import expert_precision
from mpipe_hf.families.qwen import tiny as qwen_tiny
from mpipe_hf.models.adapters import apply_adapter, is_adapter_tensor
from mpipe_hf.runtime.casts import cached_cast, step_casts
from mpipe_hf.runtime.memory import weight_copy
from mpipe_hf.train.recipe_lora import LoraSection

sys.path.insert(0, str(Path(__file__).parent))
from device_model import DeviceModel, on_device, rooted  # noqa: E402

FALLBACK = "grouped_mm fallback: offs to host"


class GroupedReads(DeviceModel):
    """The device model, plus ATen's CUDA choice for ``_grouped_mm``: operands and output all bf16 take the
    grouped GEMM; anything else its fallback loop, one host read of the offsets per call (counted as
    :data:`FALLBACK`). ``calls`` records each call's operand dtypes."""

    def __init__(self, modules=()):
        super().__init__(modules)
        self.calls: list[tuple[torch.dtype, torch.dtype]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch._grouped_mm and on_device(args[1]):
            self.calls.append((args[0].dtype, args[1].dtype))
            if {args[0].dtype, args[1].dtype, (kwargs or {}).get("out_dtype") or args[0].dtype} != {torch.bfloat16}:
                self._count(FALLBACK)
        return super().__torch_function__(func, types, args, kwargs)

    def _count(self, kind: str) -> None:
        """The device model's count, named by the innermost frame outside torch and these two files."""
        if self.paused:
            return
        frames = [f for f in traceback.extract_stack()[:-2] if "/torch/" not in f.filename
                  and not f.filename.endswith(("device_model.py", "test_moe_bf16.py"))]
        self.syncs[f"{kind} at {rooted(frames[-1].filename)}:{frames[-1].lineno}" if frames else kind] += 1

    def fallback_reads(self) -> int:
        """The host reads of the offsets by ATen's fallback (``syncs`` names each by where it was called)."""
        return sum(n for where, n in self.syncs.items() if where.startswith(FALLBACK))


def tiny_model(family: str):
    tok = qwen2_tokenizer(5120)
    torch.manual_seed(0)
    config = (qwen_tiny.tiny_qwen3_vl_moe_config(tok, num_layers=2) if family == "qwen3_vl_moe"
              else qwen_tiny.tiny_qwen3_5_config(tok, num_layers=4, moe=True))
    return AutoModelForImageTextToText.from_config(config)


def experts_of(model) -> list:
    return [m for m in model.modules() if hasattr(m, "_is_expert_parallel") and hasattr(m, "down_proj")
            and not any(c.__name__ == "BaseTunerLayer" for c in type(m).__mro__)]


def micro_batches(n: int = 2) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 5000, (2, 12), generator=gen) for _ in range(n)]


def run(model, micros, cached: bool, modules=()):
    """A step's forward and backward over ``micros`` under bf16 autocast on the device model: ``(losses, the
    trained parameters' gradients, the model's counters)``."""
    model.zero_grad(set_to_none=True)
    counter, losses = GroupedReads(modules or [model]), []
    with counter, step_casts() if cached else contextlib.nullcontext():
        for ids in micros:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            losses.append(out.loss.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return losses, grads, counter


@pytest.mark.parametrize("family", ["qwen3_vl_moe", "qwen3_5_moe"])
def test_experts_run_bf16_grouped_gemm_with_fp32_masters_and_no_host_read(family, monkeypatch):
    """Every grouped matmul takes bf16 operands; 0 host reads of the offsets; the fused weights stay fp32 with
    fp32 gradients. Transformers' own forward (registered back) ran them in fp32, two reads per MoE layer."""
    model = tiny_model(family)
    layers = len(experts_of(model))
    _, grads, counter = run(model, micro_batches(1), cached=True)
    assert counter.calls and set(counter.calls) == {(torch.bfloat16, torch.bfloat16)}, counter.calls
    assert len(counter.calls) == 2 * layers  # up and down per MoE layer (the backward's run inside autograd)
    assert counter.fallback_reads() == 0 and not [w for w in counter.syncs if "moe.py" in w], counter.syncs
    for experts in experts_of(model):
        assert experts.gate_up_proj.dtype == torch.float32 and experts.down_proj.dtype == torch.float32
    expert_grads = [g for n, g in grads.items() if ".experts." in n]
    assert expert_grads and all(g.dtype == torch.float32 and g.abs().max() > 0 for g in expert_grads)
    monkeypatch.setitem(moe.ExpertsInterface._global_mapping, "grouped_mm", moe.grouped_mm_experts_forward)
    _, _, before = run(model, micro_batches(1), cached=True)
    assert set(before.calls) == {(torch.float32, torch.float32)} and before.fallback_reads() == 2 * layers


def fused_casts(model, micros, cached: bool, monkeypatch) -> tuple[list, dict, int]:
    """``run`` plus the number of distinct bf16 copies made of the fused weights (each kept alive, so that no two
    share an id)."""
    copies = []

    def counting(weight, dtype):
        copies.append(cached_cast(weight, dtype))
        return copies[-1]
    monkeypatch.setattr(expert_precision, "cached_cast", counting)
    losses, grads, _ = run(model, micros, cached)
    monkeypatch.undo()
    return losses, grads, len({id(c) for c in copies})


def test_one_cast_per_step_equals_a_cast_per_call(monkeypatch):
    """Over two micro-batches, the step's cache casts each fused weight once (a cast per call: once per micro),
    and the losses and every gradient are the same bits."""
    model = tiny_model("qwen3_vl_moe")
    fused = 2 * len(experts_of(model))
    step, per_step, n_step = fused_casts(model, micro_batches(2), True, monkeypatch)
    call, per_call, n_call = fused_casts(model, micro_batches(2), False, monkeypatch)
    assert (n_step, n_call) == (fused, 2 * fused)
    assert all(torch.equal(a, b) for a, b in zip(step, call))
    assert sorted(per_step) == sorted(per_call) and all(torch.equal(per_step[n], per_call[n]) for n in per_step)


def test_the_step_copies_are_weights_to_the_memory_count_and_the_swap():
    """The step's copy of a trained fused weight and of a frozen one (a frozen expert: a frozen parameter, as
    ``frozen_weight_casts`` makes a frozen Linear's) are weights to ``weight_copy``, views included, so that the
    memory count and the activation swap leave them out; each is made once."""
    trained = nn.Parameter(torch.randn(4, 16, 8))
    frozen = nn.Parameter(torch.randn(4, 16, 8), requires_grad=False)
    with step_casts():
        for weight in (trained, frozen):
            copy = cached_cast(weight, torch.bfloat16)
            assert copy.dtype == torch.bfloat16 and copy is cached_cast(weight, torch.bfloat16)
            assert weight_copy(copy) and weight_copy(copy.transpose(-2, -1)), weight.requires_grad


def test_lora_on_the_fused_experts_casts_the_adapted_weight():
    """With peft's ``ParamWrapper`` on the fused experts, the grouped matmuls still take bf16 (the base weight
    plus the adapter, cast per call: it is computed on every read), only the adapters train, in fp32, and the
    step's cache changes no bit."""
    model = tiny_model("qwen3_vl_moe")
    section = LoraSection(r=2, lora_alpha=4, target_modules=["q_proj"],
                          target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
                          init_lora_weights=False)
    apply_adapter(model, section.peft_config())
    step, per_step, counter = run(model, micro_batches(2), cached=True)
    assert counter.calls and set(counter.calls) == {(torch.bfloat16, torch.bfloat16)}, counter.calls
    assert counter.fallback_reads() == 0
    assert per_step and all(is_adapter_tensor(n) and g.dtype == torch.float32 for n, g in per_step.items())
    assert any(".experts." in n and g.abs().max() > 0 for n, g in per_step.items())
    call, per_call, _ = run(model, micro_batches(2), cached=False)
    assert all(torch.equal(a, b) for a, b in zip(step, call))
    assert all(torch.equal(per_step[n], per_call[n]) for n in per_step)


def test_expert_parallel_reads_the_split_sizes_once_per_moe_layer(world):
    """transformers' ``AllToAllEP`` on a one-rank EP group: the experts still run the bf16 grouped GEMM with no
    read of the offsets, and the all-to-all's split sizes are read to the host once per MoE layer forward."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed.expert_parallel import EPImplementationInterface
    model = tiny_model("qwen3_vl_moe")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    layers = experts_of(model)
    for experts in layers:
        dispatch = EPImplementationInterface()["all_to_all"](experts, mesh, mesh)
        experts.forward = lambda h, i, w, dispatch=dispatch: dispatch(h, i, w).to(h.dtype)
    _, grads, counter = run(model, micro_batches(1), cached=True)
    assert set(counter.calls) == {(torch.bfloat16, torch.bfloat16)} and counter.fallback_reads() == 0
    split_reads = {w: n for w, n in counter.syncs.items() if "expert_parallel.py" in w}
    assert list(split_reads.values()) == [len(layers)] and all(w.startswith("tolist") for w in split_reads), \
        counter.syncs
    assert any(".experts." in n and g.abs().max() > 0 for n, g in grads.items())


def test_experts_whose_rows_the_grouped_gemm_cannot_take_in_bf16_stay_fp32():
    """The grouped GEMM needs 16-byte aligned rows: experts of hidden and intermediate size 12 (24 bytes in bf16)
    run in fp32 as before, instead of failing (the CPU kernel's error, also without the guard's cast: a bf16
    model of that size fails in transformers itself)."""
    from transformers import Qwen3VLMoeTextConfig
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextExperts
    config = Qwen3VLMoeTextConfig(hidden_size=12, moe_intermediate_size=12, num_experts=4, num_experts_per_tok=2)
    config._experts_implementation = "grouped_mm"
    experts = Qwen3VLMoeTextExperts(config)
    for p in experts.parameters():
        torch.nn.init.normal_(p)
    counter = GroupedReads([experts])
    with counter, torch.autocast("cpu", dtype=torch.bfloat16):
        out = experts(torch.randn(5, 12), torch.randint(0, 4, (5, 2)), torch.rand(5, 2))
    assert out.dtype == torch.float32 and set(counter.calls) == {(torch.float32, torch.float32)}, counter.calls
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="multiple of 16 bytes"):
        torch._grouped_mm(torch.randn(5, 12).bfloat16(), torch.randn(4, 12, 12).bfloat16(),
                          offs=torch.tensor([1, 2, 3, 5], dtype=torch.int32))


def test_the_bf16_experts_are_transformers_grouped_mm():
    """The registration is what a model's ``grouped_mm`` experts call."""
    assert moe.ALL_EXPERTS_FUNCTIONS["grouped_mm"] is expert_precision.bf16_grouped_experts
