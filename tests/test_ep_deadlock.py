"""Expert parallelism's all-to-all against the pipeline's P2P, on the CPU model of NCCL's streams.

The all-to-all is a collective of the EP group (the replicas of one pipeline rank) inside a stage's forward and
backward, on every MoE layer. ``tests/device_model.py`` adds it to the op order of
:func:`~mpipe_hf.schedule.eager.eager_streams` (conservative: a send waits for its rank's earlier receives, a rank's
receives complete in order, the host reads each layer's split sizes back), next to every replica's pipeline
transfers behind the connect prologue. EP peers hold the same stages and run the same schedule; each replica its
own micro-batches, so with ``owners: balanced`` its own owners. Single process, a few seconds."""

import dataclasses
import random

from device_model import ep_labels, ep_ops, ep_streams

from mpipe_hf.runtime.preload import body_signature
from mpipe_hf.schedule import Kind, ScheduleConfig, build_schedule
from mpipe_hf.schedule.simulate import Costs, split_pairs


def ep_case(rng: random.Random):
    """One configuration of the builder (zero-bubble too: ``B`` runs the all-to-alls' backward, ``W`` only the
    experts' weight GEMMs; packing changes nothing here, one all-to-all per MoE layer whatever a micro's rows), the
    schedule's build options, ``ep_size`` and each stage's MoE layers."""
    R, V = rng.randint(2, 4), rng.choice((1, 2))
    M = rng.randint(1, 2 * R)
    preprocess = rng.choice(("identity", "frozen", "trainable"))
    placement = rng.choice(("prefix", "fill")) if preprocess == "frozen" else "prefix"
    own, ahead = rng.choice(((True, False), (True, True), (False, True), (False, False))) \
        if placement == "fill" else (True, False)
    cfg = ScheduleConfig(R, V, M, preprocess=preprocess, overflow=rng.choice(("full", "min")), placement=placement,
                         owner_backward=preprocess == "trainable" and rng.random() < 0.5,
                         less_memory=rng.random() < 0.3, zero_bubble=rng.random() < 0.3 and R * V * M <= 48)
    costs = None if rng.random() < 0.5 else Costs(forward=rng.uniform(0.5, 2), backward=rng.uniform(1, 4),
                                                  preprocess_forward=rng.uniform(0.2, 3), data_load=rng.uniform(0, 1))
    return cfg, costs, own, ahead, rng.choice((2, 2, 3)), [rng.choice((0, 1, 1, 2)) for _ in range(R * V)]


def replica_orders(rng, cfg, costs, own, ahead, ep_size):
    """Each replica's action lists: the same schedule, with owners of its own (``owners: balanced`` draws them
    from each replica's micro-batches) where overflow ``full`` allows them."""
    out = []
    for _ in range(ep_size):
        run = cfg
        if cfg.overflow == "full":
            n = cfg.num_micro * (2 if cfg.placement == "fill" and ahead else 1)
            run = dataclasses.replace(cfg, owners=tuple(rng.randrange(min(cfg.pp_size, cfg.num_micro))
                                                        for _ in range(n)))
        out.append(build_schedule(run, costs, own, ahead))
    return out


def test_ep_all_to_alls_pair_up_and_never_deadlock_the_pipeline():
    """Over 24 random configurations with 2 or 3 replicas, each with owners of its own: every EP peer issues the same
    all-to-alls in the same order (the ``(kind, stage)`` sequence of a rank's ``F``/``B``/``W`` does not depend on
    the owners), and the model finishes every step."""
    rng, checked = random.Random(40), 0
    while checked < 24:
        cfg, costs, own, ahead, ep_size, moe = ep_case(rng)
        try:
            replicas = replica_orders(rng, cfg, costs, own, ahead, ep_size)
        except ValueError:  # a combination the builder refuses
            continue
        checked += 1
        R = cfg.pp_size
        for p in range(R):
            bodies = [[(a.kind, a.stage) for a in orders[p] if a.kind in (Kind.F, Kind.B, Kind.W)]
                      for orders in replicas]
            assert all(b == bodies[0] for b in bodies), (cfg, p)
            # the step's vote compares these signatures: it lets every such step run
            assert len({body_signature(orders[p]) for orders in replicas}) == 1, (cfg, p)
        ops = ep_ops(replicas, moe)
        for p in range(R):
            labels = [ep_labels(ops, e * R + p) for e in range(ep_size)]
            assert all(lab == labels[0] for lab in labels), (cfg, p)
            split = split_pairs(replicas[0][p])
            calls = sum(moe[a.stage] * (3 if a.kind is Kind.F else 2) for a in replicas[0][p]
                        if a.kind in (Kind.F, Kind.B) or (a.kind is Kind.W and (a.stage, a.micro) not in split))
            assert len(labels[0]) == calls, "every MoE layer: three all-to-alls forward, two backward"
        outcome = ep_streams(ops, R)
        assert not outcome.deadlocked, (cfg, moe, str(outcome))


def test_ep_peers_with_different_action_orders_deadlock():
    """The negative control: replica 1 runs the shallow warm-up (``less_memory``) and replica 0 does not, so the
    EP peers of a pipeline rank reach their all-to-alls in different orders: the model deadlocks (a peer waits in
    an all-to-all whose other member waits for a pipeline transfer behind it), and the label sequences differ.
    Without MoE layers the same two replicas finish."""
    cfg = ScheduleConfig(4, 1, 6, "identity")
    replicas = [build_schedule(cfg), build_schedule(dataclasses.replace(cfg, less_memory=True))]
    ops = ep_ops(replicas, [1, 1, 1, 1])
    outcome = ep_streams(ops, 4)
    assert outcome.deadlocked, str(outcome)
    assert any(isinstance(op.what, tuple) for op, _, _ in outcome.waits.values()), str(outcome)
    assert any(ep_labels(ops, p) != ep_labels(ops, 4 + p) for p in range(4))
    assert not ep_streams(ep_ops(replicas, [0, 0, 0, 0]), 4).deadlocked
    # the step's vote refuses these replicas before any transfer: some pipeline rank's signatures differ
    assert any(body_signature(replicas[0][p]) != body_signature(replicas[1][p]) for p in range(4))


def test_ep_peer_with_a_micro_batch_fewer_deadlocks_and_is_refused():
    """A replica with one micro-batch fewer (a short step on one EP peer): the model deadlocks, and the step's
    vote refuses it first (its signature's micro-batch count differs on every pipeline rank)."""
    cfg = ScheduleConfig(2, 1, 4, "identity")
    replicas = [build_schedule(cfg), build_schedule(dataclasses.replace(cfg, num_micro=3))]
    assert ep_streams(ep_ops(replicas, [1, 1]), 2).deadlocked
    assert all(body_signature(replicas[0][p])[0] == 4 and body_signature(replicas[1][p])[0] == 3 for p in range(2))


def test_ep_groups_across_stages_deadlock():
    """A second control: EP groups that pair pipeline rank ``p`` of one replica with rank ``R - 1 - p`` of the
    other (a mesh numbering that grouped ranks holding different stages) deadlock at the first forward; the right
    groups of the same replicas finish."""
    cfg = ScheduleConfig(2, 1, 2, "identity")
    orders = build_schedule(cfg)
    swapped = {1 - p: [dataclasses.replace(a, peer=None if a.peer is None else 1 - a.peer) for a in order]
               for p, order in orders.items()}
    assert ep_streams(ep_ops([orders, swapped], [1, 1]), 2).deadlocked
    assert not ep_streams(ep_ops([orders, orders], [1, 1]), 2).deadlocked
