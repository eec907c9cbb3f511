"""Fixtures shared by the test files."""

import os
import runpy

import pytest
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The demo (``scripts/make_demo.py``: the tiny Qwen2.5-VL checkpoint and its conversation rows), built once
    for the whole session: tests read it and write elsewhere (about 10 s a build)."""
    out = str(tmp_path_factory.mktemp("demo"))
    runpy.run_path(os.path.join(ROOT, "scripts", "make_demo.py"))["main"]([out])
    return out


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
