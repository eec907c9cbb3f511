"""What a run says about itself: the start-up line names the whole layout, and the rows a run left out are counted
by their reason, at launch and while training, in the closing line."""

from types import SimpleNamespace

import pytest
import torch

from mpipe_hf.schedule.swap import SwapConfig
from mpipe_hf.train.recipe import ParallelSection, TrainSection


def _setup(parallel: ParallelSection) -> str:
    from mpipe_hf.train.report import setup_line
    recipe = SimpleNamespace(parallel=parallel, train=TrainSection(), swap=SwapConfig(), lora=None)
    weight = torch.nn.Parameter(torch.zeros(3))
    run = SimpleNamespace(cfg=parallel.schedule(), counts=[2, 2], params={"w": weight},
                          carved=SimpleNamespace(model=torch.nn.Linear(2, 2)))
    return setup_line(recipe, run, SimpleNamespace(model_type="qwen2_vl"), None, 0)


@pytest.mark.parametrize("dp_size, dp_shard, ep_size, engine", [(1, True, 1, "none"), (2, True, 2, "FSDP2"),
                                                                 (4, False, 1, "replicas")])
def test_the_setup_line_names_the_whole_layout(dp_size, dp_shard, ep_size, engine):
    """``pp_size``, ``vpp``, ``dp_size``, ``ep_size`` and the data-parallel engine, by name, on the first line."""
    line = _setup(ParallelSection(pp_size=2, vpp=2, num_micro=4, dp_size=dp_size, dp_shard=dp_shard,
                                  ep_size=ep_size))
    assert line.startswith(f"mpipe_hf: qwen2_vl pp_size=2 vpp=2 dp_size={dp_size} ep_size={ep_size} "
                           f"engine={engine} M=4 "), line
    assert " layers per stage=[2, 2]" in line, line  # what scripts/bench/bench_packing.py reads


def test_rows_left_out_are_counted_by_reason():
    """Each reason apart, at launch (over ``max_length``, over ``max_visual_tokens``, failed the data check) and
    during training (failed to load), in the closing line, the launch warning and an empty source's error; a
    row over ``max_visual_tokens`` is not called a ``max_length`` one."""
    from mpipe_hf.data.conversation import _no_rows, dropped_warning, left_out_counts
    from mpipe_hf.train.report import summary_line
    dropped = {"a.jsonl:3": "max_length=64 would cut through an image's tokens",
               "a.jsonl:4": "every assistant token lies past max_length=64",
               "a.jsonl:9": "max_visual_tokens=100: its images and videos take 180 tokens at the floors"}
    assert left_out_counts(dropped, 2, 1) == {"over max_length": 2, "over max_visual_tokens": 1,
                                              "failed the data check": 2, "failed to load": 1}
    assert left_out_counts({}) == {}
    run = SimpleNamespace(cfg=SimpleNamespace(pp_size=1), skips=SimpleNamespace(total=1, bad_rows=1))
    job = SimpleNamespace(steps=2, start_step=0, run=run, bubbles=[[0.1]] * 2, peaks=[[2 ** 20]] * 2,
                          losses=[2.0, 1.0], left_out=(dropped, 2))
    line = summary_line(job, 1.0, "out")
    assert ("(1 steps skipped; rows left out: 2 over max_length, 1 over max_visual_tokens, 2 failed the data "
            "check, 1 failed to load)") in line, line
    clean = SimpleNamespace(**{**vars(job), "left_out": ({}, 0), "run": SimpleNamespace(
        cfg=run.cfg, skips=SimpleNamespace(total=0, bad_rows=0))})
    assert "(0 steps skipped; rows left out: none)" in summary_line(clean, 1.0, "out")
    warning = dropped_warning(_Dataset("a.jsonl", dropped, 9), 64)
    assert warning.startswith("a.jsonl: dropped 3 of 12 rows (2 over max_length=64, 1 over max_visual_tokens): "), \
        warning
    text = str(_no_rows("a.jsonl", [("a.jsonl:1", "cannot read")], dropped))
    assert "(rows left out: 2 over max_length, 1 over max_visual_tokens, 1 failed the data check; the first: " \
        "a.jsonl:1: cannot read)" in text, text


class _Dataset:
    """What :func:`~mpipe_hf.data.conversation.dropped_warning` reads of a dataset: its path, the rows it dropped
    (``{where: why}``) and its length."""

    def __init__(self, path: str, dropped: dict, size: int):
        self.path, self.dropped, self.num_dropped, self.size = path, dropped, len(dropped), size

    def __len__(self):
        return self.size
