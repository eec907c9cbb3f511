"""Fixtures shared by the test files."""

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A gloo world of this one process (the executor needs process groups)."""
    started = not dist.is_initialized()
    if started:
        store = tmp_path_factory.mktemp("world") / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    if started:
        dist.destroy_process_group()
