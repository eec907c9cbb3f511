"""torchrun worker: pipelined steps vs the unsplit model on one process, for many cases in one process group.

Usage: torchrun --nproc_per_node R numerics_worker.py FIXTURE OUT_DIR CASES_JSON
Each rank writes OUT_DIR/rank{r}.json: per case, the loss, the reference loss, the largest gradient difference
over this rank's parameters and their names.
"""

import copy
import json
import os
import sys

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from mpipe_hf.models import get_splitter
from mpipe_hf.runtime import PipelineExecutor, build_mesh, init_distributed
from mpipe_hf.schedule import ScheduleConfig


def reference_step(model, micros):
    """Loss and gradients of the unsplit model over the step, normalised by the step's label tokens."""
    total_tokens = sum(int((mb["labels"][..., 1:] != -100).sum()) for mb in micros)
    loss_total = 0.0
    for mb in micros:
        inputs = {k: v for k, v in mb.items() if k != "labels"}
        logits = model(**inputs).logits
        loss = model.loss_function(logits=logits, labels=mb["labels"], vocab_size=model.config.text_config.vocab_size,
                                   num_items_in_batch=total_tokens)
        loss.backward()
        loss_total += loss.detach().item()
    return loss_total


def corrupt(mb, image_token_id):
    """Drop one image token: the image-token count no longer matches the features."""
    mb = dict(mb)
    ids = mb["input_ids"].clone()
    ids[ids == image_token_id] = torch.where(torch.arange(int((ids == image_token_id).sum())) == 0,
                                             torch.tensor(0), torch.tensor(image_token_id))
    mb["input_ids"] = ids
    return mb


def run_case(case, fixture, group, rank, device, pp_size):
    cfg = ScheduleConfig(pp_size, case["vpp"], case["num_micro"], case["preprocess"])
    micros = [fixture["micro_batches"][(i + case.get("offset", 0)) % len(fixture["micro_batches"])]
              for i in range(cfg.num_micro)]
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig.from_dict(fixture["config"]))
    ref = copy.deepcopy(model)
    ref.model.visual.requires_grad_(cfg.trainable)
    split = get_splitter(model.config.model_type)(model, cfg, rank)
    params = split.trainable_parameters(cfg, rank)
    executor = PipelineExecutor(cfg, rank, split.stages, split.preprocess, group, device, params.values())
    result = {}
    if case.get("bad_micro") is not None:
        bad = case["bad_micro"]
        broken = {bad: corrupt(micros[bad], model.config.image_token_id)}

        def load_bad(m):
            mb = broken.get(m, micros[m])
            split.validate_micro(mb)
            return mb
        try:
            executor.step(load_bad)
            result["error"] = None
        except ValueError as err:
            result["error"] = str(err)
        for p in params.values():
            p.grad = None

    def load(m):
        split.validate_micro(micros[m])
        return micros[m]
    stats = executor.step(load)
    ref_loss = reference_step(ref, micros)
    ref_params = dict(ref.named_parameters())
    worst, max_diff = None, 0.0
    for name, p in params.items():
        ref_grad = ref_params[name].grad
        if p.grad is None or ref_grad is None:
            diff = 0.0 if (p.grad is None and ref_grad is None) else float("inf")
        else:
            diff = float((p.grad - ref_grad).abs().max())
        if diff >= max_diff:
            worst, max_diff = name, diff
    result.update(loss=stats.loss, ref_loss=ref_loss, max_diff=max_diff, worst=worst, names=sorted(params),
                  ref_names=sorted(n for n, p in ref.named_parameters() if p.requires_grad),
                  bytes_by_key=dict(executor.p2p.bytes_by_key))
    return result


def main():
    fixture_path, out_dir, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    device = init_distributed()
    fixture = torch.load(fixture_path, weights_only=False)
    pp_size = int(os.environ["WORLD_SIZE"])
    mesh = build_mesh(pp_size)
    group, rank = mesh.get_group("pp"), mesh.get_local_rank("pp")
    results = {case["name"]: run_case(case, fixture, group, rank, device, pp_size) for case in cases}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
