"""Nemotron-H Omni (``families/nemotron``) on one process: the cost model counts each block's own weights, and a
model with the released checkpoints' audio tower splits exactly with that tower frozen on stage 0 and audio rows
refused by name (the CI cases, tests/dist/specs_families.py, train the image path of a model without it)."""

import copy

import pytest
import torch
from transformers import AutoModelForImageTextToText, NemotronH_Omni_Reasoning_V3_Config

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.models.costs import layer_costs
from mpipe_hf.families.nemotron.tiny import tiny_nemotron_h_omni_config
from mpipe_hf.models.tiny import non_degenerate

from test_family_gemma import chained


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


def matmul_weights(block) -> int:
    """The weights a token multiplies by in one ``NemotronHBlock``: every matrix (and the convolution's taps), the
    MoE block's routed experts counted ``top_k`` of ``E``; norms, biases and the state-space scalars left out."""
    total = 0
    for name, p in block.mixer.named_parameters():
        if p.dim() < 2 or name.startswith("norm"):
            continue
        if name.startswith("experts."):
            total += p.numel() * block.config.num_experts_per_tok // p.shape[0]
        else:
            total += p.numel()
    return total


def test_costs_count_each_blocks_weights(tokenizer):
    config = tiny_nemotron_h_omni_config(tokenizer, num_layers=6)
    model = AutoModelForImageTextToText.from_config(config)
    blocks = model.language_model.model.layers
    assert {b.block_type for b in blocks} == {"linear_attention", "full_attention", "mlp", "moe"}
    assert layer_costs(config.text_config) == [float(matmul_weights(b)) for b in blocks]


def with_audio(tokenizer):
    """The tiny config with a 1-layer Parakeet audio tower, as the released checkpoints carry one."""
    raw = tiny_nemotron_h_omni_config(tokenizer, num_layers=4).to_dict()
    raw.pop("model_type")
    raw["audio_config"] = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                               projection_hidden_size=64, projection_bias=False)
    return NemotronH_Omni_Reasoning_V3_Config(**raw)


def test_audio_tower_frozen_on_stage_0_and_audio_refused(tokenizer):
    torch.manual_seed(0)
    config = with_audio(tokenizer)
    model = non_degenerate(AutoModelForImageTextToText.from_config(config)).train()
    ids = [5, 6] + [config.image_token_id] * 4 + [7, 8, 9, 10] * 3  # a 4 x 4 patch grid: 4 tokens
    batch = {"input_ids": torch.tensor([ids]), "pixel_values": torch.randn(16, 3 * 16 * 16),
             "image_grid_hw": torch.tensor([[4, 4]])}
    batch["labels"] = batch["input_ids"].masked_fill(batch["input_ids"] == config.image_token_id, -100)
    ref = copy.deepcopy(model)
    loss, splits, cfg = chained(model, batch, text_layers=1)
    # no cache, as a stage runs its layers: with one, the Mamba-2 scan also keeps its final state, which parts the
    # gradients by an ulp (the loss is the same)
    logits = ref(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
    ref_loss = ref.loss_function(logits=logits, labels=batch["labels"], vocab_size=config.text_config.vocab_size,
                                 num_items_in_batch=1)
    loss.backward()
    ref_loss.backward()
    assert torch.equal(loss, ref_loss)
    params = dict(ref.named_parameters())
    for r in range(2):
        for name, p in splits[r].trainable_parameters(cfg, r).items():  # the video patch projection: none on both
            assert (p.grad is None) == (params[name].grad is None), name
            assert p.grad is None and "video" in name or torch.equal(p.grad, params[name].grad), name
    assert splits[0].layout[0][:2] == ["audio_tower", "embed_audio"]
    assert {"audio_tower", "embed_audio"} <= set(splits[0].frozen)
    assert not any(p.requires_grad for p in splits[0].model.audio_tower.parameters())
    with pytest.raises(ValueError, match="audio inputs"):
        splits[0].validate_micro({**batch, "input_features": torch.zeros(1, 8, 80)})
