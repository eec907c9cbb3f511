"""Fixtures shared by the test files."""

import os
import runpy

import pytest
import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# one thread per test worker and per process a test starts: two xdist workers share the machine's cores, and a
# launch's ranks share them again (CI's 2 cores); more threads would only contend
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The demo (``scripts/make/make_demo.py``: the tiny Qwen2.5-VL checkpoint and its conversation rows), built once
    for the whole run: tests read it and write elsewhere (about 10 s a build). Under pytest-xdist the workers
    share one build, in the run's own base folder (the first worker builds it under a file lock)."""
    from filelock import FileLock
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's, not an older run's
    out = shared / "demo"
    with FileLock(str(shared / "demo.lock")):
        if not (out / "built").is_file():
            runpy.run_path(os.path.join(ROOT, "scripts", "make", "make_demo.py"))["main"]([str(out)])
            (out / "built").touch()
    return str(out)


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
