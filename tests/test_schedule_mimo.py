"""The MIMO-style layout in the simulator (``mpipe_hf.schedule.mimo``): the tower on ranks of its own, its features
sent to text stage 0 and their gradients back."""

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
