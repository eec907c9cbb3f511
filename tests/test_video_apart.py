"""A GLM-4.xV data set that mixes image rows and video rows trains without losing rows. GLM's model finds
a video's tokens with the image tokens' mask, so it cannot take a micro-batch holding both (the load-time check
refuses one, ``validate_glm_micro``; before this, a step holding such a micro-batch was skipped whole). Its
family declares ``media_apart``, and the micro-batch planner (:class:`~mpipe_hf.data.owner.MicroBatchPlan`) and
the packer (:class:`~mpipe_hf.data.packing.PackedPlan`) keep image rows and video rows in different micro-batches
(:mod:`mpipe_hf.data.apart`). Checked through the real loader (the rows read, checked and counted by
``load_conversation_dataset``, collated by the GLM collator and checked by the split's load-time check)."""

import itertools
import json
import os
import random
import sys

import datasets
import pytest

from mpipe_hf.data import ConversationCollator, build_processor, load_conversation_dataset, qwen2_tokenizer
from mpipe_hf.data.apart import IMAGE, VIDEO, apart_blocks, keep_apart, row_kinds
from mpipe_hf.data.owner import MicroBatchPlan
from mpipe_hf.data.packing import PackedPlan
from mpipe_hf.models import get_family
from mpipe_hf.families.glm import tiny as glm_tiny
from mpipe_hf.models.generic import micro_check
from mpipe_hf.models.materialize import meta_model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))  # common.py: the numerics tests' clips, photos
from common import CAPTIONS, PHOTOS, photo, write_clips  # noqa: E402

# image (i), video (v) and text-only (t) rows, in file order
KINDS = "ivitvvtiivvtiv"


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    """``(dataset, collate, validate)``: :data:`KINDS`' rows (photos as PNG files, the numerics tests' clips)
    through ``load_conversation_dataset`` with the tiny GLM-4.1V's processor, its collator, and the split's
    load-time check (``micro_check`` of the glm4v family on the model's meta-device copy)."""
    folder = tmp_path_factory.mktemp("apart")
    clips = write_clips(str(folder / "clips"))
    with open(folder / "rows.jsonl", "w") as f:
        for j, kind in enumerate(KINDS):
            if kind == "i":
                photo(PHOTOS[j % 8], 56 + 28 * (j % 2)).save(folder / f"p{j}.png")
            part = {"i": [{"type": "image", "image": f"p{j}.png"}], "v": [dict(clips[j % 3])], "t": []}[kind]
            f.write(json.dumps({"messages": [
                {"role": "user", "content": part + [{"type": "text", "text": "What is it?" + " Briefly." * (j % 3)}]},
                {"role": "assistant", "content": [{"type": "text", "text": CAPTIONS[j % 8]}]}]}) + "\n")
    tokenizer = qwen2_tokenizer(5120)
    config = glm_tiny.tiny_glm4v_config(tokenizer)
    processor = build_processor(config, tokenizer)
    cache, datasets.config.HF_DATASETS_CACHE = datasets.config.HF_DATASETS_CACHE, str(folder / "cache")
    try:
        dataset = load_conversation_dataset(str(folder / "rows.jsonl"), processor, 2048, model_type="glm4v")
    finally:
        datasets.config.HF_DATASETS_CACHE = cache
    collate = ConversationCollator(processor, 2048, model_type="glm4v")
    return dataset, collate, micro_check(get_family("glm4v"), meta_model(config))


def _kind_sets(micros, kinds) -> list[set]:
    return [{kinds[r] for r in rows} - {None} for rows in micros]


def test_the_glm_families_declare_it():
    assert all(get_family(t).media_apart for t in ("glm4v", "glm4v_moe", "glm46v"))
    assert not any(get_family(t).media_apart for t in ("qwen2_5_vl", "qwen3_vl", "glm_ocr", "llava"))


def test_the_planner_keeps_images_and_videos_apart_and_every_row_once_an_epoch(glm):
    """Two data-parallel replicas of 2 micro-batches of 3 rows, shuffled: read in the stream's order (step,
    replica, micro), each epoch's rows come once each, no micro-batch holds both an image row and a video row,
    and every micro-batch of the first epoch and a half loads (collated, the load-time check passed, no row
    dropped). A second plan with the same seed gives the same rows (what a resume relies on); a collator without
    a model type plans as before, blocks of 3 that mix them."""
    dataset, collate, validate = glm
    n, kinds = len(dataset), row_kinds(dataset)
    assert "".join({IMAGE: "i", VIDEO: "v", None: "t"}[k] for k in kinds) == KINDS
    plans = [MicroBatchPlan(dataset, collate, 2, 3, validate, shuffle=True, seed=5, replica=r, num_replicas=2)
             for r in range(2)]
    stream = [plans[r].rows(s, m) for s in range(12) for r in range(2) for m in range(2)]
    rows = [i for micro in stream for i in micro]
    for epoch in range(3):
        assert sorted(rows[epoch * n:(epoch + 1) * n]) == list(range(n)), epoch
    assert all(len(k) <= 1 for k in _kind_sets(stream, kinds)), stream
    assert all(1 <= len(micro) <= 3 for micro in stream)
    first_epoch = list(itertools.accumulate(map(len, stream))).index(n) + 1  # micro-batches of epoch 0
    assert plans[0].steps_per_epoch() == plans[1].steps_per_epoch() == first_epoch / 4
    loaded = 0
    for s in range(int(1.5 * plans[0].steps_per_epoch()) + 1):
        for r in range(2):
            for m in range(2):
                batch = plans[r].load(s, m)
                assert batch["input_ids"].shape[0] == len(plans[r].rows(s, m))
                loaded += 1
    assert loaded >= 8 and not plans[0].take_dropped() and not plans[1].take_dropped()
    again = MicroBatchPlan(dataset, collate, 2, 3, validate, shuffle=True, seed=5, replica=1, num_replicas=2)
    assert [again.rows(s, m) for s in (7, 3, 0) for m in range(2)] == [plans[1].rows(s, m) for s in (7, 3, 0)
                                                                      for m in range(2)]
    plain = MicroBatchPlan(dataset, list, 2, 3, validate, shuffle=True, seed=5)
    assert plain.kinds is None and plain.steps_per_epoch() == n / 6
    assert any(len(k) == 2 for k in _kind_sets([plain.rows(s, m) for s in range(4) for m in range(2)], kinds))


def test_an_evaluation_keeps_images_and_videos_apart_and_reads_every_row_once(glm):
    """An evaluation's micro-batches (:meth:`MicroBatchPlan.eval_micros`, what ``mpipe-hf train``'s and
    ``MPipeTrainer``'s evaluations run): every row once, none holding both kinds, each loading with no row
    dropped; without kinds, consecutive blocks in dataset order."""
    dataset, collate, validate = glm
    kinds = row_kinds(dataset)
    plan = MicroBatchPlan(dataset, collate, 2, 3, validate, evaluation=True)
    micros = plan.eval_micros()
    assert sorted(i for m in micros for i in m) == list(range(len(dataset)))
    assert all(len(k) <= 1 for k in _kind_sets(micros, kinds)) and all(1 <= len(m) <= 3 for m in micros)
    for rows in micros:
        assert plan.load_rows(rows)["input_ids"].shape[0] == len(rows)
    assert not plan.take_dropped()
    plain = MicroBatchPlan(dataset, list, 2, 3, validate, evaluation=True).eval_micros()
    assert plain == [list(range(s, min(s + 3, len(dataset)))) for s in range(0, len(dataset), 3)]


def test_the_packer_keeps_images_and_videos_apart(glm):
    """Packed micro-batches of whole rows up to 2 rows' tokens, 3 micro-batches a step, shuffled: every stream
    position is placed once (every row once an epoch), no bin holds both an image row and a video row, each bin
    of the first steps loads (packed, the load-time check passed), and the same seed gives the same bins."""
    dataset, collate, validate = glm
    n, kinds = len(dataset), row_kinds(dataset)
    lengths = list(dataset.num_tokens)
    budget = 2 * max(lengths)

    def plan():
        return PackedPlan(dataset, collate, 3, budget, lengths, costs=[t + v for t, v in zip(
            lengths, dataset.visual_tokens)], validate=validate, shuffle=True, seed=2, window=8)
    packed = plan()
    placed = [b for s in range(12) for b in packed.placed(s)]
    assert all(len(k) <= 1 for k in _kind_sets([[r for _, r in b] for b in placed], kinds)), placed
    assert packed.kinds == kinds
    positions = sorted(p for b in placed for p, _ in b)
    assert positions[:3 * n] == list(range(3 * n))  # the first three epochs, each row once each
    assert all(sum(lengths[r] for _, r in b) <= budget for b in placed) and all(placed)
    for s in range(2):
        for m in range(3):
            assert packed.load(s, m)["packed_lengths"].tolist() == [lengths[r] for r in packed.rows(s, m)]
    assert not packed.take_dropped()
    assert plan().bins(9) == packed.bins(9)


def test_apart_blocks_partition_each_epoch():
    """Random kinds and sizes: each row in exactly one micro-batch, in stream order within it, none mixing
    images and videos, at most ``size`` rows each and at most two short ones."""
    rng = random.Random(0)
    for trial in range(300):
        n, size = rng.randint(1, 40), rng.randint(1, 6)
        kinds = [rng.choice([IMAGE, VIDEO, None]) for _ in range(n)]
        order = rng.sample(range(n), n)
        blocks = apart_blocks(order, kinds, size)
        assert sorted(i for b in blocks for i in b) == list(range(n))
        assert all(len(k) <= 1 for k in _kind_sets(blocks, kinds))
        assert all(b == sorted(b, key=order.index) for b in blocks)
        assert all(1 <= len(b) <= size for b in blocks) and sum(len(b) < size for b in blocks) <= 2


def test_keep_apart_moves_the_other_kind_and_keeps_budgets():
    """A mixed bin keeps its oldest visual row's kind; the rows moved out go to a bin that takes them within both
    budgets, else back to the buffer: no row lost or doubled, no bin emptied, none mixing."""
    rng = random.Random(1)
    for trial in range(300):
        n, num_bins, budget = rng.randint(2, 30), rng.randint(1, 5), 100
        kinds = [rng.choice([IMAGE, VIDEO, None]) for _ in range(n)]
        lengths = [rng.randint(1, 60) for _ in range(n)]
        costs = [x * rng.uniform(1, 3) for x in lengths]
        bins, left = [[] for _ in range(num_bins)], []
        for i in range(n):  # a packing within budgets that mixes kinds
            fits = [b for b in bins if sum(lengths[j] for j in b) + lengths[i] <= budget]
            (rng.choice(fits) if fits else left).append(i)
        cap = max(sum(costs[j] for j in b) for b in bins) + 1
        out, rest = keep_apart([list(b) for b in bins], left, kinds, lengths, costs, budget, cap)
        assert sorted([i for b in out for i in b] + rest) == list(range(n))
        assert all(len(k) <= 1 for k in _kind_sets(out, kinds))
        assert all(b for a, b in zip(bins, out) if a) and rest == sorted(rest)  # no bin emptied
        assert all(sum(lengths[j] for j in b) <= budget and sum(costs[j] for j in b) <= cap + 1e-6 for b in out)
        oldest = [min((i for i in b if kinds[i]), default=None) for b in bins]
        assert all(i is None or i in b for i, b in zip(oldest, out))  # each bin's oldest visual row stays
