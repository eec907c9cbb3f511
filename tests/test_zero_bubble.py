"""Zero-bubble MPipe: the ``W`` action kind, its placement, the simulator against ZB-H1's closed form,
and the runtime's split of one stage's backward into ``B`` and ``W`` against the whole backward.

The pipelined runs (exact against the unsplit model on one process in every mode) are in
``tests/test_numerics.py::test_zero_bubble_is_exact_and_defers_weight_gradients``.
"""

import itertools

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mpipe_hf.runtime.zero_bubble import backward_input
from mpipe_hf.schedule import ScheduleConfig, build_schedule
from mpipe_hf.schedule.actions import Action, Kind, format_schedule, parse_schedule
from mpipe_hf.schedule.interleaved import peak_in_flight
from mpipe_hf.schedule.lowering import ScheduleError
from mpipe_hf.schedule.simulate import Costs, simulate
from mpipe_hf.schedule.validate import validate


def test_w_prints_and_parses():
    a = Action(Kind.W, 3, 2)
    assert str(a) == "2W3" and Action.parse("2W3") == a
    orders = build_schedule(ScheduleConfig(2, 2, 4, "trainable", zero_bubble=True))
    assert parse_schedule(format_schedule(orders)) == orders


@pytest.mark.parametrize("mode,placement,owner_backward", [
    ("identity", "prefix", False), ("frozen", "prefix", False), ("frozen", "fill", False),
    ("trainable", "prefix", False), ("trainable", "prefix", True)])
def test_every_backward_has_its_w_and_stage_0_splits_only_for_a_trainable_p(mode, placement, owner_backward):
    cfg = ScheduleConfig(3, 2, 5, mode, placement=placement, owner_backward=owner_backward, zero_bubble=True)
    orders = build_schedule(cfg)
    for rank, actions in orders.items():
        for s, m in itertools.product(range(rank, cfg.num_stages, cfg.pp_size), range(cfg.num_micro)):
            at = {k: [i for i, a in enumerate(actions) if (a.kind, a.stage, a.micro) == (k, s, m)]
                  for k in (Kind.F, Kind.B, Kind.W)}
            assert len(at[Kind.F]) == 1 and len(at[Kind.W]) == 1
            if s == 0 and mode != "trainable":  # its inputs take no gradient: the whole backward is its W
                assert at[Kind.B] == []
            else:
                assert len(at[Kind.B]) == 1 and at[Kind.F][0] < at[Kind.B][0] < at[Kind.W][0]


def test_validation_rejects_a_w_before_its_b_and_a_missing_w():
    cfg = ScheduleConfig(2, 1, 3, "identity", zero_bubble=True)
    orders = build_schedule(cfg)
    rank1 = orders[1]
    b, w = rank1.index(Action(Kind.B, 0, 1)), rank1.index(Action(Kind.W, 0, 1))
    early = rank1[:b] + [rank1[w]] + [a for i, a in enumerate(rank1[b:], b) if i != w]
    with pytest.raises(ScheduleError, match="hangs"):
        validate(cfg, {0: orders[0], 1: early})
    with pytest.raises(ScheduleError, match="misses body actions"):
        validate(cfg, {0: orders[0], 1: [a for a in rank1 if a != Action(Kind.W, 0, 1)]})
    with pytest.raises(ScheduleError, match="no place for"):  # a W in a schedule that is not zero-bubble
        plain = ScheduleConfig(2, 1, 3, "identity")
        validate(plain, {0: build_schedule(plain)[0], 1: build_schedule(plain)[1] + [Action(Kind.W, 0, 1)]})


@pytest.mark.parametrize("pp_size,num_micro", [(2, 4), (3, 6), (4, 8), (4, 16), (5, 10), (6, 12), (8, 16)])
def test_simulated_bubble_equals_zb_h1_closed_form(pp_size, num_micro):
    """ZB-H1 (Qi et al., 2024, section 3.1): with ``T_F = T_B = T_W`` and 1F1B's memory, the step takes
    ``M (T_F + T_B + T_W) + (R - 1)(T_F + T_B - T_W)``, against 1F1B's ``(M + R - 1)(T_F + T_B + T_W)``; the
    bubble is what is left of it. Preprocess 0 (identity), the classic 1F1B warm-up (``less_memory``)."""
    f = b = w = 1.0
    costs = Costs(forward=f, backward=b + w, weight=w, preprocess_forward=0.0)
    plain = simulate(build_schedule(ScheduleConfig(pp_size, 1, num_micro, "identity", less_memory=True)), costs)
    cfg = ScheduleConfig(pp_size, 1, num_micro, "identity", less_memory=True, zero_bubble=True)
    orders = build_schedule(cfg, costs)
    zb = simulate(orders, costs)
    assert plain.makespan == pytest.approx((num_micro + pp_size - 1) * (f + b + w))
    span = num_micro * (f + b + w) + (pp_size - 1) * (f + b - w)
    assert zb.makespan == pytest.approx(span)
    assert zb.mean_bubble == pytest.approx((pp_size - 1) * (f + b - w) / span)
    # memory-neutral: no rank holds more forwards in flight than 1F1B's fullest rank
    assert max(zb.peak_activations.values()) <= pp_size


@pytest.mark.parametrize("mode,placement,owner_backward,vpp", [
    ("identity", "prefix", False, 2), ("frozen", "prefix", False, 2), ("frozen", "fill", False, 2),
    ("trainable", "prefix", False, 1), ("trainable", "prefix", True, 2)])
def test_zero_bubble_is_never_slower_and_keeps_the_peak(mode, placement, owner_backward, vpp):
    costs = Costs(forward=1.0, backward=2.0, weight=1.0, preprocess_forward=2.0, preprocess_backward=4.0,
                  latency=0.05, dispatch=0.01)
    base = ScheduleConfig(4, vpp, 8, mode, placement=placement, owner_backward=owner_backward)
    zb = ScheduleConfig(4, vpp, 8, mode, placement=placement, owner_backward=owner_backward, zero_bubble=True)
    plain, split = build_schedule(base, costs), build_schedule(zb, costs)
    assert simulate(split, costs).makespan < simulate(plain, costs).makespan
    assert max(map(peak_in_flight, split.values())) <= max(map(peak_in_flight, plain.values()))


def test_split_costs_in_the_simulator():
    """A ``B`` with its ``W`` costs ``backward - weight``, the ``W`` ``weight``; a ``W`` alone the whole
    backward; ``weight=None`` is half."""
    cfg = ScheduleConfig(1, 1, 1, "trainable", zero_bubble=True)
    orders = build_schedule(cfg)
    for weight, b_cost in ((0.5, 2.5), (None, 1.5)):
        sim = simulate(orders, Costs(forward=1.0, backward=3.0, weight=weight, preprocess_forward=0.0,
                                     preprocess_backward=0.0))
        spans = {e.action.kind: e.end - e.start for e in sim.timeline[0]}
        assert spans[Kind.B] == pytest.approx(b_cost) and spans[Kind.W] == pytest.approx(3.0 - b_cost)
    alone = build_schedule(ScheduleConfig(1, 1, 1, "frozen", zero_bubble=True))
    spans = {e.action.kind: e.end - e.start for e in simulate(alone, Costs(backward=3.0, weight=1.0)).timeline[0]}
    assert Kind.B not in spans and spans[Kind.W] == pytest.approx(3.0)


class Block(nn.Module):
    def __init__(self, width=8, reentrant=None):
        super().__init__()
        self.a, self.b, self.norm = nn.Linear(width, 2 * width), nn.Linear(2 * width, width), nn.LayerNorm(width)
        self.scale = nn.Parameter(torch.ones(width))
        self.reentrant = reentrant

    def inner(self, x):
        return self.norm(x + self.b(torch.relu(self.a(x)))) * self.scale

    def forward(self, x):
        if self.reentrant is None:
            return self.inner(x)
        return checkpoint(self.inner, x, use_reentrant=self.reentrant)


def _grads(module, x, grad_out, split):
    module.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(x.requires_grad)
    out = module(x)
    if split:
        work = backward_input([out], [grad_out], [x], list(module.parameters()))
        before = {n: p.grad is not None for n, p in module.named_parameters()}
        work.run()
    else:
        out.backward(grad_out)
        before = None
    return x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}, before


@pytest.mark.parametrize("reentrant", [None, False])
def test_split_backward_equals_the_whole_backward(reentrant):
    torch.manual_seed(0)
    module = Block(reentrant=reentrant)
    x, grad_out = torch.randn(3, 5, 8, requires_grad=True), torch.randn(3, 5, 8)
    dx, grads, _ = _grads(module, x, grad_out, split=False)
    sdx, sgrads, before = _grads(module, x, grad_out, split=True)
    torch.testing.assert_close(sdx, dx, rtol=0, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(sgrads[name], grads[name], rtol=0, atol=1e-6)
    assert not any(before.values()), before  # B left every weight gradient to W


def test_split_backward_falls_back_to_the_whole_backward_where_it_cannot_split():
    torch.manual_seed(0)
    for module, needs in ((Block(), False), (Block(reentrant=True), True)):
        x, grad_out = torch.randn(2, 8, requires_grad=needs), torch.randn(2, 8)
        _, grads, _ = _grads(module, x, grad_out, split=False)
        _, sgrads, before = _grads(module, x, grad_out, split=True)
        assert all(before.values()), before  # B already ran the whole backward
        for name in grads:
            torch.testing.assert_close(sgrads[name], grads[name], rtol=0, atol=1e-6)
