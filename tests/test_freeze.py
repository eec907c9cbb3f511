"""What trains, by pattern: ``train.freeze`` / ``train.trainable`` and the ``freeze_vit``,
``freeze_aligner`` and ``freeze_llm`` shortcuts.

- the parts behind the shortcuts, read from each family's declaration;
- bad patterns and contradictions refused before launch, naming the field;
- with the ViT frozen and the merger trained, ``P``'s forward saves no ViT activation (measured with
  ``saved_tensors_hooks``) and the profile's backward is the merger's;
- in tests/test_numerics.py's R = 2 launch: every case of ``matrix.FREEZE_SPECS`` against the unsplit model frozen
  by the same patterns (loss, every gradient at the first and last step, per tensor; parameters after 2 AdamW
  steps), and the video cases (``dist/specs_video.py``): rows mixing images and videos (GLM-4.xV:
  micro-batches of videos and of images apart), exact against the unsplit model, and negative controls that must
  fail (docs/video.md).
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import collator, make_ragged_pool, tiny_configs  # noqa: E402

from mpipe_hf.data import qwen2_tokenizer  # noqa: E402
from mpipe_hf.models import get_family, split  # noqa: E402
from mpipe_hf.models.freeze import Trainable, apply_trainable, check_trainable, parts  # noqa: E402
from mpipe_hf.models.load import meta_model  # noqa: E402
from mpipe_hf.models.materialize import model_class  # noqa: E402
from mpipe_hf.runtime.memory import saved_bytes, storage_ids  # noqa: E402
from mpipe_hf.schedule import ScheduleConfig  # noqa: E402

CONFIGS = ("vl", "qwen3_vl", "llava", "gemma3", "qwen3-tied", "qwen3_5", "glm4v", "glm46v", "llava_onevision")


@pytest.fixture(scope="module")
def configs():
    tokenizer = qwen2_tokenizer(4096)
    return tokenizer, tiny_configs(tokenizer, list(CONFIGS))


@pytest.mark.parametrize("name, vit, aligner", [
    ("vl", "model.visual.blocks", ["model.visual.merger"]),
    ("qwen3_vl", "model.visual.blocks", ["model.visual.merger", "model.visual.deepstack_merger_list"]),
    ("llava", "model.vision_tower", ["model.multi_modal_projector"]),
    ("gemma3", "model.vision_tower", ["model.multi_modal_projector"])])
def test_shortcut_parts_come_from_the_family(configs, name, vit, aligner):
    config = configs[1][name]
    model = meta_model(config)
    found = parts(get_family(config.model_type), model)
    assert vit in found["vit"] and found["aligner"] == aligner, found
    assert not set(found["vit"]) & set(found["aligner"])
    assert found["llm"] == [get_family(config.model_type).text, "lm_head"]


def test_patterns_freeze_what_they_name_and_trainable_gives_back(configs):
    model = meta_model(configs[1]["vl"])
    spec = Trainable(freeze=["model.visual", "*.mlp.*"], trainable=["model.visual.merger"])
    frozen = apply_trainable(model, get_family("qwen2_5_vl"), spec)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert frozen and all(n.startswith("model.visual.") or ".mlp." in n for n in frozen)
    assert any(n.startswith("model.visual.merger.") for n in trained)
    assert all(n.startswith("model.visual.merger.") for n in trained if n.startswith("model.visual.") or ".mlp." in n)


def test_a_tied_pair_is_frozen_together_on_every_rank(configs):
    config = configs[1]["qwen3-tied"]
    cfg = ScheduleConfig(2, 1, 2, "frozen")
    for rank in range(2):
        carved = split(model_class(config).from_config(config), cfg, rank, None, 1)
        apply_trainable(carved.model, get_family(config.model_type), Trainable(freeze=["model.embed_tokens"]),
                        carved.frozen, carved.tied, strict=False)
        held = dict(carved.model.named_parameters())
        assert carved.tied and all(not held[n].requires_grad for pair in carved.tied for n in pair if n in held)


@pytest.mark.parametrize("spec, preprocess, match", [
    (Trainable(freeze=["model.no_such_module"]), "trainable", "train.freeze: 'model.no_such_module' matches no"),
    (Trainable(trainable=["model.visual.merger"]), "frozen", "set parallel.preprocess: trainable"),
    (Trainable(freeze_vit=True), "frozen", "freeze_vit trains the projector .* set parallel.preprocess: trainable"),
    (Trainable(freeze_vit=True, freeze_aligner=True), "trainable", "set parallel.preprocess: frozen"),
    (Trainable(freeze_vit=True, freeze_aligner=True, freeze_llm=True), "trainable", "leave no parameter")])
def test_contradictions_are_refused_before_launch(configs, spec, preprocess, match):
    with pytest.raises(ValueError, match=match):
        check_trainable(configs[1]["vl"], ScheduleConfig(2, 1, 2, preprocess), spec)


def test_every_unmatched_pattern_is_named_with_its_nearest_names(configs):
    """Every pattern that matches nothing is named in one error line, each with the names closest to it (a
    misspelt module is answered with that module, not with the model's first names in sorted order)."""
    from mpipe_hf.models.freeze import nearest_names
    spec = Trainable(freeze=["model.visual.mergr", "model.visual"], trainable=["model.langauge_model.norm"])
    with pytest.raises(ValueError) as raised:
        check_trainable(configs[1]["vl"], ScheduleConfig(2, 1, 2, "trainable"), spec)
    text = str(raised.value)
    assert "\n" not in text and text.count("matches no parameter") == 2, text
    assert "train.freeze: 'model.visual.mergr' matches no parameter of the model (nearest: ['model.visual.merger'" \
        in text, text
    assert "train.trainable: 'model.langauge_model.norm' matches no parameter of the model (nearest: " \
        "['model.language_model.norm'" in text, text
    names = ["a.b.weight", "lm_head.weight", "model.visual.merger.mlp.0.weight", "z.weight"]
    assert nearest_names(names, "model.visual.mergr", 1) == ["model.visual.merger"]
    assert sorted(names)[:1] != nearest_names(names, "model.visual.mergr", 1)  # not the first names sorted


def test_a_decoder_only_lm_has_no_vit(configs):
    with pytest.raises(ValueError, match="train.freeze_vit: .* has no vit parameters"):
        check_trainable(configs[1]["qwen3-tied"], ScheduleConfig(2, 1, 2, "frozen"), Trainable(freeze_vit=True), None,
                        1)


def test_a_bad_pattern_value_names_the_field():
    from mpipe_hf.train.recipe import TrainSection
    with pytest.raises(ValueError, match="train.freeze must be a list"):
        TrainSection(freeze=[3])
    with pytest.raises(ValueError, match="train.freeze_vit must be true or false"):
        TrainSection(freeze_vit="yes")


def _preprocess_saved(configs, spec):
    """Bytes ``P``'s forward saves for its backward (parameters excluded), trainable, under ``spec``."""
    tokenizer, tiny = configs
    config = tiny["vl"]
    torch.manual_seed(0)
    model = model_class(config).from_config(config)
    carved = split(model, ScheduleConfig(1, 1, 1, "trainable"), 0, None, 0)
    apply_trainable(carved.model, get_family(config.model_type), spec, carved.frozen, carved.tied)
    micro = next(m for m in make_ragged_pool(collator(config, tokenizer)) if "pixel_values" in m)
    pre = carved.preprocess
    raw = pre.with_host(micro)
    return saved_bytes(lambda: pre.module(pre.inputs(raw)), storage_ids(carved.model.parameters()))


def test_a_frozen_vit_keeps_no_activation(configs):
    """With ``freeze_vit`` the preprocess saves only what the merger's backward needs: under 5% of what the whole
    trainable tower saves (the tiny Qwen2.5-VL: 2 ViT blocks, one merger)."""
    whole = _preprocess_saved(configs, Trainable())
    merger_only = _preprocess_saved(configs, Trainable(freeze_vit=True))
    nothing = _preprocess_saved(configs, Trainable(freeze_vit=True, freeze_aligner=True))
    assert nothing == 0 and 0 < merger_only < 0.05 * whole, (merger_only, whole)


def test_the_cost_model_knows_a_frozen_vit_backward_is_the_mergers():
    """``mpipe-hf plan``'s estimate at Qwen2.5-VL-7B's size (the preset's config, on the meta device): with
    ``freeze_vit`` ``P``'s backward, its broadcast parameters and its graph are the merger's, a small part of the
    tower's, and the simulated step is shorter."""
    from mpipe_hf.schedule.tune import predict
    from mpipe_hf.train.plan_estimate import estimate_profile
    from mpipe_hf.train.sources import load_config
    from mpipe_hf.train.recipe import load_recipe
    recipe = load_recipe(os.path.join(os.path.dirname(__file__), "..", "recipes", "presets", "qwen2_5_vl_32b.yaml"))
    config = load_config(recipe.model)
    whole = estimate_profile(config, 2048, 1024)
    merger = estimate_profile(config, 2048, 1024, frozen_vit=True)
    assert merger.preprocess_forward_s == whole.preprocess_forward_s
    for key in ("preprocess_backward_s", "preprocess_param_bytes", "preprocess_activation_bytes"):
        assert 0 < getattr(merger, key) < 0.2 * getattr(whole, key), key
    cfg = ScheduleConfig(4, 2, 8, "trainable")
    layers = [config.get_text_config().num_hidden_layers // 8] * 8
    assert predict(merger, cfg, layers).step_s < predict(whole, cfg, layers).step_s
