"""Every script that README.md, BENCHMARKS.md or docs/ cite runs with tiny arguments (the full suite:
``MPIPE_HF_FULL=1``; minutes each): exit status 0, no traceback, a report printed. A cited script is either run
here (:data:`SMOKE`) or named in :data:`RUN_ELSEWHERE` with the test that runs it or why it cannot run on this
machine; ``tests/test_scripts_start.py`` checks in CI that every cited script is one or the other."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

# script: (arguments, with {demo} the built demo, {recipe} the demo's recipe (recipes/qwen2_5_vl_demo.yaml beside
# a link to the demo, as at the repository root) and {tmp} a fresh folder; seconds allowed)
SMOKE = {
    "bench/bench_runtime.py": (["--steps", "1", "--repeats", "1", "--rounds", "2"], 600),
    "bench/bench_owners.py": (["--steps", "1", "--micro", "4", "--pattern", "ragged", "--tower", "frozen"], 600),
    "bench/bench_schedules.py": (["--smoke", "--steps", "1"], 900),
    "bench/bench_data_start.py": (["--rows", "8", "--demo", "{demo}", "--num-proc", "1"], 900),
    "bench/bench_lora.py": (["--demo", "{demo}", "--steps", "2", "--repeats", "1"], 900),
    "bench/bench_swap.py": (["--demo", "{demo}", "--steps", "2", "--repeats", "1"], 900),
    "bench/bench_data_parallel.py": (["--demo", "{demo}", "--steps", "2"], 900),
    "bench/bench_load.py": (["--checkpoint", "{demo}/model", "--pp", "2"], 900),
    "report/demo_reply.py": (["--before", "{demo}/model", "--after", "{demo}/model"], 300),
    "bench/device_ready_figures.py": ([], 600),
    "bench/sim_at_scale.py": (["--models", "7b", "--gpus", "8", "--pp", "2"], 300),
    "bench/sim_mimo.py": (["--smoke", "--micro", "8", "--out", "{tmp}"], 300),
    "bench/sim_mimo_calibrate.py": (["--micro", "4"], 300),
    "bench/bench_checkpointing.py": (["{recipe}", "--micros", "1"], 600),
    "check/video_stock_check.py": (["tokenizer", "{tmp}"], 300),
    "make/make_long_video.py": (["{tmp}", "--frames", "2", "--size", "56", "--rows", "1"], 120),
    "bench/context_parallel_memory.py": (["--demo", "{demo}", "--frames", "4", "--size", "112", "--cps", "1,2",
                                          "--steps", "1"], 900),
}
# script: the test that runs it, or why it is not run with tiny arguments here
RUN_ELSEWHERE = {
    "bench/bench_compute.py": "tests/test_scripts.py::test_bench_compute_runs_its_schedules_at_tiny_size",
    "bench/bench_compute_stages.py": "a module of bench_compute.py's (no __main__), run by its test",
    "bench/bench_schedules_mimo.py": ("a module of bench_schedules.py's (no __main__): its MIMO-style rows, in "
                                      "its smoke run"),
    "report/demo_gantt.py": "tests/test_scripts.py::test_demo_gantt_help_and_default_output",
    "check/fault_suite.py": "tests/test_faults.py (its cases, through the script's own functions)",
    "check/gpu_check.py": "tests/test_gpu_check.py::test_gpu_check_prints_every_row_on_cpu",
    "make/make_1b.py": "tests/test_load.py (its main, --zeros)",
    "make/make_demo.py": "tests/conftest.py's demo fixture (its main, which runs the next two)",
    "make/make_demo_data.py": "tests/conftest.py's demo fixture, through make_demo.py",
    "make/make_demo_videos.py": "tests/conftest.py's demo fixture, through make_demo.py",
    "make/make_tiny_models.py": "tests/test_tiny_models.py (its main, --only)",
    "report/model_table.py": "tests/test_model_table.py (its main, --check)",
    "check/grad_matrix.py": "its cases run in tests/test_numerics.py's launches; the script's grids take hours",
    "make/make_presets.py": "writes the tracked recipes/presets (and nothing else): no tiny form",
    "bench/bench_memory.py": "trains the demo recipe four times over 4 ranks (tens of minutes on 2 cores)",
    "bench/bench_packing.py": ("its --quick run trains over 2 ranks twice (tests/test_run_report.py checks "
                               "what it reads)"),
    "check/record_stock_processors.py": ("needs torchvision and timm (the second environment); "
                                         "tests/test_stock_recorded.py compares with what it recorded"),
    "check/check_timm_families.py": "needs timm and torchvision (the second environment)",
    "check/context_parallel_trainer.py": ("trains the demo through mpipe-hf train at cp_size 1 and 2 (minutes); the cp "
                                          "cases run in tests/test_numerics.py's R = 4 launch"),
    "check/context_parallel_experts_trainer.py": ("trains the demo Qwen3-VL-MoE through mpipe-hf train at cp 1 and at "
                                                  "cp 2 x ep 2 (minutes); tests/test_ep.py runs cp 2 x ep 2 in its "
                                                  "4-process launch"),
    "bench/bench_schedules_cp.py": ("a module of bench_schedules.py's (no __main__): its --cp rows, about a minute "
                                    "on 4 processes, run for BENCHMARKS.md (the smoke run takes --smoke)"),
    "check/resume_across_cp.py": ("trains the demo 8 times at cp_size 1 and 2 (about 10 minutes); "
                                  "tests/test_resume.py resumes a cp 1 checkpoint at cp 2"),
    "check/train_tiny_recipes.py": ("trains every tiny recipe (hours); tests/test_tiny_models.py trains one "
                                    "of each group"),
}


@pytest.mark.skipif(os.environ.get("MPIPE_HF_FULL") != "1", reason="minutes each: the full suite (MPIPE_HF_FULL=1)")
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_cited_script_runs_with_tiny_arguments(script, demo, tmp_path):
    args, timeout = SMOKE[script]
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "recipes").mkdir()
    os.symlink(demo, tmp_path / "demo")
    recipe = shutil.copy(os.path.join(ROOT, "recipes", "qwen2_5_vl_demo.yaml"), tmp_path / "recipes")
    argv = [a.format(demo=demo, tmp=out, recipe=recipe) for a in args]
    run = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script), *argv], capture_output=True,
                         text=True, cwd=tmp_path, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-5000:])
    assert "Traceback" not in run.stdout + run.stderr, run.stderr[-5000:]
    assert run.stdout.strip() or any(out.iterdir()), "printed and wrote nothing"
    shutil.rmtree(out, ignore_errors=True)
