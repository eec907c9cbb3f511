"""The tiny family folders of ``scripts/make/make_tiny_models.py`` load back as hub snapshots do, their recipes in
recipes/tiny/ are what the generator writes, the Gemma 3 one and one of each family group train through ``mpipe-hf
train`` from another working directory like one process, and a chat template of another family is refused before
any process starts.

The slow check, every family's recipe trained, is ``scripts/check/train_tiny_recipes.py``.
"""

import json
import os
import runpy
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from PIL import Image

from mpipe_hf.data import default_chat_template
from mpipe_hf.data.template_family import check_template_family, template_families
from mpipe_hf.families.registry import all_data
from train_common import EPS, ROOT, recipe_reference

SCRIPT = runpy.run_path(os.path.join(ROOT, "scripts", "make", "make_tiny_models.py"))
# the families whose template format is their own (FamilyData.template_owner)
TEMPLATE_TYPES = sorted(t for t, d in all_data().items() if d.template_owner)
GROUPS = ("glm4v", "idefics3", "aria")  # one family a group: CI trains its recipe
BUILT = ("gemma3", "qwen2_5_vl", "qwen3") + GROUPS  # a few families: CI builds these, the script all


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``make_tiny_models.py OUT --only BUILT``: the folders of a few families (about 5 s)."""
    out = str(tmp_path_factory.mktemp("tiny"))
    assert SCRIPT["main"]([out, "--only", *BUILT]) == 0
    return out


@pytest.mark.parametrize("model_type", BUILT)
def test_tiny_folder_loads_back_with_its_processor_and_own_template(tiny, model_type):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer
    from mpipe_hf.data import load_checkpoint_processor
    path = os.path.join(tiny, model_type)
    config = AutoConfig.from_pretrained(path)
    assert config.model_type == model_type
    cls = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    _, info = cls.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    if cls is AutoModelForCausalLM:  # Qwen3: ChatML, the Qwen3-VL template's turns
        assert AutoTokenizer.from_pretrained(path).chat_template == default_chat_template("qwen3_vl")
        return
    processor = load_checkpoint_processor(path)
    assert model_type in template_families(processor.chat_template)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
                {"role": "assistant", "content": "A cup."}]
    text = processor.apply_chat_template(messages, tokenize=False)
    inputs = processor(text=[text], images=[Image.new("RGB", (64, 48), "red")], return_tensors="pt")
    image_id = getattr(config, "image_token_id", None)
    image_id = getattr(config, "image_token_index", None) if image_id is None else image_id
    assert (inputs["input_ids"] == image_id).sum() > 0 and inputs["pixel_values"].numel() > 0


def test_recipes_on_disk_are_what_the_generator_writes(tmp_path):
    assert SCRIPT["recipe_problems"]() == [], "run python scripts/make/make_tiny_models.py --recipes"
    written = SCRIPT["write_recipes"](str(tmp_path))
    assert "gemma3.yaml" in written and SCRIPT["recipe_problems"](str(tmp_path)) == []
    with open(tmp_path / "gemma3.yaml", "a") as f:
        f.write("# edited by hand\n")
    os.remove(tmp_path / "llava.yaml")
    (tmp_path / "bogus.yaml").write_text("model: x\n")
    assert sorted(SCRIPT["recipe_problems"](str(tmp_path))) == [
        "bogus.yaml: no family has it (remove it)", "gemma3.yaml: differs from what the generator writes",
        "llava.yaml: missing"]


def test_each_family_template_is_recognised_and_a_users_own_is_not():
    for model_type in TEMPLATE_TYPES:
        assert model_type in template_families(default_chat_template(model_type)), model_type
    qwen = template_families(default_chat_template("qwen2_5_vl"))
    assert {"qwen2_vl", "qwen3_vl", "qwen3_5"} <= set(qwen) and "gemma3" not in qwen  # one format, several families
    own = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    assert template_families(own) == [] and template_families(None) == []
    check_template_family(own, "gemma3")  # a user's own template is accepted
    check_template_family(default_chat_template("qwen2_5_vl"), "qwen3")  # a decoder-only LM is not checked
    with pytest.raises(ValueError, match="of qwen2_5_vl .*not of gemma3.* Fix: point model.tokenizer at a gemma3"):
        check_template_family(default_chat_template("qwen2_5_vl"), "gemma3")


def test_a_familys_own_default_template_is_accepted_without_rendering_every_family():
    """The common case (a checkpoint's own template, as the hub writes it or with the stand-ins) is a string
    comparison: no family's template is rendered, in the launcher or in any worker."""
    from mpipe_hf.data import template_family
    template_family._family_patterns.cache_clear()
    for model_type in TEMPLATE_TYPES:
        check_template_family(default_chat_template(model_type), model_type)
        check_template_family({"default": template_family._stood_in(default_chat_template(model_type))}, model_type)
    assert template_family._family_patterns.cache_info().misses == 0  # nothing was rendered
    with pytest.raises(ValueError, match="of qwen2_5_vl"):  # another family's still renders, and is refused
        check_template_family(default_chat_template("qwen2_5_vl"), "gemma3")
    assert template_family._family_patterns.cache_info().misses == 1


def test_qwen_template_on_gemma3_is_refused_before_any_process_starts(demo, tiny, tmp_path, monkeypatch):
    """The new user's recipe: recipes/qwen3_5.yaml's ``tokenizer: ../demo/model`` (the Qwen ChatML template) on a
    Gemma 3 model is refused by ``mpipe-hf train`` naming both families, and nothing runs; Gemma 3's own tokenizer
    (the tiny folder's, or the demo's without a template) is accepted."""
    import torch.distributed.run
    from mpipe_hf.cli import main
    from mpipe_hf.train import load_recipe
    from mpipe_hf.train.checks import check

    def launched(*args, **kwargs):
        raise AssertionError("mpipe-hf train started processes before it refused the recipe")
    monkeypatch.setattr(torch.distributed.run, "main", launched)
    os.symlink(demo, tmp_path / "demo")
    shutil.copy(os.path.join(tiny, "gemma3", "config.json"), tmp_path / "gemma3.json")
    raw = yaml.safe_load(open(os.path.join(ROOT, "recipes", "qwen3_5.yaml")))
    raw["model"]["config"] = "../gemma3.json"  # tokenizer: ../demo/model, as the Qwen3.5 recipe has it
    raw["parallel"].pop("layers_per_stage")
    raw["train"]["output_dir"] = "../out"
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "bad.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(SystemExit) as exited:
        main(["train", str(tmp_path / "recipes" / "bad.yaml")])
    error = str(exited.value.code)
    assert error.startswith("mpipe-hf: error: model.tokenizer ") and "chat template of qwen2_5_vl" in error, error
    assert "not of gemma3" in error and "Fix:" in error and not os.path.exists(tmp_path / "out"), error
    for tokenizer in (os.path.join(tiny, "gemma3"), "../demo/tokenizer"):
        raw["model"]["tokenizer"] = tokenizer
        (tmp_path / "recipes" / "good.yaml").write_text(yaml.safe_dump(raw))
        check(load_recipe(str(tmp_path / "recipes" / "good.yaml")))


def train_tiny_recipe(demo, tiny, tmp_path, model_type: str, **parallel) -> None:
    """recipes/tiny/<model_type>.yaml in a copy of the repository's layout (demo/, tiny/, recipes/tiny/), with 2
    steps, eps 1e-6 and ``parallel``'s keys, run by ``mpipe-hf train`` from a working directory outside it: the
    losses and gradient norms equal the unsplit model's on one process, and the checkpoint loads with
    ``from_pretrained`` to the one-process logits."""
    repo = tmp_path / "repo"
    (repo / "recipes" / "tiny").mkdir(parents=True)
    os.symlink(demo, repo / "demo")
    (repo / "tiny").mkdir()
    os.symlink(os.path.join(tiny, model_type), repo / "tiny" / model_type)
    raw = yaml.safe_load(open(os.path.join(ROOT, "recipes", "tiny", f"{model_type}.yaml")))
    raw["train"].update(max_steps=2, adam_epsilon=EPS)  # the paths stay as shipped, relative to the file
    raw["parallel"].update(parallel)
    path = repo / "recipes" / "tiny" / f"{model_type}.yaml"
    path.write_text(yaml.safe_dump(raw))
    (tmp_path / "elsewhere").mkdir()
    from mpipe_hf.train import load_recipe
    ref_losses, ref_norms, ref_model, micro = recipe_reference(load_recipe(str(path)), 2)
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train",
                           f"../repo/recipes/tiny/{model_type}.yaml"], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path / "elsewhere", env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-5000:]
    out = repo / "outputs" / "tiny" / model_type
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert len(rows) == 2 and all(abs(r["loss"] - ref) < 1e-4 for r, ref in zip(rows, ref_losses)), (rows, ref_losses)
    assert all(abs(r["grad_norm"] - n) < 1e-4 * n for r, n in zip(rows, ref_norms)), (rows, ref_norms)
    loaded, info = type(ref_model).from_pretrained(out / "checkpoint", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        inputs = {k: v for k, v in micro.items() if k != "labels"}
        assert (loaded(**inputs).logits - ref_model(**inputs).logits).abs().max().item() < 1e-4


def test_tiny_gemma3_recipe_trains_from_another_directory_like_one_process(demo, tiny, tmp_path):
    """The Gemma 3 recipe (:func:`train_tiny_recipe`), stage 0's only layer moved into the frozen ``P`` (``V = 1``,
    layers ``[1, 7]``, ``T = 1``): rank 0 holds nothing to train, and the run trains all the same (rank 1 does)."""
    train_tiny_recipe(demo, tiny, tmp_path, "gemma3", vpp=1, layers_per_stage=[1, 7], text_layers=1)


@pytest.mark.parametrize("model_type", GROUPS)
def test_a_tiny_recipe_of_each_family_group_trains_like_one_process(demo, tiny, tmp_path, model_type):
    """``mpipe-hf train`` on one family of each group as shipped in recipes/tiny/ (:func:`train_tiny_recipe`): GLM,
    Idefics, and Aria for the LLaVA-like ones and those with their own towers; the Qwen-like ones train through
    the demo and the shipped Qwen3-VL-MoE recipe (tests/test_train.py), Gemma above."""
    train_tiny_recipe(demo, tiny, tmp_path, model_type)


def test_shieldgemma2_checkpoint_loads_per_rank_as_shieldgemma2_reads_it(tmp_path):
    """A ShieldGemma 2 checkpoint holds ``ShieldGemma2ForImageClassification``'s names (its ``model`` is the Gemma 3
    model the split carves), which transformers' own ``AutoModelForImageTextToText`` does not map back: each rank's
    share equals, tensor for tensor, ``ShieldGemma2ForImageClassification.from_pretrained(path).model``'s."""
    from transformers import AutoConfig, ShieldGemma2ForImageClassification
    from mpipe_hf.models.load import split_from_checkpoint
    from mpipe_hf.schedule import ScheduleConfig
    assert SCRIPT["main"]([str(tmp_path), "--only", "shieldgemma2"]) == 0
    path = str(tmp_path / "shieldgemma2")
    reference = ShieldGemma2ForImageClassification.from_pretrained(path).model.state_dict()
    config, seen = AutoConfig.from_pretrained(path), set()
    for rank in range(2):
        carved, _ = split_from_checkpoint(path, config, ScheduleConfig(2, 1, 2, "frozen"), rank)
        for name, tensor in carved.model.state_dict().items():
            if name in reference and not name.endswith("inv_freq"):
                assert torch.equal(tensor, reference[name]), name
                seen.add(name)
    assert {n for n in reference if "layers." in n and "language_model" in n} <= seen
