"""The commands that read a recipe's data and start its processes: ``mpipe-hf train`` (through torchrun, with
preemption and the lost-rank report) and ``mpipe-hf check-data`` (:mod:`mpipe_hf.train.data_check`); the rest of
the command line is :mod:`mpipe_hf.cli`'s.
"""

from __future__ import annotations

import os
import sys


def _train(args) -> None:
    from .train import load_recipe
    recipe = load_recipe(args.recipe)  # fail here, before starting any process
    if args.max_restarts < 0:
        raise ValueError(f"--max-restarts must be an integer >= 0, got {args.max_restarts}")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout must be an integer >= 0 (seconds), got {args.shutdown_timeout}")
    if "RANK" in os.environ:  # already under a launcher
        from .train.trainer import main
        main([args.recipe])
        return
    from .train.data_check import precheck
    from .train.trainer import check
    check(recipe)
    precheck(recipe)  # every row, before the launch; the workers read its cache
    os.environ[CHECKED] = "1"  # the workers print no second copy of its warnings
    if args.max_restarts and not recipe.train.save_steps:
        print("mpipe-hf: warning: --max-restarts without train.save_steps: a restarted run has no checkpoint to "
              "resume from and starts again from step 0", file=sys.stderr, flush=True)
    import logging
    import time
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun
    per_node = launch_shape(recipe, args)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // per_node)))
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # the one line is the workers'
    start = time.time()
    restarts = [f"--max-restarts={args.max_restarts}"] if args.max_restarts else []
    nodes = (["--standalone"] if args.nnodes == 1 and args.master_addr is None else
             [f"--nnodes={args.nnodes}", f"--node-rank={args.node_rank}", f"--master-addr={args.master_addr}",
              f"--master-port={args.master_port}"])
    # preemption (docs/failures.md): the agent forwards SIGTERM and SIGUSR1 to the workers, which finish the step,
    # save and exit 0; it waits --shutdown-timeout seconds for them before SIGKILL
    signals = [f"--signals-to-handle={PREEMPT_SIGNALS}", f"--shutdown-timeout={args.shutdown_timeout}"]
    try:
        torchrun([*nodes, f"--nproc_per_node={per_node}", *restarts, *signals, "-m", "mpipe_hf.train",
                  args.recipe])
    except ChildFailedError as err:
        _report_lost(err, recipe, args, start)
        raise SystemExit(1) from None
    except SignalException as err:  # the workers have had their grace period; did they save?
        if not _preempted(recipe.train.output_dir, start):
            print(f"mpipe-hf: error: stopped by {err.sigval.name} before the workers could save a checkpoint "
                  f"(--shutdown-timeout {args.shutdown_timeout} s); continue from the newest checkpoint-<step> "
                  f"with train.resume: auto", file=sys.stderr, flush=True)
            raise SystemExit(1) from None


CHECKED = "MPIPE_HF_DATA_CHECKED"
PREEMPT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # torchrun's own four, and SLURM's --signal=USR1@N


def _preempted(output_dir: str, since: float) -> bool:
    """Whether the workers wrote their preemption record (rank 0, after the checkpoint is on disk) since
    ``since`` (seconds since the epoch)."""
    from .train.preempt import MARKER
    path = os.path.join(output_dir, MARKER)
    return os.path.isfile(path) and os.path.getmtime(path) >= since


def _report_lost(err, recipe, args, start: float) -> None:
    """Print the one line of a failed worker group: the rank that was lost (killed by a signal), else each
    rank's exit status, unless a worker reported its own error since ``start`` (its log is newer)."""
    import glob
    killed = sorted((f.local_rank, f) for f in err.failures.values() if f.exitcode < 0)
    logs = os.path.join(recipe.train.output_dir, "logs")
    reported = any(os.path.getmtime(p) >= start for p in glob.glob(os.path.join(logs, "rank*.log")))
    if killed:  # no worker could report it: say which rank was lost, and how to go on
        # the agent stops the others with SIGTERM: the lost rank is the one another signal ended
        lost = [k for k in killed if k[1].signal_name() != "SIGTERM"] or killed
        first_rank, first = min(lost, key=lambda k: k[1].timestamp)
        stopped = [r for r, f in killed if f is not first]
        resume = ("it restarts by itself with --max-restarts N" if not args.max_restarts else
                  f"{args.max_restarts} restarts were used up")
        print(f"mpipe-hf: error: rank {first_rank} was lost ({first.signal_name()}, pid {first.pid})"
              + (f"; the launcher stopped rank{'s' if len(stopped) > 1 else ''} "
                 f"{', '.join(map(str, stopped))}" if stopped else "")
              + f"; continue from the newest checkpoint-<step> with train.resume: auto ({resume})",
              file=sys.stderr, flush=True)
    elif not reported:
        failures = "; ".join(f"rank {f.local_rank} exited with {f.exitcode}" for f in err.failures.values())
        print(f"mpipe-hf: error: {failures}", file=sys.stderr, flush=True)


def launch_shape(recipe, args) -> int:
    """Processes per node: ``dp_size * pp_size * cp_size`` over ``--nnodes``.

    Raises:
        ValueError: a node count or rank out of range, processes that do not divide evenly over the nodes, or
            several nodes without ``--master-addr``.
    """
    processes = recipe.parallel.pp_size * recipe.parallel.dp_size * recipe.parallel.cp_size
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"--nnodes must be >= 1 and --node-rank in [0, {args.nnodes}), got {args.nnodes} and "
                         f"{args.node_rank}")
    if processes % args.nnodes:
        raise ValueError(f"parallel.dp_size * pp_size * cp_size = {processes} processes do not divide over "
                         f"--nnodes {args.nnodes}")
    if args.nnodes > 1 and args.master_addr is None:
        raise ValueError("--nnodes > 1 needs --master-addr (node 0's address) and --master-port")
    return processes // args.nnodes


def train_parsers(sub, fmt, recipe_help: str, paths_note: str) -> None:
    """The ``train`` and ``check-data`` subcommands of :func:`mpipe_hf.cli._parser`."""
    train = sub.add_parser("train", help="train from a recipe on dp_size * pp_size processes", formatter_class=fmt,
                           description="Train from a recipe on dp_size * pp_size processes (started through "
                                       "torchrun; over --nnodes, each node starts its share).", epilog=paths_note)
    train.add_argument("recipe", help=recipe_help)
    train.add_argument("--max-restarts", type=int, default=0,
                       help="restart the worker group this many times after a failure (torchrun's elastic agent); "
                            "each restart resumes from the run's newest checkpoint-<step> (train.save_steps)")
    train.add_argument("--shutdown-timeout", type=int, default=300,
                       help="on SIGTERM or SIGUSR1 (preemption), the seconds the workers get to finish the step and "
                            "save a checkpoint before they are killed")
    train.add_argument("--nnodes", type=int, default=1, help="nodes; each starts dp_size * pp_size / nnodes processes")
    train.add_argument("--node-rank", type=int, default=0, help="this node's index, 0 .. nnodes - 1")
    train.add_argument("--master-addr", help="node 0's address (several nodes)")
    train.add_argument("--master-port", type=int, default=29500, help="node 0's port (several nodes)")
    train.set_defaults(func=_train)
    check = sub.add_parser("check-data", help="check every row of a recipe's data and list every bad row",
                           formatter_class=fmt, epilog=paths_note,
                           description="Read every row of the recipe's data (data.path or data.sources, and "
                                       "data.eval_path) on this machine, in parallel, and list every bad row with its "
                                       "file and line (or row index) and the reason, then the counts; exit status 1 "
                                       "when a row is bad, 2 when the data cannot be read. Each kept row is then "
                                       "loaded as training loads it (the collator and the model's image-token count), "
                                       "one row at a time. mpipe-hf train runs the first check before it launches.")
    check.add_argument("recipe", help=recipe_help)
    check.add_argument("--num-proc", type=int, help="processes for the check (default: data.num_proc, else up to 8)")
    check.add_argument("--headers-only", action="store_true",
                       help="read each image's header only, as the training start does, not every pixel, and "
                            "skip loading the rows as training does")
    check.add_argument("--write-clean", metavar="FILE",
                       help="write the rows that pass to FILE; data.clean_rows: FILE trains on them alone")
    check.set_defaults(func=_check_data)


def _check_data(args) -> None:
    from .train.data_check import check_data_main
    if args.num_proc is not None and args.num_proc < 1:
        raise ValueError(f"--num-proc must be an integer >= 1, got {args.num_proc}")
    try:
        status = check_data_main(args.recipe, not args.headers_only, args.num_proc, args.write_clean)
    except ValueError as err:  # the data could not be checked at all: 2, apart from 1 (bad rows found)
        print(f"mpipe-hf: error: {err}", file=sys.stderr, flush=True)
        status = 2
    sys.exit(status)

