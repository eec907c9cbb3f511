"""``mpipe-hf``: the command line.

- ``mpipe-hf train RECIPE.yaml [--max-restarts N] [--nnodes N --node-rank I --master-addr A --master-port P]``
  starts ``dp_size * pp_size`` processes (through torchrun; over ``--nnodes``, each node starts its share) and
  trains; after a failure torchrun's elastic agent restarts the group up to ``N`` times, and each restart
  resumes from the run's newest ``checkpoint-<step>``; on SIGTERM or SIGUSR1 (preemption) every rank finishes
  its step, the run saves a checkpoint and exits 0 (``--shutdown-timeout S``: the grace period the workers get).
  Relative paths in a recipe are relative to the recipe file's folder;
- ``mpipe-hf check-data RECIPE.yaml [--num-proc N] [--headers-only] [--write-clean FILE]`` reads every row of
  the recipe's data on this machine and lists every bad row in one pass, with the counts (:mod:`.cli_train`);
- ``mpipe-hf schedule --pp 4 --vpp 2 --micro 8 [--preprocess identity|frozen|trainable] [--overflow full|min]
  [--owner-backward] [--less-memory] [--zero-bubble] [--gantt]`` prints each rank's action list of the MPipe
  Transpose schedule, or its Gantt chart under unit costs (F = 1, B = 2, preprocess forward = 1, backward = 2)
  with the bubble and each rank's peak in-flight activations;
- ``mpipe-hf simulate [schedule flags] [--profile PROFILE.yaml] [--micro-weights W1,W2,...]
  [--preprocess-weights W1,W2,...]`` predicts the step time, bubble and peak activations per rank, each micro-batch
  weighted (uneven micros: packed, ragged); ``--auto`` tries the knobs (``V``, ``T``, overflow,
  owner-backward, stage 0's layers) and lists them fastest first;
- ``mpipe-hf plan RECIPE.yaml [--profile PROFILE.yaml] [--gpu-gib 80]`` prints every rank's parameter, gradient,
  optimizer-state and activation bytes (exact counts on the meta device; activations from the profile, or
  estimated from the config; with ``parallel.ep_size`` a rank's share of the experts and the all-to-all's
  buffers; with ``parallel.cp_size`` a CP rank's share of each sequence and Ulysses' all-to-alls,
  :mod:`.train.plan_context_parallel`) and the predicted step time; with ``data.packing`` also step 0's packed
  micro-batches and the simulated packed step against the same rows padded (:mod:`.train.plan_packing`; needs
  the data); exits 1 when a rank does not fit;
- ``mpipe-hf profile RECIPE.yaml`` measures a cost profile of the recipe's model and data on one process;
- ``mpipe-hf plot --out GANTT.png`` draws a Gantt chart of a simulated schedule ([schedule flags]) or of a
  measured run (``--trace output_dir/trace.json`` from a recipe with ``trace: true``).

The parser's help is plain text of its own (:data:`DESCRIPTION`, each option's default shown), not this docstring.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from .cli_train import train_parsers


def _config(args):
    from .schedule import ScheduleConfig
    return ScheduleConfig(args.pp, args.vpp, args.micro, args.preprocess, args.overflow, args.owner_backward,
                          args.less_memory, zero_bubble=args.zero_bubble)


def _costs(args, cfg):
    """Unit costs, or the costs of ``--profile`` for this schedule and layout."""
    from .schedule.simulate import Costs
    if not args.profile:
        return Costs(), "time units"
    from .schedule.tune import Profile, costs_for, profile_layers
    profile = Profile.load(args.profile)
    layout = ([int(x) for x in args.layers_per_stage.split(",")] if args.layers_per_stage
              else profile_layers(profile, cfg, args.text_layers))
    return costs_for(profile, cfg, layout, args.text_layers), "seconds"


def _simulate(args) -> None:
    from .schedule import build_schedule
    from .schedule.simulate import simulate
    if args.auto:
        from .schedule.tune import Profile, tune
        if args.micro_weights or args.preprocess_weights:
            raise ValueError("--micro-weights and --preprocess-weights simulate one schedule; not with --auto")
        if not args.profile:
            raise ValueError("--auto needs --profile PROFILE.yaml (mpipe-hf profile RECIPE.yaml writes one)")
        ranked = tune(Profile.load(args.profile), args.pp, args.micro, args.preprocess)
        print(f"{'#':>4} {'step s':>9} {'vs best':>8} {'bubble':>7}  knobs")
        for i, c in enumerate(ranked[:args.top]):
            print(f"{i + 1:>4} {c.step_s:9.4f} {c.step_s / ranked[0].step_s:8.3f} {c.bubble:7.3f}  {c.describe()}")
        return
    cfg = _config(args)
    costs, unit = _costs(args, cfg)
    costs = dataclasses.replace(costs, micro_weights=_weights(args.micro_weights, "--micro-weights", cfg),
                                micro_preprocess_weights=_weights(args.preprocess_weights, "--preprocess-weights", cfg))
    sim = simulate(_swapped(args, cfg, build_schedule(cfg, costs)), costs)
    print(f"step {sim.makespan:.4g} {unit}; bubble {sim.mean_bubble:.3f} (per rank "
          f"{[round(sim.bubble[r], 3) for r in sorted(sim.bubble)]}); peak in-flight activations per rank "
          f"{[sim.peak_activations[r] for r in sorted(sim.peak_activations)]}"
          + (f"; on the device with swap {[sim.peak_resident[r] for r in sorted(sim.peak_resident)]}"
             if args.swap else ""))


def _weights(text: str | None, flag: str, cfg) -> tuple[float, ...] | None:
    """``W1,W2,...`` -> one weight per micro-batch (``None``: not given)."""
    if text is None:
        return None
    try:
        weights = tuple(float(w) for w in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated numbers, one per micro-batch; got {text!r}") from None
    if len(weights) != cfg.num_micro:
        raise ValueError(f"{flag} gives {len(weights)} weights for --micro {cfg.num_micro}: give one per micro-batch")
    return weights


def _plot(args) -> None:
    from .schedule.trace import plot_gantt, read_chrome_trace
    if args.trace:
        timeline = read_chrome_trace(args.trace)
        title, unit = f"measured: {args.trace}", "seconds"
    else:
        from .schedule import build_schedule
        from .schedule.simulate import simulate
        cfg = _config(args)
        costs, unit = _costs(args, cfg)
        sim = simulate(build_schedule(cfg, costs), costs)
        timeline = sim.timeline
        title = (f"R={cfg.pp_size} V={cfg.vpp} M={cfg.num_micro} {cfg.preprocess} overflow={cfg.overflow}"
                 f"{' owner-backward' if cfg.owner_backward else ''}: step {sim.makespan:.4g} {unit}, "
                 f"bubble {sim.mean_bubble:.3f}")
    plot_gantt(timeline, args.out, title, unit)
    print(f"wrote {args.out}")


def _profile(args) -> None:
    from .train import load_recipe
    recipe = load_recipe(args.recipe)  # before the trainer's imports: a bad recipe fails at once
    from .train.profile import profile_recipe
    profile = profile_recipe(recipe)
    profile.save(args.out)
    print(f"wrote {args.out}: " + ", ".join(f"{k}={v:.3g}" for k, v in vars(profile).items()))


def _plan(args) -> None:
    from .train import load_recipe
    recipe = load_recipe(args.recipe)  # before the trainer's imports: a bad recipe fails at once
    from .schedule.tune import Profile
    from .train.plan import plan
    from .train.plan_estimate import estimate_profile
    from .models import get_family
    from .train.trainer import check_layout, load_config
    config = load_config(recipe.model)
    get_family(config.model_type)  # an unsupported model_type is refused before the cost model reads its config
    path = args.profile or recipe.parallel.profile
    if path:
        profile, source = Profile.load(path), f"profile {path}"
    else:
        if args.tokens is None:  # a packed micro-batch holds up to the budget
            args.tokens = recipe.data.token_budget if recipe.data.packing else 2048
        if args.image_tokens is None:  # half of them, as the default 2048 holds 1024
            args.image_tokens = args.tokens // 2
        if not 0 <= args.image_tokens <= args.tokens:
            raise ValueError(f"--image-tokens {args.image_tokens} must be between 0 and the {args.tokens} tokens of a "
                             f"micro-batch (--tokens)")
        profile = estimate_profile(config, args.tokens, args.image_tokens, args.tflops, args.mfu,
                                   bf16=recipe.train.bf16, frozen_vit=recipe.train.freeze_vit)
        source = (f"estimated: {args.tokens} tokens ({args.image_tokens} image tokens) per micro-batch, "
                  f"{args.tflops:g} TFLOP/s at {args.mfu:g} MFU, {'bf16' if recipe.train.bf16 else 'fp32'} activations")
    cfg = recipe.schedule()
    layers = check_layout(recipe, config)  # the layout training will run
    if args.profile and not recipe.parallel.profile:
        by_profile = check_layout(recipe, config, profile)
        if by_profile != layers:
            print(f"note: balanced by {args.profile}'s costs the layout would be {by_profile}; set parallel.profile: "
                  f"{args.profile} in the recipe to train with it (planned below: the recipe's {layers})")
    ckpt, text_layers = recipe.train.gradient_checkpointing, recipe.parallel.text_layers
    from .train.recipe_parallel import groups_within_node
    parallel = recipe.parallel
    ep_within, cp_within = groups_within_node(parallel, config, recipe.data)
    result = plan(config, cfg, profile, layers, text_layers, ckpt, parallel.ep_size, ep_within, parallel.dp_size,
                  parallel.cp_size, cp_within, 2 if recipe.train.bf16 else 4)
    print(f"{config.model_type}: R={cfg.pp_size} V={cfg.vpp} M={cfg.num_micro} dp_size={parallel.dp_size} "
          f"ep_size={parallel.ep_size} cp_size={parallel.cp_size} preprocess={cfg.preprocess} "
          f"text_layers={text_layers} "
          f"gradient_checkpointing={ckpt}; costs from {source}")
    print(result.table(args.gpu_gib * 2**30))
    if recipe.data.packing:
        from .train.plan_packing import packed_section
        print(packed_section(recipe, config, result, None if path else (args.tokens, args.image_tokens)))
    if not result.fits(args.gpu_gib * 2**30):
        sys.exit(1)


def _schedule(args) -> None:
    from .schedule import build_schedule
    from .schedule.simulate import simulate
    from .schedule.timeline import gantt
    cfg = _config(args)
    orders = _swapped(args, cfg, build_schedule(cfg))
    if args.gantt:
        sim = simulate(orders)
        print(gantt(sim.timeline))
        print(f"bubble {sim.mean_bubble:.3f} (digits: forward of that micro; digit and '=': backward; "
              f"digit and 'w': weight gradient (W, zero bubble); P/p: preprocess forward/backward; '.': idle)")
        peaks = [sim.peak_activations[r] for r in range(cfg.pp_size)]
        print(f"peak in-flight activations per rank (stage-micro units): {peaks}"
              + (f"; on the device with swap: {[sim.peak_resident[r] for r in range(cfg.pp_size)]}"
                 if args.swap else ""))
        return
    for rank, actions in orders.items():
        print(f"rank {rank}: " + " ".join(map(str, actions)))


def _swapped(args, cfg, orders: dict) -> dict:
    """``orders`` with the swap actions of ``--swap`` (on ``--swap-ranks``, ``--min-swap-gap``)."""
    if not args.swap and not args.swap_ranks:
        return orders
    from .schedule.swap import SwapConfig, with_swaps
    args.swap = True  # --swap-ranks alone means swap on those ranks
    try:
        ranks = [int(r) for r in args.swap_ranks.split(",")] if args.swap_ranks else None
    except ValueError:
        raise ValueError(f"--swap-ranks must be comma-separated pipeline ranks, e.g. 0 or 0,1; got "
                         f"{args.swap_ranks!r}") from None
    swap = SwapConfig(enabled=True, min_swap_gap=args.min_swap_gap, ranks=ranks)
    swap.check(cfg.pp_size)
    return {r: with_swaps(o, swap, r) for r, o in orders.items()}


DESCRIPTION = "mpipe-hf: pipeline-parallel fine-tuning of Hugging Face models with the MPipe Transpose schedule."
RECIPE_HELP = ("the recipe YAML file; relative paths in it (model, data, parallel.profile, train.output_dir, "
               "train.resume) are relative to the file's folder, not the working directory")
PATHS_NOTE = ("Relative paths in a recipe resolve against the recipe file's folder: recipes/x.yaml names the "
              "repository's demo/model as ../demo/model and its outputs/ as ../outputs.")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help text with each option's default, ``(default: ...)``, except for an option whose default is ``None``
    (none)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def _schedule_flags(parser, cost_flags: bool = False, required: bool = True) -> None:
    parser.add_argument("--pp", type=int, required=required, help="pipeline ranks R")
    parser.add_argument("--vpp", type=int, default=1, help="chunks per rank V")
    parser.add_argument("--micro", type=int, required=required, help="micro-batches M")
    parser.add_argument("--preprocess", default="frozen", choices=["identity", "frozen", "trainable"],
                        help="the transposed block P: identity (no P), a frozen or a trainable vision tower")
    parser.add_argument("--overflow", default="full", choices=["full", "min"],
                        help="the overflow policy of the transposed forwards")
    parser.add_argument("--owner-backward", action="store_true", help="trainable P: owners backprop P")
    parser.add_argument("--less-memory", action="store_true", help="shallow warm-up of the interleaved body")
    parser.add_argument("--zero-bubble", action="store_true",
                        help="split each backward into B (input gradient) and W (weight gradient), W in the waits")
    parser.add_argument("--swap", action="store_true", help="activation swap (the recipe's swap section)")
    parser.add_argument("--swap-ranks", help="comma-separated ranks that swap; every rank when not given")
    parser.add_argument("--min-swap-gap", type=int, default=2, help="compute actions between F and B to swap")
    if cost_flags:
        parser.add_argument("--profile", help="a cost profile (mpipe-hf profile RECIPE.yaml); unit costs without")
        parser.add_argument("--text-layers", type=int, default=0, help="T: decoder layers moved into P")
        parser.add_argument("--layers-per-stage",
                            help="comma-separated layers per stage; balanced by the profile's costs without")


def _parser() -> argparse.ArgumentParser:
    """The ``mpipe-hf`` parser: plain-text help (no reST), each option's default shown."""
    fmt = DefaultsHelpFormatter
    parser = argparse.ArgumentParser(prog="mpipe-hf", description=DESCRIPTION, epilog=PATHS_NOTE,
                                     formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", required=True)
    train_parsers(sub, fmt, RECIPE_HELP, PATHS_NOTE)
    sched = sub.add_parser("schedule", help="print the MPipe Transpose schedule", formatter_class=fmt,
                           description="Print each rank's action list of the MPipe Transpose schedule, or its Gantt "
                                       "chart under unit costs (F = 1, B = 2, preprocess forward = 1, backward = 2).")
    _schedule_flags(sched)
    sched.add_argument("--gantt", action="store_true", help="print a text Gantt chart under unit costs")
    sched.set_defaults(func=_schedule)
    sim = sub.add_parser("simulate", help="predict a schedule's step time, or rank the knobs (--auto)",
                         formatter_class=fmt, description="Predict the step time, bubble and peak activations per "
                         "rank; --auto tries the knobs and lists them fastest first.")
    _schedule_flags(sim, cost_flags=True)
    sim.add_argument("--auto", action="store_true", help="try V, T, overflow, owner-backward and layouts")
    sim.add_argument("--top", type=int, default=20, help="candidates to print with --auto")
    sim.add_argument("--micro-weights", help="comma-separated, one per micro-batch: how many times the profile's "
                     "micro-batch each costs in the body (F, B, W), e.g. its tokens over the profile's; uniform "
                     "without")
    sim.add_argument("--preprocess-weights", help="comma-separated, one per micro-batch: likewise for its preprocess "
                     "(TRANSPOSE_FWD/BWD, DATA_LOAD), e.g. its image tokens over the profile's; uniform without")
    sim.set_defaults(func=_simulate)
    plot = sub.add_parser("plot", help="draw a Gantt chart (PNG) of a simulated or measured schedule",
                          formatter_class=fmt, description="Draw a Gantt chart of a simulated schedule (the "
                          "schedule flags) or of a measured run (--trace).")
    _schedule_flags(plot, cost_flags=True, required=False)
    plot.add_argument("--trace", help="a Chrome trace written by a recipe with trace: true")
    plot.add_argument("--out", required=True, help="the PNG to write")
    plot.set_defaults(func=_plot)
    plan = sub.add_parser("plan", help="every rank's memory and the predicted step time of a recipe",
                          formatter_class=fmt, epilog=PATHS_NOTE,
                          description="Print every rank's parameter, gradient, optimizer-state and activation bytes "
                                      "and the predicted step time of a recipe; exit status 1 when a rank does not "
                                      "fit.")
    plan.add_argument("recipe", help=RECIPE_HELP)
    plan.add_argument("--profile", help="a cost profile (mpipe-hf profile); estimated from the config without")
    plan.add_argument("--tokens", type=int, default=None, help="tokens per micro-batch, for the estimate (default: "
                      "data.max_tokens_per_micro with data.packing, else 2048)")
    plan.add_argument("--image-tokens", type=int, default=None,
                      help="image tokens per micro-batch (estimate; default: half the tokens, at most --tokens)")
    plan.add_argument("--tflops", type=float, default=989.0, help="peak TFLOP/s of one device (H100 bf16 dense)")
    plan.add_argument("--mfu", type=float, default=0.4, help="share of the peak reached (estimate)")
    plan.add_argument("--gpu-gib", type=float, default=80.0, help="device memory in GiB")
    plan.set_defaults(func=_plan)
    prof = sub.add_parser("profile", help="measure a cost profile of a recipe's model on one process",
                          formatter_class=fmt, epilog=PATHS_NOTE,
                          description="Measure a cost profile of a recipe's model and data on one process.")
    prof.add_argument("recipe", help=RECIPE_HELP)
    prof.add_argument("--out", default="profile.yaml", help="the profile YAML to write")
    prof.set_defaults(func=_profile)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run ``mpipe-hf`` with ``argv`` (default ``sys.argv[1:]``). A bad recipe or flag (a ``ValueError``) exits
    with status 1 and one line ``mpipe-hf: error: ...`` on stderr; argparse's own errors exit with status 2."""
    args = _parser().parse_args(argv)
    try:
        args.func(args)
    except ValueError as err:
        sys.exit(f"mpipe-hf: error: {err}")


if __name__ == "__main__":
    main()
