"""LoRA on MoE layers, one process (docs/lora.md "MoE layers"): what ``target_modules`` and
``target_parameters`` reach on the tiny Qwen3-VL-MoE and Qwen3.5-MoE, that only the adapter trains, and that the
merged weights equal peft's ``merge_and_unload``. The pipelined run against one process is the ``moe-experts``
case of ``tests/test_lora.py``."""

import pytest
import torch

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.models.adapters import (adapted_parameters, adapter_state, apply_adapter, base_name, is_adapter_tensor,
                                      load_adapter_state, merged_state)
from mpipe_hf.families.qwen.tiny import tiny_qwen3_5_config, tiny_qwen3_vl_moe_config
from mpipe_hf.train.recipe_lora import LoraSection

# docs/lora.md's recipe snippet: attention and shared expert by module, fused experts and router by parameter
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "shared_expert_gate"]
TARGET_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"]
ATTENTION = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"}
SHARED = {"mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj",
          "mlp.shared_expert_gate"}
PARAMETERS = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"}


def tiny(family):
    """``(model, expected {layer: adapted modules}, layers)``: Qwen3.5-MoE's layers 0-2 are Gated DeltaNet
    (``linear_attn.in_proj_*``, which the attention names do not reach), layer 3 full attention."""
    from transformers import AutoModelForImageTextToText
    tok = qwen2_tokenizer(5120)
    torch.manual_seed(0)
    if family == "qwen3_vl_moe":
        config, modules = tiny_qwen3_vl_moe_config(tok, num_layers=2), {0: ATTENTION, 1: ATTENTION}
    else:
        config = tiny_qwen3_5_config(tok, num_layers=4, moe=True)
        modules = {i: SHARED | (ATTENTION if i == 3 else set()) for i in range(4)}
    return AutoModelForImageTextToText.from_config(config), modules


def adapt(model):
    section = LoraSection(r=2, lora_alpha=4, target_modules=TARGET_MODULES, target_parameters=TARGET_PARAMETERS,
                          init_lora_weights=False)
    return apply_adapter(model, section.peft_config())


def per_layer(names):
    """``{layer index: {name within the layer}}`` of the decoder's names."""
    out = {}
    for n in names:
        if ".language_model.layers." in n:
            layer, _, rest = n.split(".language_model.layers.")[1].partition(".")
            out.setdefault(int(layer), set()).add(rest)
    return out


@pytest.mark.parametrize("family", ["qwen3_vl_moe", "qwen3_5_moe"])
def test_lora_on_moe_reaches_what_the_doc_says_and_trains_only_the_adapter(family):
    """``target_modules`` adapts the attention and the shared expert (``nn.Linear``), never the fused experts
    or the router; ``target_parameters`` adapts those (peft's ``ParamWrapper``) in every layer; nothing in the
    tower. A forward and backward with the load-balancing loss gives every adapter tensor a nonzero gradient
    and no base weight a gradient; the adapter goes through PEFT's file keys and back (save, resume); the merged
    weights equal ``merge_and_unload``'s."""
    from peft.tuners.lora import Linear as LoraLinear
    model, modules = tiny(family)
    peft_model = adapt(model)
    linear = [base_name(n) for n, m in model.named_modules() if isinstance(m, LoraLinear)]
    assert per_layer(linear) == modules and all(".language_model." in n for n in linear), linear
    params = adapted_parameters(model)
    assert per_layer(params) == {i: PARAMETERS for i in modules}, sorted(params)
    assert {tuple(params[f"model.language_model.layers.0.{p}"].get_param().shape)[0] for p in
            ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")} == {model.config.get_text_config().num_experts}
    ids = torch.randint(0, 5000, (2, 12))
    out = peft_model(input_ids=ids, labels=ids)
    assert out.aux_loss is not None and out.aux_loss > 0  # the routers' load-balancing term is in the loss
    out.loss.backward()
    for n, p in model.named_parameters():
        if is_adapter_tensor(n):
            assert p.requires_grad and p.grad is not None and p.grad.abs().max() > 0, n
        else:
            assert not p.requires_grad and p.grad is None, n
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    adapter = sorted(n for n in state if is_adapter_tensor(n))
    saved = adapter_state(peft_model, state)  # PEFT's keys, as the checkpoints write them; and read back
    assert len(saved) == len(adapter) and any("mlp.experts.base_layer.lora_A.weight" in k for k in saved)
    other, _ = tiny(family)
    torch.manual_seed(1)
    other_peft = adapt(other)
    assert not torch.equal(other.state_dict()[adapter[0]], state[adapter[0]])
    load_adapter_state(other_peft, saved, adapter)
    assert all(torch.equal(other.state_dict()[n], state[n]) for n in adapter)
    merged = merged_state(model, state)
    want = peft_model.merge_and_unload().state_dict()
    assert sorted(merged) == sorted(want)
    changed = [n for n in want if not torch.equal(want[n], state.get(n, torch.empty(0)))]
    assert per_layer(n.removesuffix(".weight") for n in changed if "experts" in n or "gate." in n)[0] >= {
        "mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate"}, changed
    assert all(torch.allclose(merged[n], want[n], atol=1e-6, rtol=0) for n in want)


def test_the_router_is_no_target_module():
    """The router is a ``TopKRouter`` holding a ``weight``, not an ``nn.Linear``: ``target_modules`` cannot adapt
    it (peft's error, naming the field), ``target_parameters`` can; a target parameter that names nothing is an
    error naming ``lora.target_parameters`` (peft itself ignores it while another target matches)."""
    model, _ = tiny("qwen3_vl_moe")
    with pytest.raises(ValueError, match=r"lora\.target_modules.*TopKRouter"):
        apply_adapter(model, LoraSection(target_modules=["q_proj", "gate"]).peft_config())
    model, _ = tiny("qwen3_vl_moe")
    with pytest.raises(ValueError, match=r"lora\.target_parameters: 'mlp\.experts\.gate_up' names no parameter"):
        apply_adapter(model, LoraSection(target_modules=["q_proj"],
                                         target_parameters=["mlp.experts.gate_up"]).peft_config())
