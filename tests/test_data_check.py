"""``mpipe-hf check-data`` runs the checks loading runs, and does not change a run's rows.

- A checkpoint whose image processor merges no patches (``merge_size`` 1) while its model merges 2 x 2 gives rows
  whose image-token counts differ from what the model takes: the row check passes them (it counts with the
  processor), loading drops them (the model's ``validate_micro``). ``check-data`` lists every one of them, in
  the training file and in ``data.eval_path``, with the loader's reason, and leaves them out of the clean list.
- A row whose image is truncated passes a header read and fails a decode: whether ``check-data`` (which decodes)
  ran first or not, a run reads the same rows, and each step gets the same ones.
"""

import json
import math
import os
import shutil

import datasets
import pytest
import yaml


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A ``datasets`` cache of this test's own (where :func:`mpipe_hf.data.prepare.cache_root` keeps the rows)."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def rows_of(demo, n):
    """``n`` demo rows, the text-only ones among them, with absolute image paths."""
    rows = [json.loads(line) for line in open(os.path.join(demo, "data", "train.jsonl")) if line.strip()]
    text = [r for r in rows if not r.get("images")]
    rows = [r for r in rows if r.get("images")][:n - len(text)] + text
    for row in rows:
        row["images"] = [os.path.join(demo, "data", image) for image in row.get("images", [])]
    return [rows[i] for i in (1, 0, 9, 2, 3, 10, 4, 5, 6, 7, 11, 8)[:n]] if n == 12 else rows


def write_rows(folder, rows, name):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def recipe_at(folder, model, **data):
    from mpipe_hf.train.recipe import load_recipe
    path = os.path.join(folder, "recipe.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"model": model, "data": {"path": "train.jsonl", **data},
                        "parallel": {"pp_size": 2, "num_micro": 2},
                        "train": {"output_dir": os.path.join(folder, "out")}}, f)
    return load_recipe(path)


def test_check_data_runs_the_load_time_image_token_check_on_both_splits(demo, tmp_path, fresh_cache):
    from mpipe_hf.train.data_check import check_data, format_report
    model = tmp_path / "model"
    shutil.copytree(os.path.join(demo, "model"), model)
    processor = json.loads((model / "preprocessor_config.json").read_text())
    (model / "preprocessor_config.json").write_text(json.dumps({**processor, "merge_size": 1}))
    rows = rows_of(demo, 12)
    with_images = [i for i, r in enumerate(rows) if r["images"]]
    assert 0 < len(with_images) < len(rows)  # text-only rows too: they pass
    write_rows(str(tmp_path), rows, "train.jsonl")
    write_rows(str(tmp_path), rows[:6], "eval.jsonl")
    recipe = recipe_at(str(tmp_path), str(model), eval_path="eval.jsonl")
    train, evaluation = check_data(recipe, decode=True, num_proc=1)
    for report, n in ((train, 12), (evaluation, 6)):
        expected = [f"{report.path}:{i + 1}" for i in with_images if i < n]
        assert [where for where, _ in report.bad] == expected, report.bad
        assert all(why.startswith("as loaded: image-token count") for _, why in report.bad), report.bad
        assert report.load_bad == report.counts["bad"] == len(expected)
        assert report.keep == [i for i in range(n) if i not in with_images]
        assert sum(report.counts.values()) == n
    text = format_report([train, evaluation], recipe.data.row_length)
    assert f"{len(train.bad)} of the bad rows passed the row check and failed only when collated" in text
    headers = check_data(recipe, decode=False, num_proc=1)  # --headers-only: not loaded, and it says so
    assert all(r.load_bad is None and not r.bad for r in headers)
    assert "not loaded as training loads them (--headers-only)" in format_report(headers, 2048)


def step_rows(recipe, dataset, steps=3):
    from mpipe_hf.data import MicroBatchPlan
    plan = MicroBatchPlan(dataset, list, recipe.parallel.num_micro, recipe.data.micro_batch_size,
                          shuffle=recipe.data.shuffle, seed=recipe.train.seed)
    return [[dataset.where(i) for m in range(plan.num_micro) for i in plan.rows(k, m)] for k in range(steps)]


def test_a_prior_check_data_leaves_every_steps_rows_as_they_were(demo, tmp_path, fresh_cache):
    from mpipe_hf.train.data_check import check_data, precheck
    from mpipe_hf.train.sources import load_config, load_data, load_processor
    rows = rows_of(demo, 12)
    data = open(os.path.join(demo, "data", "images", "coffee.png"), "rb").read()
    (tmp_path / "truncated.png").write_bytes(data[:len(data) // 3])
    rows.insert(2, {"messages": [{"role": "user", "content": "<image>What is it?"},
                                 {"role": "assistant", "content": "Coffee."}], "images": ["truncated.png"]})
    write_rows(str(tmp_path), rows, "train.jsonl")
    recipe = recipe_at(str(tmp_path), os.path.join(demo, "model"), micro_batch_size=2)
    config = load_config(recipe.model)
    processor = load_processor(recipe, config)
    seen = []
    for checked_first in (False, True):
        datasets.config.HF_DATASETS_CACHE = str(fresh_cache / str(checked_first))
        if checked_first:
            report = check_data(recipe, decode=True, num_proc=1)[0]
            assert report.bad and "cannot decode image" in report.bad[0][1]
        precheck(recipe)  # mpipe-hf train's, before the launch; the workers then read its cache
        dataset, _ = load_data(recipe, config, processor, quiet=True)
        seen.append(step_rows(recipe, dataset))
    assert seen[0] == seen[1], seen
    assert any(where.endswith(":3") for step in seen[0] for where in step)  # the truncated row, dropped at load


def video_rows(demo, folder):
    """The demo's video rows and 12 of its image rows, paths absolute, as ``train.jsonl`` in ``folder``."""
    data, rows = os.path.join(demo, "data"), rows_of(demo, 12)
    for line in open(os.path.join(data, "video.jsonl")).read().splitlines():
        row = json.loads(line)
        for part in (p for m in row["messages"] if isinstance(m["content"], list) for p in m["content"]):
            for key in ("video", "image"):
                if isinstance(part.get(key), str):
                    part[key] = os.path.join(data, part[key])
        rows.append(row)
    return write_rows(folder, rows, "train.jsonl")


def test_check_data_reports_the_visual_tokens_and_the_rows_over_each_cap(demo, tmp_path, fresh_cache):
    """The visual-token figures of ``check-data`` on both splits, the rows over each cap counted
    from the uncapped rows as the processor makes them (the collator's grids), not from the caps' code."""
    from PIL import Image

    from mpipe_hf.data.conversation import ConversationCollator, Source, load_sources
    from mpipe_hf.train.data_check import check_data, format_report
    from mpipe_hf.train.sources import load_config, load_processor
    video_rows(demo, str(tmp_path))
    write_rows(str(tmp_path), rows_of(demo, 6), "eval.jsonl")
    caps = dict(max_pixels=80 * 80, max_frames=4, max_visual_tokens=12)
    recipe = recipe_at(str(tmp_path), os.path.join(demo, "model"), eval_path="eval.jsonl", **caps)
    train, evaluation = check_data(recipe, decode=False, num_proc=1)
    config = load_config(recipe.model)
    processor = load_processor(recipe, config)
    plain = load_sources([Source(str(tmp_path / "train.jsonl"))], processor, 2048, config.model_type, num_proc=1)
    collate = ConversationCollator(processor, 2048, model_type=config.model_type)
    frames = [collate([plain[i]]).get("video_grid_thw") for i in range(len(plain))]
    over = {"max_frames": [i for i, g in enumerate(frames) if g is not None and bool((g[:, 0] * 2 > 4).any())],
            "max_pixels": [i for i in range(len(plain)) if any(
                math.prod(Image.open(p).size) > caps["max_pixels"] for p in plain[i]["images"])]}
    for cap, rows in over.items():
        assert rows and train.over[cap] == [plain.where(i) for i in rows], cap
    assert "max_visual_tokens" in train.over and len(train.keep) + len(train.dropped) == len(plain)
    text = format_report([train, evaluation], recipe.data.row_length, recipe.data.caps)
    visual = sum(why.startswith("max_visual_tokens=") for _, why in train.dropped)
    assert f"0 dropped over max_length=2048, {visual} dropped over max_visual_tokens, " in text, text[:2000]
    for report in (train, evaluation):
        total = [i + v for i, v in zip(report.image_tokens, report.video_tokens)]
        assert total and max(total) <= caps["max_visual_tokens"]
    assert text.count("visual tokens per row: images") == 2 and text.count("tokens  images  videos   total") == 2
    first = plain.where(over["max_frames"][0])
    assert f"over data.max_frames=4: {len(over['max_frames'])} row(s) (sampled down): {first}" in text
    assert f"over data.max_pixels=6400: {len(over['max_pixels'])} row(s)" in text
