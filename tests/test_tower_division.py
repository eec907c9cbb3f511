"""The vision tower divided over a context-parallel group by images and frames, in one process: each CP rank's
share of a micro-batch (images whole, videos by temporal patch) is smaller than the whole, the shares cover every
item once, and the Qwen-VL towers run on the shares give, put in the micro-batch's order, the rows of the whole
tower (so a video cut between temporal patches is exact: each attends within itself, Qwen2.5-VL's windows too).
The distributed gather and its backward are checked through the pipeline (tests/dist/specs_context_parallel.py's
TOWER_CASES)."""

import pytest
import torch

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.families.qwen import tiny as qwen_tiny
from mpipe_hf.models import split as split_model
from mpipe_hf.models.host_metadata import tower_metadata
from mpipe_hf.models.tower_division import TowerItem, _columns, share_of
from mpipe_hf.schedule import ScheduleConfig

CP = 2
# images (1, 8, 8) and (1, 4, 8); a video of 3 temporal patches of 12 x 8 (Qwen2.5-VL: several windows a frame)
# and one of 2 of 4 x 4
IMAGES, VIDEOS = [[1, 8, 8], [1, 4, 8]], [[3, 12, 8], [2, 4, 4]]


def test_the_shares_cover_every_item_once_and_a_rank_without_items_still_counts():
    items = [TowerItem("image", 0, (0, 1), 64, 16), TowerItem("video", 0, (0, 1), 32, 8),
             TowerItem("video", 0, (1, 2), 32, 8)]
    shares = [share_of(items, CP, r) for r in range(CP)]
    assert shares[0].counts == shares[1].counts and sum(shares[0].counts) == 32
    assert sorted((i for s in shares for i in s.mine), key=repr) == sorted(items, key=repr)
    rows = sorted(p for pieces in shares[0].pieces.values() for p in pieces)
    assert rows == [(0, 16), (16, 8), (24, 8)]  # rank 0: the image; rank 1: both temporal patches
    lone = [share_of(items[:1], CP, r) for r in range(CP)]
    assert lone[1].mine == () and lone[1].counts == (16, 0)


def _tower(config):
    model_class = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
                   "qwen3_vl": "Qwen3VLForConditionalGeneration"}[config.model_type]
    import transformers
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    return model, split_model(model, ScheduleConfig(1, 1, 1, "trainable"), 0).preprocess.module


@pytest.mark.parametrize("make", [qwen_tiny.tiny_qwen2_vl_config, qwen_tiny.tiny_qwen2_5_vl_config,
                                  qwen_tiny.tiny_qwen3_vl_config], ids=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_each_rank_runs_fewer_patches_and_the_shares_give_the_whole_towers_rows(make):
    model, tower = _tower(make(qwen2_tokenizer(5120), num_layers=1))
    visual = model.model.visual
    dim = visual.config.in_channels * visual.config.temporal_patch_size * visual.config.patch_size ** 2
    gen = torch.Generator().manual_seed(0)
    grids = {"image_grid_thw": torch.tensor(IMAGES), "video_grid_thw": torch.tensor(VIDEOS)}
    raw = {"pixel_values": torch.randn(int(grids["image_grid_thw"].prod(-1).sum()), dim, generator=gen),
           "pixel_values_videos": torch.randn(int(grids["video_grid_thw"].prod(-1).sum()), dim, generator=gen),
           **grids}
    division = tower.division
    whole_in = {**raw, **tower_metadata(visual, raw)}
    with torch.no_grad():
        whole = {"image": _columns(tower.images(whole_in)), "video": _columns(tower.videos(whole_in))}
        items = division.items(raw)
        patches = sum(item.cost for item in items)
        gathered, videos = [], []
        for rank in range(CP):
            share = share_of(items, CP, rank)
            local = {**raw, **division.host_inputs(raw, share.mine)}
            local.update(division.call_inputs(local, share.mine))
            mine = sum(item.cost for item in share.mine)
            assert 0 < mine < patches  # this rank runs part of the tower's work, not all of it
            assert local["pixel_values"].shape[0] + local["pixel_values_videos"].shape[0] == mine
            kinds = {item.kind for item in share.mine}  # a kind this rank has no item of: no rows (no call)
            gathered += [_columns(run(local)) if kind in kinds else rows_of.new_zeros(0, rows_of.shape[1])
                         for kind, run, rows_of in (("image", tower.images, whole["image"]),
                                                    ("video", tower.videos, whole["video"]))]
            videos.append(gathered[-1])
        rows = torch.cat(gathered)
        assert rows.shape[0] == sum(share.counts)
        for kind, pieces in share.pieces.items():
            ordered = torch.cat([rows.narrow(0, first, n) for first, n in pieces])
            torch.testing.assert_close(ordered, whole[kind], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="this CP rank's share"):  # the whole micro-batch's pixels: refused
        division.call_inputs(raw, share.mine)
    # the check has teeth: the videos' rows in rank order, not put back in the micro-batch's, differ from the whole's
    assert (torch.cat(videos) - whole["video"]).abs().max() > 1e-2


def test_only_declared_towers_are_divided_and_the_others_say_why():
    """Qwen2.5-VL's transposed tower is divided (its host also computes the share at load); GLM-4.1V's (the Qwen
    presets, no tower_division declared) and an identity preprocess (the tower in stage 0) run whole, by name."""
    from transformers import Glm4vForConditionalGeneration, Qwen2_5_VLForConditionalGeneration
    from mpipe_hf.families.glm import tiny as glm_tiny
    from mpipe_hf.models.tower_division import divide_towers
    tokenizer = qwen2_tokenizer(5120)
    qwen = Qwen2_5_VLForConditionalGeneration(qwen_tiny.tiny_qwen2_5_vl_config(tokenizer, num_layers=1))
    glm = Glm4vForConditionalGeneration(glm_tiny.tiny_glm4v_config(tokenizer, num_layers=1))
    pre = split_model(qwen, ScheduleConfig(1, 1, 1, "frozen"), 0).preprocess
    host = pre.host
    assert divide_towers(pre, None) == "divided" and pre.host is not host and pre.module.tower is not None
    pre = split_model(glm, ScheduleConfig(1, 1, 1, "frozen"), 0).preprocess
    assert divide_towers(pre, None) == "whole: glm4v declares no tower_division" and pre.module.tower is None
    pre = split_model(qwen, ScheduleConfig(1, 1, 1, "identity"), 0).preprocess
    assert divide_towers(pre, None).startswith("whole: preprocess identity")
