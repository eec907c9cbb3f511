"""FSDP2 under ``train.bf16`` against one process under autocast (``tests/test_fsdp_bf16.py``; torchrun, 2
processes, gloo).

Two stage chunks per rank, as a pipeline rank holds them: a real Qwen2 decoder (embedding, RMSNorms, attention and
MLP ``nn.Linear`` with and without bias; in one run frozen under a PEFT LoRA adapter with dropout) and a head with
an ``nn.Conv1d``, a LayerNorm and an ``nn.Linear`` with bias. Each of the 2 replicas runs its own 3 micro-batches
per step (forward and summed-loss backward, the chunk's last backward reducing, as the executor drives
:class:`~mpipe_hf.runtime.data_parallel.DataParallel`), then an SGD step, for 2 steps. The reference is the unsplit
pair on one process: each replica's micro-batches in turn under per-micro autocast, the two replicas' fp32 gradients
averaged as FSDP2 averages them. Runs: FSDP2 in fp32 (an fp32-gathering engine), FSDP2 in bf16 with fp32 reduction
(one autocast region per micro or per step), with activation checkpointing, and with LoRA; each records the dtypes
of its all-gathers and reduce-scatters and of the Linear and Conv weights their forwards see. Rank 0 writes the
findings as JSON to ``argv[1]``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from transformers import Qwen2Config, Qwen2Model

from mpipe_hf.models.tiny import non_degenerate
from mpipe_hf.runtime.data_parallel import AUTOCAST_MATMULS, DataParallel, local

HIDDEN, VOCAB, MICRO, STEPS, LR = 32, 96, 3, 2, 0.5


class Head(nn.Module):
    """A convolution over the sequence, a LayerNorm and an LM head with a bias."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(HIDDEN, HIDDEN, 3, padding=1)
        self.norm = nn.LayerNorm(HIDDEN)
        self.out = nn.Linear(HIDDEN, VOCAB)

    def forward(self, hidden):
        hidden = hidden + self.conv(hidden.transpose(1, 2)).transpose(1, 2)
        return self.out(self.norm(hidden))


def build(lora: bool = False) -> dict[int, nn.Module]:
    """The two chunks; ``lora``: the decoder frozen under a LoRA adapter with dropout (PEFT)."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "eager"
    body = non_degenerate(Qwen2Model(config))  # its zero-initialised biases drawn afresh
    if lora:
        from peft import LoraConfig, get_peft_model
        body.requires_grad_(False)
        body = get_peft_model(body, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.3, init_lora_weights="gaussian",
                                               target_modules=["q_proj", "v_proj", "down_proj"]))
    return {0: body.train(), 1: Head().train()}


def micros(replica: int, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + 10 * replica)
    return [torch.randint(0, VOCAB, (2, 5 + m), generator=g) for m in range(MICRO)]


def loss_of(stages, ids: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(int(ids.sum()) * 31 + ids.shape[1])  # each micro's dropout masks, on any replica
    hidden = stages[0](input_ids=ids).last_hidden_state
    logits = stages[1](hidden)
    return nn.functional.cross_entropy(logits.float()[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1),
                                       reduction="sum")


def reference(lora: bool = False) -> tuple[list[list[float]], list[dict[str, torch.Tensor]]]:
    """Per step: every replica's micro losses, and the averaged gradients (one process, per-micro autocast)."""
    stages = build(lora)
    params = {f"{s}.{n}": p for s, m in stages.items() for n, p in m.named_parameters() if p.requires_grad}
    losses, grads = [], []
    for step in range(STEPS):
        sums, step_losses = [], []
        for replica in range(2):
            for p in params.values():
                p.grad = None
            for ids in micros(replica, step):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = loss_of(stages, ids)
                loss.backward()
                step_losses.append(loss.item())
            sums.append({n: p.grad.clone() for n, p in params.items()})
        grads.append({n: (sums[0][n] + sums[1][n]) / 2 for n in params})
        with torch.no_grad():
            for n, p in params.items():
                p -= LR * grads[-1][n]
        losses.append(step_losses)
    return losses, grads


@contextlib.contextmanager
def recording(log: dict):
    """Record the dtype and element count of every all-gather and reduce-scatter FSDP2 issues (its default
    collectives call ``dist.all_gather_single`` and ``dist.reduce_scatter_single``)."""
    saved = dist.all_gather_single, dist.reduce_scatter_single

    def gather(output, input, *args, **kwargs):
        log.setdefault("all_gather", []).append([str(input.dtype), input.numel()])
        return saved[0](output, input, *args, **kwargs)

    def scatter(output, input, *args, **kwargs):
        log.setdefault("reduce_scatter", []).append([str(input.dtype), input.numel()])
        return saved[1](output, input, *args, **kwargs)
    dist.all_gather_single, dist.reduce_scatter_single = gather, scatter
    try:
        yield
    finally:
        dist.all_gather_single, dist.reduce_scatter_single = saved


def run_fsdp(mesh, bf16: bool, checkpointing: bool, step_wide: bool, lora: bool, replica: int) -> dict:
    """The FSDP2 run on this replica (``step_wide``: one autocast region over the step, else one per micro):
    its micro losses and full gradients per step, and what it recorded."""
    stages = build(lora)
    if checkpointing:
        stages[0].gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    weight_dtypes = set()
    for m in (m for s in stages.values() for m in s.modules() if type(m) in AUTOCAST_MATMULS):
        m.register_forward_hook(lambda mod, args, out: weight_dtypes.add(str(mod.weight.dtype)))
    dp = DataParallel(mesh, "shard", bf16=bf16)
    dp.wrap(stages)
    params = {f"{s}.{n}": p for s, m in stages.items() for n, p in m.named_parameters() if p.requires_grad}
    log, losses, grads = {}, [], []
    with recording(log):
        for step in range(STEPS):
            dp.start_step()
            batch, step_losses = micros(replica, step), []
            # a disabled outer autocast would still nest the micros' regions (and keep its cache): none at all
            with torch.autocast("cpu", dtype=torch.bfloat16) if step_wide else contextlib.nullcontext():
                for m, ids in enumerate(batch):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        loss = loss_of(stages, ids)
                    if m == len(batch) - 1:
                        dp.before_last_backward(0)
                        dp.before_last_backward(1)
                    loss.backward()
                    step_losses.append(loss.item())
            grads.append({n: p.grad.full_tensor() for n, p in params.items()})
            with torch.no_grad():
                for p in params.values():
                    local(p).sub_(LR * local(p.grad))
                    p.grad = None
            losses.append(step_losses)
    return {"losses": losses, "grads": grads, "log": log, "weight_dtypes": sorted(weight_dtypes)}


def worst(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in a)


# (name, bf16 engine, activation checkpointing, one autocast region per step, LoRA). The fp32 engine in
# per-micro regions only: in one step-wide region its cached casts lose the last micro's gradients (the note in
# tests/test_fsdp_bf16.py)
RUNS = [("fp32", False, False, False, False), ("bf16", True, False, False, False),
        ("bf16_step", True, False, True, False), ("bf16_ac", True, True, True, False),
        ("bf16_lora", True, False, True, True)]


def findings(mesh, replica: int) -> dict:
    """Every run of :data:`RUNS` on this replica against the reference (what ``tests/test_fsdp_bf16.py``
    asserts); a worker that already has a 2-process group can call this with ``mesh`` its 1-D ``dp`` mesh."""
    references, out = {}, {}
    for name, bf16, checkpointing, step_wide, lora in RUNS:
        if lora not in references:
            references[lora] = reference(lora)
        ref_losses, ref_grads = references[lora]
        run = run_fsdp(mesh, bf16, checkpointing, step_wide, lora, replica)
        mine = [step[replica * MICRO:(replica + 1) * MICRO] for step in ref_losses]
        out[name] = {
            "loss_diff": max(abs(a - b) for x, y in zip(run["losses"], mine) for a, b in zip(x, y)),
            "grad_diff": [worst(g, r) for g, r in zip(run["grads"], ref_grads)],
            "all_gather": sorted({d for d, _ in run["log"].get("all_gather", [])}),
            "reduce_scatter": sorted({d for d, _ in run["log"].get("reduce_scatter", [])}),
            "gathered_bytes": sum(n * (2 if d == "torch.bfloat16" else 4) for d, n in run["log"]["all_gather"]),
            "weight_dtypes": run["weight_dtypes"]}
    return out


def main() -> None:
    faulthandler.enable()  # a C++ abort (once in CI: "terminate called without an active exception") names its place
    dist.init_process_group("gloo")
    replica = dist.get_rank()
    out = findings(init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))["dp"], replica)
    if replica == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
