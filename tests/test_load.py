"""Each rank holds only its share (mpipe_hf.models.load): the shares equal the unsplit model's tensors bit for bit,
from a checkpoint and from a config; a ~1.2B Qwen2.5-VL checkpoint is loaded at R = 4 without any rank holding
the whole model; the presets' plans fit; the cost-balanced layout beats the count-balanced one."""

import glob
import os
import runpy

import pytest
import torch
from accelerate.utils import set_seed

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.families.llava.tiny import tiny_llava_config
from mpipe_hf.models import get_family, split
from mpipe_hf.families.qwen import tiny as qwen_tiny
from mpipe_hf.families.text import tiny as text_tiny
from mpipe_hf.models.load import READ_BLOCK_BYTES, model_class, split_from_checkpoint, split_from_config
from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.schedule.layout import balanced_layers
from mpipe_hf.schedule.tune import Profile, predict, profile_layers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def configs():
    tokenizer = qwen2_tokenizer(1024)
    return {"qwen2_5_vl": qwen_tiny.tiny_qwen2_5_vl_config(tokenizer),
            "qwen2_vl": qwen_tiny.tiny_qwen2_vl_config(tokenizer),
            "qwen3_vl": qwen_tiny.tiny_qwen3_vl_config(tokenizer), "llava": tiny_llava_config(tokenizer),
            "llama": text_tiny.tiny_causal_lm_config(tokenizer, "llama"),
            "qwen3_tied": text_tiny.tiny_causal_lm_config(tokenizer, "qwen3", tie_word_embeddings=True)}


def unsplit(config, seed=3):
    set_seed(seed)
    return model_class(config).from_config(config, dtype=torch.float32)


def tensors(model):
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def reference_share(config, cfg, rank, text_layers, seed=3):
    """The old way: the whole model, then the split (what every rank held before)."""
    return split(unsplit(config, seed), cfg, rank, None, text_layers)


CASES = [("qwen2_5_vl", 2, 2, "frozen", 0), ("qwen2_5_vl", 3, 1, "identity", 0), ("qwen2_5_vl", 2, 1, "trainable", 1),
         ("qwen2_vl", 2, 2, "frozen", 0), ("qwen3_vl", 2, 2, "trainable", 0), ("llava", 3, 1, "frozen", 0),
         ("llama", 2, 2, "frozen", 1), ("qwen3_tied", 2, 2, "trainable", 1), ("qwen3_tied", 3, 1, "identity", 0)]


@pytest.mark.parametrize("name,pp,vpp,preprocess,text_layers", CASES)
def test_shares_equal_the_unsplit_model_bitwise(configs, tmp_path, name, pp, vpp, preprocess, text_layers):
    config = configs[name]
    cfg = ScheduleConfig(pp, vpp, pp, preprocess)
    unsplit(config).save_pretrained(tmp_path)  # the hub layout on disk (save_pretrained's key names)
    for rank in range(pp):
        ref = reference_share(config, cfg, rank, text_layers)
        expected = tensors(ref.model)
        for how in ("config", "checkpoint"):
            if how == "config":
                carved, report = split_from_config(config, cfg, rank, None, text_layers, seed=3)
            else:
                carved, report = split_from_checkpoint(str(tmp_path), config, cfg, rank, None, text_layers)
            got = tensors(carved.model)
            assert sorted(got) == sorted(expected), (how, rank)
            differ = [n for n, t in got.items() if t.dtype != expected[n].dtype or not torch.equal(t, expected[n])]
            assert not differ, f"{name} {how} rank {rank}: {differ[:5]}"
            assert carved.layout == ref.layout and carved.tied == ref.tied
            assert {n for n, p in carved.model.named_parameters() if p.requires_grad} == {
                n for n, p in ref.model.named_parameters() if p.requires_grad}
            share = sum(t.numel() * t.element_size() for t in {id(t): t for t in got.values()}.values())
            assert report.kept_bytes == share < report.full_model_bytes or pp * vpp == 1
            if how == "checkpoint":
                assert not carved.model.training  # as from_pretrained leaves it
                assert report.largest_temporary_bytes <= READ_BLOCK_BYTES


def test_checkpoint_errors_name_the_tensor(configs, tmp_path):
    from safetensors.torch import load_file, save_file
    config = configs["llama"]
    unsplit(config).save_pretrained(tmp_path)
    path = os.path.join(tmp_path, "model.safetensors")
    state = load_file(path)
    state.pop("model.layers.7.mlp.up_proj.weight")
    state["model.layers.0.mlp.up_proj.weight"] = state["model.layers.0.mlp.up_proj.weight"][:, :3].contiguous()
    save_file(state, path, metadata={"format": "pt"})
    cfg = ScheduleConfig(2, 1, 2, "identity")
    with pytest.raises(ValueError, match=r"lacks tensors rank 1 holds: \['model.layers.7.mlp.up_proj.weight'\]"):
        split_from_checkpoint(str(tmp_path), config, cfg, 1)
    with pytest.raises(ValueError, match="model.layers.0.mlp.up_proj.weight has shape"):
        split_from_checkpoint(str(tmp_path), config, cfg, 0)


@pytest.fixture(scope="module")
def checkpoint_1b(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("qwen2_5_vl_1b"))
    runpy.run_path(os.path.join(ROOT, "scripts", "make", "make_1b.py"))["main"]([out, "--zeros"])
    return out


def test_1b_load_never_holds_the_whole_model(checkpoint_1b):
    """R = 4 on the ~1.2B checkpoint (bf16 shards of 500 MB): every rank materialises its own layers and ``P``,
    and at most one 64 MiB block beside them; it reads from disk only the tensors it keeps; the ranks' own
    layers are disjoint and cover the model."""
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(checkpoint_1b)
    cfg = ScheduleConfig(4, 1, 4, "frozen")
    with torch.device("meta"):
        sizes = {n: p.numel() * 4 for n, p in model_class(config).from_config(config).named_parameters()}
    tower = {n for n in sizes if n.startswith("model.visual.")}
    full = sum(sizes.values())
    owned = []
    for rank in range(4):
        carved, report = split_from_checkpoint(checkpoint_1b, config, cfg, rank)
        held = {n: p for n, p in carved.model.named_parameters()}
        params = sum(p.numel() * p.element_size() for p in held.values())
        own = set(held) - tower
        assert tower <= set(held) and params == sum(sizes[n] for n in own | tower)
        assert report.full_model_bytes > full > 4.5e9  # 1.2B fp32 parameters (plus buffers)
        assert report.kept_bytes - params < 1e6  # the rest are buffers (rotary frequencies)
        assert report.largest_temporary_bytes <= READ_BLOCK_BYTES
        assert report.kept_bytes + report.largest_temporary_bytes < full - min(sizes[n] for n in set(sizes) - own)
        assert params < 0.55 * full, f"rank {rank} holds {params / 1e9:.2f} GB of {full / 1e9:.2f}"
        assert report.read_bytes == params // 2  # bf16 on disk: only the kept tensors were read
        assert ("lm_head.weight" in held) == (rank == 3)
        owned.append(own)
        del carved, held
    assert all(not (owned[a] & owned[b]) for a in range(4) for b in range(a + 1, 4))
    assert set().union(*owned) | tower == set(sizes)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "recipes", "presets", "*.yaml"))))
def test_every_preset_plan_fits_80gb(path):
    """Each preset's shipped config on the meta device: the planned shape fits 80 GiB with 10% headroom (with
    ``parallel.ep_size``, each EP rank holding ``E / ep_size`` of the experts)."""
    from mpipe_hf.train import load_recipe
    from mpipe_hf.train.plan import plan
    from mpipe_hf.train.plan_estimate import estimate_profile
    from mpipe_hf.train.trainer import check_layout, load_config
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        recipe = load_recipe(path)
        config = load_config(recipe.model)
    finally:
        os.chdir(cwd)
    profile = estimate_profile(config, 2048, 1024)
    layers = check_layout(recipe, config)
    ep_size = recipe.parallel.ep_size
    result = plan(config, recipe.schedule(), profile, layers, recipe.parallel.text_layers,
                  recipe.train.gradient_checkpointing, ep_size)
    assert result.fits(80 * 2**30), result.table(80 * 2**30)
    assert recipe.parallel.pp_size >= 2 and result.ranks[0].param_bytes > 0
    total = sum(r.param_bytes for r in result.ranks)
    with torch.device("meta"):
        named = list(model_class(config).from_config(config).named_parameters())
    whole = sum(p.numel() * 4 for _, p in named)
    tower = sum(p.numel() * 4 for n, p in named
                if n.startswith(("model.visual.", "model.vision_tower.", "model.multi_modal_projector.")))
    tied = dict(named).get("lm_head.weight") is None  # a tied head is a second copy on the last rank
    head = config.get_text_config().hidden_size * config.get_text_config().vocab_size * 4 if tied else 0
    experts = sum(p.numel() * 4 for n, p in named if p.dim() == 3 and ".experts." in n)  # fused (E, ...) tensors
    # the shares cover the model once (an EP rank 1 / ep_size of the experts), plus a replica of the frozen tower on
    # every other rank
    assert total == whole - experts + experts // ep_size + (recipe.parallel.pp_size - 1) * tower + head


def test_every_preset_says_which_cp_size_its_model_takes():
    """Each preset's comment on context parallelism is the one ``scripts/make/make_presets.py`` writes for its
    config today (the ``cp_size`` values whose split :func:`~mpipe_hf.train.checks.check_context_parallel` accepts,
    or why none runs), so a preset never offers a ``cp_size`` the launch would refuse; and the preset's own
    ``parallel.cp_size`` passes that check."""
    import importlib.util
    import textwrap
    from mpipe_hf.train import load_recipe
    from mpipe_hf.train.checks import check_context_parallel
    from mpipe_hf.train.trainer import load_config
    spec = importlib.util.spec_from_file_location("make_presets", os.path.join(ROOT, "scripts", "make",
                                                                               "make_presets.py"))
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    paths = sorted(glob.glob(os.path.join(ROOT, "recipes", "presets", "*.yaml")))
    assert len(paths) == len(make.PRESETS)
    for path in paths:
        recipe = load_recipe(path)
        config = load_config(recipe.model)
        check_context_parallel(config, recipe.parallel.cp_size)
        note = make.context_parallel_note(config)
        comment = [line for line in open(path).read().splitlines() if line.startswith("#")]
        assert "\n".join("# " + line for line in textwrap.wrap(note, 110)) in "\n".join(comment), (path, note)


@pytest.mark.parametrize("name,preprocess,text_layers", [("qwen3_vl", "trainable", 0), ("qwen2_5_vl", "frozen", 0),
                                                         ("qwen3_tied", "trainable", 1)])
def test_plan_counts_what_the_loaded_ranks_hold(configs, name, preprocess, text_layers):
    from mpipe_hf.train.plan import plan
    config = configs[name]
    cfg = ScheduleConfig(2, 2, 4, preprocess)
    layers = get_family(config.model_type).layer_counts(config, cfg, None, text_layers)
    profile = Profile(num_layers=8, layer_forward_s=1.0, layer_backward_s=2.0, layer_activation_bytes=100.0,
                      head_activation_bytes=1000.0)
    result = plan(config, cfg, profile, layers, text_layers)
    for rank, rp in enumerate(result.ranks):
        carved, _ = split_from_config(config, cfg, rank, layers, text_layers)
        assert rp.param_bytes == sum(p.numel() * 4 for p in carved.model.parameters())
        trained = carved.trainable_parameters(cfg, rank)
        assert rp.grad_bytes == sum(p.numel() * 4 for p in trained.values())
        assert rp.optimizer_bytes == 2 * rp.grad_bytes
    # rank 1 holds the last stage: its peak includes the head's activations once
    assert result.ranks[1].activation_bytes % 100 == 0 and result.ranks[1].activation_bytes >= 1000


def test_cost_balanced_layout_beats_count_balanced_on_the_demo_profile():
    """The demo's profile as measured on a 2-core CPU machine (mpipe-hf profile recipes/qwen2_5_vl_demo.yaml)."""
    profile = Profile.load(os.path.join(ROOT, "recipes", "profiles", "qwen2_5_vl_demo.yaml"))
    head = profile.head_forward_s + profile.head_backward_s
    layer = profile.layer_forward_s + profile.layer_backward_s
    assert 1.5 < head / layer < 4, "the demo's head should cost what a real 7B head costs: about 2.3 layers"
    cfg = ScheduleConfig(4, 2, 8, "frozen")
    by_count = predict(profile, cfg, balanced_layers(profile.num_layers, cfg.num_stages))
    by_cost = predict(profile, cfg)
    assert list(by_cost.layers_per_stage) == profile_layers(profile, cfg)
    assert by_cost.step_s < 0.97 * by_count.step_s, (by_cost, by_count)
    # the demo recipe's default layout, balanced by the config's matmul sizes, is as fast as the profile's own
    make_demo = runpy.run_path(os.path.join(ROOT, "scripts", "make", "make_demo.py"))
    config = qwen_tiny.tiny_qwen2_5_vl_config(qwen2_tokenizer(make_demo["DEMO_RANKS"]),
                                              num_layers=make_demo["DEMO_LAYERS"], vision_depth=4)
    default = predict(profile, cfg, get_family(config.model_type).layer_counts(config, cfg))
    assert default.step_s < 1.02 * by_cost.step_s, (default, by_cost)


def test_saved_bytes_leave_out_the_weights():
    """``F.linear`` saves ``weight.t()``, a new tensor on the weight's storage: it is not an activation."""
    from mpipe_hf.runtime.memory import saved_bytes, storage_ids
    layer = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64, requires_grad=True)
    assert saved_bytes(lambda: layer(x), storage_ids(layer.parameters())) == x.numel() * 4


def test_tied_config_with_a_separate_head_in_the_checkpoint_loads_both(configs, tmp_path):
    """A config that ties the head, with a checkpoint that stores its own lm_head: like from_pretrained, both
    tensors load, untied, and their gradients are not summed."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
    config = configs["qwen3_tied"]
    unsplit(config).save_pretrained(tmp_path)
    path = os.path.join(tmp_path, "model.safetensors")
    state = load_file(path)
    state["lm_head.weight"] = torch.randn_like(state["model.embed_tokens.weight"])
    save_file(state, path, metadata={"format": "pt"})
    with pytest.warns(UserWarning, match="stores lm_head.weight apart"):
        carved, _ = split_from_checkpoint(str(tmp_path), config, ScheduleConfig(1, 1, 1, "identity"), 0)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path)
    got = tensors(carved.model)
    assert torch.equal(got["lm_head.weight"], state["lm_head.weight"])
    assert torch.equal(got["model.embed_tokens.weight"], state["model.embed_tokens.weight"])
    assert torch.equal(ref.lm_head.weight, state["lm_head.weight"])  # transformers does the same
    with pytest.warns(UserWarning):
        carved, _ = split_from_checkpoint(str(tmp_path), config, ScheduleConfig(2, 1, 2, "identity"), 1)
    assert carved.tied == [] and torch.equal(carved.model.lm_head.weight, state["lm_head.weight"])


def test_layout_errors_name_the_cause(configs):
    from mpipe_hf.models.base import plan_layers
    from mpipe_hf.train.recipe import DataSection, ModelSource, ParallelSection, Recipe
    from mpipe_hf.train.trainer import check_layout
    with pytest.raises(ValueError, match="text_layers must be an integer >= 0, got '2'"):
        plan_layers(8, ScheduleConfig(2, 1, 2, "frozen"), None, "2", (1.0, 2.0))
    recipe = Recipe(ModelSource(config=os.path.join(ROOT, "recipes", "presets", "qwen2_5_vl_7b", "config.json")),
                    DataSection("x.jsonl"), ParallelSection(pp_size=2, vpp=1, num_micro=2))
    profile = Profile(num_layers=16, layer_forward_s=1.0, layer_backward_s=2.0)
    with pytest.raises(ValueError, match="the profile measures a model of 16 decoder layers, but 'qwen2_5_vl' here "
                                         "has 28"):
        check_layout(recipe, configs["qwen2_5_vl"].__class__.from_pretrained(recipe.model.config), profile)


def test_plan_counts_the_graphs_a_trainable_preprocess_keeps(configs):
    from mpipe_hf.train.plan import plan
    config = configs["qwen2_5_vl"]
    profile = Profile(num_layers=8, layer_forward_s=1.0, layer_backward_s=2.0, layer_activation_bytes=100.0,
                      preprocess_activation_bytes=10_000.0)
    peaks = {}
    for owner_backward in (False, True):
        cfg = ScheduleConfig(4, 1, 8, "trainable", owner_backward=owner_backward)
        layers = get_family(config.model_type).layer_counts(config, cfg)
        peaks[owner_backward] = [r.activation_bytes for r in plan(config, cfg, profile, layers).ranks]
    # without owner-backward only rank 0 rebuilds one graph at a time; with it every owner keeps its two
    assert peaks[False][0] >= 10_000 and all(p < 10_000 for p in peaks[False][1:])
    assert all(p >= 20_000 for p in peaks[True])
