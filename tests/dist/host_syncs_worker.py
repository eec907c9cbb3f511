"""torchrun worker (2 processes): the host syncs of a pipelined step with transfers between the ranks.

Usage: torchrun --nproc_per_node 2 host_syncs_worker.py OUT_DIR

Every rank runs NCCL's transfer path on a device emulated on the CPU (``tests/device_model.py``): the transfers'
headers over real gloo header groups on the host, their payloads over gloo groups standing for NCCL, CUDA streams
and events faked (``test_connect.fake_cuda``), strict device mode on. The device model counts every host read of a
device tensor during a step (the second one: the first builds caches), once with ``M`` and once with ``2 M``
micro-batches, for each case. Each rank writes ``OUT_DIR/rank<r>.json``: ``{case: {"M": {where: count}, ...}}``,
``where`` being ``"kind at file:line"`` of the read's innermost frame outside torch, with the file's root
(``mpipe_hf/...``, ``transformers/...``).
"""

import json
import os
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import VOCAB_RANKS, collator, make_packed_pool, make_ragged_pool, qwen2_tokenizer  # noqa: E402
from device_model import DEVICE, DeviceModel  # noqa: E402
from test_connect import fake_cuda  # noqa: E402
from transformers import AutoModelForImageTextToText  # noqa: E402

from mpipe_hf.data.packing import pack_micro  # noqa: E402
from mpipe_hf.models import split as split_model  # noqa: E402
from mpipe_hf.families.qwen import tiny as qwen_tiny  # noqa: E402
from mpipe_hf.runtime import PipelineExecutor  # noqa: E402
from mpipe_hf.runtime.watchdog import Watchdog  # noqa: E402
from mpipe_hf.schedule import ScheduleConfig  # noqa: E402

M = 2  # micro-batches of the smaller step; the larger has 2 M
CASES = [  # (name, config, preprocess, pool, micro-batches of the pool)
    ("qwen2_5_vl-identity", "vl", "identity", "ragged", None),
    ("qwen2_5_vl-frozen", "vl", "frozen", "ragged", None),
    ("qwen2_5_vl-trainable", "vl", "trainable", "ragged", None),
    ("qwen2_5_vl-owner-backward", "vl", "owner_backward", "ragged", None),  # GRAD_SEND and GRAD_REDUCE too
    ("qwen3_vl-frozen", "qwen3_vl", "frozen", "ragged", None),
    ("qwen3_5-unpadded", "qwen3_5", "frozen", "ragged", (3, 5, 7)),  # no padding: the mask is dropped at load
    ("qwen3_vl-packed", "qwen3_vl", "frozen", "packed", None),
]


def configs(tokenizer) -> dict:
    """Tiny real configs, one decoder layer per stage (Qwen3.5: two, the last one full attention)."""
    return {"vl": qwen_tiny.tiny_qwen2_5_vl_config(tokenizer, num_layers=2),
            "qwen3_vl": qwen_tiny.tiny_qwen3_vl_config(tokenizer, num_layers=2),
            "qwen3_5": qwen_tiny.tiny_qwen3_5_config(tokenizer, num_layers=4)}


def polled_wait(self, work, what):
    """``Watchdog.wait`` for gloo works standing for NCCL's (which report completion; gloo's complete in
    ``wait``): a bounded blocking wait."""
    work.wait(timedelta(seconds=60))


def step_syncs(config, preprocess, micros, num_micro, rank) -> dict:
    """The device model's counts of the second of two steps of ``num_micro`` micro-batches (``R = 2, V = 1``)."""
    owner_backward = preprocess == "owner_backward"
    cfg = ScheduleConfig(2, 1, num_micro, "trainable" if owner_backward else preprocess, owner_backward=owner_backward)
    torch.manual_seed(0)
    split = split_model(AutoModelForImageTextToText.from_config(config), cfg, rank)
    params = split.trainable_parameters(cfg, rank)
    modules = [*split.stages.values(), *([split.preprocess.module] if split.preprocess.module else [])]
    data = [micros[m % len(micros)] for m in range(num_micro)]

    def load(m):
        split.validate_micro(data[m])
        return data[m]
    with DeviceModel(modules) as counter:
        ex = PipelineExecutor(cfg, rank, split.stages, split.preprocess, dist.group.WORLD, DEVICE, params.values(),
                              timedelta(seconds=60), split.tied_parameters(cfg, rank), strict=True)
        assert ex.p2p.headers is not None, "NCCL's path: header groups"
        ex.p2p.cuda = True  # NCCL's path: payloads on the (emulated) device, CUDA streams (faked)
        ex.step(load)
        counter.syncs.clear()
        ex.step(load)
    ex.close()
    return dict(counter.syncs)


def main(out_dir: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    tokenizer = qwen2_tokenizer(VOCAB_RANKS)
    made = configs(tokenizer)
    pools = {}
    results = {}
    with pytest.MonkeyPatch.context() as patch, fake_cuda(patch):
        patch.setattr(Watchdog, "wait", polled_wait)
        for name, family, preprocess, kind, pick in CASES:
            key = (family, kind)
            if key not in pools:
                collate = collator(made[family], tokenizer)
                pools[key] = make_packed_pool(collate) if kind == "packed" else make_ragged_pool(collate)
            micros = [pools[key][i] for i in (pick or range(len(pools[key])))]
            if kind == "packed":
                micros = [pack_micro(mb) for mb in micros]
            results[name] = {str(n): step_syncs(made[family], preprocess, micros, n, rank) for n in (M, 2 * M)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
