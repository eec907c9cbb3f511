"""Properties a GPU run depends on, proven on CPU in one process (a world of one rank, gloo).

- bf16 memory: each trained weight is cast to bf16 once per step and every micro-batch in flight shares that
  copy, so with weights dominating a micro saves no more in bf16 than in fp32 (a region per stage call saved a
  copy per micro), and the step is still exact: the same loss and gradients as the region-per-call policy.
- Host syncs: on a device emulated on the CPU (tests/device_model.py), every read of a device tensor on the
  host and every blocking copy during a step is counted: one per step (the step's sums), none per action, for a
  decoder-only model in fp32 and bf16 and for Qwen2.5-VL (an earlier runtime: 2 + 5 per micro-batch, and about 23
  more per micro-batch for Qwen2.5-VL).
- Strict device mode: every one of those steps runs with ``strict=True``, so every tensor handed to a transfer
  or a collective is on the (emulated) device.
- The peak-activation metric leaves FSDP2's gathered weights out, as it leaves the weights out.
"""

import os

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mpipe_hf.models import split as split_model
from mpipe_hf.runtime import PipelineExecutor
from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.train.precision import autocast_modules

VOCAB, HIDDEN, TOKENS = 512, 256, 8  # weights (about 0.9 MB of bf16 per layer) dominate a micro's activations


def qwen2(layers: int = 2, lora: bool | str = False) -> Qwen2ForCausalLM:
    """A real Qwen2 (random weights, seed 0); ``lora``: peft's LoRA on every projection, the base frozen
    (``"dora"``: with DoRA, whose layers also read their base weight's norm)."""
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    if lora:
        from peft import LoraConfig
        from mpipe_hf.models.adapters import apply_adapter
        apply_adapter(model, LoraConfig(r=4, lora_dropout=0.0, use_dora=lora == "dora", target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    return model


def micros(count: int) -> list[dict]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        ids = torch.randint(0, VOCAB, (1, TOKENS), generator=gen)
        out.append({"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)})
    return out


def executor_for(model, group, bf16: bool, num_micro: int, measure_memory: bool = True):
    cfg = ScheduleConfig(1, 2, num_micro, "identity")
    split = split_model(model, cfg, 0)
    stages, preprocess = split.stages, split.preprocess
    if bf16:
        stages, preprocess = autocast_modules(stages, preprocess, torch.device("cpu"))
    params = split.trainable_parameters(cfg, 0)
    ex = PipelineExecutor(cfg, 0, stages, preprocess, group, torch.device("cpu"), params.values(),
                          measure_memory=measure_memory)
    return ex, params


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_bf16_saves_no_more_per_micro_than_fp32_when_weights_dominate(world, lora):
    """The saved bytes at the step's peak, per micro-batch in flight, in bf16 and fp32: a weight's bf16 copy is
    one per step, not one per micro, trained (autocast's cache) or frozen (a LoRA base layer, cast when the step
    starts). With a copy per micro (the old policy) bf16 saved several times fp32: 1.37 against 0.16 MiB, and
    with LoRA 1.22 against 0.13 MiB."""
    data = micros(4)
    peaks = {}
    for bf16 in (False, True):
        ex, _ = executor_for(qwen2(lora=lora), world, bf16, num_micro=4)
        stats = ex.step(lambda m: data[m])
        peaks[bf16] = stats.rank_activation_bytes[0] / stats.peak_activations
        ex.close()
    assert peaks[True] <= peaks[False], f"bf16 {peaks[True]:.0f} B per micro vs fp32 {peaks[False]:.0f} B"


@pytest.mark.parametrize("lora", [False, True, "dora"], ids=["full", "lora", "dora"])
def test_one_weight_cast_per_step_is_exact_against_a_region_per_call(world, lora):
    """The same loss and the same gradients, bit for bit, as each stage call in a region of its own (the cached
    or precast copy is the same rounding of the same fp32 weight)."""
    data = micros(3)
    results = []
    for one_region in (True, False):
        model = qwen2(lora=lora)
        ex, params = executor_for(model, world, True, num_micro=3, measure_memory=False)
        if not one_region:
            ex.autocast = None  # each stage call opens and closes its own region: a cast per call
        stats = ex.step(lambda m: data[m])
        results.append((stats.loss, {n: p.grad.clone() for n, p in params.items()}))
        ex.close()
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_a == loss_b
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def syncs_per_step(model, group, num_micro: int, bf16: bool = False):
    """Host synchronisations of the second step (the first builds caches) on an emulated device."""
    from device_model import DEVICE, DeviceModel
    cfg = ScheduleConfig(1, 2, num_micro, "identity")
    split = split_model(model, cfg, 0)
    stages, preprocess = split.stages, split.preprocess
    if bf16:
        stages, preprocess = autocast_modules(stages, preprocess, DEVICE)
    params = split.trainable_parameters(cfg, 0)
    data = micros(num_micro)
    with DeviceModel(list(stages.values())) as counter:
        ex = PipelineExecutor(cfg, 0, stages, preprocess, group, DEVICE, params.values(), strict=True)
        counter.transport(ex.p2p)
        ex.step(lambda m: data[m])
        counter.syncs.clear()
        ex.step(lambda m: data[m])
    ex.close()
    return counter.syncs


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_host_syncs_per_step_are_a_fixed_few_and_none_per_action(world, bf16, monkeypatch):
    """Every read of a device tensor on the host and every blocking copy, counted on an emulated device: the
    same count for 2 and 6 micro-batches (none per action), and at most two per step (the step's sums). The sums
    leave the host through ``to_device`` (pinned on CUDA: a ``non_blocking`` copy from pageable memory waits for
    the device, another host sync per step), not a plain ``.to``."""
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from mpipe_hf.runtime import executor, placement
    moved = []
    monkeypatch.setattr(executor, "to_device", lambda t, device: moved.append(t) or placement.to_device(t, device))
    few = syncs_per_step(qwen2(), world, 2, bf16)
    assert [t.dtype for t in moved] == [torch.float64, torch.float64], moved  # the two steps' sums
    many = syncs_per_step(qwen2(), world, 6, bf16)
    assert sum(many.values()) == sum(few.values()), f"per action: {many - few}"
    assert sum(few.values()) <= 2, few


@pytest.fixture(scope="module")
def vl_models():
    """Tiny real Qwen2.5-VL and Qwen3-VL configs, and micro-batches their own processors made from real photos
    (some with an image per row, some without)."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
    from common import VOCAB_RANKS, collator, make_ragged_pool, qwen2_tokenizer, tiny_configs
    tokenizer = qwen2_tokenizer(VOCAB_RANKS)
    configs = tiny_configs(tokenizer)
    return {name: (configs[name], make_ragged_pool(collator(configs[name], tokenizer))) for name in ("vl", "qwen3_vl")}


@pytest.mark.parametrize("family, preprocess", [("vl", "trainable"), ("vl", "identity"), ("qwen3_vl", "frozen")])
def test_a_vision_language_step_reads_nothing_back_per_micro(world, vl_models, family, preprocess):
    """Qwen-VL's rope index, vision positions, windows and attention boundaries are computed on the host at load
    (transformers reads them back about 23 times per micro-batch otherwise), and Qwen3-VL's DeepStack adds at
    image positions computed there: the same few syncs for 2 and 3 micro-batches, with ``P`` trained on its
    owner, frozen, or in stage 0 (identity)."""
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from device_model import syncs_per_step
    from transformers import AutoModelForImageTextToText
    config, pool = vl_models[family]
    torch.manual_seed(0)
    counts = syncs_per_step(AutoModelForImageTextToText.from_config(config), preprocess, pool, world)
    assert sum(counts[3].values()) == sum(counts[2].values()), f"per micro: {counts[3] - counts[2]}"
    assert sum(counts[2].values()) <= 2, counts[2]


def test_fsdp_gathered_weights_are_not_counted_as_activations(world):
    """With FSDP2 a forward saves the unsharded weight, a tensor of a storage of its own: the saved
    activation bytes of a stage chunk must be the same with and without FSDP2 (a world of one rank)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from mpipe_hf.runtime.memory import SavedStorages, storage_ids
    counts = []
    for shard in (False, True):
        torch.manual_seed(0)
        chunk = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        if shard:
            fully_shard(chunk, mesh=init_device_mesh("cpu", (1,)), reshard_after_forward=False)
        x = torch.randn(4, 64, requires_grad=True)
        with SavedStorages(storage_ids(chunk.parameters())) as saved:
            chunk(x).sum().backward()
        counts.append(saved.bytes())
    assert counts[1] == counts[0], f"FSDP2 {counts[1]} B saved against {counts[0]} B without"
