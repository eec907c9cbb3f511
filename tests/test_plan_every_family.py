"""``mpipe-hf plan``'s estimate (``estimate_profile`` on the meta device, then ``plan`` over the family's own
two-stage layout) runs on every registered family's tiny config, and counts what Gemma 3n and Gemma 4 hand
between stages and layers: the AltUp streams ``(4, B, L, H)``, the per-layer inputs, the shared keys and values
(a config that shares them cannot be cut to fewer layers, so the count keeps its full depth)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.models import get_family
from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.train.plan import plan
from mpipe_hf.train.plan_estimate import estimate_profile, meta_activation_bytes

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import TIMM_TOWERS, VOCAB_RANKS, family_builders, tiny_configs  # noqa: E402

BUILDERS = family_builders(timm=True)
TOKENS, IMAGE_TOKENS = 64, 16
SHARES_KV = ("gemma3n_text", "gemma4", "gemma4_unified")
# the numerics tests' configs named their own way (tests/dist/common.py's NAMED_CONFIGS)
OLDER = ("vl", "qwen2_vl", "qwen3_vl", "llava", "llava-full", "llama", "qwen2", "qwen3-tied")


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(VOCAB_RANKS)


@pytest.fixture(scope="module")
def older(tokenizer):
    configs = tiny_configs(tokenizer)
    return {name: configs[name] for name in OLDER}


def test_every_registered_family_has_a_config_here(older, tokenizer):
    """The configs below cover every model type the registry splits."""
    from mpipe_hf.models.registry import FAMILIES
    covered = set(BUILDERS) | {c.model_type for c in older.values()}
    assert set(FAMILIES) <= covered, sorted(set(FAMILIES) - covered)


@pytest.mark.parametrize("model_type", sorted(BUILDERS) + list(OLDER))
def test_plan_estimate_runs_on_every_familys_tiny_config(tokenizer, older, model_type):
    """Every rank's memory and a step time come out positive for the tiny config of each family (the timm-tower
    families where timm imports)."""
    if model_type in TIMM_TOWERS and importlib.util.find_spec("timm") is None:
        pytest.skip("its tower is a timm model; timm is not installed")
    config = older[model_type] if model_type in older else BUILDERS[model_type](tokenizer, num_layers=4)
    vision = hasattr(config, "vision_config")
    profile = estimate_profile(config, TOKENS, IMAGE_TOKENS if vision else 0)
    assert profile.layer_activation_bytes > 0 and profile.head_activation_bytes > 0
    cfg = ScheduleConfig(2, 1, 4, "frozen" if vision else "identity")  # a decoder-only LM: no tower to freeze
    result = plan(config, cfg, profile, get_family(config.model_type).layer_counts(config, cfg))
    assert result.step_s > 0 and all(r.activation_bytes > 0 and r.param_bytes > 0 for r in result.ranks)


@pytest.mark.parametrize("model_type", SHARES_KV)
def test_shared_kv_families_are_counted_at_full_depth_under_bf16_too(tokenizer, model_type):
    """The bf16 count (fake CPU tensors under autocast) reaches the layers that reuse keys and values as well."""
    config = BUILDERS[model_type](tokenizer, num_layers=4)
    layer, head = meta_activation_bytes(config, TOKENS, bf16=True)
    assert 0 < layer < meta_activation_bytes(config, TOKENS)[0] and head > 0


def test_gemma3n_boundary_is_four_streams_and_the_per_layer_inputs(tokenizer):
    """Between stages Gemma 3n hands on its 4 AltUp streams (fp32) and the per-layer inputs of every layer, and
    a layer saves more than it would with one stream (a text layer that read one stream would save less)."""
    config = BUILDERS["gemma3n_text"](tokenizer, num_layers=4)
    text = config.get_text_config()
    assert text.altup_num_inputs == 4
    profile = estimate_profile(config, TOKENS)
    per_layer = text.num_hidden_layers * text.hidden_size_per_layer_input
    assert profile.activation_bytes == 4 * TOKENS * (4 * text.hidden_size + per_layer)
    g4 = BUILDERS["gemma4"](tokenizer, num_layers=4)
    width, text4 = g4.get_text_config().hidden_size_per_layer_input or 0, g4.get_text_config()
    assert estimate_profile(g4, TOKENS).activation_bytes == 4 * TOKENS * (text4.hidden_size +
                                                                          text4.num_hidden_layers * width)


def test_gemma3n_count_is_the_mean_of_its_real_layers_on_cpu(tokenizer):
    """The meta count of Gemma 3n (4 streams, per-layer inputs, layers that store and reuse keys and values) is the
    mean of what each real layer saves on CPU, run in order with one shared key/value dict as the model runs them
    (a reused key or value is the producer's storage, counted there); a count of one stream would be far less."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.cache_utils import KVSharingDict

    from mpipe_hf.runtime.memory import saved_bytes, storage_ids
    from mpipe_hf.train.plan_estimate import register_fused_attention
    config = BUILDERS["gemma3n_text"](tokenizer, num_layers=4)
    config._attn_implementation = register_fused_attention()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    inner, text = model.get_decoder(), config.get_text_config()
    assert "reuse" in text.kv_sharing_modes and "store" in text.kv_sharing_modes
    hidden = torch.randn(4, 1, TOKENS, text.hidden_size, requires_grad=True)
    per_layer = torch.randn(1, TOKENS, text.hidden_size_per_layer_input, requires_grad=True)
    positions, shared, saved = torch.arange(TOKENS).unsqueeze(0), KVSharingDict(), []
    for layer, layer_type, mode in zip(inner.layers, text.layer_types, text.kv_sharing_modes):
        rope = inner.rotary_emb(hidden, positions, layer_type)
        skip = storage_ids(model.parameters()) | (storage_ids(t for kv in shared.values() for t in kv)
                                                  if mode == "reuse" else set())
        saved.append(saved_bytes(lambda: layer(hidden, per_layer_input=per_layer, shared_kv_states=shared,
                                               attention_mask=None, position_embeddings=rope), skip))
    planned, _ = meta_activation_bytes(config, TOKENS)
    assert planned == round(sum(saved) / len(saved)), (saved, planned)
