"""The device-readiness figures for a checkout: host syncs per step on an emulated device and bf16 bytes saved
per micro-batch.

Usage: python scripts/bench/device_ready_figures.py [--root CHECKOUT]

``--root`` is the checkout whose ``mpipe_hf`` runs (default: this one); the device model is always this tree's
``tests/device_model.py``, so an older commit can be measured from a worktree (``git worktree add /tmp/old REV``).
One process, a gloo world of one rank; a 2-layer Qwen2 (hidden 256, 8 tokens per micro, R = 1, V = 2), with and
without LoRA, and a tiny Qwen2.5-VL whose micro-batches its own processor made from real photos.
"""

import argparse
import copy
import inspect
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=HERE)
    args = parser.parse_args()
    sys.path[:0] = [args.root, os.path.join(HERE, "tests"), os.path.join(HERE, "tests", "dist")]
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
    import mpipe_hf
    from device_model import DEVICE, DeviceModel
    from mpipe_hf.models import split as split_model
    from mpipe_hf.runtime import PipelineExecutor
    from mpipe_hf.schedule import ScheduleConfig
    from mpipe_hf.train.precision import autocast_modules
    from test_device_ready import micros, qwen2
    print(f"mpipe_hf from {os.path.dirname(mpipe_hf.__file__)}")
    strict = {"strict": True} if "strict" in inspect.signature(PipelineExecutor).parameters else {}

    def executor(model, cfg, bf16, device, **kwargs):
        split = split_model(model, cfg, 0)
        stages, preprocess = split.stages, split.preprocess
        if bf16:
            stages, preprocess = autocast_modules(stages, preprocess, device)
        ex = PipelineExecutor(cfg, 0, stages, preprocess, dist.group.WORLD, device,
                              split.trainable_parameters(cfg, 0).values(), **kwargs)
        return ex, [*stages.values(), *([preprocess.module] if preprocess.module is not None else [])]

    def syncs(model, cfg, data, bf16=False):
        ex, modules = executor(model, cfg, bf16, DEVICE, **strict)
        with DeviceModel(modules) as counter:
            counter.transport(ex.p2p)
            ex.step(lambda m: data[m])
            counter.syncs.clear()
            ex.step(lambda m: data[m])
        ex.close()
        return sum(counter.syncs.values())

    for bf16 in (False, True):
        few, many = (syncs(qwen2(), ScheduleConfig(1, 2, m, "identity"), micros(m), bf16) for m in (2, 6))
        print(f"decoder {'bf16' if bf16 else 'fp32'}: host syncs per step M=2 {few}, M=6 {many} "
              f"({(many - few) / 4:g} per micro)")
    vl, pool = tiny_vl()
    counts = [syncs(copy.deepcopy(vl), ScheduleConfig(1, 2, m, "frozen"), [pool[i % len(pool)] for i in range(m)])
              for m in (2, 4)]
    print(f"Qwen2.5-VL frozen tower: host syncs per step M=2 {counts[0]}, M=4 {counts[1]} "
          f"({(counts[1] - counts[0]) / 2:g} per micro)")
    for lora in (False, True):
        row = {}
        for bf16 in (False, True):
            model = qwen2(lora=lora)
            ex, _ = executor(model, ScheduleConfig(1, 2, 4, "identity"), bf16, torch.device("cpu"),
                             measure_memory=True)
            data = micros(4)
            stats = ex.step(lambda m: data[m])
            row[bf16] = stats.rank_activation_bytes[0] / stats.peak_activations / 2 ** 20
            ex.close()
        print(f"{'LoRA' if lora else 'full'}: saved per micro fp32 {row[False]:.3f} MiB, bf16 {row[True]:.3f} MiB")


def tiny_vl():
    """A tiny real Qwen2.5-VL (random weights, seed 0) and micro-batches its processor made from real photos."""
    import torch
    from common import VOCAB_RANKS, collator, make_vl_pools, qwen2_tokenizer, tiny_configs
    from transformers import AutoModelForImageTextToText
    tokenizer = qwen2_tokenizer(VOCAB_RANKS)
    config = tiny_configs(tokenizer)["vl"]
    pool = make_vl_pools(collator(config, tokenizer))["images"]
    torch.manual_seed(0)
    return AutoModelForImageTextToText.from_config(config), pool


if __name__ == "__main__":
    main()
