"""Load-aware owners: the LPT assignment, its validation, the schedules built through
``cfg.owner()``, the relabelled fast path of the executor, and ``parallel.owners: balanced`` training exactly like
one process on ragged conversation data.

The exactness of the pipelined step with other owners against the unsplit model (loss and every gradient, atol
1e-5) is in tests/test_numerics.py (``OWNER_CASES``)."""

import json
import os
import random
import sys

import pytest

from mpipe_hf.schedule import ScheduleConfig, ScheduleError, build_schedule, simulate, validate
from mpipe_hf.schedule.actions import Kind
from mpipe_hf.schedule.fill import carried_facts
from mpipe_hf.schedule.owners import (MicroCosts, balance_owners, canonical_owners, modulo_counts, modulo_owners,
                                      owner_loads, reassign, relabel, step_owners, with_owners)
from mpipe_hf.schedule.simulate import Costs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_common import (EPS, LR, conversation_rows, demo_plan, run, train_unsplit,  # noqa: E402,F401
                        write_recipe)


def ragged_costs(rng, num_micro):
    """Image tokens of ``num_micro`` micro-batches of 1 to 16 images, each of a random Qwen-like size (28 px
    patches after the 2x2 merge)."""
    sides = [224, 336, 448, 672, 896]
    return [sum((rng.choice(sides) // 28) * (rng.choice(sides) // 28) for _ in range(rng.randint(1, 16)))
            for _ in range(num_micro)]


# ---- the assignment --------------------------------------------------------------------------------------------

def test_lpt_beats_modulo_on_ragged_costs_and_is_near_the_bound():
    """Over 200 draws of ragged steps, LPT's largest owner load is never above ``m % NT``'s, is 20% lower on
    average, and stays within Graham's 4/3 bound of the lower bound max(mean load, heaviest micro)."""
    rng = random.Random(0)
    for num_micro in (8, 16):
        ratios = []
        for _ in range(200):
            costs = ragged_costs(rng, num_micro)
            lpt = max(owner_loads(costs, balance_owners(costs, 4), 4))
            modulo = max(owner_loads(costs, modulo_owners(num_micro, 4), 4))
            bound = max(sum(costs) / 4, max(costs))
            assert lpt <= modulo and lpt <= bound * 4 / 3, (costs, lpt, modulo)
            ratios.append(lpt / modulo)
        assert sum(ratios) / len(ratios) < 0.85, sum(ratios) / len(ratios)


def test_lpt_is_deterministic_and_breaks_ties_by_micro_then_count_then_rank():
    costs = [5, 3, 5, 0, 3, 0, 0, 0]
    first = balance_owners(costs, 3)
    assert all(balance_owners(list(costs), 3) == first for _ in range(5))
    # 5 (micro 0) -> 0, 5 (micro 2) -> 1, 3 (micro 1) -> 2, 3 (micro 4) -> 2 (load 3 < 5), then the zeros go to
    # the owners with the fewest micros: 0, 1, then 0, 1
    assert first == (0, 2, 1, 0, 2, 1, 0, 1)
    assert balance_owners([0] * 6, 4) == (0, 1, 2, 3, 0, 1), "zero costs spread like m % NT"
    assert balance_owners([1.0] * 8, 4) == modulo_owners(8, 4)


def test_lpt_with_counts_and_start_loads():
    costs = [9, 1, 1, 1, 1, 1, 1, 1]
    assert owner_loads(costs, balance_owners(costs, 2), 2) == [9, 7]  # unconstrained: the heavy one alone
    capped = balance_owners(costs, 2, counts=modulo_counts(8, 2))
    assert [capped.count(r) for r in range(2)] == [4, 4]
    # owner 0 starts 10 behind: everything but what it must take goes elsewhere
    assert balance_owners([1, 1, 1], 2, start=[10, 0]) == (1, 1, 1)
    assert modulo_counts(5, 4) == (2, 1, 1, 1) and canonical_owners((2, 1, 1, 1)) == modulo_owners(5, 4)
    assert canonical_owners((0, 3, 1)) == (1, 2, 1, 1)


@pytest.mark.parametrize("call,match", [
    (lambda: balance_owners([], 2), "at least one"),
    (lambda: balance_owners([1, -1], 2), r"costs\[1\] must be a finite number >= 0"),
    (lambda: balance_owners([1, float("nan")], 2), r"costs\[1\]"),
    (lambda: balance_owners([1, "2"], 2), r"costs\[1\]"),
    (lambda: balance_owners([1, 2], 0), "num_owners must be an integer >= 1"),
    (lambda: balance_owners([1, 2], 2, start=[0]), "start must give 2 loads"),
    (lambda: balance_owners([1, 2], 2, counts=[2, 1]), "counts must be 2 integers >= 0 summing to 2"),
    (lambda: step_owners("greedy", [1, 2], ScheduleConfig(2, 1, 2)), "owners must be one of"),
    (lambda: step_owners("balanced", [1, 2], ScheduleConfig(2, 1, 2, overflow="min")), "needs overflow 'full'"),
    (lambda: step_owners("balanced", [1], ScheduleConfig(2, 1, 2)), "one cost per micro-batch"),
])
def test_bad_assignment_inputs_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---- the config field ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(owners=(0, 1, 0)), r"^owners must give 4 ranks"),
    (dict(owners=(0, 1, 0, 4)), r"^owners must be ranks in \[0, 4\)"),
    (dict(owners=(0, 1, 0, -1)), r"^owners must be ranks in \[0, 4\)"),
    (dict(owners=(0, 1, 0, True)), r"^owners must be ranks"),
    (dict(owners=(0, 1, 0, 1.0)), r"^owners must be ranks"),
    (dict(owners="0101"), r"^owners must be null or a list of 4 ranks"),
    (dict(owners=(0, 1, 2, 3), overflow="min"), r"^owners needs overflow 'full'"),
    (dict(owners=(0, 1, 2, 3) * 2), r"^owners must give 4 ranks"),  # 2M only with placement fill
    (dict(owners=(0, 1, 2, 3) * 3, placement="fill"), r"^owners must give 4 \(or 8 with the look-ahead"),
])
def test_config_owners_are_validated_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ScheduleConfig(4, 1, 4, **kwargs)


def test_config_owner_and_owned_follow_the_owners_and_the_look_ahead():
    assert ScheduleConfig(3, 1, 2, owners=[1, 0]).owners == (1, 0), "a list (YAML) becomes a tuple"
    with pytest.raises(ValueError, match=r"owners must be ranks in \[0, 2\)"):
        ScheduleConfig(3, 1, 2, owners=(2, 0))  # NT = min(R, M) = 2
    cfg = ScheduleConfig(4, 2, 6, placement="fill", owners=(3, 3, 0, 1, 2, 0, 0, 1, 2, 3, 0, 1))
    assert [cfg.owner(m) for m in range(6)] == [3, 3, 0, 1, 2, 0]
    assert [cfg.owner(6 + m) for m in range(6)] == [0, 1, 2, 3, 0, 1], "micro M + m: the next step's owner"
    assert cfg.owned(3) == [0, 1] and cfg.owned(0) == [2, 5]
    plain = ScheduleConfig(4, 2, 6, placement="fill")
    assert [plain.owner(6 + m) for m in range(6)] == [plain.owner(m) for m in range(6)]
    short = with_owners(plain, (1, 1, 1, 1, 1, 1))
    assert [short.owner(6 + m) for m in range(6)] == [m % 4 for m in range(6)], "no next owners: m % NT"
    assert with_owners(plain) is plain
    with pytest.raises(ValueError, match="next_owners must give one rank per micro-batch of the next step"):
        with_owners(plain, None, (0, 1))


# ---- the schedules ---------------------------------------------------------------------------------------------

CONFIGS = [ScheduleConfig(4, 2, 8, "frozen"), ScheduleConfig(3, 1, 5, "trainable"),
           ScheduleConfig(4, 1, 6, "identity"), ScheduleConfig(2, 2, 3, "trainable", owner_backward=True),
           ScheduleConfig(4, 2, 8, "frozen", placement="fill"), ScheduleConfig(3, 2, 5, "frozen", placement="fill")]


def _variants(cfg):
    return [(True, False)] if cfg.placement == "prefix" else [(True, False), (True, True), (False, True),
                                                              (False, False)]


@pytest.mark.parametrize("base", CONFIGS, ids=lambda c: f"R{c.pp_size}V{c.vpp}M{c.num_micro}-{c.preprocess}-"
                                                        f"{c.placement}{'-ob' if c.owner_backward else ''}")
def test_schedules_with_any_owners_validate_and_the_fast_path_equals_a_build(base):
    """Random owners: every builder goes through ``cfg.owner()``; each owner loads exactly its micros and sends
    them to rank 0 type-major in ascending order, which rank 0 receives in the same order per sender. Where
    :func:`reassign` applies, the relabelled base schedule validates and runs the same actions as a full build."""
    rng = random.Random(base.num_micro)
    nt, n = base.num_owners, base.num_micro
    fast = 0
    for _ in range(4):
        owners, nxt = tuple(rng.randrange(nt) for _ in range(n)), tuple(rng.randrange(nt) for _ in range(n))
        for own, ahead in _variants(base):
            cfg = with_owners(base, owners, nxt if ahead else None)
            orders = build_schedule(cfg, None, own, ahead)
            micros = (list(range(n)) if own else []) + (list(range(n, 2 * n)) if ahead else [])
            for rank, actions in orders.items():
                loads = [a.micro for a in actions if a.kind is Kind.DATA_LOAD]
                assert sorted(loads) == [m for m in micros if cfg.owner(m) == rank]
                if rank:
                    for kind in (Kind.DATA_SEND, Kind.FWD_SEND):
                        sent = [a.micro for a in actions if a.kind is kind]
                        assert sent == sorted(sent) == [m for m in micros if cfg.owner(m) == rank] or \
                            not cfg.transposed and kind is Kind.FWD_SEND
            for sender in range(1, base.pp_size):  # rank 0 receives in each sender's order
                for send, recv in ((Kind.DATA_SEND, Kind.DATA_RECV), (Kind.FWD_SEND, Kind.FWD_RECV)):
                    assert [a.micro for a in orders[0] if a.kind is recv and a.peer == sender] == [
                        a.micro for a in orders[sender] if a.kind is send]
            cheap = reassign(cfg, own, ahead)
            if cheap is None:
                continue
            fast += 1
            relabelled = {r: relabel(a, cheap[1]) for r, a in build_schedule(cheap[0], None, own, ahead).items()}
            validate(cfg, relabelled, None if own else carried_facts(cfg))
            for rank in orders:
                assert sorted(map(str, relabelled[rank])) == sorted(map(str, orders[rank]))
    applies = not base.owner_backward
    assert (fast > 0) == applies, fast


def test_fast_path_bases_are_few_and_modulo_counts_reuse_the_default_schedule():
    cfg = ScheduleConfig(4, 2, 8, "frozen")
    owners = balance_owners([5, 1, 9, 2, 2, 7, 3, 3], 4, counts=modulo_counts(8, 4))
    base, mapping = reassign(with_owners(cfg, owners))
    assert base == cfg and mapping, "the counts of m % NT: the default schedule, relabelled"
    fill = ScheduleConfig(4, 2, 8, "frozen", placement="fill")
    base, mapping = reassign(with_owners(fill, owners, (3, 3, 3, 3, 2, 1, 0, 0)), own=False, ahead=True)
    assert base.owners[:8] == modulo_owners(8, 4) and base.owners[8:] == canonical_owners((2, 1, 1, 4))
    assert set(mapping) <= set(range(8, 16)), "only the look-ahead micros are relabelled"
    assert reassign(with_owners(fill, owners), own=False, ahead=False) == (fill, {})
    assert reassign(with_owners(fill, owners), own=True, ahead=False) is None, "due at F(0, m): built"


def test_a_mismatched_owner_view_is_caught_by_validation():
    """Two ranks that disagree on the owners post different messages: the validator names the pair (the
    executor cannot check this without a collective; every rank derives the owners from the same data)."""
    a = build_schedule(ScheduleConfig(3, 1, 6, owners=(0, 1, 2, 0, 1, 2)))
    b = build_schedule(ScheduleConfig(3, 1, 6, owners=(0, 2, 1, 0, 1, 2)))
    with pytest.raises(ScheduleError):
        validate(ScheduleConfig(3, 1, 6), {0: a[0], 1: b[1], 2: b[2]})


def test_balanced_owners_shorten_the_simulated_prefix_step():
    """R = 4, V = 2, M = 8, body F = 10 ms and B = 20 ms, ``P`` proportional to ragged image tokens (heaviest
    micro 40 ms): LPT's step is never longer than ``m % NT``'s, and shorter on average."""
    rng = random.Random(3)
    gains = []
    for _ in range(10):
        tokens = ragged_costs(rng, 8)
        costs = MicroCosts.of(Costs(0.010, 0.020), [0.040 * t / max(tokens) for t in tokens])
        cfg = ScheduleConfig(4, 2, 8, "frozen")
        modulo = simulate(build_schedule(cfg, costs), costs).makespan
        lpt = simulate(build_schedule(with_owners(cfg, balance_owners(tokens, 4)), costs), costs).makespan
        assert lpt <= modulo + 1e-9
        gains.append(modulo - lpt)
    assert sum(gains) > 0


def test_micro_costs_give_each_micro_its_own_preprocess_cost():
    from mpipe_hf.schedule.actions import Action
    costs = MicroCosts.of(Costs(1.0, 2.0, 0.5, 0.25), [3.0, 4.0], [6.0])
    assert costs.compute(Action(Kind.TRANSPOSE_FWD, 1)) == 4.0
    assert costs.compute(Action(Kind.TRANSPOSE_FWD, 2)) == 0.5, "past the tuple: the uniform cost"
    assert costs.compute(Action(Kind.TRANSPOSE_BWD, 0)) == 6.0 and costs.compute(Action(Kind.F, 0, 0)) == 1.0
    with pytest.raises(ValueError, match=r"forward\[0\] must be a finite number >= 0"):
        MicroCosts.of(None, [-1.0])


# ---- the recipe and the trainer --------------------------------------------------------------------------------

def test_recipe_owners_policy():
    from mpipe_hf.train.recipe import ParallelSection
    section = ParallelSection(pp_size=2, num_micro=4, owners="balanced")
    assert section.owners == "balanced" and section.schedule().owners is None
    assert section.owner(3) == 1 and section.assignment is None
    assert ParallelSection(pp_size=2).owners == "modulo"
    with pytest.raises(ValueError, match=r"^parallel\.owners must be one of \('modulo', 'balanced'\)"):
        ParallelSection(pp_size=2, owners="lpt")



def test_balanced_owners_train_exactly_like_one_process(demo, tmp_path):  # noqa: F811 - the fixture
    """``parallel.owners: balanced`` through ``mpipe-hf train`` at R = 2, M = 4, placement fill with look-ahead
    (each step also loads the next step's micros, whose owners differ), on conversation rows with 0 to 3 images:
    the per-micro image tokens every rank counts from the image headers equal the collated micro-batches' image
    tokens; each rank loads exactly the micros the LPT owners give it (the trace: step 0's micros ``m`` in step 0,
    each later step's as look-ahead micros ``M + m`` of the step before); the losses, gradient norms and the
    trained model equal one process's."""
    import shutil

    import torch
    from transformers import AutoModelForImageTextToText

    from mpipe_hf.schedule.trace import read_chrome_trace
    from mpipe_hf.train.recipe import TrainSection
    from mpipe_hf.train.trainer import owner_costs
    data = tmp_path / "data"
    data.mkdir()
    names = sorted(os.listdir(os.path.join(demo, "data", "images")))[:6]
    for name in names:
        shutil.copy(os.path.join(demo, "data", "images", name), data / name)
    rows = conversation_rows(names)
    rows[5]["images"] = [names[0]]  # no bad image here
    with open(data / "conv.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    steps = 3
    keys = dict(path=str(data / "conv.jsonl"), shuffle=False, micro_batch_size=1, num_micro=4, vpp=1,
                max_steps=steps, owners="balanced", placement="fill", trace=True)
    out = str(tmp_path / "out")
    run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train",
         write_recipe(demo, tmp_path / "balanced.yaml", out, **keys)])
    plan = demo_plan(demo, str(data / "conv.jsonl"), num_micro=4, micro_batch_size=1, shuffle=False)
    model = AutoModelForImageTextToText.from_pretrained(os.path.join(demo, "model"), dtype=torch.float32)
    image_token = model.config.image_token_id
    row_costs = owner_costs(plan.dataset, model.config)
    cfg = ScheduleConfig(2, 1, 4, placement="fill")
    expected = {0: [], 1: []}
    changed = False
    for step in range(steps):
        costs = plan.micro_costs(step, row_costs)
        assert costs == [int((plan.load(step, m)["input_ids"] == image_token).sum()) for m in range(4)]
        owners = step_owners("balanced", costs, cfg)
        changed |= owners != modulo_owners(4, 2)
        for m, r in enumerate(owners):
            expected[r].append(m if step == 0 else 4 + m)
    assert changed, "the balanced owners are m % NT in every step: the test shows nothing"
    timeline = read_chrome_trace(os.path.join(out, "trace.json"))
    for rank, events in timeline.items():
        loads = sorted(e.action.micro for e in events if e.action.kind is Kind.DATA_LOAD)
        assert loads == sorted(expected[rank]), (rank, loads, expected[rank])
    model.model.visual.requires_grad_(False)
    train = TrainSection(max_steps=steps, learning_rate=LR, adam_epsilon=EPS)
    losses, norms, micros = train_unsplit(model, plan, 4, steps, train)
    metrics = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert len(metrics) == steps
    for row, loss, norm in zip(metrics, losses, norms):
        assert abs(row["loss"] - loss) < 1e-4 and abs(row["grad_norm"] - norm) < 1e-4 * norm, (row, loss, norm)
    loaded = AutoModelForImageTextToText.from_pretrained(os.path.join(out, "checkpoint"))
    with torch.no_grad():
        inputs = {k: v for k, v in micros[0].items() if k != "labels"}
        assert (loaded(**inputs).logits - model(**inputs).logits).abs().max().item() < 1e-4


def test_the_balanced_policy_keeps_the_modulo_counts_when_that_costs_little():
    """``step_owners("balanced")`` keeps ``m % NT``'s counts (the default schedule, relabelled) when the largest
    load stays within 5% of free LPT's, and takes free LPT otherwise."""
    cfg = ScheduleConfig(4, 2, 8)
    rng = random.Random(5)
    kept = 0
    for _ in range(50):
        costs = ragged_costs(rng, 8)
        owners = step_owners("balanced", costs, cfg)
        best = max(owner_loads(costs, balance_owners(costs, 4), 4))
        assert max(owner_loads(costs, owners, 4)) <= best * 1.05
        kept += tuple(owners.count(r) for r in range(4)) == modulo_counts(8, 4)
    assert kept >= 30, kept  # 34 of 50 at M = 8
    skewed = [10, 3, 3, 3, 3]  # M = 5, NT = 4: with the counts (2, 1, 1, 1) the heavy micro gets company (13)
    assert step_owners("balanced", skewed, ScheduleConfig(4, 1, 5)) == balance_owners(skewed, 4) == (0, 1, 2, 3, 1)
    assert step_owners("modulo", skewed, ScheduleConfig(4, 1, 5)) is None


def test_the_balanced_policy_keeps_the_modulo_counts_under_placement_fill():
    skewed = [10, 3, 3, 3, 3]
    owners = step_owners("balanced", skewed, ScheduleConfig(4, 1, 5, placement="fill"))
    assert tuple(owners.count(r) for r in range(4)) == modulo_counts(5, 4) and owners[0] == 0


def test_fill_headroom_is_each_owners_idle_end_and_shifts_the_load_to_it():
    """Rank ``r`` of the interleaved body ends about ``r`` backwards (B = 2) before rank 0; with that headroom the
    balanced owners give the later ranks more of the next step's ``P``, and the simulated steady fill step is no
    longer than with plain LPT."""
    from mpipe_hf.schedule.owners import fill_headroom
    cfg = ScheduleConfig(4, 1, 8, "frozen", placement="fill")
    room = fill_headroom(cfg)
    assert room == pytest.approx([0.0, 2.0, 4.0, 6.0])
    tokens = [8, 7, 6, 5, 4, 3, 2, 1]  # in the unit of the headroom; fill keeps 2 micros an owner
    plain, shifted = step_owners("balanced", tokens, cfg), step_owners("balanced", tokens, cfg, room)
    assert owner_loads(tokens, plain, 4) == [9] * 4 and owner_loads(tokens, shifted, 4) == [6, 8, 10, 12]
    costs = MicroCosts.of(Costs(), [0.0] * 8 + [1.0] * 8)

    def step(nxt):
        c = with_owners(cfg, None, nxt)
        base, mapping = reassign(c, own=False, ahead=True)
        return simulate({r: relabel(a, mapping) for r, a in build_schedule(base, None, False, True).items()},
                        costs).makespan
    assert step(shifted) <= step(plain)
    with pytest.raises(ValueError, match="headroom must give 4 times"):
        step_owners("balanced", tokens, cfg, [1.0])
    with pytest.raises(ValueError, match="headroom is that of placement 'fill'"):
        fill_headroom(ScheduleConfig(4, 1, 8))
