"""The tiny test models' attention starts at the usual temperature (``mpipe_hf.models.tiny.usual_temperature``, the
tiny Muse configs' ``qk_scale_factor``): with nearly one-hot softmaxes, the exactness cases' step-2 checks measured
a random model's sensitivity to fp32 rounding rather than the split (``tests/dist/specs_families.py``)."""

import os
import sys

import pytest
import torch

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.models import tiny
from mpipe_hf.models.materialize import model_class
from mpipe_hf.families.registry import tiny_config

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import VOCAB_RANKS, make_text_pool  # noqa: E402
from reference import reference_run  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(VOCAB_RANKS)


def _tiny_model(model_type, tokenizer, **text):
    config = tiny_config(model_type)(tokenizer, num_layers=8)
    for key, value in text.items():
        setattr(config.text_config, key, value)
    torch.manual_seed(0)
    return tiny.non_degenerate(model_class(config).from_config(config))


@pytest.mark.parametrize("model_type", ["gemma4", "gemma4_unified"])
def test_unscaled_text_attention_starts_at_one_over_sqrt_head_dim(model_type, tokenizer):
    """Each text attention's query and key norm scales multiply to ``head_dim ** -0.5`` (a layer that reuses
    earlier keys: its query scale ``head_dim ** -0.25``); the vision tower's attention is left as built."""
    model = _tiny_model(model_type, tokenizer)
    text = [m for m in model.modules() if type(m).__name__.endswith("TextAttention")]
    assert text
    for attn in text:
        want = attn.head_dim ** -0.25
        torch.testing.assert_close(attn.q_norm.weight, torch.full_like(attn.q_norm.weight, want))
        if getattr(attn, "k_norm", None) is not None:
            torch.testing.assert_close(attn.k_norm.weight, torch.full_like(attn.k_norm.weight, want))
    for name, param in model.named_parameters():
        if "vision" in name and name.endswith(("q_norm.weight", "k_norm.weight")):
            assert torch.equal(param, torch.ones_like(param)), name


def _step2_parting(model) -> float:
    """Two copies of ``model``: step 1's gradients summed in the reference's order and in the pipeline's (as a
    split sums them), one AdamW step each (lr 1e-3, eps 1e-6), then step 2's gradients: their largest difference
    over the largest gradient."""
    pool = make_text_pool(qwen2_tokenizer(VOCAB_RANKS))
    copies = [model, type(model)(model.config)]
    copies[1].load_state_dict(model.state_dict())
    for copy, order in zip(copies, ("hf", "pipeline")):
        optimizer = torch.optim.AdamW(copy.parameters(), lr=1e-3, eps=1e-6)
        reference_run(copy, pool[:3], order=order)
        optimizer.step()
        copy.zero_grad(set_to_none=True)
        reference_run(copy, pool[3:6])
    pairs = [(a.grad, b.grad) for a, b in zip(copies[0].parameters(), copies[1].parameters()) if a.grad is not None]
    return max(float((a - b).abs().max()) for a, b in pairs) / max(float(a.abs().max()) for a, _ in pairs)


def test_muse_glimmer_step_two_is_not_sensitive_and_the_real_scale_is(tokenizer):
    """Muse Glimmer's tiny model parts its step-2 gradients by under 2e-5 of their largest (measured 5.5e-6); at the
    real model's ``qk_scale_factor`` 3.87 (the negative control) by over 5e-5 (measured 1.4e-4)."""
    assert _step2_parting(_tiny_model("muse_glimmer", tokenizer)) < 2e-5
    assert _step2_parting(_tiny_model("muse_glimmer", tokenizer, qk_scale_factor=3.87)) > 5e-5
