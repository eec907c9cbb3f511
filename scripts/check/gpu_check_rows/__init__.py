"""The rows of ``scripts/check/gpu_check.py``, one module per kind (docs/gpus.md explains each row):

- :mod:`.families`: sync-debug over tiny Qwen2.5-VL (identity, frozen, trainable), Qwen3-VL, Qwen3.5 unpadded,
  a packed micro-batch, and FlashAttention 2 where ``flash_attn`` imports;
- :mod:`.wire`: a micro-batch through the sender and wire code onto the device, run by stage 0;
- :mod:`.numerics`: FSDP2 on a one-rank mesh (bf16, LoRA) against one process, and the split against the
  unsplit model under deterministic algorithms;
- :mod:`.perf`: bf16 memory, the plan, swap overlap, step timing and host syncs on a decoder-only model;
- :mod:`.moe`: fused MoE experts on the bf16 grouped GEMM against the fp32 path and a dense MLP, per token;
- :mod:`.nccl_init`: eager or lazy communicator set-up, from NCCL's own log.
"""

from __future__ import annotations


def all_rows() -> tuple:
    """``(check, measure)`` of every row, in the table's order; ``measure(setup)`` returns a
    :class:`~.common.Row`."""
    from . import families, moe, nccl_init, numerics, perf, wire
    return (*families.rows(), *wire.rows(), *numerics.rows(), *perf.rows(), *moe.rows(), *nccl_init.rows())
