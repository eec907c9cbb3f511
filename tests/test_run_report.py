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
    assert " layers per stage=[2, 2]" in line, line  # what scripts/bench_packing.py reads
