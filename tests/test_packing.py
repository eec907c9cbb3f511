"""Packed micro-batches: pack_micro's packed sequence and the token-budget packer (PackedPlan)."""

import math

import pytest
import torch

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.data.collate import IGNORE, TextCollator
from mpipe_hf.data.bin_packing import best_fit_decreasing
from mpipe_hf.data.packing import STALE_AFTER, PackedCollate, PackedPlan, pack_micro

TEXTS = ["Hi.", "A photo of a cat sitting on a red mat in the sun.", "Two words", "x " * 23,
         "The quick brown fox jumps over the lazy dog, twice: the quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def collate():
    return TextCollator(qwen2_tokenizer(5120), max_length=20)


def test_pack_micro_concatenates_rows_without_padding(collate):
    batch = collate([{"text": t} for t in TEXTS])
    mask = batch["attention_mask"].bool()
    assert not mask.all()  # the batch has padding to remove
    packed = pack_micro(batch)
    assert "attention_mask" not in packed
    lengths = mask.sum(1)
    assert packed["packed_lengths"].dtype == torch.int64 and packed["packed_lengths"].tolist() == lengths.tolist()
    assert packed["input_ids"].shape == (1, int(lengths.sum()))
    ids = torch.cat([batch["input_ids"][i, :n] for i, n in enumerate(lengths.tolist())])
    assert torch.equal(packed["input_ids"][0], ids)
    labels = torch.cat([torch.cat([torch.tensor([IGNORE]), batch["labels"][i, 1:n]])
                        for i, n in enumerate(lengths.tolist())])
    assert torch.equal(packed["labels"][0], labels)
    starts = torch.cumsum(lengths, 0) - lengths
    assert (packed["labels"][0, starts] == IGNORE).all()
    # the label tokens the shifted loss counts are those of the unpacked batch
    assert int((packed["labels"][..., 1:] != IGNORE).sum()) == int((batch["labels"][..., 1:] != IGNORE).sum())
    assert pack_micro(packed) is packed


def test_pack_micro_per_token_keys_and_image_tensors():
    ids = torch.arange(1, 11).reshape(2, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    types = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    grid = torch.tensor([[1, 2, 2]])
    tiles = {"pixel_values": torch.randn(2, 3, 3, 4, 4), "pixel_attention_mask": torch.ones(2, 3, 4, 4)}
    batch = {"input_ids": ids, "attention_mask": mask, "labels": ids.clone(), "mm_token_type_ids": types,
             "image_grid_thw": grid, **tiles}
    packed = pack_micro(batch)
    keep = mask.bool()
    assert torch.equal(packed["mm_token_type_ids"][0], types[keep])
    assert packed["image_grid_thw"] is grid
    assert torch.equal(packed["pixel_values"], tiles["pixel_values"].reshape(1, 6, 3, 4, 4))
    assert torch.equal(packed["pixel_attention_mask"], tiles["pixel_attention_mask"].reshape(1, 6, 4, 4))
    # LLaVA-NeXT's (images, crops, C, h, w) with images == B is per image: unchanged
    crops = torch.randn(2, 3, 3, 4, 4)
    assert pack_micro({"input_ids": ids, "attention_mask": mask, "pixel_values": crops})["pixel_values"] is crops
    # no attention_mask: every token is real
    assert pack_micro({"input_ids": ids})["packed_lengths"].tolist() == [5, 5]
    with pytest.raises(ValueError, match="labels"):
        pack_micro({"input_ids": ids, "labels": ids[:, :3]})


def test_packed_collate_null_batch(collate):
    packed = PackedCollate(collate)
    assert packed([{"text": "hello"}])["packed_lengths"].tolist() == [len(collate.tokenizer("hello").input_ids)]
    null = packed.null_batch()
    assert "packed_lengths" in null and (null["labels"] == IGNORE).all()
    assert getattr(PackedCollate(lambda rows: collate(rows)), "null_batch", None) is None
    assert packed.max_length == collate.max_length  # other attributes read through


def test_plan_loads_packed_micro_batches_and_drops_bad_rows(collate):
    rows = [{"text": t} for t in TEXTS * 3] + [{"nothing": "here"}]
    lengths = [min(len(collate.tokenizer(r["text"]).input_ids), collate.max_length) for r in rows[:-1]] + [5]
    plan = PackedPlan(rows, collate, num_micro=2, max_tokens_per_micro=40, lengths=lengths, shuffle=True, seed=3)
    for m in range(2):
        picked = plan.rows(0, m)
        batch = plan.load(0, m)
        good = [i for i in picked if i != len(rows) - 1]
        assert batch["packed_lengths"].tolist() == [lengths[i] for i in good]
        assert batch["input_ids"].shape == (1, sum(lengths[i] for i in good))
    assert plan.micro_costs(0, lengths) == [sum(lengths[i] for i in plan.rows(0, m)) for m in range(2)]
    bad = PackedPlan(rows, collate, 1, 40, lengths).load_rows([len(rows) - 1])  # every row bad: the null batch
    assert "packed_lengths" in bad and (bad["labels"] == IGNORE).all()


def lognormal_lengths(n, budget, seed=0):
    """Heavy-tailed row lengths: lognormal around 300 tokens, cut to the budget."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.exp(torch.randn(n, generator=g) * 0.9 + math.log(300))
    return raw.round().clamp(1, budget).long().tolist()


def plan_of(lengths, **kw):
    kw.setdefault("num_micro", 4)
    kw.setdefault("max_tokens_per_micro", 2048)
    return PackedPlan(list(range(len(lengths))), None, lengths=lengths, **kw)


@pytest.mark.parametrize("shuffle", [False, True])
def test_packer_places_every_row_once_within_budget(shuffle):
    lengths = lognormal_lengths(500, 2048)
    plan = plan_of(lengths, num_replicas=2, shuffle=shuffle, seed=5)
    n, steps = len(lengths), math.ceil(plan.steps_per_epoch())
    seen = []
    for k in range(steps + 3):
        for b in plan.placed(k):
            assert b and sum(lengths[r] for _, r in b) <= plan.budget
            assert [p for p, _ in b] == sorted(p for p, _ in b)  # stream order
            assert all(r == plan._row_at(p) for p, r in b)
            seen += [p for p, _ in b]
        if k == steps - 1:
            assert set(range(n)) <= set(seen)  # epoch 0 is placed by then ...
    assert len(seen) == len(set(seen))  # ... no row twice, none split
    assert sorted(plan._row_at(p) for p in range(n)) == list(range(n))
    assert steps - 1 < plan.steps_per_epoch() <= steps


def test_packer_deterministic_resumable_and_split_by_replica():
    lengths = lognormal_lengths(300, 2048, seed=1)
    costs = [x * (3.0 if i % 5 == 0 else 1.0) for i, x in enumerate(lengths)]
    kw = dict(costs=costs, num_replicas=2, shuffle=True, seed=11)
    first, second = plan_of(lengths, **kw), plan_of(lengths, **kw)
    assert [first.bins(k) for k in range(8)] == [second.bins(k) for k in range(8)]
    resumed = plan_of(lengths, **kw)
    assert resumed.bins(6) == first.bins(6)
    for k in range(4):
        parts = [plan_of(lengths, replica=r, **kw) for r in range(2)]
        assert [p.rows(k, m) for p in parts for m in range(4)] == first.bins(k)
        stats = parts[1].packing_stats(k)
        assert stats["tokens"] == [sum(lengths[i] for i in parts[1].rows(k, m)) for m in range(4)]


def reference_bfd(lengths, num_bins, budget):
    """Best-fit decreasing by a plain scan of the bins."""
    room, bins, left = [budget] * num_bins, [[] for _ in range(num_bins)], []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fits = [b for b in range(num_bins) if room[b] >= lengths[i]]
        if not fits:
            left.append(i)
            continue
        b = min(fits, key=lambda b: (room[b], b))
        bins[b].append(i)
        room[b] -= lengths[i]
    return bins, sorted(left)


def test_best_fit_decreasing_matches_a_plain_scan():
    for seed in range(5):
        lengths = lognormal_lengths(60, 1024, seed=seed)
        assert best_fit_decreasing(lengths, 5, 1024) == reference_bfd(lengths, 5, 1024)


def test_packer_fills_ragged_rows_and_leaves_none_waiting():
    lengths = lognormal_lengths(2000, 4096, seed=2)
    plan = plan_of(lengths, max_tokens_per_micro=4096)
    steps = int(plan.steps_per_epoch())
    fills = [f for k in range(steps) for f in plan.packing_stats(k)["fill"]]
    assert sum(fills) / len(fills) >= 0.9, sum(fills) / len(fills)
    # epoch 0 is placed about when as many rows as it has are: no short row is left behind for long
    rows_per_step = sum(r for k in range(steps) for r in plan.packing_stats(k)["rows"]) / steps
    assert plan.steps_per_epoch() <= len(lengths) / rows_per_step + STALE_AFTER + 2


def test_best_fit_decreasing_places_stale_items_first():
    lengths = [3, 3, 3, 9, 9, 9]  # the long ones fill both bins unless the short, stale ones go first
    assert {0, 1, 2} <= set(best_fit_decreasing(lengths, 2, 10)[1])
    bins, left = best_fit_decreasing(lengths, 2, 10, stale=3)
    assert sorted(i for b in bins for i in b)[:3] == [0, 1, 2] and left


def sequential_bins(lengths, order, num_bins, budget, steps):
    """Sequential filling: rows in stream order into a bin until the next does not fit."""
    out, at = [], 0
    for _ in range(steps):
        step = []
        for _ in range(num_bins):
            b, used = [], 0
            while used + lengths[order[at]] <= budget:
                b.append(order[at])
                used += lengths[order[at]]
                at += 1
            step.append(b)
        out.append(step)
    return out


def spread(bins, costs):
    per = [sum(costs[i] for i in b) for b in bins]
    return max(per) / min(per)


def test_packer_balances_costly_rows():
    lengths = lognormal_lengths(1500, 2048, seed=4)
    g = torch.Generator().manual_seed(4)
    images = (torch.rand(len(lengths), generator=g) < 0.3).tolist()  # a third of the rows carry a costly image
    costs = [x + (2000.0 if img else 0.0) for x, img in zip(lengths, images)]
    plan = plan_of(lengths, costs=costs)
    steps = 20
    packed = sum(spread(plan.bins(k), costs) for k in range(steps)) / steps
    naive = sum(spread(b, costs) for b in sequential_bins(lengths, list(range(len(lengths))), 4, 2048, steps))
    assert packed < naive / steps, (packed, naive / steps)
    by_length = plan_of(lengths)  # balanced by tokens only: the costly rows fall unevenly
    assert packed < sum(spread(by_length.bins(k), costs) for k in range(steps)) / steps


def test_every_micro_gets_rows_even_at_zero_cost():
    plan = plan_of([1] * 50, costs=[0.0] * 50, max_tokens_per_micro=100)
    assert all(plan.bins(0)) and sorted(r for b in plan.bins(0) for r in b) == list(range(50))  # a row once a step
    stats = plan.packing_stats(0)
    assert max(stats["rows"]) - min(stats["rows"]) <= 1  # zero costs: spread by tokens


@pytest.mark.parametrize("change, field", [
    (dict(max_tokens_per_micro=0), "data.max_tokens_per_micro"),
    (dict(lengths=[10] * 9), "lengths"),
    (dict(lengths=[10] * 9 + [0]), r"lengths\[9\]"),
    (dict(lengths=[10] * 9 + [50]), "row 9 .*data.max_tokens_per_micro"),
    (dict(costs=[1.0] * 9 + [-1.0]), r"costs\[9\]"),
    (dict(costs=[1.0] * 9 + [math.inf]), r"costs\[9\]"),
    (dict(costs=[1.0] * 3), "costs"),
    (dict(window=1), "window"),
])
def test_packer_rejects_bad_inputs(change, field):
    kw = {**dict(num_micro=2, max_tokens_per_micro=40, lengths=[10] * 10), **change}
    with pytest.raises(ValueError, match=field):
        PackedPlan(list(range(10)), None, **kw)


@pytest.mark.parametrize("data,field", [
    (dict(packing="yes"), "data.packing"), (dict(packing=True, max_tokens_per_micro=0), "data.max_tokens_per_micro"),
    (dict(max_tokens_per_micro=512), "data.max_tokens_per_micro"),
])
def test_bad_packing_keys_name_the_field(data, field):
    from mpipe_hf.train.recipe_data import DataSection
    with pytest.raises(ValueError, match=field):
        DataSection(path="rows.jsonl", **data)


def test_packed_rows_are_cut_at_the_budget_and_micro_means_are_refused(tmp_path):
    from mpipe_hf.train.recipe import parse_recipe
    from mpipe_hf.train.recipe_data import DataSection
    data = DataSection(path="rows.jsonl", packing=True, max_tokens_per_micro=512, max_length=2048)
    assert (data.row_length, data.token_budget) == (512, 512)
    assert DataSection(path="rows.jsonl", packing=True).token_budget == 2048
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    raw = {"model": str(tmp_path), "data": {"path": "rows.jsonl", "packing": True},
           "parallel": {"pp_size": 2, "num_micro": 2}, "train": {"loss_normalization": "micro"}}
    with pytest.raises(ValueError, match="train.loss_normalization"):
        parse_recipe(raw)


def test_chunked_attention_cannot_be_packed():
    from types import SimpleNamespace
    from mpipe_hf.models.decoder import check_packable
    check_packable(SimpleNamespace(layer_types=["full_attention", "linear_attention", "sliding_attention"]))
    with pytest.raises(ValueError, match="chunked_attention"):
        check_packable(SimpleNamespace(layer_types=["full_attention", "chunked_attention"]))


def test_refine_moves_cost_to_the_cheapest_bin_within_budget():
    """Costs 17 and 3 (rows 0 and 1 costly) become 10 and 10 (a swap, then a move) within 10 tokens a bin; with no
    room for any move or swap, nothing changes."""
    from mpipe_hf.data.bin_packing import refine_costs
    lengths, costs = [4, 4, 4, 4, 2], [9.0, 8.0, 1.0, 1.0, 1.0]
    bins = refine_costs([[0, 1], [2, 3, 4]], lengths, costs, budget=10)
    assert sorted(sum(costs[i] for i in b) for b in bins) == [10.0, 10.0], bins
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins), bins
    assert refine_costs([[0], [1, 2]], [6, 4, 4], [9.0, 1.0, 1.0], budget=8) == [[0], [1, 2]]
