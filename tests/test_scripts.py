"""Small checks of the scripts a new user runs first."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_demo_gantt_help_and_default_output(tmp_path):
    """``--help`` prints the usage (no file named ``--help``, no traceback); with no argument the picture goes to
    ``gantt.png`` in the working directory, never over the tracked ``docs/gantt.png``."""
    pytest.importorskip("matplotlib")
    script = os.path.join(ROOT, "scripts", "report", "demo_gantt.py")
    tracked = os.path.join(ROOT, "docs", "gantt.png")
    before = os.path.getmtime(tracked)
    help_run = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, cwd=tmp_path,
                              timeout=120)
    assert help_run.returncode == 0 and "usage:" in help_run.stdout and not os.listdir(tmp_path)
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "gantt.png").stat().st_size > 0 and os.path.getmtime(tracked) == before


@pytest.mark.skipif(os.environ.get("MPIPE_HF_FULL") != "1", reason="about 60 s: the full suite (MPIPE_HF_FULL=1)")
def test_bench_compute_runs_its_schedules_at_tiny_size(tmp_path):
    """``scripts/bench/bench_compute.py --tiny --skip-packing``: MPipe and torch's schedules over real
    Qwen2.5-VL layers on 2 gloo ranks, at hidden 64 and one step a row; every row runs and the report names the
    best rows and the goal of each tower mode."""
    script = os.path.join(ROOT, "scripts", "bench", "bench_compute.py")
    run = subprocess.run([sys.executable, script, "--tiny", "--skip-packing", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "failed" not in run.stdout, run.stdout[-3000:]
    for mode in ("frozen", "trainable"):
        assert f"### {mode} tower" in run.stdout
    summaries = [line for line in run.stdout.splitlines() if line.startswith("best torch ")]
    assert len(summaries) == 2 and all("; goal " in line for line in summaries), run.stdout[-3000:]
