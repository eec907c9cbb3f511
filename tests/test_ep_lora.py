"""LoRA on the fused experts under expert parallelism, one process, no launch: what
:func:`~mpipe_hf.models.expert_parallel.shard_experts` leaves each EP rank of peft's ``ParamWrapper`` adapters.

Each EP rank's share is made from a copy of the same adapted model, its dispatch replaced by transformers'
``AllReduceEP`` arithmetic on one process (every rank runs its own experts on the whole batch, the routes to other
ranks' experts masked; the ranks' outputs summed). The sum equals the unsharded wrapped experts' output, and each
rank's adapter gradients are its cut of the unsharded ones, so the layout of ``lora_A`` (expert-major rows) and
``lora_B`` (strided columns) and the local ``num_experts`` are right; the shards joined again are the one-process
adapter (what a checkpoint writes), and merged they are ``merge_and_unload``'s experts. The pipelined ``pp 2 x ep 2``
runs are ``tests/test_ep.py``'s ``-lora`` cases."""

from __future__ import annotations

import copy

import pytest
import torch

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.models import split
from mpipe_hf.families.glm import tiny as glm_tiny
from mpipe_hf.families.qwen import tiny as qwen_tiny
from mpipe_hf.models.adapters import apply_adapter, is_adapter_tensor, merged_state
from mpipe_hf.models.expert_parallel import shard_experts
from mpipe_hf.models.expert_shards import ExpertCut
from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.train.recipe_lora import LoraSection

from ep_stubs import EPMesh, masked

EP, R = 2, 2


def first_experts(model) -> str:
    """The FQN of the first MoE layer's experts (GLM-4.5V's layer 0 is dense)."""
    return next(n for n, _ in model.named_modules() if n.endswith("mlp.experts"))


def adapted(family="qwen3_vl_moe"):
    tok = qwen2_tokenizer(5120)
    config = (qwen_tiny.tiny_qwen3_vl_moe_config(tok, num_layers=2) if family == "qwen3_vl_moe"
              else glm_tiny.tiny_glm4v_config(tok, num_layers=2, moe=True))
    from transformers import AutoModelForImageTextToText
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    section = LoraSection(r=R, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=False,
                          target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    peft_model = apply_adapter(model, section.peft_config())
    return model, peft_model


def ep_shares(peft_model, monkeypatch):
    """``[(carved share, ExpertShards)]`` of each EP rank, made from copies of ``peft_model`` (pp 1)."""
    import transformers.distributed.expert_parallel as hf_ep
    from mpipe_hf.runtime import watchdog
    monkeypatch.setattr(watchdog, "watched", lambda mesh: None)
    cfg, out = ScheduleConfig(1, 1, 1, "frozen"), []
    for ep_rank in range(EP):
        monkeypatch.setattr(hf_ep, "EPImplementationInterface",
                            lambda r=ep_rank: {"all_to_all": lambda experts, group, tp: masked(experts, r)})
        own = copy.deepcopy(peft_model)
        carved = split(own.base_model.model, cfg, 0)
        carved.peft = own
        out.append((carved, shard_experts(carved, carved.model.config, 0, 1, EPMesh(EP, ep_rank), None)))
    return out


def routed(model, tokens=24, seed=1):
    """Rows, top-2 expert ids and weights for one experts module."""
    text = model.config.get_text_config()
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, text.hidden_size, generator=g)
    index = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(tokens)])
    return hidden, index, torch.rand(tokens, 2, generator=g)


@pytest.mark.parametrize("family", ["qwen3_vl_moe", "glm4v_moe"])
def test_ep_adapter_shards_run_and_join_as_the_unsharded_adapter(family, monkeypatch):
    """Every adapter tensor of a sharded experts module is recorded with its cut (``lora_A`` rows, ``lora_B``
    strided columns) and the wrapper counts ``E / ep`` experts; the ranks' masked outputs sum to the unsharded
    wrapped experts' output, each rank's adapter gradients are its cut of the unsharded ones, the shards joined
    are the one-process adapter, and merged (gathered state) they equal ``merge_and_unload``'s weights."""
    model, peft_model = adapted(family)
    layer = first_experts(model)
    shares = ep_shares(peft_model, monkeypatch)
    hidden, index, weights = routed(model)
    whole = model.get_submodule(layer)
    want = whole(hidden, index, weights)
    want.square().sum().backward()
    full = {n: p for n, p in model.named_parameters()}
    got = sum(carved.model.get_submodule(layer)(hidden, index, weights) for carved, _ in shares)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), (got - want).abs().max()
    got.square().sum().backward()
    for carved, shards in shares:
        adapters = sorted(n for n in shards.names if is_adapter_tensor(n))
        assert {n.split(".lora_")[0].removeprefix(layer) for n in adapters if n.startswith(layer + ".")} == {
            "", ".base_layer"}, adapters  # both nested wrappers (down_proj outside, gate_up_proj inside)
        cuts = {shards.names[n].dim for n in adapters}
        assert cuts == {0, 1}  # lora_A by rows, lora_B by columns
        wrapper = carved.model.get_submodule(layer)
        assert wrapper.num_experts == wrapper.base_layer.num_experts == 4 // EP
        params = dict(carved.model.named_parameters())
        for name in adapters:
            if name.startswith(layer + "."):  # the first MoE layer's: those the forward ran
                cut = shards.names[name]
                assert torch.allclose(params[name].grad, cut.cut(full[name].grad), atol=1e-5, rtol=1e-5), name
    joined = {n: cut.joined([dict(c.model.named_parameters())[n].detach() for c, _ in shares])
              for n, cut in shares[0][1].names.items()}
    state = {n: t.detach() for n, t in model.state_dict().items()}
    assert all(torch.equal(joined[n], state[n]) for n in joined)
    assert all(torch.equal(shares[1][1].cut(n, state[n]), dict(shares[1][0].model.named_parameters())[n])
               for n in joined)
    gathered = {**{n: t.detach() for n, t in shares[0][0].model.state_dict().items()}, **joined}
    merged = merged_state(shares[0][0].model, gathered)
    merged_want = peft_model.merge_and_unload().state_dict()
    experts = [n for n in merged_want if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert experts and all(torch.allclose(merged[n], merged_want[n], atol=1e-6, rtol=0) for n in experts)


def test_a_contiguous_cut_of_lora_b_fails(monkeypatch):
    """The negative control: ``lora_B`` cut as a contiguous block of columns (as if expert-major, like
    ``lora_A``) runs, but the ranks' outputs no longer sum to the unsharded one."""
    model, peft_model = adapted()
    layer = first_experts(model)
    shares = ep_shares(peft_model, monkeypatch)
    hidden, index, weights = routed(model)
    with torch.no_grad():
        want = model.get_submodule(layer)(hidden, index, weights)
        for carved, shards in shares:
            for name, cut in shards.names.items():
                if ".lora_B." in name:
                    wrong = ExpertCut(1, 1, cut.outer, cut.rows, cut.fused)  # (out, E, r) instead of (out, r, E)
                    dict(carved.model.named_parameters())[name].copy_(
                        wrong.cut(model.state_dict()[name]))
        got = sum(carved.model.get_submodule(layer)(hidden, index, weights) for carved, _ in shares)
    assert (got - want).abs().max() > 1e-3


def test_ep_refuses_lora_on_fused_biases_and_copies_of_the_experts(monkeypatch):
    """What LoRA under EP still cannot do, by name: a ``target_parameters`` entry on a fused per-expert bias
    (GPT-OSS's plan shards ``gate_up_proj_bias``, whose 2-D ``ParamWrapper`` shares one ``lora_A`` over every
    expert), and the experts module in ``lora.modules_to_save`` (a trained copy the sharding does not reach)."""
    from peft import LoraConfig
    from transformers import GptOssConfig
    from mpipe_hf.models.expert_parallel import check_expert_parallel
    oss = GptOssConfig(num_local_experts=4, num_hidden_layers=2)
    with pytest.raises(ValueError, match=r"fused biases \(\['mlp.experts.gate_up_proj_bias'\]\)"):
        check_expert_parallel(oss, 2, adapter=LoraConfig(target_modules=["q_proj"],
                                                         target_parameters=["mlp.experts.gate_up_proj_bias"]))
    check_expert_parallel(oss, 2, adapter=LoraConfig(target_modules=["q_proj"],
                                                     target_parameters=["mlp.experts.gate_up_proj"]))
    tok = qwen2_tokenizer(5120)
    from transformers import AutoModelForImageTextToText
    model = AutoModelForImageTextToText.from_config(qwen_tiny.tiny_qwen3_vl_moe_config(tok, num_layers=2))
    peft_model = apply_adapter(model, LoraSection(r=R, target_modules=["q_proj"],
                                                  modules_to_save=["mlp.experts"]).peft_config())
    with pytest.raises(ValueError, match="modules_to_save or target_modules on an experts module"):
        ep_shares(peft_model, monkeypatch)


def test_an_adapter_checkpoint_loads_into_ep_shards(tmp_path, monkeypatch):
    """The HF Trainer reads a checkpoint after the share was made expert-parallel: the fused expert adapters of
    PEFT's file (as a save writes them) are cut to each rank's part as they load (``load_adapter_values`` with the
    rank's ``ExpertShards``), every other adapter tensor read whole."""
    from safetensors.torch import save_file
    from mpipe_hf.models.adapters import ADAPTER_WEIGHTS, adapter_state
    from mpipe_hf.models.load import load_adapter_values
    model, peft_model = adapted()
    shares = ep_shares(peft_model, monkeypatch)
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    save_file(adapter_state(peft_model, state), str(tmp_path / ADAPTER_WEIGHTS))
    cfg = ScheduleConfig(1, 1, 1, "frozen")
    for carved, shards in shares:
        params = {n: p for n, p in carved.model.named_parameters() if is_adapter_tensor(n)}
        with torch.no_grad():
            for p in params.values():
                p.zero_()
        load_adapter_values(str(tmp_path), carved, cfg, 0, shards)
        assert sum(n in shards.names for n in params) == 8  # 2 layers x 2 tensors x (lora_A, lora_B)
        assert all(torch.equal(p, shards.cut(n, state[n])) for n, p in params.items())


def test_a_full_checkpoint_loads_into_ep_shards(tmp_path, monkeypatch):
    """Full fine-tuning, resumed by the HF Trainer after the share was made expert-parallel: each expert shard
    reads only its experts' rows of the checkpoint's fused tensors (``load_share_values`` with the rank's
    ``ExpertShards``), every other tensor whole; without the shards the fused shape is refused by name."""
    import transformers.distributed.expert_parallel as hf_ep
    from transformers import AutoModelForImageTextToText
    from mpipe_hf.models.load import load_share_values
    from mpipe_hf.runtime import watchdog
    monkeypatch.setattr(watchdog, "watched", lambda mesh: None)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(qwen_tiny.tiny_qwen3_vl_moe_config(qwen2_tokenizer(5120),
                                                                                       num_layers=2))
    model.save_pretrained(tmp_path)
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    cfg = ScheduleConfig(1, 1, 1, "frozen")
    for ep_rank in range(EP):
        monkeypatch.setattr(hf_ep, "EPImplementationInterface",
                            lambda r=ep_rank: {"all_to_all": lambda experts, group, tp: masked(experts, r)})
        carved = split(copy.deepcopy(model), cfg, 0)
        shards = shard_experts(carved, carved.model.config, 0, 1, EPMesh(EP, ep_rank), None)
        with torch.no_grad():
            for p in carved.model.parameters():
                p.zero_()
        with pytest.raises(ValueError, match="has shape"):
            load_share_values(str(tmp_path), carved, cfg, 0)
        load_share_values(str(tmp_path), carved, cfg, 0, shards)
        held = carved.model.state_dict()
        assert len(shards.names) == 4 and all(held[n].shape[0] * EP == state[n].shape[0] for n in shards.names)
        assert all(torch.equal(t, shards.cut(n, state[n])) for n, t in held.items()), ep_rank
