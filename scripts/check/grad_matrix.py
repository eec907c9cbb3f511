"""The gradient matrix: the pipelined step against the unsplit Hugging Face model on one process.

Usage:
    python scripts/check/grad_matrix.py            # the full grid (every mode x P x R x V x M), several minutes per R
    python scripts/check/grad_matrix.py --ci       # the pairwise covering subset that CI runs
    python scripts/check/grad_matrix.py --pp 2 3   # only these pipeline sizes
    python scripts/check/grad_matrix.py --ci --swap all   # every case with activation swap on every rank (or rank0)
    python scripts/check/grad_matrix.py --ci --zero-bubble   # every case with the backward split into B and W
    python scripts/check/grad_matrix.py --families --zero-bubble   # every model family (R = 2, V = 2, checkpoint
                                                             # reload), each with the backward split
    python scripts/check/grad_matrix.py --packed --pp 2   # every family with packed micro-batches
    python scripts/check/grad_matrix.py --controls        # the packing and gradient controls: each case must FAIL,
                                                    # and every family with its last AdamW step skipped

Each pipeline size runs as torchrun jobs of gloo CPU processes (at most --chunk cases per job). Every case checks
the loss, every gradient (atol 1e-5; the families per tensor, tests/dist/matrix.py), each AdamW step's update per
tensor against the reference's, relative to its size (where the case takes several steps), and that each rank loads
only its own micro-batches. Prints one line per case (the worst loss difference, the worst gradient difference and
in units of 1e-5 + 1e-5 * max|ref|, the worst update difference as a fraction of its tensor's update, the
parameters' after the steps, the wall time)
and the total; exits 1 on any failure (with --controls, on any pass).
"""

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "dist"))
from common import build_fixture, read_results, run_torchrun  # noqa: E402
from matrix import (check_case, check_reload, covering_subset, family_grid, full_grid, gradient_controls,  # noqa: E402
                    packed_configs, packed_grid, packing_controls, skipped_step_controls, zero_by_design)

WORKER = os.path.join(HERE, "..", "..", "tests", "dist", "numerics_worker.py")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ci", action="store_true", help="run the pairwise covering subset only")
    parser.add_argument("--pp", type=int, nargs="+", default=[2, 3, 4], help="pipeline sizes to run")
    parser.add_argument("--chunk", type=int, default=40, help="cases per torchrun job")
    parser.add_argument("--swap", choices=["all", "rank0"], help="activation swap in every case")
    parser.add_argument("--zero-bubble", action="store_true", help="zero-bubble schedules (B and W) in every case")
    parser.add_argument("--families", action="store_true",
                        help="the model-family grid (every family frozen and trainable, T = 0 and 1, identity, "
                             "zero-bubble, MoE in the Trainer's order, at R = 2, V = 2, 2 AdamW steps, then a save "
                             "and a from_pretrained reload) instead of the grid")
    parser.add_argument("--packed", action="store_true",
                        help="every family with packed micro-batches (a text-only row next to rows of "
                             "one and two images in one sequence), frozen and trainable, against the same rows "
                             "unpacked, instead of the grid")
    parser.add_argument("--controls", action="store_true",
                        help="the negative controls (packing bugs, wrong gradients of each kind): each must fail")
    parser.add_argument("--only", nargs="+", metavar="CONFIG",
                        help="only the cases of these model configs (e.g. --families --only gemma3 aya_vision); the "
                             "fixture then builds only their pools")
    args = parser.parse_args(argv)
    controls = packing_controls() + gradient_controls() + skipped_step_controls() if args.controls else None
    grid = (controls if args.controls else packed_grid() if args.packed
            else family_grid() if args.families else covering_subset() if args.ci else full_grid())
    cases = [c for c in grid if c["pp_size"] in args.pp and (not args.only or c["family"] in args.only)]
    if args.swap:
        cases = [dict(case, swap=args.swap, name=f"{case['name']}-swap={args.swap}") for case in cases]
    if args.zero_bubble:
        cases = [dict(case, zero_bubble=True, name=f"{case['name']}-zb") for case in cases]
    start, failed = time.perf_counter(), []
    with tempfile.TemporaryDirectory() as tmp:
        fixture = os.path.join(tmp, "fixture.pt")
        packed = [c for c in packed_configs() if not args.only or c in args.only] if args.packed else ()
        if args.controls:
            packed = tuple(c["family"] for c in grid if c.get("packed"))
        if args.packed or args.controls:  # the packed pools, and the family pools of the cases alone
            build_fixture(fixture, packed, only=sorted({c["family"] for c in cases}))
        else:
            build_fixture(fixture, only=args.only)
        for pp_size in args.pp:
            mine = [c for c in cases if c["pp_size"] == pp_size]
            for i in range(0, len(mine), args.chunk):
                chunk, out = mine[i:i + args.chunk], tempfile.mkdtemp(dir=tmp)
                try:
                    run_torchrun(WORKER, pp_size, [fixture, out, json.dumps(chunk)], timeout=3600)
                except AssertionError as err:  # the job died: every case of the chunk counts as failed
                    print(f"FAIL torchrun job of {len(chunk)} cases (R={pp_size}):\n{str(err)[-3000:]}", flush=True)
                    failed += [case["name"] for case in chunk]
                    continue
                results = read_results(out, pp_size)
                for case in chunk:
                    per_rank = [r[case["name"]] for r in results]
                    problems = check_case(case, per_rank) + (check_reload(per_rank) if case.get("reload") else [])
                    print(f"{'FAIL' if problems else 'ok  '} {case['name']:<90} {figures(per_rank)}", flush=True)
                    for p in problems[:5]:
                        print(f"     {p}")
                    if bool(problems) != args.controls:
                        failed.append(case["name"])
    wall = time.perf_counter() - start
    print(f"{len(cases) - len(failed)}/{len(cases)} cases {'failed, as they must' if args.controls else 'passed'} in {wall:.0f}s ({wall / 60:.1f} min)")
    return 1 if failed else 0


def figures(per_rank: list[dict]) -> str:
    """One case's figures over its ranks: the worst loss difference, the worst gradient difference (absolute, and in
    units of the per-tensor 1e-5 + 1e-5 * max|ref|), the worst AdamW update difference (rms, as a fraction of its
    tensor's update; tensors zero by design left out) and the parameters' after the steps, the wall time."""
    loss = max(abs(a - b) for r in per_rank for a, b in zip(r["losses"], r["ref_losses"]))
    grad = max(r["max_diff"] for r in per_rank)
    scaled = max(r["grad_scaled"] for r in per_rank)
    updates = [diff / max(ref, 1e-30) for r in per_rank for step in r.get("update_stats") or []
               for name, (ref, diff, _) in step.items() if name not in zero_by_design(r["grad_stats"])]
    params = max((r["param_diff"] for r in per_rank if r["param_diff"] is not None), default=None)
    return (f"loss {loss:.1e} grad {grad:.1e} ({scaled:.3g} x tol) updates {max(updates):.1e} of theirs (params "
            f"{params:.1e} apart) " if updates else f"loss {loss:.1e} grad {grad:.1e} ({scaled:.3g} x tol) ") + \
        f"{per_rank[0]['wall_s']:.1f}s"


if __name__ == "__main__":
    sys.exit(main())
