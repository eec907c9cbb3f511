"""scripts/check/gpu_check.py on the CPU: one table with every row; the rows that can run on a CPU pass (the
wire loopback, the split against the unsplit model, FSDP2 on a one-rank mesh, bf16 saved bytes, swap), the
sync-debug rows run their step and say n/a, the CUDA-only rows say n/a; and a row broken on purpose
(``--break``) makes the exit status non-zero and is named. The CUDA paths themselves run only where there is a GPU
(docs/gpus.md)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "check", "gpu_check.py")
TINY = ["--device", "cpu", "--hidden", "64", "--layers", "2", "--vocab", "256", "--tokens", "16", "--micro", "2",
        "--steps", "2"]
ROWS = ["sync-debug qwen2.5-vl identity", "sync-debug qwen2.5-vl frozen", "sync-debug qwen2.5-vl trainable",
        "sync-debug qwen3-vl frozen", "sync-debug qwen3.5 unpadded", "sync-debug qwen2.5-vl packed",
        "sync-debug flash_attention_2", "wire loopback to stage 0", "split vs unsplit (deterministic)",
        "fsdp2 one-rank bf16 lora", "fsdp2 one-rank bf16 lora own autocast", "bf16 saved bytes per micro",
        "max_memory_allocated vs plan", "swap overlap", "step timing (CUDA events)", "host syncs per step",
        "host syncs per action", "moe experts bf16 grouped gemm", "nccl eager init"]
ON_CPU = ["wire loopback to stage 0", "split vs unsplit (deterministic)", "fsdp2 one-rank bf16 lora",
          "fsdp2 one-rank bf16 lora own autocast", "bf16 saved bytes per micro", "swap overlap",
          "moe experts bf16 grouped gemm"]


def run(tmp_path, *extra):
    """The script on the CPU with the tiny sizes: ``(process, rows by name)``."""
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, SCRIPT, *TINY, "--json", str(out), *extra], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    rows = {r["check"]: r for r in json.loads(out.read_text())["rows"]} if out.exists() else {}
    return done, rows


def test_gpu_check_prints_every_row_on_cpu(tmp_path):
    done, rows = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(rows) == ROWS
    for check, row in rows.items():  # one table, every row in it
        assert any(line.startswith(check) and row["result"] in line for line in done.stdout.splitlines()), check
    for check in ON_CPU:
        assert rows[check]["result"] == "PASS", rows[check]
    for check in set(ROWS) - set(ON_CPU):
        assert rows[check]["result"] == "n/a" and "n/a on cpu" in rows[check]["figures"], rows[check]
    for check in ROWS[:6]:  # the sync-debug cases built and ran their step on the CPU
        assert "the step ran: loss" in rows[check]["figures"], rows[check]
    bf16 = rows["bf16 saved bytes per micro"]["values"]
    assert 0 < bf16["bf16_saved_per_micro"] <= bf16["fp32_saved_per_micro"] < bf16["weight_bytes"], bf16
    assert rows["swap overlap"]["values"]["offloaded_bytes"] > 0
    assert rows["max_memory_allocated vs plan"]["values"]["plan_bytes"] > 3 * bf16["weight_bytes"]
    assert rows["split vs unsplit (deterministic)"]["values"]["max_grad_diff"] <= 1e-5
    assert rows["fsdp2 one-rank bf16 lora"]["values"]["sharded"] > 0
    own = rows["fsdp2 one-rank bf16 lora own autocast"]["values"]  # the executor chose a region per stage call
    assert own["sharded"] > 0 and own["step_autocast"] == "None", own
    moe = rows["moe experts bf16 grouped gemm"]["values"]  # the bf16 GEMM's operands, within bf16 of fp32
    assert moe["dtypes"] == ["torch.bfloat16/torch.bfloat16"] and 0 < moe["rel_diff"] < 2 ** -6, moe
    assert set(moe["per_token_s"]) == {"bf16", "fp32", "dense"}, moe
    wire = rows["wire loopback to stage 0"]["values"]
    assert wire["bytes_sent"] > 0 and all(got == plain for got, plain in wire["losses"].values()), wire


def test_a_broken_row_fails_the_run_and_is_named(tmp_path):
    check = "split vs unsplit (deterministic)"
    done, rows = run(tmp_path, "--only", "split vs unsplit", "--only", "wire", "--break", check)
    assert done.returncode == 1, done.stdout + done.stderr
    assert rows[check]["result"] == "FAIL" and "max diff 1.00e-03" in rows[check]["figures"], rows[check]
    assert rows["wire loopback to stage 0"]["result"] == "PASS"  # the rows after a failed one still run
    assert f"FAILED: {check}" in done.stdout
    assert rows["swap overlap"]["figures"] == "skipped (--only)"


def test_a_row_past_its_time_limit_fails_and_a_stuck_one_ends_the_run():
    """A row that runs past ``--row-timeout`` raises ``TimeoutError`` in the row (it FAILs, the rows after it
    run); one stuck where the signal cannot reach it (here: the signal blocked) ends the process a grace period
    later, printing the rows so far and its FAIL, with exit status 1."""
    import time
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import gpu_check
    start = time.perf_counter()
    try:
        with gpu_check.time_limit("slow", 0.2, []):
            time.sleep(20)
    except TimeoutError as err:
        assert "--row-timeout" in str(err) and time.perf_counter() - start < 5
    else:
        raise AssertionError("the row ran past its limit")
    stuck = ("import signal, sys, time; sys.path.insert(0, sys.argv[1]); import gpu_check; "
             "from gpu_check_rows.common import Row\n"
             "with gpu_check.time_limit('stuck', 0.2, [Row('earlier', 'PASS', 'fine')], grace=0.5):\n"
             "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM}); time.sleep(60)")
    done = subprocess.run([sys.executable, "-c", stuck, os.path.dirname(SCRIPT)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("earlier") for line in lines) and any(
        line.startswith("stuck") and "FAIL" in line and "the process ends" in line for line in lines), done.stdout
