"""Small checks of the scripts a new user runs first (issue 41, item 11)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_demo_gantt_help_and_default_output(tmp_path):
    """``--help`` prints the usage (no file named ``--help``, no traceback); with no argument the picture goes to
    ``gantt.png`` in the working directory, never over the tracked ``docs/gantt.png``."""
    pytest.importorskip("matplotlib")
    script = os.path.join(ROOT, "scripts", "demo_gantt.py")
    tracked = os.path.join(ROOT, "docs", "gantt.png")
    before = os.path.getmtime(tracked)
    help_run = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, cwd=tmp_path,
                              timeout=120)
    assert help_run.returncode == 0 and "usage:" in help_run.stdout and not os.listdir(tmp_path)
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "gantt.png").stat().st_size > 0 and os.path.getmtime(tracked) == before
