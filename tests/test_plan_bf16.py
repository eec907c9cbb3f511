"""The memory plan's bf16 figure (``train.bf16``: fp32 weights, bf16 autocast) is what a bf16 run of the
executor measures (``measure_memory``), in one process (a world of one gloo rank, R=1, V=2)."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mpipe_hf.models import split as split_model
from mpipe_hf.runtime import PipelineExecutor
from mpipe_hf.schedule import ScheduleConfig, build_schedule
from mpipe_hf.train.plan import _peak_activation_bytes, plan
from mpipe_hf.train.plan_estimate import estimate_profile, meta_activation_bytes, register_fused_attention
from mpipe_hf.train.precision import autocast_modules

VOCAB, HIDDEN, TOKENS, MICROS = 512, 256, 64, 3


def small_config(layers: int = 2) -> Qwen2Config:
    return Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       tie_word_embeddings=False)


def measured_peak(group, config: Qwen2Config, cfg: ScheduleConfig) -> tuple[int, int]:
    """``(saved bytes at the step's peak, stage forwards then in flight)`` of a bf16 step through the executor,
    attention by the plan's fused stand-in (so the run saves what the plan counts: no ``L x L`` probabilities)."""
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.config._attn_implementation = register_fused_attention()
    split = split_model(model, cfg, 0)
    stages, preprocess = autocast_modules(split.stages, split.preprocess, torch.device("cpu"))
    ex = PipelineExecutor(cfg, 0, stages, preprocess, group, torch.device("cpu"),
                          split.trainable_parameters(cfg, 0).values(), measure_memory=True)
    gen = torch.Generator().manual_seed(1)
    data = []
    for _ in range(cfg.num_micro):
        ids = torch.randint(0, VOCAB, (1, TOKENS), generator=gen)
        data.append({"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)})
    try:
        stats = ex.step(lambda m: data[m])
    finally:
        ex.close()
    return stats.rank_activation_bytes[0], stats.peak_activations


def test_bf16_plan_matches_the_measured_peak(world):
    """The plan's activation peak from ``estimate_profile(..., bf16=True)`` is the saved bytes a bf16 step measures
    at its peak, exactly, once the one term the plan leaves out is added: the embedding saves its ``input_ids``
    (int64, 8 bytes a token) for a stage-0 forward (the same walk of the schedule with that term in stage 0's
    bytes). The counts are of the same ops on the same shapes and storages, so no tolerance is needed; the
    plan's own figure is within those ids (8 bytes a token against some 15 KB a token). The fp32 figure (what
    the plan gave before ``bf16``) is far off the bf16 run."""
    config, cfg = small_config(), ScheduleConfig(1, 2, MICROS, "identity")
    measured, in_flight = measured_peak(world, config, cfg)
    planned = plan(config, cfg, estimate_profile(config, TOKENS, bf16=True), [1, 1]).ranks[0]
    fp32 = plan(config, cfg, estimate_profile(config, TOKENS), [1, 1]).ranks[0]
    print(f"measured {measured} B, planned bf16 {planned.activation_bytes} B, fp32 {fp32.activation_bytes} B")
    assert planned.peak_in_flight == in_flight
    layer, head = meta_activation_bytes(config, TOKENS, bf16=True)
    walked, _ = _peak_activation_bytes(build_schedule(cfg)[0], [layer + 8 * TOKENS, layer + head])
    assert measured == walked, (measured, walked)
    assert 0 <= measured - planned.activation_bytes <= 8 * TOKENS * MICROS
    assert abs(fp32.activation_bytes - measured) > 0.2 * measured


def test_bf16_count_at_full_size_is_the_hand_count():
    """At Qwen2-7B's widths and 4096 tokens (fake tensors: no memory, under a second) the bf16 count is this
    tensor-by-tensor list of the HF layer under autocast. Each RMSNorm keeps its fp32 input, its fp32 ``rsqrt``
    and its fp32 normalised input (the fp32 residual stream), and every matmul reading the norm's fp32 output
    keeps a bf16 cast of its own (autocast caches weight casts only): 3 after the first norm, 2 after the
    second; the rotary's ``cos``/``sin`` are fp32; q and k go in to the attention as bf16 casts of their fp32
    rotary products, v and the output as they are (bf16), with an fp32 log-sum-exp; the MLP keeps gate, SiLU,
    up and the product in bf16. The head: its norm as a layer's, one cast for the LM head, the fp32
    log-softmax of the upcast logits, the int64 targets and three fp32 scalars. Half of fp32 it is not."""
    h, inter, heads, kv, d, vocab, tokens = 3584, 18944, 28, 4, 128, 152064, 4096
    config = Qwen2Config(vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_hidden_layers=28,
                         num_attention_heads=heads, num_key_value_heads=kv)
    layer, head = meta_activation_bytes(config, tokens, bf16=True)
    norms = (4 * h + 4 + 4 * h + 3 * 2 * h) + (4 * h + 4 + 4 * h + 2 * 2 * h)
    attention = 2 * (heads * d + 2 * kv * d) + 2 * 4 * d + 2 * heads * d + 4 * heads
    assert layer == tokens * (norms + attention + 4 * 2 * inter)
    assert head == tokens * (4 * h + 4 + 4 * h + 2 * h + 4 * vocab + 8) + 12
    fp32_layer, _ = meta_activation_bytes(config, tokens)
    assert 0.55 * fp32_layer < layer < 0.7 * fp32_layer
