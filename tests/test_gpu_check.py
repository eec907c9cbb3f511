"""scripts/gpu_check.py on the CPU: the table has every row, the rows that measure on a CPU pass, and the CUDA-only
rows say so (the CUDA paths themselves run only where there is a GPU; docs/gpus.md)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--hidden", "64", "--layers", "2", "--vocab", "256", "--tokens", "16", "--micro", "2", "--steps", "2"]


def test_gpu_check_prints_every_row_on_cpu(tmp_path):
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py"), "--device", "cpu",
                           "--json", str(out), *TINY], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["check"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["bf16 saved bytes per micro", "swap overlap", "step timing (CUDA events)",
                          "max_memory_allocated vs plan", "host syncs per step", "host syncs per action"]
    for check, row in rows.items():  # one table, every row in it
        assert any(line.startswith(check) and row["result"] in line for line in done.stdout.splitlines()), check
    assert rows["bf16 saved bytes per micro"]["result"] == "PASS", rows["bf16 saved bytes per micro"]
    bf16 = rows["bf16 saved bytes per micro"]["values"]
    assert 0 < bf16["bf16_saved_per_micro"] <= bf16["fp32_saved_per_micro"] < bf16["weight_bytes"], bf16
    assert rows["swap overlap"]["result"] == "PASS" and rows["swap overlap"]["values"]["offloaded_bytes"] > 0
    assert rows["max_memory_allocated vs plan"]["values"]["plan_bytes"] > 3 * bf16["weight_bytes"]
    for check in ("step timing (CUDA events)", "host syncs per step", "host syncs per action"):
        assert (rows[check]["result"], rows[check]["figures"]) == ("n/a", "n/a on cpu"), rows[check]
