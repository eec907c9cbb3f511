"""The discrete-event simulator against schedules whose bubbles are known in closed form, its deadlock report,
and the pictures: a Gantt PNG and a Chrome trace that reads back."""

import json

import pytest

from mpipe_hf.schedule import Action, Kind, ScheduleConfig, build_schedule
from mpipe_hf.schedule.simulate import Costs, Deadlock, Event, simulate


def gpipe(pp_size, num_micro):
    """GPipe: every forward, then every backward in reverse (Huang et al. 2019)."""
    orders = {}
    for r in range(pp_size):
        order = []
        for m in range(num_micro):
            order += [Action(Kind.RECV_F, m, r, r - 1)] if r else []
            order += [Action(Kind.F, m, r)] + ([Action(Kind.SEND_F, m, r, r + 1)] if r < pp_size - 1 else [])
        for m in reversed(range(num_micro)):
            order += [Action(Kind.RECV_B, m, r, r + 1)] if r < pp_size - 1 else []
            order += [Action(Kind.B, m, r)] + ([Action(Kind.SEND_B, m, r, r - 1)] if r else [])
        orders[r] = order
    return orders


@pytest.mark.parametrize("pp_size,num_micro", [(2, 1), (3, 5), (4, 8), (8, 3)])
def test_gpipe_bubble_is_known(pp_size, num_micro):
    sim = simulate(gpipe(pp_size, num_micro), Costs(forward=1.0, backward=2.0))
    expected = (pp_size - 1) / (num_micro + pp_size - 1)
    assert all(b == pytest.approx(expected) for b in sim.bubble.values()), (sim.bubble, expected)
    assert sim.makespan == pytest.approx((num_micro + pp_size - 1) * 3.0)
    assert sim.peak_activations == {r: num_micro for r in range(pp_size)}


@pytest.mark.parametrize("pp_size,vpp,num_micro", [(4, 1, 8), (4, 2, 8), (4, 2, 16), (2, 3, 4), (3, 2, 6)])
def test_interleaved_1f1b_bubble_is_known(pp_size, vpp, num_micro):
    """With M a multiple of R and uniform costs, interleaved 1F1B idles (R - 1) / (V M + R - 1) (Narayanan et
    al. 2021); V = 1 is 1F1B, GPipe's bubble with fewer activations."""
    sim = simulate(build_schedule(ScheduleConfig(pp_size, vpp, num_micro, "identity")), Costs(1.0, 2.0))
    assert sim.mean_bubble == pytest.approx((pp_size - 1) / (vpp * num_micro + pp_size - 1))


def test_transfer_latency_and_bandwidth_add_to_the_critical_path():
    """GPipe's critical path crosses R - 1 links forward and R - 1 back: latency plus bytes over bandwidth each."""
    costs = Costs(forward=1.0, backward=2.0, latency=0.25, bandwidth=100.0, message_bytes={"F": 50.0, "B": 25.0})
    sim = simulate(gpipe(4, 6), costs)
    assert sim.makespan == pytest.approx((6 + 3) * 3.0 + 3 * (0.25 + 0.5) + 3 * (0.25 + 0.25))


def test_dispatch_holds_every_action():
    """One micro through GPipe: every action is on the critical path (2 R computes, 4 (R - 1) sends and
    receives), and each holds its rank ``dispatch`` longer."""
    sim = simulate(gpipe(4, 1), Costs(forward=1.0, backward=2.0, dispatch=0.1))
    assert sim.makespan == pytest.approx(4 * 3.0 + (2 * 4 + 4 * 3) * 0.1)
    assert simulate(gpipe(4, 1), Costs(forward=1.0, backward=2.0)).makespan == pytest.approx(12.0)


def test_mpipe_preprocess_runs_on_the_owners_in_parallel():
    sim = simulate(build_schedule(ScheduleConfig(4, 2, 8, "frozen")), Costs(preprocess_forward=3.0))
    firsts = {r: next(e for e in events if e.action.kind is Kind.TRANSPOSE_FWD) for r, events in sim.timeline.items()}
    assert {e.start for e in firsts.values()} == {0.0}
    assert sim.peak_activations == {0: 11, 1: 9, 2: 7, 3: 5}


def test_a_broken_order_is_reported_as_a_deadlock_naming_who_waits_for_whom():
    orders = gpipe(2, 2)
    orders[0] = orders[0][4:] + orders[0][:4]  # rank 0 waits for a gradient before it sends any activation
    with pytest.raises(Deadlock, match=r"ranks 0 -> 1 -> 0 wait on each other; rank 0 waits at 0RECV_B1@1 for "
                                       r"rank\(s\) \[1\]; rank 1 waits at 1RECV_F0@0 for rank\(s\) \[0\]") as err:
        simulate(orders)
    assert set(err.value.waits) == {0, 1}


def test_messages_paired_in_different_orders_are_reported():
    orders = gpipe(2, 2)
    orders[1][0], orders[1][3] = orders[1][3], orders[1][0]  # rank 1 receives micro 1 before micro 0
    with pytest.raises(Deadlock, match=r"rank 0's message number 0 to rank 1 is \('F', 0, 0\), but rank 1 expects"):
        simulate(orders)


def test_a_collective_some_rank_never_reaches_is_a_deadlock():
    orders = build_schedule(ScheduleConfig(2, 1, 2, "trainable", owner_backward=True))
    orders[1] = [a for a in orders[1] if a.kind is not Kind.GRAD_REDUCE]
    with pytest.raises(Deadlock, match="rank 0 waits at GRAD_REDUCE for rank\\(s\\) \\[1\\]"):
        simulate(orders)


def test_gantt_png_and_chrome_trace(tmp_path):
    from PIL import Image

    from mpipe_hf.schedule.trace import chrome_trace, plot_gantt, read_chrome_trace
    sim = simulate(build_schedule(ScheduleConfig(4, 2, 8, "trainable")), Costs(preprocess_forward=2.0))
    png = tmp_path / "gantt.png"
    plot_gantt(sim.timeline, str(png), "MPipe R=4 V=2 M=8")
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size[0] > 1000 and len(image.convert("RGB").getcolors(maxcolors=1 << 16) or []) > 4
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(chrome_trace(sim.timeline, unit_s=1e-3)))
    back = read_chrome_trace(str(path))
    assert sorted(back) == [0, 1, 2, 3]
    for rank, events in sim.timeline.items():
        by_action = {str(e.action): e for e in back[rank]}
        assert len(by_action) == len(events)
        for e in events:
            assert by_action[str(e.action)].end - by_action[str(e.action)].start == pytest.approx(
                (e.end - e.start) * 1e-3, abs=1e-9)
    assert isinstance(back[0][0], Event)


FILL_GRID = [(r, v, m, pf, ov) for r, v, m in [(2, 2, 4), (3, 1, 5), (4, 2, 8), (4, 1, 3), (3, 3, 7)]
             for pf in (1.0, 4.0) for ov in ("full", "min")]


@pytest.mark.parametrize("pp_size,vpp,num_micro,pf,overflow", FILL_GRID)
def test_bubble_filling_keeps_the_schedule_valid_and_never_slower(pp_size, vpp, num_micro, pf, overflow):
    from mpipe_hf.schedule import strip_mpipe
    costs = Costs(forward=1.0, backward=2.0, preprocess_forward=pf)
    prefix = build_schedule(ScheduleConfig(pp_size, vpp, num_micro, "frozen", overflow), costs)
    fill = build_schedule(ScheduleConfig(pp_size, vpp, num_micro, "frozen", overflow, placement="fill"), costs)
    assert strip_mpipe(fill) == strip_mpipe(prefix), "the body is untouched"
    assert {r: sorted(map(str, a)) for r, a in fill.items()} == {r: sorted(map(str, a)) for r, a in prefix.items()}
    assert simulate(fill, costs).makespan <= simulate(prefix, costs).makespan


def test_bubble_filling_moves_work_out_of_the_prefix():
    """R = 4, V = 2, M = 16, preprocess forward 4x a stage's: the fill is shorter than the prefix placement."""
    costs = Costs(forward=1.0, backward=2.0, preprocess_forward=4.0)
    prefix = simulate(build_schedule(ScheduleConfig(4, 2, 16, "frozen"), costs), costs).makespan
    fill_orders = build_schedule(ScheduleConfig(4, 2, 16, "frozen", placement="fill"), costs)
    fill = simulate(fill_orders, costs).makespan
    assert fill < prefix
    first_body = next(i for i, a in enumerate(fill_orders[1]) if a.kind is Kind.F)
    assert sum(a.kind is Kind.TRANSPOSE_FWD for a in fill_orders[1][:first_body]) < 4, "rank 1 starts its body sooner"


def test_fill_needs_a_frozen_preprocess():
    with pytest.raises(ValueError, match="placement 'fill' moves the forwards of a frozen preprocess"):
        ScheduleConfig(4, 2, 8, "trainable", placement="fill")
    with pytest.raises(ValueError, match="placement must be one of"):
        ScheduleConfig(4, 2, 8, "frozen", placement="middle")


@pytest.mark.parametrize("zero_bubble", [False, True])
def test_all_to_all_is_time_inside_the_stage_forward_and_backward(zero_bubble):
    """``Costs.all_to_all``: an ``F`` takes its stage's all-to-alls on top of its compute, a ``B`` (and a
    ``W`` that is the whole backward) the backward ones, a split ``W`` none, each scaled by its micro-batch's
    weight: the timeline equals the same schedule's with those seconds added to ``forward`` and ``backward`` (a
    zero-bubble ``weight`` kept, so the ``W`` is unchanged), and the step is longer than without them."""
    cfg = ScheduleConfig(2, 2, 6, "frozen", zero_bubble=zero_bubble)
    a2a, a2a_back = (0.3, 0.0, 0.5, 0.2), (0.25, 0.0, 0.4, 0.1)
    base = dict(forward=(1.0, 1.2, 0.8, 1.1), backward=(2.0, 2.2, 1.8, 2.4), preprocess_forward=0.7,
                weight=(1.0, 1.1, 0.9, 1.2) if zero_bubble else None, micro_weights=(1.0, 0.5, 2.0, 1.5, 1.0, 0.7))
    charged = Costs(**base, all_to_all=a2a, all_to_all_backward=a2a_back)
    folded = Costs(**{**base, "forward": tuple(f + x for f, x in zip(base["forward"], a2a)),
                      "backward": tuple(b + x for b, x in zip(base["backward"], a2a_back))})
    orders = build_schedule(cfg)
    if zero_bubble:
        assert any(a.kind is Kind.W for order in orders.values() for a in order)
    sim, ref = simulate(orders, charged), simulate(orders, folded)
    for r in orders:
        assert [e.action for e in sim.timeline[r]] == [e.action for e in ref.timeline[r]]
        assert [e.end for e in sim.timeline[r]] == pytest.approx([e.end for e in ref.timeline[r]], rel=1e-12)
    assert sim.makespan > simulate(orders, Costs(**base)).makespan
    assert Costs(**base, all_to_all=0.5).compute(Action(Kind.B, 0, 1)) == pytest.approx(2.2 + 0.5)
