"""Video rows end to end for Qwen2-VL / Qwen2.5-VL (docs/video.md): the loader keeps each row's videos
and counts their tokens from the headers, the owners' costs count them, families that take no video refuse it at
load and in the split, the split's load-time check counts the video tokens, a step of video micro-batches reads
nothing back per micro on an emulated device, and the video demo recipe trains as the unsplit model does on one
process. Exactness against one process over the pipeline schedules: tests/test_freeze.py's launch
(``dist/specs_video.py``)."""

import json
import os

import pytest
import torch

from mpipe_hf.data import ConversationCollator, build_processor, qwen2_tokenizer
from mpipe_hf.data.conversation_rows import canonical_row
from mpipe_hf.data.hub import load_checkpoint_processor
from mpipe_hf.families.qwen import tiny as qwen_tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


@pytest.fixture(scope="module")
def data(demo):
    return os.path.join(demo, "data")


def test_the_loader_reads_video_rows_and_counts_them_from_the_headers(demo, data):
    """``load_conversation_dataset`` keeps each row's videos as references (``dataset[i]["videos"]``, decoded by
    the collator only) and counts their tokens from the headers: the collated micro-batch holds exactly as many
    ``<|video_pad|>`` and ``<|image_pad|>`` tokens per row, and the owners' cost of a row is both together."""
    from mpipe_hf.data import load_conversation_dataset
    from mpipe_hf.data.owner import MicroBatchPlan
    from transformers import AutoConfig
    from mpipe_hf.train.sources import owner_costs
    processor = load_checkpoint_processor(os.path.join(demo, "model"))
    dataset = load_conversation_dataset(os.path.join(data, "video.jsonl"), processor, 2048)
    rows = [canonical_row(json.loads(line), data, "r") for line in open(os.path.join(data, "video.jsonl"))]
    assert len(dataset) == 6 and [dataset[i]["videos"] for i in range(6)] == [r["videos"] for r in rows]
    batch = ConversationCollator(processor, 2048)([dataset[i] for i in range(6)])
    for kind, counts in (("video", dataset.video_tokens), ("image", dataset.image_tokens)):
        token = getattr(processor, f"{kind}_token_id")
        assert (batch["input_ids"] == token).sum(1).tolist() == counts, kind
    assert sum(dataset.video_tokens) > 0 and sum(dataset.image_tokens) > 0
    costs = owner_costs(dataset, AutoConfig.from_pretrained(os.path.join(demo, "model")))
    assert costs == [i + v for i, v in zip(dataset.image_tokens, dataset.video_tokens)]
    plan = MicroBatchPlan(dataset, None, 3, 2)
    assert plan.micro_costs(0, costs) == [int(((batch["input_ids"][2 * m:2 * m + 2] == processor.video_token_id)
                                              | (batch["input_ids"][2 * m:2 * m + 2] == processor.image_token_id))
                                             .sum()) for m in range(3)]


def test_a_family_without_videos_refuses_them_at_load_and_in_the_split(data, tokenizer, tmp_path):
    """InternVL (and every family that declares no ``video_inputs``) refuses a video: the loader reports the row,
    naming it, and the split's load-time check refuses ``pixel_values_videos`` naming the model type, rather than
    train the video's placeholder tokens as text."""
    from mpipe_hf.data import load_conversation_dataset
    from mpipe_hf.models import get_family
    from mpipe_hf.models.generic import micro_check
    from mpipe_hf.families.llava.tiny import tiny_llava_next_config
    from mpipe_hf.families.internvl.tiny import tiny_internvl_config
    from mpipe_hf.models.materialize import meta_model
    internvl = build_processor(tiny_internvl_config(tokenizer), tokenizer)
    with pytest.raises(ValueError, match="video.jsonl:1: the row has 1 video\\(s\\) but .* takes no videos"):
        load_conversation_dataset(os.path.join(data, "video.jsonl"), internvl, 2048)
    micro = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "pixel_values_videos": torch.zeros(4, 8)}
    for config in (tiny_internvl_config(tokenizer),
                   tiny_llava_next_config(tokenizer)):
        check = micro_check(get_family(config.model_type), meta_model(config))
        with pytest.raises(ValueError, match=f"{config.model_type}: video inputs .* are not supported"):
            check(micro)


def test_a_micro_batch_whose_video_tokens_do_not_match_is_refused_at_load(demo, data, tokenizer):
    """Qwen2.5-VL's load-time check counts the video tokens from ``video_grid_thw``, as it counts the image tokens
    from ``image_grid_thw``: one video token fewer in ``input_ids`` is refused before the step."""
    from mpipe_hf.models import get_family
    from mpipe_hf.models.generic import micro_check
    from mpipe_hf.models.materialize import meta_model
    config = qwen_tiny.tiny_qwen2_5_vl_config(tokenizer)
    processor = build_processor(config, tokenizer)
    row = canonical_row(json.loads(open(os.path.join(data, "video.jsonl")).readline()), data, "video.jsonl:1")
    micro = ConversationCollator(processor, None)([row])
    check = micro_check(get_family(config.model_type), meta_model(config))
    check(micro)
    ids = micro["input_ids"].clone()
    ids[tuple((ids == processor.video_token_id).nonzero()[0])] = 0
    with pytest.raises(ValueError, match="video-token count"):
        check({**micro, "input_ids": ids})


def test_the_video_demo_recipe_trains_like_one_process(demo, tmp_path):
    """``recipes/qwen2_5_vl_video_demo.yaml`` (the demo's video rows, a frozen ViT with its merger trained,
    load-aware owners) through ``mpipe-hf train`` for 2 steps, with no torchvision installed: the losses and the
    gradient norms equal those of the unsplit model trained on one process with the same parameters frozen."""
    import importlib.util
    import subprocess
    import sys
    import yaml
    from train_common import EPS, set_keys, train_unsplit
    from mpipe_hf.data.owner import MicroBatchPlan
    from mpipe_hf.models import get_family
    from mpipe_hf.models.freeze import apply_trainable
    from mpipe_hf.train import load_recipe
    from mpipe_hf.train.sources import load_config, load_data, load_model, load_processor
    assert importlib.util.find_spec("torchvision") is None
    os.symlink(demo, tmp_path / "demo")  # the recipe names ../demo/... relative to its folder, recipes/
    raw = yaml.safe_load(open(os.path.join(ROOT, "recipes", "qwen2_5_vl_video_demo.yaml")))
    set_keys(raw, max_steps=2, adam_epsilon=EPS, output_dir=str(tmp_path / "out"), timeout_s=120)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "video.yaml").write_text(yaml.safe_dump(raw))
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train", "recipes/video.yaml"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:  # the reference while the pipeline runs
        recipe = load_recipe("recipes/video.yaml")
        config = load_config(recipe.model)
        model = load_model(recipe.model, config, recipe.train.seed)
        apply_trainable(model, get_family(config.model_type), recipe.train.trainable_spec())
        dataset, collate = load_data(recipe, config, load_processor(recipe, config), quiet=True)
        plan = MicroBatchPlan(dataset, collate, recipe.parallel.num_micro, recipe.data.micro_batch_size, None,
                              recipe.data.shuffle, recipe.train.seed)
        losses, norms, micros = train_unsplit(model, plan, recipe.parallel.num_micro, 2, recipe.train)
    finally:
        os.chdir(cwd)
        _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-5000:]
    assert any("pixel_values_videos" in mb for mb in micros)
    rows = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
    assert len(rows) == 2 and all(abs(r["loss"] - ref) < 1e-4 for r, ref in zip(rows, losses)), (rows, losses)
    assert all(abs(r["grad_norm"] - n) < 1e-4 * n for r, n in zip(rows, norms)), (rows, norms)


@pytest.mark.parametrize("preprocess", ["trainable", "identity", "frozen"])
def test_a_video_step_reads_nothing_back_per_micro(world, tmp_path, preprocess):
    """On an emulated device in strict device mode (``tests/test_device_ready.py``'s), steps of micro-batches
    mixing images and videos: the video grids, the tower's video metadata and the M-RoPE positions with the
    videos' ``second_per_grid_ts`` are computed on the host at load, so the same few syncs for 2 and 3
    micro-batches (none per micro), with ``P`` trained, frozen, or in stage 0."""
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
    from common import VOCAB_RANKS, collator, make_video_pool, tiny_configs, write_clips
    from device_model import syncs_per_step
    from transformers import AutoModelForImageTextToText
    words = qwen2_tokenizer(VOCAB_RANKS)
    config = tiny_configs(words, ["vl"])["vl"]
    pool = make_video_pool(collator(config, words), write_clips(str(tmp_path / "clips")))
    torch.manual_seed(0)
    # micro m: pool[m + 3]: two videos; a video and an image; no video
    counts = syncs_per_step(AutoModelForImageTextToText.from_config(config), preprocess, pool, world, offset=3)
    assert sum(counts[3].values()) == sum(counts[2].values()), f"per micro: {counts[3] - counts[2]}"
    assert sum(counts[2].values()) <= 2, counts[2]
