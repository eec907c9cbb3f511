"""NCCL's buffer memory per rank, for ``mpipe-hf plan``: the communicators a rank joins and what each holds.

The model, from NCCL's documented defaults (NCCL user guide, "Environment Variables": ``NCCL_BUFFSIZE``, the
buffer used between a pair of GPUs, 4 MiB by default; ``NCCL_PROTO``, the three protocols Simple, LL and LL128;
``NCCL_NCHANNELS_PER_NET_PEER``, 2 channels per peer for point-to-point over the network by default; within a node
NCCL picks between ``NCCL_MIN_P2P_NCHANNELS`` and ``NCCL_MAX_P2P_NCHANNELS``): a communicator holds, for each
peer it connects to, one buffer per channel and per protocol, ``NCCL_BUFFSIZE`` each,
``peers x channels x protocols x 4 MiB`` = 24 MiB per peer. NCCL's own figures differ a little per protocol (LL's
buffer is smaller, LL128's a little larger): this is an estimate of the right size, not a count of NCCL's
allocations. A collective's communicator over NVLink can open more channels than two (up to NCCL's maximum),
so for the collective groups the figure is a floor; only a GPU shows the real one (``scripts/check/gpu_check.py``).

The communicators (:mod:`mpipe_hf.runtime.groups`): one per directed pair of pipeline ranks the rank is in (a peer
each; :func:`~mpipe_hf.schedule.eager.pipeline_pairs`: at most 6, rank 0 ``2R - 2``), the pipeline's collective
group and the world's (a ring: two peers), the data-parallel group when ``dp_size > 1`` (a ring), the EP group
when ``ep_size > 1`` (its all-to-all connects every member) and, with ``cp_size > 1``, the CP group (Ulysses'
all-to-all: every member) and the ``dp x cp`` reduction group in place of the data-parallel one (a ring,
:func:`~mpipe_hf.runtime.mesh.reduction_mesh`). The header and vote groups are gloo's: host memory.
"""

from __future__ import annotations

from ..schedule.eager import pipeline_pairs

NCCL_BUFFSIZE = 4 * 2**20  # bytes, NCCL_BUFFSIZE's default
PROTOCOLS = 3              # Simple, LL, LL128
CHANNELS = 2               # per peer, NCCL_NCHANNELS_PER_NET_PEER's default
PER_PEER = NCCL_BUFFSIZE * PROTOCOLS * CHANNELS


def communicators(rank: int, pp_size: int, dp_size: int = 1, ep_size: int = 1,
                  cp_size: int = 1) -> dict[str, tuple[int, int]]:
    """``{kind: (communicators, peers they connect in all)}`` of pipeline rank ``rank`` (every replica's is the
    same); kinds with none are left out."""
    ring = lambda n: min(2, n - 1)  # noqa: E731 - a ring's neighbours
    pairs = sum(rank in pair for pair in pipeline_pairs(pp_size))
    reduction = "data parallel" if cp_size == 1 else "data x context parallel"
    out = {"pipeline pairs": (pairs, pairs), "pipeline collectives": (1, ring(pp_size)),
           "world": (1, ring(pp_size * dp_size * cp_size)), reduction: (1, ring(dp_size * cp_size)),
           "expert parallel": (1, ep_size - 1), "context parallel": (1, cp_size - 1)}
    return {kind: counts for kind, counts in out.items() if counts[1] > 0}


def nccl_bytes(rank: int, pp_size: int, dp_size: int = 1, ep_size: int = 1, cp_size: int = 1) -> int:
    """The NCCL buffer bytes of pipeline rank ``rank`` under the module's model: ``PER_PEER`` for every peer of
    every communicator it joins (:func:`communicators`); 0 for a world of one process."""
    return PER_PEER * sum(peers for _, peers in communicators(rank, pp_size, dp_size, ep_size, cp_size).values())
