"""One GPU class and its links as published figures (:class:`Cluster`), and what data parallelism with ZeRO
stage 1 costs on them: the bytes a rank holds and the seconds of the step's gradient exchange.

Pure Python, no torch. Every figure's source is in the docstring of the field that holds it; every assumption
says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class Cluster:
    """One GPU class and its links. Published figures, unless the attribute says "assumption".

    Attributes:
        name: for the report.
        peak_flops: dense bf16 tensor-core peak per GPU, FLOP/s. H100 SXM5: 989.4 TFLOPS (1,979 with 2:4
            sparsity, which dense training does not use); NVIDIA H100 Tensor Core GPU datasheet.
        compute_efficiency: assumption: the share of ``peak_flops`` that a decoder layer's or the tower's
            forward and backward reach, counted as model FLOPs over time (so it absorbs the memory-bound kernels
            left out of the count). 0.5: above end-to-end MFU reports, which also lose the pipeline bubbles
            and the communication this simulation adds back (38-43% bf16 MFU for Llama 3 405B on 8K-16K H100s;
            Dubey et al., 2024, "The Llama 3 Herd of Models", table 4), and below the peak, since attention,
            the norms and the other memory-bound kernels run slower than dense GEMMs.
        memory_bytes: device memory. 80 GB HBM3 (datasheet), taken as 80 GiB, as ``mpipe-hf plan`` does.
        memory_headroom: assumption: the share of ``memory_bytes`` kept free (allocator fragmentation, the CUDA
            context, NCCL buffers); 0.1, as :meth:`~mpipe_hf.train.plan.Plan.fits`.
        gpus_per_node: 8, an HGX/DGX H100 baseboard (NVIDIA DGX H100 user guide).
        nvlink_bytes_per_s: NVLink 4 per GPU and direction: 450 GB/s (900 GB/s total, both directions, over 18
            links of 25 GB/s each way; datasheet), through NVSwitch to any GPU of the node.
        nvlink_efficiency: assumption: the share of ``nvlink_bytes_per_s`` one NCCL P2P transfer or ring
            collective reaches, 0.8 (about 360 GB/s).
        nvlink_latency_s: assumption: the fixed cost of one NCCL send/recv or ring step within a node, 10 us
            (kernel launch plus protocol handshake; NCCL's small-message latencies are a few us).
        ib_bytes_per_s: InfiniBand NDR, 400 Gb/s = 50 GB/s per GPU and direction: one ConnectX-7 400G NIC per
            GPU on DGX H100 (DGX H100 user guide; NVIDIA ConnectX-7 datasheet).
        ib_efficiency: assumption: 0.8 of line rate (about 40 GB/s) for a transfer or a ring collective
            crossing nodes.
        ib_latency_s: assumption: 20 us per transfer or ring step across nodes (the NIC, one switch hop, NCCL's
            proxy).
    """

    name: str = "H100 SXM5 80GB, NVLink 4 + NDR InfiniBand"
    peak_flops: float = 989.4e12
    compute_efficiency: float = 0.5
    memory_bytes: float = 80 * GIB
    memory_headroom: float = 0.1
    gpus_per_node: int = 8
    nvlink_bytes_per_s: float = 450e9
    nvlink_efficiency: float = 0.8
    nvlink_latency_s: float = 10e-6
    ib_bytes_per_s: float = 50e9
    ib_efficiency: float = 0.8
    ib_latency_s: float = 20e-6

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s: ``peak_flops * compute_efficiency``."""
        return self.peak_flops * self.compute_efficiency

    @property
    def memory_budget_bytes(self) -> float:
        """What a rank may hold: ``memory_bytes * (1 - memory_headroom)``."""
        return self.memory_bytes * (1 - self.memory_headroom)

    def link(self, within_node: bool) -> tuple[float, float]:
        """``(latency s, achieved bytes/s)`` of one link: NVLink within a node, else InfiniBand."""
        if within_node:
            return self.nvlink_latency_s, self.nvlink_bytes_per_s * self.nvlink_efficiency
        return self.ib_latency_s, self.ib_bytes_per_s * self.ib_efficiency

    def pipeline_link(self, pp_size: int) -> tuple[float, float]:
        """The link of a pipeline's P2P transfers, with each pipeline on consecutive GPUs: NVLink when it fits
        in a node, else InfiniBand for every transfer (one simulator link; conservative, since only the hops
        that cross a node boundary take InfiniBand)."""
        return self.link(pp_size <= self.gpus_per_node)

    def ring_seconds(self, nbytes: float, ranks: int, within_node: bool) -> float:
        """One ring reduce-scatter or all-gather of ``nbytes`` (the full buffer) over ``ranks`` GPUs:
        ``(ranks - 1) * (latency + nbytes / ranks / bandwidth)`` (each GPU sends ``(ranks - 1) / ranks`` of the
        buffer; Patarasuk and Yuan, 2009, "Bandwidth optimal all-reduce algorithms for clusters of
        workstations"). Across nodes the ring's slowest link, a NIC, sets the pace."""
        if ranks <= 1:
            return 0.0
        latency, bandwidth = self.link(within_node)
        return (ranks - 1) * (latency + nbytes / ranks / bandwidth)


def zero1_state_bytes(trained_params: float, dp_size: int, frozen_params: float = 0.0,
                      grad_params: float | None = None) -> float:
    """Bytes one rank holds for its parameters under mixed-precision AdamW with ZeRO stage 1 (optimizer states
    sharded over the ``dp_size`` replicas; Rajbhandari et al., 2020, "ZeRO: Memory Optimizations Toward
    Training Trillion Parameter Models", section 3.1 and figure 1: ``2 + 2 + K / N_d`` bytes per parameter,
    ``K = 12``: fp32 master weight, momentum and variance): bf16 weights and gradients of ``trained_params``, their
    optimizer states over ``dp_size``, bf16 weights of ``frozen_params``, and a bf16 gradient buffer for
    ``grad_params`` replicas that backprop without an optimizer (``None``: none)."""
    return (trained_params * (4 + 12 / dp_size) + 2 * frozen_params
            + (2 * grad_params if grad_params else 0.0))


def zero1_sync_seconds(grad_params: float, dp_size: int, cluster: Cluster, within_node: bool) -> float:
    """The data-parallel exchange of one step under ZeRO stage 1, after the pipeline: a ring reduce-scatter of
    the bf16 gradients, each replica updating its shard, then a ring all-gather of the updated bf16 weights;
    the volume of one all-reduce (Rajbhandari et al., 2020, section 7: ZeRO-DP's stage 1 moves ``2 * Psi``
    per step, as plain data parallelism does). ``grad_params`` is the rank's
    trained parameter count; nothing overlaps with compute (an upper bound: frameworks overlap the
    reduce-scatter with the last backwards)."""
    nbytes = 2.0 * grad_params
    return 2 * cluster.ring_seconds(nbytes, dp_size, within_node)


def dp_group_within_node(pp_size: int, dp_size: int, gpus_per_node: int) -> bool:
    """Whether a data-parallel group (pipeline rank ``r`` of every replica, GPUs ``d * pp_size + r``) lies in
    one node when the replicas' pipelines fill consecutive GPUs."""
    return math.ceil(pp_size * dp_size / gpus_per_node) <= 1 or dp_size == 1
