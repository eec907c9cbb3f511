"""Experts cut at load, one process, no launch: ``split_from_checkpoint(..., experts=(ep_rank,
ep_size))`` on a saved tiny Qwen3-VL-MoE gives each fused ``(E, ...)`` expert tensor of the rank's stages only its
EP rank's ``E / ep_size`` rows, read from the checkpoint (and never made real whole), while every other tensor,
``P``'s experts included, is the no-EP load's; the hub layout (experts stored transposed, ``(E, H, 2I)``) reads the
same; ``shard_experts`` takes such a share as it is (and refuses it on another EP rank), and its masked outputs
summed over the EP ranks are the unsplit experts'; a LoRA adapter on the attention draws as without EP, one on the
fused experts (``target_parameters``) keeps the experts whole for ``shard_experts`` to cut."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.models import load
from mpipe_hf.families.qwen import tiny as qwen_tiny
from mpipe_hf.models.expert_parallel import shard_experts
from mpipe_hf.models.load import load_share_values, model_class, split_from_checkpoint
from mpipe_hf.schedule import ScheduleConfig

from ep_stubs import EPMesh, masked

E, EP, T = 4, 2, 1  # experts, EP ranks, P's text layers (its experts stay whole)
CFG = ScheduleConfig(2, 1, 2, "trainable")  # pp 2: rank 0 holds layers 1-2 of 4, rank 1 layer 3 (layer 0 in P)
FUSED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``(config, the unsplit model's state, checkpoint dir, hub-layout checkpoint dir)``: the second stores the
    fused ``gate_up_proj`` tensors transposed, ``(E, H, 2I)``, as the hub's Qwen3-VL-MoE checkpoints (transformers'
    ``Transpose(1, 2, check_dims=True)``; the tiny ``down_proj`` is square, ``H = I``, where no layout shows)."""
    config = qwen_tiny.tiny_qwen3_vl_moe_config(qwen2_tokenizer(5120), num_layers=4)
    torch.manual_seed(0)
    model = model_class(config).from_config(config, dtype=torch.float32)
    path, hub = tmp_path_factory.mktemp("moe"), tmp_path_factory.mktemp("moe-hub")
    model.save_pretrained(path)
    model.config.save_pretrained(hub)
    file = os.path.join(path, "model.safetensors")
    with safe_open(file, "pt") as f:
        disk = {k: f.get_tensor(k) for k in f.keys()}
    save_file({k: t.transpose(1, 2).contiguous() if k.endswith(FUSED[0]) else t for k, t in disk.items()},
              os.path.join(hub, "model.safetensors"), metadata={"format": "pt"})
    return config, {n: t.detach().clone() for n, t in model.state_dict().items()}, str(path), str(hub)


def stage_experts(names, rank: int) -> list[str]:
    """The fused expert tensors of ``rank``'s stages (not ``P``'s layer 0)."""
    return [n for n in names if n.endswith(FUSED) and ".layers.0." not in n]


def materialized_shapes(monkeypatch) -> dict[str, tuple]:
    """Record the shape of every tensor ``split_from_checkpoint`` makes real (by name, last load wins)."""
    seen: dict[str, tuple] = {}
    real = load.materialize

    def recording(model, only=None):
        real(model, only)
        seen.update({n: tuple(p.shape) for n, p in model.named_parameters() if not p.is_meta})
    monkeypatch.setattr(load, "materialize", recording)
    return seen


@pytest.mark.parametrize("rank", [0, 1])
def test_experts_are_cut_at_load(saved, rank, monkeypatch):
    """Each EP rank's fused expert tensors hold its ``E / 2`` rows of the checkpoint's, no ``(E, ...)`` one was
    ever made real, the other tensors equal the no-EP load bit for bit, and the report keeps and reads exactly the
    other EP rank's expert bytes less."""
    config, full, path, _ = saved
    whole, whole_report = split_from_checkpoint(path, config, CFG, rank, None, T)
    expected = whole.model.state_dict()
    cut = stage_experts(expected, rank)
    assert cut and all(expected[n].shape[0] == E for n in cut)
    others = sum(t.numel() * t.element_size() for n, t in expected.items() if n in cut) // EP
    for ep_rank in range(EP):
        shapes = materialized_shapes(monkeypatch)
        carved, report = split_from_checkpoint(path, config, CFG, rank, None, T, experts=(ep_rank, EP))
        got = carved.model.state_dict()
        assert sorted(got) == sorted(expected)
        rows = slice(ep_rank * E // EP, (ep_rank + 1) * E // EP)
        for name in cut:
            assert shapes[name][0] == E // EP, (name, shapes[name])  # never (E, ...)
            assert torch.equal(got[name], full[name][rows]), name
        differ = [n for n, t in got.items() if n not in cut and not torch.equal(t, expected[n])]
        assert not differ, differ[:5]
        assert all(got[n].shape[0] == E for n in got if n.endswith(FUSED) and n not in cut)  # P's layer 0
        assert whole_report.kept_bytes - report.kept_bytes == others, (whole_report.kept_bytes, report.kept_bytes)
        assert whole_report.read_bytes - report.read_bytes == others
        assert report.full_model_bytes == whole_report.full_model_bytes


def test_hub_layout_experts_read_transposed(saved):
    """A checkpoint whose fused experts are stored transposed (the hub's layout, which ``from_pretrained``
    transposes back) loads to the same values, whole and cut, block by block."""
    config, full, _, hub = saved
    from_pretrained = model_class(config).from_pretrained(hub, dtype=torch.float32).state_dict()
    assert all(torch.equal(from_pretrained[n], t) for n, t in full.items())  # the layout is transformers'
    for experts in (None, (1, EP)):
        carved, _ = split_from_checkpoint(hub, config, CFG, 0, None, T, experts=experts)
        got = carved.model.state_dict()
        cut = stage_experts(got, 0) if experts else []
        assert all(torch.equal(t, full[n][E // EP:] if n in cut else full[n]) for n, t in got.items()), experts


def test_shard_experts_takes_the_cut_share(saved, monkeypatch):
    """``shard_experts`` keeps a share cut at load as it is: the EP ranks' masked outputs of a stage's experts sum
    to the unsplit experts' output; a share cut for another EP rank is refused by name. Resuming before
    ``shard_experts`` (``load_share_values`` without shards) reads only the rows cut at load."""
    import transformers.distributed.expert_parallel as hf_ep
    from mpipe_hf.runtime import watchdog
    config, full, path, _ = saved
    monkeypatch.setattr(watchdog, "watched", lambda mesh: None)
    layer = "model.language_model.layers.1.mlp.experts"
    unsplit = model_class(config).from_pretrained(path, dtype=torch.float32).get_submodule(layer)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(24, config.text_config.hidden_size, generator=g)
    index = torch.stack([torch.randperm(E, generator=g)[:2] for _ in range(24)])
    weights = torch.rand(24, 2, generator=g)
    outputs = []
    for ep_rank in range(EP):
        monkeypatch.setattr(hf_ep, "EPImplementationInterface",
                            lambda r=ep_rank: {"all_to_all": lambda experts, group, tp: masked(experts, r)})
        carved, _ = split_from_checkpoint(path, config, CFG, 0, None, T, experts=(ep_rank, EP))
        with torch.no_grad():
            for p in carved.model.parameters():
                p.zero_()
        load_share_values(path, carved, CFG, 0)  # mpipe-hf train's resume comes before shard_experts
        held = carved.model.state_dict()
        shards = shard_experts(carved, config, 0, CFG.pp_size, EPMesh(EP, ep_rank), None)
        assert sorted(shards.names) == sorted(stage_experts(held, 0))
        assert all(p is carved.model.get_parameter(n) for n, p in zip(shards.names, shards.params))
        assert all(torch.equal(held[n], shards.cut(n, full[n])) for n in shards.names)
        outputs.append(carved.model.get_submodule(layer)(hidden, index, weights))
        other, _ = split_from_checkpoint(path, config, CFG, 0, None, T, experts=(1 - ep_rank, EP))
        with pytest.raises(ValueError, match="was loaded with the experts"):
            shard_experts(other, config, 0, CFG.pp_size, EPMesh(EP, ep_rank), None)
    want = unsplit(hidden, index, weights)
    assert torch.allclose(sum(outputs), want, atol=1e-6, rtol=1e-5), (sum(outputs) - want).abs().max()


def test_lora_on_attention_cuts_experts_on_the_experts_keeps_them(saved):
    """An adapter on the attention alone: the experts are cut at load and every other tensor, the adapter's
    drawn ones included, equals the no-EP load's. An adapter on the fused experts (``target_parameters``, whose
    ``ParamWrapper`` sizes ``lora_A`` / ``lora_B`` by the experts it finds): the share is the no-EP one, whole,
    for ``shard_experts`` to cut with its adapter."""
    from mpipe_hf.train.recipe_lora import LoraSection
    config, full, path, _ = saved
    for targets in (None, list(FUSED)):
        adapter = LoraSection(r=2, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=False,
                              target_parameters=targets).peft_config()
        whole, _ = split_from_checkpoint(path, config, CFG, 0, None, T, adapter=adapter, seed=5)
        carved, _ = split_from_checkpoint(path, config, CFG, 0, None, T, adapter=adapter, seed=5, experts=(1, EP))
        expected, got = whole.model.state_dict(), carved.model.state_dict()
        assert sorted(got) == sorted(expected) and any(".lora_A." in n for n in got)
        cut = [n for n in stage_experts(got, 0) if got[n].shape != expected[n].shape]
        assert len(cut) == (0 if targets else 4), cut
        assert all(torch.equal(got[n], expected[n][E // EP:] if n in cut else expected[n]) for n in got)


def test_a_run_carves_its_ep_ranks_experts(saved, world):
    """``PipelineRun.carve`` with ``parallel.ep_size: 2`` reads EP rank ``dp_rank % 2``'s experts of a checkpoint
    (the numbering of ``expert_mesh``), before any EP mesh exists; with ``cp_size: 2`` EP rank
    ``(dp_rank * 2 + cp_rank) % 2``'s."""
    from mpipe_hf.models import get_family
    from mpipe_hf.train.recipe_model import ModelSource
    from mpipe_hf.train.recipe_parallel import ParallelSection
    from mpipe_hf.train.run import PipelineRun
    config, full, path, _ = saved
    parallel = ParallelSection(pp_size=2, num_micro=2, preprocess="trainable", text_layers=T, dp_size=4, ep_size=2)
    counts = get_family(config.model_type).layer_counts(config, parallel.schedule(), None, T)
    for dp_rank in range(4):
        run = PipelineRun(parallel)
        run.dp_rank, run.rank, run.every, run.device = dp_rank, 0, (0, 1, None), torch.device("cpu")
        run.carve(ModelSource(name_or_path=path), config, counts)
        held = run.carved.model.state_dict()
        rows = slice(dp_rank % 2 * E // EP, (dp_rank % 2 + 1) * E // EP)
        assert all(torch.equal(held[n], full[n][rows]) for n in stage_experts(held, 0)), dp_rank
    # with context parallelism the EP group is cut from the dp x cp ranks: CP rank c of replica 0 is EP rank c
    parallel = ParallelSection(pp_size=2, num_micro=2, preprocess="trainable", text_layers=T, dp_size=1, cp_size=2,
                               ep_size=2)
    for cp_rank in range(2):
        run = PipelineRun(parallel)
        run.dp_rank, run.cp_rank, run.rank, run.every, run.device = 0, cp_rank, 0, (0, 1, None), torch.device("cpu")
        run.carve(ModelSource(name_or_path=path), config, counts)
        held = run.carved.model.state_dict()
        rows = slice(cp_rank * E // EP, (cp_rank + 1) * E // EP)
        assert all(torch.equal(held[n], full[n][rows]) for n in stage_experts(held, 0)), cp_rank


@pytest.mark.skipif(os.environ.get("MPIPE_HF_FULL") != "1", reason="one more 4-process launch: MPIPE_HF_FULL=1")
def test_recipe_from_a_checkpoint_with_ep_size_2_trains_like_one_process(demo, tmp_path):
    """``mpipe-hf train`` on recipes/qwen3_vl_moe_ep.yaml with its model read from a checkpoint (each EP rank
    reading its experts alone, checked against the EP mesh by ``shard_experts``): losses and clipped gradient
    norms equal one process's ``from_pretrained`` model trained on the global batch."""
    from test_ep import ep_reference, ep_train, metrics
    from mpipe_hf.train.sources import load_config
    from mpipe_hf.train.recipe_model import ModelSource
    os.symlink(demo, tmp_path / "demo")
    (tmp_path / "recipes").mkdir()
    config = load_config(ModelSource(config=os.path.join(demo, "configs", "qwen3_vl_moe.json")))
    torch.manual_seed(0)
    model_class(config).from_config(config, dtype=torch.float32).save_pretrained(tmp_path / "checkpoint")
    recipe, out = ep_train(tmp_path, "run", model={"name_or_path": str(tmp_path / "checkpoint"),
                                                   "tokenizer": os.path.join(demo, "model")})
    assert recipe.model.name_or_path and recipe.parallel.ep_size == 2
    losses, norms, _ = ep_reference(recipe, 2)
    rows = metrics(out)
    assert len(rows) == 2
    for row, loss, norm in zip(rows, losses, norms):
        assert abs(row["loss"] - loss) < 1e-4 and abs(row["grad_norm"] - norm) < 1e-4 * norm, (rows, losses, norms)
