"""The pipelined step equals the unsplit Hugging Face model on one process: loss and every parameter gradient
(fp32, atol 1e-5), the visual tower's included, on gloo with 2 and 4 processes.

One torchrun per world size runs every case in one process group. Micro-batches in a step differ in sequence
length, image count and image size. A micro-batch with a wrong image-token count raises the same ValueError on
every rank, and the step after it is exact.
"""

import itertools
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import build_fixture, read_results, run_torchrun  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "dist", "numerics_worker.py")
ATOL = 1e-5


@pytest.fixture(scope="module")
def fixture_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("numerics") / "fixture.pt")
    build_fixture(path, num_micro=8)
    return path


def cases(pp_size):
    out = []
    for preprocess, vpp, num_micro in itertools.product(("frozen", "trainable"), (1, 2), (pp_size, 2 * pp_size)):
        out.append(dict(name=f"{preprocess}-V{vpp}-M{num_micro}", preprocess=preprocess, vpp=vpp,
                        num_micro=num_micro, offset=vpp + num_micro))
    # a bad sample owned by the last rank: every rank raises, then the next step is exact
    out.append(dict(name="after-bad-sample", preprocess="trainable", vpp=2, num_micro=pp_size,
                    bad_micro=pp_size - 1))
    return out


@pytest.mark.parametrize("pp_size", [2, 4])
def test_pipeline_matches_unsplit_model(pp_size, fixture_path, tmp_path):
    import json
    run_torchrun(WORKER, pp_size, [fixture_path, str(tmp_path), json.dumps(cases(pp_size))], timeout=900)
    results = read_results(str(tmp_path), pp_size)
    for case in cases(pp_size):
        per_rank = [r[case["name"]] for r in results]
        for rank, res in enumerate(per_rank):
            assert abs(res["loss"] - res["ref_loss"]) < ATOL, (case["name"], rank, res["loss"], res["ref_loss"])
            assert res["max_diff"] < ATOL, (case["name"], rank, res["worst"], res["max_diff"])
        owned = [name for res in per_rank for name in res["names"]]
        assert sorted(owned) == per_rank[0]["ref_names"], "every trainable parameter is checked on exactly one rank"
        assert any(n.startswith("model.visual.") for n in owned) == (case["preprocess"] == "trainable")
        if "bad_micro" in case:
            for res in per_rank:
                assert "image-token count" in res["error"] and f"micro-batch {case['bad_micro']}" in res["error"]


def test_frozen_tower_never_ships_pixels(fixture_path, tmp_path):
    """Byte counts are per run, so the frozen cases run alone: the owner ships token ids and features only."""
    import json
    frozen = [c for c in cases(2) if c["preprocess"] == "frozen"][:2]
    run_torchrun(WORKER, 2, [fixture_path, str(tmp_path), json.dumps(frozen)], timeout=600)
    results = read_results(str(tmp_path), 2)
    sent_by_owner = results[1][frozen[-1]["name"]]["bytes_by_key"]
    assert "image_features" in sent_by_owner and "input_ids" in sent_by_owner
    assert "pixel_values" not in sent_by_owner
