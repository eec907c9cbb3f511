"""The CI subset of the fault suite (``scripts/check/fault_suite.py``): real runs of the demo model broken
on purpose, each checked against an uninterrupted run, bit for bit (``restart``, ``preempt`` and
``preempt-in-save`` with ``MPIPE_HF_FULL=1``).

- ``restart``: rank 1 SIGKILLed in the middle of a step under ``--max-restarts 1`` with placement ``fill``:
  torchrun restarts the group, which resumes by itself, exactly (on NCCL every mid-step failure ends the run
  this way);
- ``preempt``: SIGTERM to ``mpipe-hf train`` in the middle of step 4: every rank finishes the step, the run
  saves ``checkpoint-4``, exits 0 with one line naming it, and ``resume: auto`` continues exactly;
- ``preempt-in-save``: SIGTERM to the torchrun agent while ``checkpoint-4`` is being written: the save finishes,
  the run stops there with no second save, and the resume is exact;
- ``nan``: a NaN in the last stage's loss skips that step on every rank, with no optimizer step;
- ``disk-full``: one rank's checkpoint write fails with ENOSPC: every rank stops with that error, no partial
  checkpoint is left, and the previous one resumes exactly.
- ``nccl-kill`` and ``nccl-stop`` (``MPIPE_HF_FULL=1``): every rank blocked in step 4 as NCCL leaves it on a lost
  peer (a wait only the communicators' abort ends), then rank 1 SIGKILLed or SIGSTOPped: the liveness thread ends
  rank 0 within 30 s, or ``timeout_s`` + 10 s, with one line naming rank 1 (``tests/test_liveness.py`` models
  the same in CI for pp, dp x pp and ep x pp).

The other cases (``kill``: the same kill without restarts, stopping with one line that names the lost rank and
resumed by hand; ``kill-in-save``: rank 0 killed while it writes a checkpoint, the previous one loading and the
resume exact (a save cut short in CI: ``disk-full``, and the atomic rename in ``tests/test_resume.py``); every bad row, NaN at every step, an output directory that is not writable, the recipe table)
run in ``python scripts/check/fault_suite.py``; the recipe table and the bad rows are also unit-tested
(``tests/test_recipe_schema.py``, ``tests/test_conversation.py``).
"""

import os
import runpy

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = runpy.run_path(os.path.join(ROOT, "scripts", "check", "fault_suite.py"))


@pytest.fixture(scope="module")
def suite(demo, tmp_path_factory):
    return SUITE["Suite"](demo, str(tmp_path_factory.mktemp("faults")))


# restart, preempt and preempt-in-save (each a minute or more) run with MPIPE_HF_FULL=1 and in
# scripts/check/fault_suite.py; CI stops every rank on a signal in tests/test_preempt.py and saves and stops a preempted
# MPipeTrainer in tests/test_hf_trainer.py
FULL = os.environ.get("MPIPE_HF_FULL") == "1"


@pytest.mark.parametrize("case", ["nan", "disk-full"] + (["restart", "preempt", "preempt-in-save", "nccl-kill",
                                                            "nccl-stop"] if FULL else []))
def test_fault(suite, case):
    outcome = SUITE["CASES"][case](suite)
    assert outcome.hung == 0, outcome.happened
    assert outcome.lost == 0, outcome.happened
    assert outcome.passed, outcome.happened
