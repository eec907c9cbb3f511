"""Pure schedule tests: no processes, milliseconds each."""

import itertools

import pytest
from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

from mpipe_hf.schedule import (Action, Kind, ScheduleConfig, ScheduleError, body_order, build_schedule,
                               format_schedule, parse_schedule, strip_mpipe, validate)
from mpipe_hf.schedule.actions import RECV_KINDS, SEND_TO_RECV
from mpipe_hf.schedule.interleaved import peak_in_flight
from mpipe_hf.schedule.simulate import Costs, simulate

GRID = list(itertools.product(range(1, 6), range(1, 4), range(1, 13)))


def torch_order(R, V, M, rank):
    """torch's own interleaved 1F1B compute order for one rank (its no-op slots dropped)."""
    sched = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = R, V, M
    sched.number_of_rounds = max(1, M // R)
    sched.microbatches_per_round = M // sched.number_of_rounds
    ops = sched._calculate_single_rank_operations(rank)
    return [({"FORWARD": "F", "FULL_BACKWARD": "B"}[a.computation_type.name], a.stage_index, a.microbatch_index) for a in ops if a is not None]


def torch_accepts(R, M):
    return M % max(1, M // R) == 0


@pytest.mark.parametrize("R,V,M", [g for g in GRID if torch_accepts(g[0], g[2])])
def test_body_order_equals_torch_interleaved_1f1b(R, V, M):
    for rank in range(R):
        ours = [(a.kind.value, a.stage, a.micro) for a in body_order(R, V, M, rank)]
        assert ours == torch_order(R, V, M, rank), f"rank {rank}"


def modes():
    """Every schedule mode: preprocess x overflow x owner-backward x less_memory."""
    for preprocess, overflow, owner_backward, less_memory in itertools.product(
            ("identity", "frozen", "trainable"), ("full", "min"), (False, True), (False, True)):
        if owner_backward and preprocess != "trainable":
            continue
        yield dict(preprocess=preprocess, overflow=overflow, owner_backward=owner_backward, less_memory=less_memory)


def channel_sequences(orders):
    sends, recvs = {}, {}
    for rank, actions in orders.items():
        for a in actions:
            if a.kind in SEND_TO_RECV:
                sends.setdefault((rank, a.peer), []).append(a.message())
            elif a.kind in RECV_KINDS:
                recvs.setdefault((a.peer, rank), []).append(a.message())
    return sends, recvs


@pytest.mark.parametrize("R,V,M", GRID)
def test_every_mode_is_valid_and_keeps_the_body(R, V, M):
    """SPEC.md steps 1-4 for every mode: the body survives, per-pair order, one broadcast, each remote micro
    received once, loads only by owners, P's backward exactly once per micro."""
    for mode in modes():
        cfg = ScheduleConfig(R, V, M, **mode)
        orders = build_schedule(cfg)  # validates
        assert strip_mpipe(orders) == {r: body_order(R, V, M, r, cfg.less_memory) for r in range(R)}, mode
        sends, recvs = channel_sequences(orders)
        assert sends == recvs, mode
        loads = [a.micro for acts in orders.values() for a in acts if a.kind is Kind.DATA_LOAD]
        assert sorted(loads) == list(range(M)), "every micro is loaded exactly once, by its owner"
        remote = [m for m in range(M) if cfg.owner(m) != 0]
        for rank, actions in orders.items():
            assert all(a.micro in cfg.owned(rank) for a in actions if a.kind is Kind.DATA_LOAD)
            assert sum(a.kind is Kind.PARAM_BROADCAST for a in actions) == cfg.trains_preprocess, mode
            assert sum(a.kind is Kind.GRAD_REDUCE for a in actions) == cfg.owner_backward, mode
        expected = {Kind.DATA_RECV: remote, Kind.FWD_RECV: remote if cfg.transposed else [],
                    Kind.GRAPH_RECV: remote if cfg.trains_preprocess and not cfg.owner_backward else []}
        for kind, micros in expected.items():
            assert sorted(a.micro for a in orders[0] if a.kind is kind) == micros, (mode, kind)
        p_backward = [a.micro for acts in orders.values() for a in acts
                      if a.kind is Kind.TRANSPOSE_BWD]
        assert sorted(p_backward) == (list(range(M)) if cfg.trains_preprocess else []), mode
        if not cfg.transposed:
            assert not any(a.kind is Kind.TRANSPOSE_FWD for acts in orders.values() for a in acts)


def test_min_mode_runs_overflow_inline_before_its_stage0_forward():
    cfg = ScheduleConfig(3, 2, 7, "trainable", overflow="min")
    rank0 = build_schedule(cfg)[0]
    for m in range(3, 7):
        i = rank0.index(Action(Kind.F, m, 0))
        assert rank0[i - 2:i] == [Action(Kind.DATA_LOAD, m), Action(Kind.TRANSPOSE_FWD, m)]
    assert [a.micro for a in rank0[:rank0.index(Action(Kind.F, 0, 0))] if a.kind is Kind.DATA_LOAD] == [0]


def after_the_body(cfg, orders):
    """``orders`` with owner-backward's gradients and ``P`` backwards moved after the body, as SPEC.md ("How the
    schedule is built", 4) had them: rank 0 sends every remote micro's gradient in ascending order, each owner
    receives and backprops its micros, then ``GRAD_REDUCE``."""
    moved = (Kind.GRAD_SEND, Kind.GRAD_RECV, Kind.TRANSPOSE_BWD, Kind.GRAD_REDUCE)
    out = {}
    for rank, actions in orders.items():
        keep = [a for a in actions if a.kind not in moved]
        if rank == 0:
            own = [Action(Kind.TRANSPOSE_BWD, m) for m in cfg.owned(0)]
            tail = own + [Action(Kind.GRAD_SEND, m, peer=cfg.owner(m)) for m in range(cfg.num_micro)
                          if cfg.owner(m) != 0]
        else:
            tail = [b for m in cfg.owned(rank) for b in (Action(Kind.GRAD_RECV, m, peer=0), Action(Kind.TRANSPOSE_BWD, m))]
        out[rank] = keep + tail + [Action(Kind.GRAD_REDUCE)]
    return out


@pytest.mark.parametrize("R,V,M,zero_bubble", [(3, 1, 7, False), (4, 2, 8, False), (4, 2, 16, True), (2, 3, 6, True)])
def test_owner_backward_sends_gradients_inline_and_backprops_in_the_waits(R, V, M, zero_bubble):
    """Rank 0 sends each gradient right after its stage-0 backward; every owner backprops a micro after its
    gradient arrived; and that is faster than the whole owner-backward after the body (SPEC.md's placement),
    with ``P`` as heavy as the bench's (Pf = 4 F)."""
    cfg = ScheduleConfig(R, V, M, "trainable", owner_backward=True, zero_bubble=zero_bubble)
    costs = Costs(forward=1.0, backward=2.0, preprocess_forward=4.0, preprocess_backward=8.0)
    orders = build_schedule(cfg, costs)
    rank0 = orders[0]
    for m in range(M):
        b = rank0.index(Action(Kind.B, m, 0))
        if cfg.owner(m) != 0:
            assert rank0[b + 1] == Action(Kind.GRAD_SEND, m, peer=cfg.owner(m))
        else:
            assert rank0.index(Action(Kind.TRANSPOSE_BWD, m)) > b
    for rank in range(1, R):
        actions = orders[rank]
        for m in cfg.owned(rank):
            assert actions.index(Action(Kind.GRAD_RECV, m, peer=0)) < actions.index(Action(Kind.TRANSPOSE_BWD, m))
        assert actions[-1] == Action(Kind.GRAD_REDUCE)
    assert not any(a.kind is Kind.GRAPH_SEND for acts in orders.values() for a in acts)
    suffix = after_the_body(cfg, orders)
    validate(cfg, suffix)
    assert simulate(orders, costs).makespan < simulate(suffix, costs).makespan


@pytest.mark.parametrize("R,V,M", [(4, 1, 8), (4, 2, 8), (4, 2, 16), (3, 3, 9), (2, 3, 6)])
def test_less_memory_holds_fewer_activations(R, V, M):
    deep = [peak_in_flight(body_order(R, V, M, r)) for r in range(R)]
    shallow = [peak_in_flight(body_order(R, V, M, r, less_memory=True)) for r in range(R)]
    assert all(s <= d for s, d in zip(shallow, deep)) and shallow[0] < deep[0]
    if V == 1:
        assert shallow == [R - r for r in range(R)], "classic 1F1B holds R - r micro-batches on rank r"


def test_config_rejects_owner_backward_without_trainable_preprocess():
    with pytest.raises(ValueError, match="owner_backward needs preprocess 'trainable'"):
        ScheduleConfig(2, 1, 2, "frozen", owner_backward=True)
    with pytest.raises(ValueError, match="less_memory must be true or false"):
        ScheduleConfig(2, 1, 2, less_memory="yes")
    with pytest.raises(ValueError, match="preprocess must be one of"):
        ScheduleConfig(2, 1, 2, "vision")


def test_frozen_schedule_ships_no_graph():
    orders = build_schedule(ScheduleConfig(4, 2, 8, "frozen"))
    kinds = {a.kind for acts in orders.values() for a in acts}
    assert not kinds & {Kind.GRAPH_SEND, Kind.GRAPH_RECV, Kind.TRANSPOSE_BWD, Kind.PARAM_BROADCAST}


def test_transpose_bwd_follows_stage0_backward():
    orders = build_schedule(ScheduleConfig(2, 2, 4, "trainable"))
    rank0 = orders[0]
    for i, a in enumerate(rank0):
        if a.kind is Kind.TRANSPOSE_BWD:
            assert rank0[i - 1] == Action(Kind.B, a.micro, 0)


def test_actions_print_and_parse():
    assert str(Action(Kind.F, 0, 2)) == "2F0"
    assert str(Action(Kind.SEND_F, 3, 1, 2)) == "1SEND_F3@2"
    assert Action.parse("DATA_RECV5@1") == Action(Kind.DATA_RECV, 5, None, 1)
    assert Action.parse("PARAM_BROADCAST") == Action(Kind.PARAM_BROADCAST)
    orders = build_schedule(ScheduleConfig(3, 2, 5, "trainable"))
    assert parse_schedule(format_schedule(orders)) == orders
    with pytest.raises(ValueError, match="cannot parse"):
        Action.parse("2X0")


def test_validator_rejects_swapped_receives():
    cfg = ScheduleConfig(2, 2, 4, "frozen")
    orders = build_schedule(cfg)
    rank1 = orders[1]
    i, j = [k for k, a in enumerate(rank1) if a.kind is Kind.RECV_F][:2]
    rank1[i], rank1[j] = rank1[j], rank1[i]
    with pytest.raises(ScheduleError, match="sends"):
        validate(cfg, orders)


def test_validator_rejects_backward_before_forward():
    cfg = ScheduleConfig(1, 1, 2)
    orders = build_schedule(cfg)
    f = orders[0].index(Action(Kind.F, 1, 0))
    b = orders[0].index(Action(Kind.B, 1, 0))
    orders[0][f], orders[0][b] = orders[0][b], orders[0][f]
    with pytest.raises(ScheduleError, match="before its forward"):
        validate(cfg, orders)


def test_validator_detects_a_hang():
    cfg = ScheduleConfig(2, 1, 2, "frozen")
    orders = build_schedule(cfg)
    # rank 0 waits for the first backward gradient before it sends any forward: a cyclic wait.
    first_recv_b = next(a for a in orders[0] if a.kind is Kind.RECV_B)
    orders[0].remove(first_recv_b)
    orders[0].insert(orders[0].index(Action(Kind.F, 0, 0)), first_recv_b)
    with pytest.raises(ScheduleError, match="hangs"):
        validate(cfg, orders)


@pytest.mark.parametrize("field,kwargs", [
    ("num_micro", dict(pp_size=2, num_micro=0)),
    ("pp_size", dict(pp_size=0)),
    ("vpp", dict(pp_size=2, vpp=0)),
    ("preprocess", dict(pp_size=2, preprocess="warm")),
    ("overflow", dict(pp_size=2, overflow="some")),
])
def test_bad_config_names_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        ScheduleConfig(**kwargs)


def test_timeline_gantt_and_bubble():
    from mpipe_hf.schedule.simulate import simulate
    from mpipe_hf.schedule.timeline import gantt
    single = ScheduleConfig(1, 1, 3)
    assert simulate(build_schedule(single)).mean_bubble == 0.0
    cfg = ScheduleConfig(4, 2, 8, "frozen")
    sim = simulate(build_schedule(cfg))
    rows = gantt(sim.timeline).splitlines()
    assert len(rows) == 4 and len({len(r) for r in rows}) == 1
    # every rank runs the preprocess for its own two micros first, in parallel
    assert all(row.split("|")[1].startswith("PP") for row in rows)
    # 16 forwards of 1 unit and 16 backwards of 2 per rank, plus 2 preprocess units
    bars = [row.split("|")[1] for row in rows]
    assert sum(bar.count(c) for bar in bars for c in "0123456789=P") == 4 * (16 + 32 + 2)
    assert 0.0 < sim.mean_bubble < 0.5
