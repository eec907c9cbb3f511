"""Packed costs: the simulator takes per-micro costs (``Costs.micro_weights``, ``micro_preprocess_weights``),
``mpipe_hf.train.plan_packing`` weighs a packed step against the profile's micro-batch and against the same rows
padded, ``mpipe-hf simulate --micro-weights`` and ``mpipe-hf plan`` (``data.packing``) show it."""

import dataclasses
import math
import os
import re

import pytest
import yaml

from mpipe_hf.data.packing import PackedPlan
from mpipe_hf.schedule import ScheduleConfig, build_schedule
from mpipe_hf.schedule.actions import Action, Kind
from mpipe_hf.schedule.simulate import Costs, simulate
from mpipe_hf.schedule.tune import Profile, costs_for
from mpipe_hf.train.plan_packing import (StepMicros, mean_tokens, micro_weights, packed_micros, padded_micros,
                                         simulate_micros)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BODY = Costs(forward=1.0, backward=2.0)


def busy(sim) -> float:
    return sum(e.end - e.start for events in sim.timeline.values() for e in events if e.busy)


@pytest.mark.parametrize("vpp", [1, 2])
def test_one_heavy_micro_makes_a_larger_bubble_than_the_same_total_spread_evenly(vpp):
    """1F1B and interleaved 1F1B, R = 4, M = 8: one micro costing 4.5 times the others' 0.5 (total 8, as eight
    1s) does the same work, so the step is longer exactly by the extra idle time: the heavy micro's ``F`` and
    ``B`` pass every rank in turn while the others wait."""
    cfg = ScheduleConfig(4, vpp, 8, "identity")
    orders = build_schedule(cfg)
    even = simulate(orders, dataclasses.replace(BODY, micro_weights=(1.0,) * 8))
    heavy = simulate(orders, dataclasses.replace(BODY, micro_weights=(4.5,) + (0.5,) * 7))
    assert busy(heavy) == pytest.approx(busy(even)) == pytest.approx(cfg.num_stages * 8 * (1.0 + 2.0))
    assert heavy.makespan > even.makespan + 1.0
    assert heavy.mean_bubble > even.mean_bubble


def test_a_heavy_preprocess_micro_lengthens_the_step():
    """MPipe's frozen ``P`` on the owners: one micro's tower taking 8 of the 8 units (the rest 0) keeps one owner
    busy for it alone; spread evenly, the owners share it."""
    orders = build_schedule(ScheduleConfig(4, 2, 8, "frozen"))
    costs = Costs(preprocess_forward=2.0)
    even = simulate(orders, dataclasses.replace(costs, micro_preprocess_weights=(1.0,) * 8))
    heavy = simulate(orders, dataclasses.replace(costs, micro_preprocess_weights=(8.0,) + (0.0,) * 7))
    assert busy(heavy) == pytest.approx(busy(even))
    assert heavy.makespan > even.makespan


@pytest.mark.parametrize("cfg", [ScheduleConfig(4, 2, 8, "frozen"),
                                 ScheduleConfig(3, 1, 5, "identity", zero_bubble=True),
                                 ScheduleConfig(4, 1, 6, "trainable", owner_backward=True),
                                 ScheduleConfig(4, 2, 8, "frozen", placement="fill")])
def test_no_weights_is_todays_simulation_and_weights_scale_it(cfg):
    """``None`` weights and weights of 1 give the same timeline, number for number; weights all ``c`` (no
    latency or dispatch) give every event ``c`` times later and longer."""
    costs = Costs(forward=(1.0, 1.5, 0.5, 2.0, 1.0, 1.0, 1.0, 1.0), backward=(2.0, 3.0, 1.0, 4.0, 2.0, 2.0, 2.0, 2.0),
                  preprocess_forward=1.5, preprocess_backward=2.5, data_load=0.25)
    assert costs.micro_weights is None and costs.micro_preprocess_weights is None
    plain = simulate(build_schedule(cfg, costs), costs)
    ones = dataclasses.replace(costs, micro_weights=[1] * cfg.num_micro, micro_preprocess_weights=[1] * cfg.num_micro)
    assert simulate(build_schedule(cfg, ones), ones).timeline == plain.timeline
    scaled = dataclasses.replace(costs, micro_weights=(3.0,) * cfg.num_micro,
                                 micro_preprocess_weights=(3.0,) * cfg.num_micro)
    triple = simulate(build_schedule(cfg, costs), scaled)
    assert triple.makespan == pytest.approx(3 * plain.makespan)
    assert triple.bubble == pytest.approx(plain.bubble)


@pytest.mark.parametrize("field", ["micro_weights", "micro_preprocess_weights"])
@pytest.mark.parametrize("value,why", [((1.0, -0.5), r"\[1\] = -0.5"), ((math.nan,), r"\[0\] = nan"),
                                       ((1.0, math.inf), r"\[1\] = inf"), ("ab", "sequence of numbers"),
                                       (3.0, "sequence of numbers")])
def test_bad_weights_are_refused_naming_the_field(field, value, why):
    with pytest.raises(ValueError, match=f"Costs.{field}{why}" if why.startswith("\\[") else f"Costs.{field} .*{why}"):
        Costs(**{field: value})


@pytest.mark.parametrize("field", ["micro_weights", "micro_preprocess_weights"])
@pytest.mark.parametrize("count", [7, 9])
def test_weights_not_one_per_micro_are_refused_naming_the_field(field, count):
    orders = build_schedule(ScheduleConfig(4, 2, 8, "frozen"))
    with pytest.raises(ValueError, match=f"Costs.{field} gives {count} weights for a schedule of 8 micro-batches"):
        simulate(orders, Costs(**{field: (1.0,) * count}))
    kind = Kind.F if field == "micro_weights" else Kind.TRANSPOSE_FWD
    with pytest.raises(ValueError, match=f"Costs.{field} gives 2 weights, but the schedule has micro-batch 5"):
        Costs(**{field: (1.0, 1.0)}).compute(Action(kind, 5, 0))


class Rows:
    """A dataset-like object: the columns the packer and the plan read, and ``len()``."""

    def __init__(self, num_tokens, image_tokens):
        self.num_tokens, self.image_tokens = list(num_tokens), list(image_tokens)

    def __len__(self):
        return len(self.num_tokens)


def ragged_plan(num_micro=4, budget=256, seed=3):
    lengths = [40 + (i * 37) % 180 for i in range(60)]
    images = [(i * 11) % 5 * 16 for i in range(60)]
    rows = Rows(lengths, images)
    return PackedPlan(rows, list, num_micro, budget, lengths, [n + 0.5 * i for n, i in zip(lengths, images)],
                      shuffle=True, seed=seed), lengths, images


def test_packed_weights_are_each_micros_tokens_over_the_reference():
    plan, lengths, images = ragged_plan()
    micros = packed_micros(plan, step=1)
    rows = [plan.rows(1, m) for m in range(4)]
    assert micros.tokens == tuple(sum(lengths[r] for r in b) for b in rows) == micros.real_tokens
    assert micros.image_tokens == tuple(sum(images[r] for r in b) for b in rows)
    assert micros.rows == tuple(map(len, rows)) and micros.padding == 0.0
    weights, pre = micro_weights(micros, 512, 64)
    assert [w * 512 for w in weights] == pytest.approx(micros.tokens)
    assert [w * 64 for w in pre] == pytest.approx(micros.image_tokens)
    weights, pre = micro_weights(micros, *mean_tokens(micros))  # a measured profile: the step's mean micro is 1
    assert sum(weights) / len(weights) == pytest.approx(1.0) and sum(pre) / len(pre) == pytest.approx(1.0)
    assert micro_weights(micros, 512, 0)[1] is None
    with pytest.raises(ValueError, match="reference tokens must be > 0"):
        micro_weights(micros, 0, 64)


@pytest.mark.parametrize("mbs", [1, 3])
def test_padded_rows_are_the_packed_rows_and_cost_at_least_their_tokens(mbs):
    """The padded micro-batches hold the packed step's rows, ``mbs`` at a time, each costing rows x its longest."""
    plan, lengths, images = ragged_plan()
    packed, padded = packed_micros(plan), padded_micros(plan, mbs)
    assert sum(padded.rows) == sum(packed.rows) and max(padded.rows) == mbs
    assert sum(padded.real_tokens) == sum(packed.tokens) and sum(padded.image_tokens) == sum(packed.image_tokens)
    assert all(t >= r for t, r in zip(padded.tokens, padded.real_tokens))
    assert (sum(padded.tokens) > sum(packed.tokens)) == (mbs > 1), "ragged rows pad only when a micro holds two"


def test_even_micros_at_the_reference_simulate_as_the_profile_does():
    """Micros of exactly the reference's tokens are the profile's micro-batch: the plain simulation, exactly."""
    profile = Profile(num_layers=8, layer_forward_s=0.01, layer_backward_s=0.02, preprocess_forward_s=0.03,
                      head_forward_s=0.005, head_backward_s=0.01, activation_bytes=1e6, feature_bytes=2e5)
    cfg, layers = ScheduleConfig(2, 2, 4, "frozen"), [2, 2, 2, 2]
    costs = costs_for(profile, cfg, layers)
    plain = simulate(build_schedule(cfg, costs), costs)
    even = StepMicros((100,) * 4, (100,) * 4, (30,) * 4, (2,) * 4)
    got = simulate_micros(profile, cfg, layers, 0, even, (100, 30))
    assert (got.seconds, got.bubble, got.steps) == (pytest.approx(plain.makespan), pytest.approx(plain.mean_bubble), 1)
    twice = simulate_micros(profile, cfg, layers, 0, StepMicros(*(t * 2 for t in dataclasses.astuple(even))),
                            (100, 30), owners="balanced")
    assert twice.steps == 2 and twice.seconds == pytest.approx(2 * plain.makespan)


def cli_bubble(capsys, *extra):
    from mpipe_hf.cli import main
    main(["simulate", "--pp", "4", "--vpp", "2", "--micro", "8", *extra])
    return float(re.search(r"bubble ([0-9.]+)", capsys.readouterr().out).group(1))


def test_cli_simulate_takes_micro_weights(capsys):
    even = cli_bubble(capsys)
    assert cli_bubble(capsys, "--micro-weights", ",".join(["1"] * 8), "--preprocess-weights", "1,1,1,1,1,1,1,1") == even
    assert cli_bubble(capsys, "--micro-weights", "4.5," + ",".join(["0.5"] * 7)) > even
    from mpipe_hf.cli import main
    with pytest.raises(SystemExit, match="mpipe-hf: error: --micro-weights gives 2 weights for --micro 8"):
        main(["simulate", "--pp", "4", "--micro", "8", "--micro-weights", "1,2"])
    with pytest.raises(SystemExit, match="--preprocess-weights must be comma-separated numbers"):
        main(["simulate", "--pp", "4", "--micro", "8", "--preprocess-weights", "1,x,1,1,1,1,1,1"])


def demo_recipe(demo, tmp_path, **data):
    with open(os.path.join(ROOT, "recipes", "qwen2_5_vl_demo.yaml")) as f:
        raw = yaml.safe_load(f)
    raw["model"] = os.path.join(demo, "model")
    raw["data"].update({"path": os.path.join(demo, "data", "train.jsonl"), "packing": True,
                        "max_tokens_per_micro": 256, **data})
    raw["train"]["output_dir"] = str(tmp_path / "out")
    path = tmp_path / "packed.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_plan_shows_the_packed_step_against_the_padded_one(demo, tmp_path, capsys):
    from mpipe_hf.cli import main
    main(["plan", demo_recipe(demo, tmp_path)])
    out = capsys.readouterr().out
    print(out)
    assert "predicted step" in out and "packed step 0 (data.packing, 256 tokens a micro-batch" in out
    assert "estimated: 256 tokens (128 image tokens) per micro-batch" in out  # never more image tokens than tokens
    table = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)$", out, re.M)
    assert [int(m) for m, *_ in table] == list(range(8)), "one line per micro-batch of M = 8"
    assert all(int(t) <= 256 and float(f) == pytest.approx(int(t) / 256, abs=0.006) for _, _, t, f, *_ in table)
    assert all(float(w) == pytest.approx(int(t) / 256, abs=6e-3) for _, _, t, _, _, w, _ in table)  # vs the budget
    packed = re.search(r"^packed: (\d+) rows, (\d+) tokens.*: ([0-9.e-]+) s, bubble", out, re.M)
    padded = re.search(r"^padded: the same (\d+) rows .*: (\d+) tokens .*: ([0-9.e-]+) s, bubble", out, re.M)
    assert packed and padded, out
    assert packed.group(1) == padded.group(1) and int(padded.group(2)) >= int(packed.group(2))
    assert float(padded.group(3)) > float(packed.group(3))


def test_plan_without_the_data_says_why_and_plans_the_rest(demo, tmp_path, capsys):
    from mpipe_hf.cli import main
    main(["plan", demo_recipe(demo, tmp_path, path=str(tmp_path / "missing.jsonl"))])
    out = capsys.readouterr().out
    assert "predicted step" in out
    assert len(re.findall(r"^packed step: not shown, the data did not load: .*missing", out, re.M)) == 1, out
