"""``mpipe_hf.models.costs`` against the real HF decoder layers: for scaled-down real configs of every attention
and MLP kind (softmax, sliding, gated softmax, Gated DeltaNet, multi-head latent attention; dense, routed and
shared experts, dense-first and interleaved sparse layers), each layer's cost equals the weights counted on the
module built on the meta device; and the plan's activation count of such models against their real layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import (AutoModel, AutoModelForCausalLM, AutoModelForImageTextToText, DeepseekV3Config,
                          Gemma3TextConfig, Glm4vMoeTextConfig, InternVLConfig, Llama4TextConfig, MuseGlimmerTextConfig,
                          MuseSparkTextConfig, Qwen3_5MoeTextConfig, Qwen3_5TextConfig, Qwen3VLMoeConfig,
                          Qwen3VLMoeTextConfig)

from mpipe_hf.models import get_family
from mpipe_hf.models.costs import layer_costs, matmul_costs
from mpipe_hf.models.load import meta_model
from mpipe_hf.runtime.memory import saved_bytes, storage_ids
from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.train.plan import plan
from mpipe_hf.train.plan_estimate import estimate_profile, meta_activation_bytes, register_fused_attention
from mpipe_hf.train.plan_vision import patches_per_image_token, vision_parts

from ep_stubs import EPMesh

# every width distinct, so a field read in the wrong place changes the count
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=12, linear_value_head_dim=10,
              linear_conv_kernel_dim=3)
ROPE = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1]}
CONFIGS = {
    "qwen3_5": lambda: Qwen3_5TextConfig(
        vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=20, layer_types=["linear_attention", "full_attention"] * 2, **LINEAR),
    "qwen3_5_moe": lambda: Qwen3_5MoeTextConfig(
        vocab_size=97, hidden_size=48, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=20, moe_intermediate_size=24, shared_expert_intermediate_size=40, num_experts=6,
        num_experts_per_tok=2, layer_types=["linear_attention", "linear_attention", "full_attention",
                                            "linear_attention"], **LINEAR),
    "qwen3_vl_moe": lambda: Qwen3VLMoeTextConfig(
        vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=5, num_attention_heads=4,
        num_key_value_heads=2, head_dim=20, moe_intermediate_size=24, num_experts=6, num_experts_per_tok=3,
        decoder_sparse_step=2, mlp_only_layers=[3], rope_parameters=ROPE),
    "glm4v_moe": lambda: Glm4vMoeTextConfig(
        vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=2, moe_intermediate_size=24, n_routed_experts=5, num_experts_per_tok=2,
        n_shared_experts=2, first_k_dense_replace=1, rope_parameters={**ROPE, "partial_rotary_factor": 0.5}),
    "gemma3": lambda: Gemma3TextConfig(
        vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=20, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    "deepseek_v3": lambda: DeepseekV3Config(
        vocab_size=97, hidden_size=48, intermediate_size=88, moe_intermediate_size=24, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, n_shared_experts=1, q_lora_rank=20, kv_lora_rank=14,
        qk_rope_head_dim=6, qk_nope_head_dim=10, v_head_dim=12),
    "deepseek_v3_no_q_lora": lambda: DeepseekV3Config(
        vocab_size=97, hidden_size=48, intermediate_size=88, moe_intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, n_shared_experts=1, q_lora_rank=None, kv_lora_rank=14,
        qk_rope_head_dim=6, qk_nope_head_dim=10, v_head_dim=12),
    "llama4": lambda: Llama4TextConfig(  # dense layers intermediate_size_mlp wide; experts and shared intermediate_size
        vocab_size=97, hidden_size=48, intermediate_size=24, intermediate_size_mlp=88, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=20, num_local_experts=4, num_experts_per_tok=2,
        interleave_moe_layer_step=2),
    "muse_glimmer": lambda: MuseGlimmerTextConfig(  # a gate_proj beside q_proj
        vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=20, bos_token_id=None, eos_token_id=None),
    "muse_spark": lambda: MuseSparkTextConfig(  # experts at moe_hidden_size between two projections
        vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=20, moe_intermediate_size=24, moe_hidden_size=28, num_local_experts=4,
        num_experts_per_tok=2, mlp_layer_types=["dense", "sparse", "sparse", "dense"], bos_token_id=None,
        eos_token_id=None),
}


def counted_layer_weights(layer: nn.Module) -> float:
    """Weights one token multiplies by in ``layer``, from the module alone: every ``nn.Linear`` and ``nn.Conv1d``
    weight and every other parameter of two or more dimensions (routers), with a fused expert tensor
    ``(experts, ...)`` counted ``top_k / experts`` (``top_k`` from the layer's router module)."""
    top_k = {m.top_k for m in layer.modules() if hasattr(m, "top_k")}
    assert len(top_k) <= 1
    total = 0.0
    for module in layer.modules():
        for name, p in module.named_parameters(recurse=False):
            if isinstance(module, (nn.Linear, nn.Conv1d)):
                total += p.numel() if name == "weight" else 0
            elif p.dim() == 3:  # fused experts: (num_experts, out, in)
                total += p.numel() * next(iter(top_k)) / p.shape[0]
            elif p.dim() == 2:
                total += p.numel()
    return total


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_layer_costs_equal_the_weights_of_the_real_layers(name):
    config = CONFIGS[name]()
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    expected = [counted_layer_weights(layer) for layer in model.layers]
    assert layer_costs(config) == pytest.approx(expected, rel=1e-12)
    layer, head = matmul_costs(config)
    assert layer == pytest.approx(sum(expected) / len(expected))
    assert head == config.hidden_size * config.vocab_size


def test_layer_kinds_differ_where_the_config_says():
    """The tiny configs above do reach both kinds of layer they name (else the equality proves less)."""
    qwen35, vl_moe, deepseek = (layer_costs(CONFIGS[n]()) for n in ("qwen3_5", "qwen3_vl_moe", "deepseek_v3"))
    assert qwen35[0] != qwen35[1] and qwen35[0] == qwen35[2]           # linear vs full attention
    assert vl_moe[0] == vl_moe[3] != vl_moe[1]                        # dense (odd step, mlp_only) vs sparse
    assert deepseek[0] != deepseek[1] == deepseek[2]                  # first_k_dense_replace


def test_unknown_moe_layout_and_layer_type_are_refused():
    unknown = CONFIGS["qwen3_vl_moe"]()
    unknown.__dict__["moe_intermediate_size"] = None  # an expert layout the module does not know
    with pytest.raises(ValueError, match="moe_intermediate_size"):
        layer_costs(unknown)
    config = CONFIGS["gemma3"]()
    config.layer_types = ["sliding_attention", "mamba", "full_attention"]
    with pytest.raises(ValueError, match="mamba"):
        layer_costs(config)


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_5_moe", "qwen3_vl_moe", "deepseek_v3", "gemma3"])
def test_planned_layer_activations_are_the_mean_of_the_real_layers(name):
    """``meta_activation_bytes`` (one layer of each kind, on the meta device, experts through transformers'
    grouped-mm fallback) is the mean over all layers of the bytes each real layer saves on CPU with real
    routing (the fused-attention stand-in in both), so hybrid and dense-first models are not sized by layer 0."""
    tokens = 24
    config = CONFIGS[name]()
    if name == "qwen3_vl_moe":  # its text config has no causal LM of its own
        config = Qwen3VLMoeConfig(text_config=config.to_dict(), vision_config=dict(
            depth=1, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=48,
            deepstack_visual_indexes=[]))
    config._attn_implementation = register_fused_attention()
    torch.manual_seed(0)
    model = (AutoModelForImageTextToText if name == "qwen3_vl_moe" else AutoModelForCausalLM).from_config(config)
    inner = model.get_decoder()
    config = config.get_text_config()
    params = storage_ids(model.parameters())
    hidden = torch.randn(1, tokens, config.hidden_size, requires_grad=True)
    positions = torch.arange(tokens).unsqueeze(0)
    if "mrope_section" in (config.rope_parameters or {}):
        positions = positions.expand(3, 1, tokens)
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    saved = []
    for layer, layer_type in zip(inner.layers, types):
        rope = inner.rotary_emb(hidden, positions, layer_type) if name == "gemma3" else inner.rotary_emb(hidden,
                                                                                                        positions)
        saved.append(saved_bytes(lambda: layer(hidden, attention_mask=None, position_embeddings=rope), params))
    planned, _ = meta_activation_bytes(model.config, tokens)
    mean = sum(saved) / len(saved)
    print(name, saved, planned)
    # exact but for Gated DeltaNet's reference kernel, whose freed temporaries let a storage key be reused (a
    # few KB either way, on meta and CPU alike); the layer kinds differ by far more than that
    assert planned == pytest.approx(mean, rel=0.03)
    if max(saved) > 1.1 * min(saved):
        assert planned != pytest.approx(saved[0], rel=0.03)


def test_moe_plan_times_the_routed_experts_and_holds_them_all():
    """``estimate_profile`` times a layer by its active weights (router, ``top_k`` experts) and sends a layer's
    parameters with every expert; ``plan`` holds, trains and keeps AdamW moments for every expert."""
    text = CONFIGS["qwen3_vl_moe"]().to_dict()  # to_dict names the experts num_local_experts
    text.update(num_local_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[])
    config = Qwen3VLMoeConfig(text_config=text, vision_config=dict(
        depth=1, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=48, deepstack_visual_indexes=[]))
    tokens, rate = 64, 1e12
    profile = estimate_profile(config, tokens, 16, tflops=1.0, mfu=1.0)
    active = layer_costs(config.text_config)
    assert profile.layer_forward_s == pytest.approx(2 * tokens * sum(active) / len(active) / rate)
    model = meta_model(config)
    layers = model.get_decoder().layers
    stored = sum(p.numel() for p in layers.parameters()) / len(layers)
    assert profile.layer_param_bytes == pytest.approx(4 * stored)
    fused = [p for p in layers[0].parameters() if p.dim() == 3]
    assert fused[0].shape[0] == 8
    assert stored - max(active) >= (1 - 2 / 8) * sum(p.numel() for p in fused)  # 6 of 8 experts idle a token
    cfg = ScheduleConfig(2, 1, 4, "frozen")
    result = plan(config, cfg, profile, get_family(config.model_type).layer_counts(config, cfg))
    tower = sum(p.numel() for n, p in model.named_parameters() if n.startswith("model.visual."))
    trained = sum(p.numel() for p in model.parameters()) - tower
    assert sum(r.optimizer_bytes for r in result.ranks) == 8 * trained
    assert sum(r.grad_bytes for r in result.ranks) == 4 * trained


VLM_CLASSES = ("InternVLConfig", "Gemma3Config", "Idefics3Config", "SmolVLMConfig", "Glm4vConfig", "Glm4vMoeConfig",
               "Qwen3_5Config", "Qwen3_5MoeConfig", "Qwen3VLMoeConfig", "LlavaConfig", "Qwen2_5_VLConfig")


@pytest.mark.parametrize("name", VLM_CLASSES)
def test_the_plan_finds_every_familys_tower(name):
    """The tower (and projector) the plan times and sends is what the family declares (``Family.vision``), and
    the name-based search for an undeclared family finds the same modules; both on the default config of each
    class with one decoder layer and one tower block (meta device)."""
    import transformers
    config = getattr(transformers, name)()
    text, vision = config.get_text_config(), config.vision_config
    text.num_hidden_layers = 1
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:1]
    setattr(vision, "depth" if hasattr(vision, "depth") else "num_hidden_layers", 1)
    model = meta_model(config)
    declared = vision_parts(model, config.model_type)
    assert declared[0] > 0 and declared[:2] == vision_parts(model)
    assert patches_per_image_token(config) > 0  # (default Gemma3Config pairs 196 patches with 256 tokens)


def test_internvl_patches_per_token_is_its_image_sequence():
    """InternVL's pixel shuffle: the patches of a 448 px tile over ``image_seq_length`` tokens."""
    config = InternVLConfig()
    side = config.vision_config.image_size[0] // config.vision_config.patch_size[0]
    assert patches_per_image_token(config) == side * side / config.image_seq_length


def test_the_meta_count_prints_no_kernel_fallback_warning(capfd):
    """``plan`` counts a Qwen3.5 layer on the meta device without transformers' "falling back to
    its reference PyTorch implementation ... much slower" notices (it runs no model)."""
    from transformers.utils import logging as hf_logging
    level = hf_logging.get_verbosity()
    meta_activation_bytes(CONFIGS["qwen3_5"](), 16)
    err = capfd.readouterr().err
    assert "much slower" not in err and "falling back" not in err, err
    assert hf_logging.get_verbosity() == level


def moe_vl_config(experts: int = 6):
    """A Qwen3-VL-MoE config of 6 layers, layers 1 and 3 sparse (every second one, 5 dense by ``mlp_only_layers``),
    ``experts`` experts, 2 a token, and a one-block tower."""
    text = CONFIGS["qwen3_vl_moe"]().to_dict()
    text.update(num_hidden_layers=6, num_local_experts=experts, num_experts_per_tok=2, decoder_sparse_step=2,
                mlp_only_layers=[5])
    return Qwen3VLMoeConfig(text_config=text, vision_config=dict(
        depth=1, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=48, deepstack_visual_indexes=[]))


@pytest.mark.parametrize("ep_size", [2, 3])
def test_ep_plan_holds_what_shard_experts_leaves_a_rank(monkeypatch, ep_size):
    """With ``ep_size`` each rank's parameters, gradients and AdamW moments are those of its carved meta
    model after the runtime's own slicing (:func:`shard_experts`: ``E / ep_size`` rows of each fused expert tensor of
    its stages; ``P``'s two text layers, one of them sparse, keep every expert), and fewer than without EP."""
    import transformers.distributed.expert_parallel as hf_ep
    from mpipe_hf.models import split
    from mpipe_hf.models.expert_parallel import shard_experts
    from mpipe_hf.runtime import watchdog
    monkeypatch.setattr(watchdog, "watched", lambda mesh: None)
    monkeypatch.setattr(hf_ep, "EPImplementationInterface", lambda: {"all_to_all": lambda *args: None})
    config, cfg, text_layers = moe_vl_config(), ScheduleConfig(2, 2, 4, "trainable"), 2
    layers = get_family(config.model_type).layer_counts(config, cfg, None, text_layers)
    profile = estimate_profile(config, 32, 8)
    whole = plan(config, cfg, profile, layers, text_layers)
    result = plan(config, cfg, profile, layers, text_layers, ep_size=ep_size)
    assert sum(result.experts.moe_layers) == 1  # layer 3; layer 1 is in P, whose experts stay whole
    for rank, rp in enumerate(result.ranks):
        carved = split(meta_model(config), cfg, rank, layers, text_layers)
        shards = shard_experts(carved, config, rank, cfg.pp_size, EPMesh(ep_size, ep_size - 1), None)
        assert rp.param_bytes == sum(p.numel() * 4 for p in carved.model.parameters())
        trained = carved.trainable_parameters(cfg, rank)
        assert rp.grad_bytes == sum(p.numel() * 4 for p in trained.values())
        assert rp.optimizer_bytes == 2 * rp.grad_bytes
        assert (rp.param_bytes < whole.ranks[rank].param_bytes) == bool(shards.params)
        assert rp.all_to_all_bytes == (2 * result.experts.dispatch_bytes if shards.params else 0)


def test_plan_charges_each_moe_layers_all_to_all():
    """The plan's step is the simulator's with each stage's ``F`` and ``B`` longer by its MoE layers (counted here
    from the meta model's modules) times one layer's all-to-alls on the micro-batch's rows (``tokens * top_k *
    hidden`` fp32) over NVLink, and longer than the step without EP."""
    import dataclasses
    from mpipe_hf.schedule import build_schedule
    from mpipe_hf.schedule.hardware import moe_all_to_all_seconds
    from mpipe_hf.schedule.simulate import simulate
    from mpipe_hf.schedule.tune import costs_for
    config, cfg, tokens = moe_vl_config(), ScheduleConfig(2, 2, 4, "frozen"), 64
    layers = get_family(config.model_type).layer_counts(config, cfg)
    profile = estimate_profile(config, tokens, 16)
    decoder = meta_model(config).get_decoder().layers
    starts = [sum(layers[:s]) for s in range(len(layers))]
    moe = [sum(hasattr(decoder[i].mlp, "experts") for i in range(a, a + n)) for a, n in zip(starts, layers)]
    assert sum(moe) == 2
    text = config.get_text_config()
    forward, backward = moe_all_to_all_seconds(tokens * text.num_experts_per_tok * text.hidden_size * 4, 3)
    costs = costs_for(profile, cfg, layers)
    costs = dataclasses.replace(costs, forward=tuple(f + n * forward for f, n in zip(costs.forward, moe)),
                                backward=tuple(b + n * backward for b, n in zip(costs.backward, moe)))
    result = plan(config, cfg, profile, layers, ep_size=3)
    assert result.step_s == pytest.approx(simulate(build_schedule(cfg, costs), costs).makespan, rel=1e-12)
    assert result.step_s > plan(config, cfg, profile, layers).step_s
    assert "ep_size 3: 2 of 6 experts" in result.table()


@pytest.mark.parametrize("bf16", [False, True])
def test_all_to_all_rows_and_saved_bytes_are_what_the_plan_counts(world, monkeypatch, bf16):
    """A sparse decoder layer through transformers' ``AllToAllEP`` over this process's gloo group (the all-to-alls
    run, moving the rows to this one rank) against the same layer's grouped-mm experts: each all-to-all of rows
    sends the plan's ``dispatch_bytes``, and the layer saves for its backward the plan's ``saved_bytes`` more; in
    fp32 and under bf16 autocast (the rows sent stay fp32: the residual stream's; the outputs sent back are bf16)."""
    import transformers.distributed.expert_parallel as hf_ep
    from torch.distributed.device_mesh import DeviceMesh
    from mpipe_hf.schedule.tune import Profile
    from mpipe_hf.train.plan_estimate import _experts_fallback
    from mpipe_hf.train.plan_experts import expert_plan
    config = moe_vl_config()
    text = config.get_text_config()
    torch.manual_seed(0)
    model = AutoModel.from_config(text)
    model.set_experts_implementation("grouped_mm")
    tokens, layer = 37, model.layers[1]
    hidden = torch.randn(1, tokens, text.hidden_size, requires_grad=True)
    rope = model.rotary_emb(hidden, torch.arange(tokens).expand(3, 1, tokens))
    params = storage_ids(model.parameters())
    sent = []
    rows = hf_ep.all_to_all_single_autograd
    monkeypatch.setattr(hf_ep, "all_to_all_single_autograd", lambda t, *a: sent.append(t.nbytes) or rows(t, *a))
    region = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)

    def saved():
        with region, _experts_fallback():
            return saved_bytes(lambda: layer(hidden, attention_mask=None, position_embeddings=rope,
                                             position_ids=None), params)
    alone = saved()
    mesh = DeviceMesh.from_group(world, "cpu", mesh_dim_names=("ep",))
    dispatch = hf_ep.EPImplementationInterface()["all_to_all"](layer.mlp.experts, mesh, mesh)
    layer.mlp.experts.forward = lambda h, i, w: dispatch(h, i, w).to(h.dtype)
    layer.mlp.experts._is_expert_parallel = True  # as shard_experts sets it
    with_ep = saved()
    profile = Profile(num_layers=6, layer_forward_s=1.0, layer_backward_s=1.0,
                      activation_bytes=4.0 * tokens * text.hidden_size)
    expected = expert_plan(config, profile, [3, 3], 0, ep_size=2)
    # the combine sends the experts' outputs, bf16 under autocast (mpipe_hf.models.expert_precision): the plan's
    # fp32 figure bounds it
    assert sent == [expected.dispatch_bytes, expected.dispatch_bytes / (2 if bf16 else 1)]
    assert with_ep - alone == expected.saved_bytes


def test_all_to_all_seconds_and_where_the_ep_group_lies():
    """An all-to-all sends ``(ep - 1) / ep`` of a rank's rows over NVLink within a node, InfiniBand across (the
    cluster's published rates at its efficiency), nothing for one rank; a MoE layer's forward adds the counts'
    exchange to two all-to-alls of rows, its backward has the two. An EP group lies in a node when its block of
    processes (``ep_size`` with ``dp_inner``, ``ep_size * pp_size`` with ``pp_inner``) divides the node's 8."""
    from mpipe_hf.schedule.cluster import Cluster
    from mpipe_hf.schedule.hardware import all_to_all_seconds, moe_all_to_all_seconds
    from mpipe_hf.train.recipe_parallel import ParallelSection, groups_within_node
    c, nbytes = Cluster(), 3e8
    for within, rate, latency in ((True, c.nvlink_bytes_per_s * c.nvlink_efficiency, c.nvlink_latency_s),
                                  (False, c.ib_bytes_per_s * c.ib_efficiency, c.ib_latency_s)):
        assert all_to_all_seconds(nbytes, 4, c, within) == pytest.approx(latency + nbytes * 3 / 4 / rate)
        forward, backward = moe_all_to_all_seconds(nbytes, 4, c, within)
        assert forward == pytest.approx(backward + latency) and backward == pytest.approx(2 * (latency + nbytes * 3
                                                                                               / 4 / rate))
    assert all_to_all_seconds(nbytes, 1) == 0 and moe_all_to_all_seconds(nbytes, 1) == (0.0, 0.0)
    cases = {("dp_inner", 8, 2): True, ("dp_inner", 2, 8): True, ("pp_inner", 8, 2): False, ("pp_inner", 2, 4): True,
             ("dp_inner", 2, 16): False}
    for (order, pp, ep), within in cases.items():
        parallel = ParallelSection(pp_size=pp, num_micro=pp, dp_size=ep, ep_size=ep, mesh_order=order)
        assert groups_within_node(parallel, None, None)[0] is within, (order, pp, ep)


def test_plan_table_gives_each_column_its_unit():
    """``mpipe-hf plan``'s table: a units row under the headings says GiB under each memory column, and the
    in-flight column, a count of stage forwards, stands apart from them with its own unit (it is no size)."""
    from mpipe_hf.train.plan import Plan, RankPlan
    table = Plan([RankPlan(0, 2**30, 2**30, 2**31, 2**29, 47)], [2], 1.0, 0.1, None).table().splitlines()
    head, units, row = (line.split() for line in table[:3])
    assert head == ["rank", "params", "grads", "optim", "activ", "nccl", "total", "|", "in-flight"], table
    assert units == ["GiB"] * 6 + ["|", "forwards"], table
    assert row == ["0", "1.00", "1.00", "2.00", "0.50", "0.00", "4.50", "|", "47"], table
    assert all("(GiB)" not in line for line in table), table


def test_plan_counts_nccl_buffers_by_the_communicators_a_rank_joins():
    """``mpipe-hf plan``'s NCCL column: 24 MiB (4 MiB x 2 channels x 3 protocols) per peer of every communicator a
    rank joins. At ``pp = 16``: rank 0's 30 pair groups, the pipeline's and the world's rings, 34 peers, 0.80 GiB;
    rank 5's 6 pairs and the rings, 10 peers; a replica adds the data-parallel ring, EP its group's other members.
    The figures follow the pairs a rank is in."""
    from mpipe_hf.train.plan import RankPlan
    from mpipe_hf.train.plan_nccl import PER_PEER, communicators, nccl_bytes
    assert PER_PEER == 24 * 2**20
    assert nccl_bytes(0, 16) == 34 * PER_PEER and nccl_bytes(5, 16) == 10 * PER_PEER
    assert nccl_bytes(0, 1) == 0 and nccl_bytes(0, 2) == 4 * PER_PEER  # pairs 0->1, 1->0; rings of one peer
    assert communicators(5, 16, dp_size=4, ep_size=2) == {
        "pipeline pairs": (6, 6), "pipeline collectives": (1, 2), "world": (1, 2), "data parallel": (1, 2),
        "expert parallel": (1, 1)}
    assert RankPlan(0, 0, 0, 0, 0, 0, 0, nccl_bytes(0, 16)).total_bytes == 34 * PER_PEER
