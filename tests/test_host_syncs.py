"""Host syncs that come back across ranks.

The R = 1 counts (``test_device_ready``) run no transfer. Here two processes run NCCL's transfer path (headers on
the host over gloo, payloads over gloo groups standing for NCCL's, CUDA streams faked) on a device emulated on the
CPU that counts every host read of a device tensor (``tests/dist/host_syncs_worker.py``), for Qwen2.5-VL (``P``
identity, frozen, trainable, trainable with owner-backward), Qwen3-VL, Qwen3.5 on unpadded micro-batches and a
packed Qwen3-VL micro-batch, each at ``M = 2`` and ``M = 4`` with strict device mode on. Before the fix the sender
moved the host keys (image grids, the tower's attention boundaries, packed row lengths) to the device: rank 0's
tower read them back once per vision block and micro-batch (13 reads inside transformers per micro-batch rank 0
received, with ``P`` identity or trainable), the wire code read the packed lengths back (2 per micro-batch) and
strict mode refused the packed case's ``SEND_F``. About 10 s.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import read_results, run_torchrun  # noqa: E402

from mpipe_hf.models.host_metadata import VISION_META_KEYS  # noqa: E402
from mpipe_hf.models.packed import PACKED_KEYS  # noqa: E402
from mpipe_hf.runtime.wire import HEADER_KEYS, decode_header, encode_header, make_plan, pack, unpack  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "dist", "host_syncs_worker.py")
# reads inside transformers that remain at R = 2, by "kind at file:line" (docs/gpus.md, "What is verified"): none
TRANSFORMERS_READS: frozenset[str] = frozenset()


def by_origin(counts: dict[str, int]) -> tuple[int, dict[str, int], dict[str, int]]:
    """``(project's reads, reads inside transformers, reads from elsewhere)`` of one step's counts."""
    own = sum(n for where, n in counts.items() if " at mpipe_hf/" in where)
    library = {w: n for w, n in counts.items() if " at transformers/" in w}
    other = {w: n for w, n in counts.items() if " at mpipe_hf/" not in w and " at transformers/" not in w}
    return own, library, other


def test_reads_of_the_device_do_not_grow_with_the_micro_batches_across_ranks(tmp_path):
    """On both ranks and in every case, the project's own reads of device tensors are the same at M and 2 M and
    one per step (the step's sums; ``GRAD_REDUCE``'s vote on which of ``P``'s parameters have a gradient is on
    the host), and nothing inside transformers reads the device back but the reads
    listed in :data:`TRANSFORMERS_READS`."""
    run_torchrun(WORKER, 2, [str(tmp_path)], timeout=300)
    for rank, results in enumerate(read_results(str(tmp_path), 2)):
        assert len(results) == 7, sorted(results)
        for case, steps in results.items():
            (own_few, lib_few, other_few), (own_many, lib_many, other_many) = (by_origin(steps[m]) for m in ("2", "4"))
            what = f"rank {rank}, {case}: {steps}"
            assert own_few == own_many == 1, what
            assert set(lib_few) | set(lib_many) <= TRANSFORMERS_READS, what
            assert other_few == other_many == {}, what


def test_host_keys_travel_in_the_header_and_arrive_on_the_host_with_their_dtype():
    """Every key the owner keeps on the host is a header key; on the host (an int32 boundary, a 0-d length, an
    int64 grid) they travel in the header with their dtype and take no payload bytes; on the device (a
    FlashAttention tower's boundaries) the same key travels in the payload."""
    assert set(PACKED_KEYS) | {"image_grid_thw"} | {k for k in VISION_META_KEYS if "seqlen" in k} <= HEADER_KEYS
    payload = {"image_grid_thw": torch.tensor([[1, 4, 6], [1, 2, 2]]), "x": torch.randn(3),
               "vision_meta.cu_seqlens": torch.tensor([0, 24, 28], dtype=torch.int32),
               "vision_meta.max_seqlen": torch.tensor(24), "packed_lengths": torch.tensor([5, 7])}
    header = encode_header(payload)
    entries = decode_header(header)
    assert make_plan(entries)[3] == 12, "only x's bytes in the payload"
    got = unpack(entries, pack([payload["x"]]))
    for key, tensor in payload.items():
        assert got[key].dtype == tensor.dtype and got[key].shape == tensor.shape and torch.equal(got[key], tensor)
    meta = torch.device("meta")  # stands for a device: not the host
    on_device = {"vision_meta.cu_seqlens": torch.empty(3, dtype=torch.int32, device=meta)}
    assert decode_header(encode_header(on_device))[0][1] is torch.int32, "a device tensor goes in the payload"
