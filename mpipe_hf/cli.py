"""``mpipe-hf``: the command line.

- ``mpipe-hf train RECIPE.yaml`` starts ``pp_size`` local processes (through torchrun) and trains;
- ``mpipe-hf schedule --pp 4 --vpp 2 --micro 8 [--preprocess identity|frozen|trainable] [--overflow full|min]
  [--owner-backward] [--less-memory] [--gantt]`` prints each rank's action list of the MPipe Transpose schedule,
  or its Gantt chart under unit costs (F = 1, B = 2, preprocess forward = 1, backward = 2) with the bubble and
  each rank's peak in-flight activations.
"""

from __future__ import annotations

import argparse
import os
import sys


def _train(args) -> None:
    from .train import load_recipe
    recipe = load_recipe(args.recipe)  # fail here, before starting any process
    if "RANK" in os.environ:  # already under a launcher
        from .train.trainer import main
        main([args.recipe])
        return
    from .train.trainer import check
    check(recipe)
    from torch.distributed.run import main as torchrun
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // recipe.pp_size)))
    torchrun(["--standalone", f"--nproc_per_node={recipe.pp_size}", "-m", "mpipe_hf.train", args.recipe])


def _schedule(args) -> None:
    from .schedule import ScheduleConfig, build_schedule
    from .schedule.simulate import simulate
    from .schedule.timeline import gantt
    cfg = ScheduleConfig(args.pp, args.vpp, args.micro, args.preprocess, args.overflow, args.owner_backward,
                         args.less_memory)
    orders = build_schedule(cfg)
    if args.gantt:
        sim = simulate(orders)
        print(gantt(sim.timeline))
        print(f"bubble {sim.mean_bubble:.3f} (digits: forward of that micro; digit and '=': backward; "
              f"P/p: preprocess forward/backward; '.': idle)")
        peaks = [sim.peak_activations[r] for r in range(cfg.pp_size)]
        print(f"peak in-flight activations per rank (stage-micro units): {peaks}")
        return
    for rank, actions in orders.items():
        print(f"rank {rank}: " + " ".join(map(str, actions)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mpipe-hf", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a recipe on pp_size local processes")
    train.add_argument("recipe")
    train.set_defaults(func=_train)
    sched = sub.add_parser("schedule", help="print the MPipe Transpose schedule")
    sched.add_argument("--pp", type=int, required=True, help="pipeline ranks R")
    sched.add_argument("--vpp", type=int, default=1, help="chunks per rank V")
    sched.add_argument("--micro", type=int, required=True, help="micro-batches M")
    sched.add_argument("--preprocess", default="frozen", choices=["identity", "frozen", "trainable"])
    sched.add_argument("--overflow", default="full", choices=["full", "min"])
    sched.add_argument("--owner-backward", action="store_true", help="trainable P: owners backprop P")
    sched.add_argument("--less-memory", action="store_true", help="shallow warm-up of the interleaved body")
    sched.add_argument("--gantt", action="store_true", help="print a text Gantt chart under unit costs")
    sched.set_defaults(func=_schedule)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except ValueError as err:
        sys.exit(f"mpipe-hf: error: {err}")


if __name__ == "__main__":
    main()
