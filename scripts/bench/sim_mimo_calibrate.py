"""MIMO's published setting in the simulator: Qwen3.5-VL 27B, the language model at TP4 x PP2 x DP2 (16 GPUs) plus
one vision rank (17 GPUs), against the best standard 16-GPU layout (the tower inside pipeline stage 0), and MPipe
Transpose on the same GPUs. Megatron-Bridge reports 1.23x to 1.45x tokens/s/GPU for the 17-GPU layout.

Usage: python scripts/bench/sim_mimo_calibrate.py [--micro 16]

Model (units: one micro-batch's text forward over the whole language model = 1): a pipeline rank is a TP4 group;
each PP2 stage's forward is 1/2, backward twice that. The tower, trained, costs ``v`` forward per micro-batch on a
TP4 group and ``2 v`` backward; on the one vision GPU it costs ``v x 4 e`` (``e``: how well the tower's forward
scales over TP4; 1 = perfectly, 0.25 = not at all, as a small ViT whose per-layer all-reduces eat the split). The vision GPU serves both
data-parallel replicas, so in one replica's simulation its cost per micro-batch is doubled (it alternates
replicas). Standard: the fastest of interleaved 1F1B (V = 1, 2) and zero-bubble, the tower in stage 0. MIMO-style:
:func:`mpipe_hf.schedule.mimo.best_mimo`, text as the standard's fastest body. MPipe: overflow ``full`` and ``min``,
owner-backward, with and without zero-bubble, on the 16 GPUs. tokens/s/GPU ratio = (16-GPU step / layout's step)
x (16 / layout's GPUs). No transfer or runtime overhead, no memory limit: the schedules alone.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

PP, GPUS = 2, 16
PUBLISHED = (1.23, 1.45)


def standard(num_micro: int, v: float):
    """The best 16-GPU layout's step and name: the tower (``v`` forward, ``2 v`` backward) inside stage 0."""
    from mpipe_hf.schedule import Costs, ScheduleConfig, build_schedule, simulate
    best = None
    for vpp in (1, 2):
        stages = PP * vpp
        fwd, bwd = [1.0 / stages] * stages, [2.0 / stages] * stages
        weight = [b / 2 for b in bwd]
        fwd[0], bwd[0], weight[0] = fwd[0] + v, bwd[0] + 2 * v, weight[0] + 2 * v
        for zb in (False, True):
            orders = build_schedule(ScheduleConfig(PP, vpp, num_micro, "identity", zero_bubble=zb))
            step = simulate(orders, Costs(tuple(fwd), tuple(bwd), weight=tuple(weight))).makespan
            if best is None or step < best[0]:
                best = (step, f"V = {vpp}{' zero-bubble' if zb else ''}")
    return best


def mimo(num_micro: int, v: float, efficiency: float):
    """The 17-GPU MIMO-style layout's step and name: one vision GPU for both replicas."""
    from mpipe_hf.schedule import Costs, ScheduleConfig, build_schedule
    from mpipe_hf.schedule.mimo import best_mimo
    best = None
    tower = v * 4 * efficiency * 2  # one GPU instead of four, serving two replicas
    for vpp in (1, 2):
        stages = PP * vpp
        for zb in (False, True):
            text = build_schedule(ScheduleConfig(PP, vpp, num_micro, "identity", zero_bubble=zb))
            sim = best_mimo(text, 1, True, Costs(1.0 / stages, 2.0 / stages, tower, 2 * tower))[0]
            if best is None or sim.makespan < best[0]:
                best = (sim.makespan, f"V = {vpp}{' zero-bubble' if zb else ''}")
    return best


def mpipe(num_micro: int, v: float):
    """MPipe Transpose on the 16 GPUs: the tower spread over the pipeline ranks' TP4 groups."""
    from mpipe_hf.schedule import Costs, ScheduleConfig, build_schedule, simulate
    best = None
    for vpp in (1, 2):
        stages = PP * vpp
        for fields in (dict(overflow="full"), dict(overflow="min"), dict(owner_backward=True)):
            for zb in (False, True):
                cfg = ScheduleConfig(PP, vpp, num_micro, "trainable", zero_bubble=zb, **fields)
                recompute = 0.0 if cfg.owner_backward else v
                costs = Costs(1.0 / stages, 2.0 / stages, v, 2 * v + recompute, weight=1.0 / stages)
                try:
                    step = simulate(build_schedule(cfg, costs), costs).makespan
                except ValueError:  # a configuration this pipeline size does not take
                    continue
                if best is None or step < best[0]:
                    best = (step, f"V = {vpp} {fields}{' zero-bubble' if zb else ''}")
    return best


def main(argv=None):
    """Print the calibration table: per tower share and TP4 efficiency, the three layouts' per-GPU ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro", type=int, default=16, help="micro-batches per replica per step")
    args = parser.parse_args(argv)
    print(f"Published (Megatron-Bridge, Qwen3.5-VL 27B): MIMO 17 GPUs / best standard 16 GPUs = {PUBLISHED[0]}x to "
          f"{PUBLISHED[1]}x tokens/s/GPU. Simulated, M = {args.micro} per replica:\n")
    print("| tower v (x text fwd) | TP4 eff. e | standard step | MIMO step | MIMO/standard per GPU | MPipe step "
          "(16 GPUs) | MPipe/standard per GPU | MPipe/MIMO per GPU | in published range |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v in (0.05, 0.1, 0.2, 0.3, 0.5):
        base, ours = standard(args.micro, v), mpipe(args.micro, v)
        for efficiency in (0.25, 0.5, 1.0):
            other = mimo(args.micro, v, efficiency)
            ratio = base[0] / other[0] * GPUS / (GPUS + 1)
            inside = PUBLISHED[0] <= ratio <= PUBLISHED[1]
            print(f"| {v:g} | {efficiency:g} | {base[0]:.3f} ({base[1]}) | {other[0]:.3f} ({other[1]}) | "
                  f"{ratio:.3f} | {ours[0]:.3f} ({ours[1]}) | {base[0] / ours[0]:.3f} | "
                  f"{other[0] / ours[0] * (GPUS + 1) / GPUS:.3f} | {'yes' if inside else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
