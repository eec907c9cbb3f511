"""Per-row visual caps (``data.max_pixels``, ``video_max_pixels``, ``max_frames``,
``max_visual_tokens``; :mod:`mpipe_hf.data.budgets`) and the packer's budget that counts the tower's cost
(:mod:`mpipe_hf.train.plan_packing`).

- A capped row's tokens are the processor's for the resized input: every kept row of the demo's image and video
  rows, loaded under tight caps, is collated alone by the training collator, and the grids the processor returns
  give each image's and video's tokens as the row check counted them; the control collates the same rows without
  their stored resize, and the counts then differ.
- Packing by the tower's cost balances better: rows of images, videos and text, each row's real work measured as
  the FLOPs of the tiny Qwen2-VL model's own tower and decoder (``FlopCounterMode``, eager attention), packed by
  tokens alone (the packer before) and by cost within a cost budget; the spread of the micro-batches' measured
  work is compared, not a number written here.
"""

import json
import os
import random
import statistics

import datasets
import pytest
import torch

from mpipe_hf.data import build_processor, qwen2_tokenizer
from mpipe_hf.data.conversation import ConversationCollator, ConversationDataset, Source, load_sources
from mpipe_hf.data.budgets import RowCaps
from mpipe_hf.data.packing import PackedPlan
from mpipe_hf.families.qwen import tiny as qwen_tiny
from mpipe_hf.train.recipe_data import DataSection


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def processor():
    tokenizer = qwen2_tokenizer(5120)
    return build_processor(qwen_tiny.tiny_qwen2_5_vl_config(tokenizer), tokenizer, max_pixels=160 * 160)


def demo_rows(demo, tmp_path):
    """The demo's video rows and its first 24 image rows in one file, paths made absolute."""
    data, rows = os.path.join(demo, "data"), []
    for name, limit in (("video.jsonl", None), ("train.jsonl", 24)):
        for line in open(os.path.join(data, name)).read().splitlines()[:limit]:
            row = json.loads(line)
            row["images"] = [os.path.join(data, p) for p in row.get("images", [])]
            for part in (p for m in row["messages"] if isinstance(m["content"], list) for p in m["content"]):
                for key in ("video", "image"):
                    if isinstance(part.get(key), str):
                        part[key] = os.path.join(data, part[key])
            rows.append(row)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def processor_counts(batch, merge: int = 2) -> tuple[list[int], list[int]]:
    """Each image's and video's tokens as the processor made them: its grid ``t * h * w / merge**2``."""
    return tuple((batch[key].prod(-1) // merge ** 2).tolist() if key in batch else []
                 for key in ("image_grid_thw", "video_grid_thw"))


def test_capped_rows_take_the_processors_tokens_for_the_resized_input(demo, tmp_path, fresh_cache, processor):
    path = demo_rows(demo, tmp_path)
    caps = RowCaps(max_pixels=100 * 100, video_max_pixels=70 * 70, max_frames=4, max_visual_tokens=14)
    plain = load_sources([Source(path)], processor, 2048, "qwen2_5_vl", num_proc=1)
    capped = load_sources([Source(path)], processor, 2048, "qwen2_5_vl", num_proc=1, caps=caps)
    collate = ConversationCollator(processor, 2048, model_type="qwen2_5_vl")
    over, resized = {}, 0
    for i in range(len(capped)):
        meta, row = json.loads(capped.rows[i]["visual"]), capped[i]
        batch = collate([row])
        assert processor_counts(batch) == (meta["image_tokens"], meta["video_tokens"]), row["where"]
        assert batch["input_ids"].shape[1] == capped.num_tokens[i]
        assert capped.image_tokens[i] + capped.video_tokens[i] <= caps.max_visual_tokens
        for cap in meta["over"]:
            over[cap] = over.get(cap, 0) + 1
        if any(meta["resize"]):
            resized += 1
            control = processor_counts(collate([{**row, "resize": None}]))
            assert control[0] != meta["image_tokens"], "the resize must change what the processor makes"
    assert resized and set(over) == {"max_pixels", "video_max_pixels", "max_frames", "max_visual_tokens"}, over
    assert len(plain) == len(capped) + len(capped.dropped)


def test_a_row_over_the_cap_at_its_smallest_is_dropped_with_the_reason(demo, tmp_path, fresh_cache, processor):
    path = demo_rows(demo, tmp_path)
    capped = load_sources([Source(path)], processor, 2048, "qwen2_5_vl", num_proc=1,
                          caps=RowCaps(max_visual_tokens=8))
    assert capped.dropped and all("max_visual_tokens=8" in why for why in capped.dropped.values())
    assert all(i + v <= 8 for i, v in zip(capped.image_tokens, capped.video_tokens))


@pytest.mark.parametrize("change, field", [
    (dict(video_max_pixels=1000), "data.video_max_pixels"), (dict(max_frames=1), "data.max_frames"),
    (dict(max_visual_tokens=0), "data.max_visual_tokens"), (dict(max_frames=2.5), "data.max_frames"),
])
def test_caps_are_checked_naming_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        DataSection(path="rows.jsonl", **change)
    assert DataSection(path="rows.jsonl", max_frames=8, max_visual_tokens=512).caps == RowCaps(112 * 112, None, 8,
                                                                                            512)


def measured_rows(config, count: int = 256, seed: int = 0):
    """Rows of text, an image or a video of random sizes, each with its measured FLOPs on ``config``'s model (the
    tower over its grid, the decoder and head over its tokens; eager attention, so that every matmul counts)."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import Qwen2VLForConditionalGeneration
    model = Qwen2VLForConditionalGeneration._from_config(config, attn_implementation="eager").eval()
    memo = {}

    def flops(key, run):
        if key not in memo:
            with FlopCounterMode(display=False) as counter, torch.no_grad():
                run()
            memo[key] = counter.get_total_flops()
        return memo[key]

    def tower(t, h, w):
        pixels = torch.randn(t * h * w, 3 * 2 * 14 * 14)
        return flops((t, h, w), lambda: model.model.visual(pixels, grid_thw=torch.tensor([[t, h, w]])))

    def decoder(n):
        embeds = torch.randn(1, n, config.text_config.hidden_size)
        return flops(n, lambda: model.lm_head(model.model.language_model(inputs_embeds=embeds).last_hidden_state))

    rng, rows = random.Random(seed), []
    for _ in range(count):
        kind, text, side = rng.choice(["text", "image", "video", "video"]), rng.choice([32, 64, 96]), 0
        t, side = (0, 0) if kind == "text" else (1, rng.choice([8, 16, 24])) if kind == "image" else (
            rng.choice([2, 4]), rng.choice([4, 8, 16, 24, 32]))
        tokens = t * side * side // 4
        work = decoder(text + tokens) + (tower(t, side, side) if t else 0)
        meta = {"image_tokens": [tokens] if kind == "image" else [], "video_tokens": [tokens] if kind == "video"
                else [], "video_groups": [t] if kind == "video" else []}
        rows.append((text + tokens, meta, work))
    return rows


def test_packing_with_the_tower_cost_balances_better():
    from mpipe_hf.train.plan_packing import cost_budget, packing_costs
    from mpipe_hf.train.sources import packing_rows
    config = qwen_tiny.tiny_qwen2_vl_config(qwen2_tokenizer(5120), num_layers=4, vision_depth=8)  # a heavy tower
    rows = measured_rows(config)
    lengths, metas, work = zip(*rows)
    dataset = ConversationDataset(
        "measured", datasets.Dataset.from_dict({"visual": [json.dumps(m) for m in metas]}), list(lengths),
        image_tokens=[sum(m["image_tokens"]) for m in metas], video_tokens=[sum(m["video_tokens"]) for m in metas])
    budget = 4096
    data = DataSection(path="rows.jsonl", packing=True, max_tokens_per_micro=budget, max_length=budget)
    tokens, before = packing_rows(dataset, config, data)  # tokens + w * visual tokens, one token budget
    _, costs = packing_costs(dataset, config, data)  # + the tower's attention, and a cost budget

    def spread(costs, limit):
        plan = PackedPlan(dataset, list, 4, budget, tokens, costs, shuffle=True, seed=1, cost_budget=limit)
        loads = [[sum(work[r] for r in b) for b in plan.bins(step)] for step in range(10)]
        return statistics.mean(max(load) / statistics.mean(load) for load in loads)

    old, linear, new = (spread(before, None), spread(before, cost_budget(tokens, before, budget)),
                        spread(costs, cost_budget(tokens, costs, budget)))
    print(f"measured work, costliest micro-batch over the mean, over 10 steps of 4: tokens only {old:.3f}, "
          f"cost budget with linear tower cost {linear:.3f}, with the tower's attention {new:.3f}")
    assert new < linear < old
    ratios = ([c / w for c, w in zip(x, work)] for x in (before, costs))
    fit = [statistics.pstdev(r) / statistics.mean(r) for r in ratios]
    print(f"spread of cost / measured work over the rows: linear {fit[0]:.3f}, with attention {fit[1]:.3f}")
    assert fit[1] < fit[0]
