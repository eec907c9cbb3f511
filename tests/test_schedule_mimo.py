"""The MIMO-style layout in the simulator (``mpipe_hf.schedule.mimo``): the tower on ranks of its own, its features
sent to text stage 0 and their gradients back; and what ``scripts/bench/bench_schedules.py`` measures it with: the
tower whose cost varies per micro-batch, MPipe's load-aware owners there, the frozen tower a step ahead, and where
a step's time went."""

import os
import re

import pytest

from mpipe_hf.schedule import Costs, ScheduleConfig, build_schedule, simulate
from mpipe_hf.schedule.actions import Action, Kind
from mpipe_hf.schedule.mimo import best_mimo, mimo_orders, tower_owners


def text_orders(ranks=2, vpp=1, micro=2):
    return build_schedule(ScheduleConfig(ranks, vpp, micro, "identity"))


def test_the_text_waits_for_each_feature_and_the_tower_for_each_gradient():
    # tower forwards end at 10 and 20; text rank 0 (1F1B, two forwards warm-up) runs micro 1's forward at 20-21, then
    # micro 0's backward (21-23: its gradient back at 23) and micro 1's (25-27, after stage 1's 22-24... 23-25);
    # the tower's backwards (5 each) run 23-28 and 28-33
    orders = mimo_orders(text_orders(), 1, trainable=True)
    sim = simulate(orders, Costs(forward=1.0, backward=2.0, preprocess_forward=10.0, preprocess_backward=5.0))
    assert sim.makespan == pytest.approx(33.0)
    kinds = [a.kind for a in orders[0]]
    assert kinds.count(Kind.TRANSPOSE_FWD) == 2 and kinds.count(Kind.TRANSPOSE_BWD) == 2
    assert sum(a.kind is Kind.FWD_RECV for a in orders[1]) == 2  # on the rank of text stage 0
    assert all(a.peer is None or a.peer >= 1 for r in (1, 2) for a in orders[r] if a.kind is not Kind.GRAD_SEND
               and a.kind is not Kind.FWD_RECV)


def test_a_frozen_tower_sends_no_gradient_and_more_towers_share_the_work():
    one = simulate(mimo_orders(text_orders(micro=4), 1, False), Costs(1.0, 2.0, 10.0, 0.0))
    two = simulate(mimo_orders(text_orders(micro=4), 2, False), Costs(1.0, 2.0, 10.0, 0.0))
    assert not any(a.kind is Kind.GRAD_SEND for order in one.timeline.values() for a in (e.action for e in order))
    assert one.makespan >= 40.0 and two.makespan < one.makespan


def test_towers_take_micro_batches_by_list_scheduling():
    assert tower_owners(4, 2) == [0, 1, 0, 1]
    assert tower_owners(4, 2, (3.0, 1.0, 1.0, 1.0)) == [0, 1, 1, 1]
    with pytest.raises(ValueError, match="at least one tower"):
        tower_owners(4, 0)


def test_the_best_lead_is_no_slower_than_every_forward_first():
    text = build_schedule(ScheduleConfig(2, 2, 8, "identity"))
    costs = Costs(0.5, 1.0, 1.0, 2.0)
    best, _, _ = best_mimo(text, 1, True, costs)
    assert best.makespan <= simulate(mimo_orders(text, 1, True), costs).makespan + 1e-9


def test_a_text_schedule_with_a_collective_is_refused():
    text = text_orders()
    text = {r: order + [Action(Kind.GRAD_REDUCE)] for r, order in text.items()}
    with pytest.raises(ValueError, match="collective"):
        mimo_orders(text, 1, True)


def test_filling_with_zero_bubble_takes_weights_for_this_step_and_the_next():
    # placement fill weighs 2M micros (this step's and the next's); the zero-bubble placement runs before the
    # look-ahead and must see this step's M of them
    micro = 4
    weights = (1.5, 0.5, 1.0, 1.0) * 2
    costs = Costs(1.0, 2.0, 1.0, 0.0, weight=1.0, micro_preprocess_weights=weights)
    orders = build_schedule(ScheduleConfig(2, 2, micro, "frozen", placement="fill", zero_bubble=True), costs,
                            own=False, ahead=True)
    assert simulate(orders, costs).makespan > 0


BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "bench")


@pytest.fixture
def bench(monkeypatch):
    """The benchmark's modules, with every sleep recorded instead of slept (seconds, in call order)."""
    monkeypatch.syspath_prepend(BENCH)
    import bench_schedules_stages
    import bench_schedules_varying
    import sleeping
    slept = []
    monkeypatch.setattr(sleeping.time, "sleep", slept.append)
    return bench_schedules_varying, bench_schedules_stages, slept


def tower_sleeps(slept, body=0.010):
    """The sleeps that are not the body's (every body sleep of the tiny stages is ``body`` seconds)."""
    return [s for s in slept if s != pytest.approx(body)]


def test_a_varying_tower_sleeps_each_micro_batchs_own_cost(bench):
    varying, stages_module, slept = bench
    weights, pf, pb = (0.5, 2.0, 1.0), 0.003, 0.007
    body = stages_module.stage_costs(0.0, 0.0)  # 10 ms forward, 10 + 10 ms backward per stage
    inside = varying.VaryingStages(body, pf, pb, weights, transposed=False)
    (rows,), _ = inside.torch_inputs(len(weights))
    for m, w in enumerate(weights):  # torch's stage 0: micro m is row m of the batch
        slept.clear()
        inside.torch_stage(0)(rows[m:m + 1]).sum().backward()
        assert tower_sleeps(slept) == pytest.approx([pf * w, pb * w])
        slept.clear()  # our executor's stage 0, P inside it: micro m from load(m)
        inside.stage(0, False)(inside.load(m))["hidden_states"].sum().backward()
        assert tower_sleeps(slept) == pytest.approx([pf * w, pb * w])
    transposed = varying.VaryingStages(body, pf, pb, weights, transposed=True)
    slept.clear()
    transposed.preprocess()(transposed.load(1))["feat"].sum().backward()
    assert slept == pytest.approx([pf * weights[1], pb * weights[1]])
    slept.clear()  # control: transposed, stage 0 is the body alone (P is not counted twice)
    transposed.stage(0, False)(transposed.load(1))["hidden_states"].sum().backward()
    assert tower_sleeps(slept) == [] and len(slept) == 3


def test_mpipe_owners_at_a_varying_point_are_the_trainers_balanced_owners(bench):
    varying, _, _ = bench
    from mpipe_hf.schedule.owners import owner_loads, step_owners
    weights = (3.0, 0.2, 0.2, 0.2, 2.0, 0.2, 0.2, 0.2)
    model = Costs(1.0, 2.0, 0.5, 0.0)
    prefix = ScheduleConfig(4, 2, 8, "frozen")
    owners = varying.balanced_owners(prefix, weights, model)
    assert owners == step_owners("balanced", weights, prefix)
    assert max(owner_loads(weights, owners, 4)) < max(owner_loads(weights, [m % 4 for m in range(8)], 4))
    fill = ScheduleConfig(4, 2, 8, "frozen", placement="fill")
    assert len(varying.balanced_owners(fill, weights, model)) == 16  # this step's and the next's, alike
    assert varying.balanced_owners(ScheduleConfig(4, 2, 8, "frozen", overflow="min"), weights, model) is None


def test_a_frozen_mimo_tower_a_step_ahead_costs_its_busiest_rank(bench):
    import bench_schedules_mimo
    import bench_schedules_profiles
    weights = (3.0,) + (1.0,) * 15
    for pf, towers in ((0.04, 1), (0.1, 1), (0.1, 2), (0.2, 2)):
        sc = bench_schedules_mimo.text_costs(4 - towers)
        text = simulate(build_schedule(ScheduleConfig(4 - towers, 2, 16, "identity", zero_bubble=True)),
                        Costs(sc.fwd, sc.bwd, weight=sc.bwd_w)).makespan
        sim = bench_schedules_profiles.mimo_simulation("zb", towers, 16, pf, 0.0, weights, {})
        owners = tower_owners(16, towers, weights)
        busiest = max(sum(pf * w for w, o in zip(weights, owners) if o == t) for t in range(towers))
        assert sim.makespan == pytest.approx(max(text, busiest))
        assert len(sim.timeline) == 4  # the tower ranks are in its bubble and imbalance


def test_where_a_step_went_adds_up_to_the_measured_step(bench):
    varying, _, _ = bench
    text = build_schedule(ScheduleConfig(2, 1, 4, "identity"))

    def simulate_with(latency, dispatch):
        return simulate(text, Costs(1.0, 2.0, latency=0.1 if latency else 0.0, dispatch=0.05 if dispatch else 0.0))
    line = varying.time_split(simulate_with, 20.0, 12.0)
    parts = [float(p) for p in re.findall(r" ([+-][0-9.]+)", line)]  # bubble, transfer, dispatch, the rest
    assert line.startswith("20.000 s = work / R 12.000") and 12.0 + sum(parts) == pytest.approx(20.0, abs=2e-3)
    assert parts[1] > 0 and parts[2] > 0
