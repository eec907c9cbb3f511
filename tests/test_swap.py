"""Activation swap: the schedule's swap actions, and the swap manager on a real HF decoder layer.

The pipelined runs with swap on are in ``tests/test_numerics.py`` (``SWAP_CASES``: exact against one process in
every mode, with the bytes offloaded and the peak counted).
"""


import pytest
import torch

from mpipe_hf.runtime.memory import storage_ids
from mpipe_hf.runtime.swap import SwapManager
from mpipe_hf.schedule import ScheduleConfig, build_schedule
from mpipe_hf.schedule.actions import Action, Kind, format_schedule, parse_schedule
from mpipe_hf.schedule.interleaved import peak_in_flight
from mpipe_hf.schedule.lowering import ScheduleError
from mpipe_hf.schedule.simulate import simulate
from mpipe_hf.schedule.swap import SWAP_KINDS, SwapConfig, peak_resident, swap_groups, with_swaps
from mpipe_hf.schedule.validate import validate


def swapped(cfg, swap):
    return {r: with_swaps(o, swap, r) for r, o in build_schedule(cfg).items()}


@pytest.mark.parametrize("cfg", [ScheduleConfig(4, 2, 8, "frozen"), ScheduleConfig(4, 2, 8, "trainable"),
                                 ScheduleConfig(3, 1, 5, "trainable", owner_backward=True),
                                 ScheduleConfig(4, 2, 8, "frozen", placement="fill"), ScheduleConfig(2, 3, 4)],
                         ids=["frozen", "trainable", "owner-backward", "fill", "identity"])
def test_swap_actions_print_parse_validate_and_simulate(cfg):
    """Every (stage, micro) at least ``min_swap_gap`` computes from its backward gets its five actions; the
    schedule round-trips through its text form, validates, simulates to the same makespan under zero-cost
    swaps, and the resident peak is never above the in-flight one (at R = 4, rank 0's is under half of it)."""
    plain = build_schedule(cfg)
    orders = swapped(cfg, SwapConfig(enabled=True, min_swap_gap=2))
    assert parse_schedule(format_schedule(orders)) == orders
    validate(cfg, orders)
    for rank, order in orders.items():
        groups = swap_groups(plain[rank], 2)
        assert sum(a.kind in SWAP_KINDS for a in order) == 5 * len(groups)
        assert [a for a in order if a.kind not in SWAP_KINDS] == plain[rank]
        assert peak_resident(order) <= peak_in_flight(order) == peak_in_flight(plain[rank])
        if rank == 0 and cfg.pp_size == 4:  # the deep warm-up: most of it can wait off the device
            assert peak_resident(order) < peak_in_flight(order) / 2
    sim = simulate(orders)
    assert sim.makespan == simulate(plain).makespan
    assert sim.peak_activations == {r: peak_in_flight(o) for r, o in plain.items()}


def test_swapping_rank0_keeps_three_of_its_eleven_forwards():
    """``R = 4``, ``V = 2``, ``M = 8``: rank 0 holds 11 stage forwards in flight, the last rank 5; swapping
    rank 0 only leaves 3 of its 11 on the device and the other ranks as they were."""
    cfg = ScheduleConfig(4, 2, 8, "frozen")
    plain = build_schedule(cfg)
    assert [peak_in_flight(plain[r]) for r in range(4)] == [11, 9, 7, 5]
    orders = swapped(cfg, SwapConfig(enabled=True, ranks=[0]))
    assert peak_resident(orders[0]) == 3
    assert all(orders[r] == plain[r] for r in (1, 2, 3))


@pytest.mark.parametrize("swap", [SwapConfig(), SwapConfig(enabled=True, ranks=[]),
                                  SwapConfig(enabled=True, min_swap_gap=10 ** 6)],
                         ids=["off", "no-ranks", "gap-too-large"])
def test_swapping_zero_groups_is_a_no_op(swap):
    cfg = ScheduleConfig(4, 2, 8, "trainable")
    assert swapped(cfg, swap) == build_schedule(cfg)


def test_the_validator_rejects_swaps_out_of_order():
    cfg = ScheduleConfig(2, 1, 4, "frozen")
    orders = swapped(cfg, SwapConfig(enabled=True))
    rank = next(r for r, o in orders.items() if any(a.kind in SWAP_KINDS for a in o))
    order = list(orders[rank])
    wait = next(i for i, a in enumerate(order) if a.kind is Kind.SWAP_WAIT_LOAD)
    action = order.pop(wait)
    b = next(i for i, a in enumerate(order) if a.kind is Kind.B and (a.stage, a.micro) == (action.stage,
                                                                                         action.micro))
    order.insert(b + 1, action)  # the load is awaited after the backward that needs it
    with pytest.raises(ScheduleError, match="out of order"):
        validate(cfg, {**orders, rank: order})
    order = [a for a in orders[rank] if a is not action]
    with pytest.raises(ScheduleError, match="each swap action once"):
        validate(cfg, {**orders, rank: order})
    assert str(Action(Kind.SWAP_LAUNCH_OFFLOAD, 3, 1)) == "1SWAP_LAUNCH_OFFLOAD3"


@pytest.mark.parametrize("raw, field", [({"enabled": "yes"}, "swap.enabled"), ({"min_swap_gap": 1}, "swap.min_swap_gap"),
                                        ({"ranks": [0, 0]}, "swap.ranks"), ({"ranks": "0"}, "swap.ranks"),
                                        ({"min_bytes": -1}, "swap.min_bytes")])
def test_bad_swap_values_name_the_field(raw, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        SwapConfig(**raw)
    with pytest.raises(ValueError, match="beyond parallel.pp_size"):
        SwapConfig(enabled=True, ranks=[4]).check(4)


# ---- the manager, on one real HF decoder layer ------------------------------------------------------------

def decoder_layer(checkpointing=False):
    """Two real ``Qwen2DecoderLayer``s (scaled down) with their rotary embedding, as a stage runs them."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding
    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=2, vocab_size=100)
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([Qwen2DecoderLayer(config, i) for i in range(2)])
    rotary = Qwen2RotaryEmbedding(config)

    def run(h):
        positions = torch.arange(h.shape[1]).unsqueeze(0)
        emb = rotary(h, positions)
        for layer in layers:
            if checkpointing:
                h = torch.utils.checkpoint.checkpoint(lambda x, lay=layer: lay(x, position_embeddings=emb), h,
                                                      use_reentrant=False)
            else:
                h = layer(h, position_embeddings=emb)
        return h
    return layers, run


def run_with(manager, key, layers, run, x, offload=True, edit=None):
    manager.set_group(key)
    with manager.hooks():
        out = run(x)
    manager.keep(key, [x, out])
    if edit is not None:
        edit()
    filed = manager.resident_bytes
    if offload:
        manager.launch_offload(key)
        manager.wait_offload(key)
    after = manager.resident_bytes
    if offload:
        manager.launch_load(key)
        manager.wait_load(key)
    out.square().sum().backward()
    manager.release(key)
    return filed, after, {n: p.grad.clone() for n, p in layers.named_parameters()}, x.grad.clone()


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
def test_the_manager_swaps_a_real_layer_exactly(checkpointing):
    """Offloaded, freed and loaded back, the saved tensors give bitwise the gradients of a run without hooks;
    every filed byte but the boundary tensors leaves the device; with gradient checkpointing only what
    checkpointing keeps is filed (less)."""
    layers, run = decoder_layer(checkpointing)
    x = torch.randn(2, 24, 64, requires_grad=True)
    run(x).square().sum().backward()
    want = {n: p.grad.clone() for n, p in layers.named_parameters()}, x.grad.clone()
    layers.zero_grad(set_to_none=True)
    x.grad = None
    manager = SwapManager(torch.device("cpu"), storage_ids(layers.parameters()), min_bytes=0)
    filed, after, grads, xgrad = run_with(manager, (0, 0), layers, run, x)
    assert all(torch.equal(grads[n], want[0][n]) for n in want[0]) and torch.equal(xgrad, want[1])
    boundary = x.untyped_storage().nbytes()
    assert filed > boundary and after <= boundary, (filed, after)
    assert manager.offloaded_bytes == filed - after and manager.resident_bytes == 0
    if checkpointing:
        plain_layers, plain_run = decoder_layer(False)
        other = SwapManager(torch.device("cpu"), storage_ids(plain_layers.parameters()), min_bytes=0)
        y = x.detach().clone().requires_grad_(True)
        assert run_with(other, (0, 0), plain_layers, plain_run, y, offload=False)[0] > filed


def test_small_tensors_and_weights_stay():
    """No weight is ever filed; storages under ``min_bytes`` are counted but not moved."""
    layers, run = decoder_layer()
    weights = storage_ids(layers.parameters())
    x = torch.randn(1, 8, 64, requires_grad=True)
    manager = SwapManager(torch.device("cpu"), weights, min_bytes=10 ** 9)
    manager.set_group((1, 2))
    with manager.hooks():
        out = run(x)
    assert manager.groups[(1, 2)].saved and not set(manager.groups[(1, 2)].saved) & weights
    manager.keep((1, 2), [x, out])
    filed = manager.resident_bytes
    manager.launch_offload((1, 2))
    manager.wait_offload((1, 2))
    assert manager.resident_bytes == filed > 0 and manager.offloaded_bytes == 0


def test_a_failed_step_leaves_no_saved_tensor_alive():
    """A forward whose backward never runs (a failed step): after ``reset`` every storage the group filed is
    freed, offloaded or not, although autograd's graph (holding the handles) is still alive; ops that save their
    own output (``exp``, RMSNorm's ``rsqrt``) would otherwise keep a cycle through their ``grad_fn``."""
    import gc
    layers, run = decoder_layer()
    for offload in (False, True):
        manager = SwapManager(torch.device("cpu"), storage_ids(layers.parameters()), min_bytes=0)
        x = torch.randn(2, 24, 64, requires_grad=True)
        manager.set_group((0, 1))
        with manager.hooks():
            out = run(x).exp()
        manager.keep((0, 1), [x])
        if offload:
            manager.launch_offload((0, 1))
        refs = [e.base.untyped_storage()._weak_ref() for e in manager.groups[(0, 1)].saved.values()
                if e.base.untyped_storage()._cdata != x.untyped_storage()._cdata]
        assert len(refs) > 10
        graph = out.grad_fn  # the graph stays alive, as a failed step's may
        del out
        manager.reset()
        gc.collect()
        alive = sum(not torch.UntypedStorage._expired(r) for r in refs)
        assert alive == 0 and graph is not None, (offload, alive, len(refs))


def test_a_tensor_saved_twice_is_one_entry_and_copied_once():
    """``h`` is saved by ``sin`` and by ``cos``: one entry, its bytes counted and moved once; the gradient
    equals a run without hooks."""
    x = torch.randn(64, 64, requires_grad=True)
    want = torch.autograd.grad(((x * 2).sin() * (x * 2).cos()).sum(), x)[0]
    manager = SwapManager(torch.device("cpu"), set(), min_bytes=0)
    manager.set_group((0, 0))
    with manager.hooks():
        h = x * 2
        y = h.sin() * h.cos()
    manager.keep((0, 0), [x, y])
    group = manager.groups[(0, 0)]
    assert sum(e.views.__len__() >= 2 for e in group.saved.values()) == 1  # h's storage, saved twice
    manager.launch_offload((0, 0))
    manager.wait_offload((0, 0))
    assert manager.offloaded_bytes == sum(e.nbytes for sid, e in group.saved.items() if sid not in group.kept)
    manager.launch_load((0, 0))
    manager.wait_load((0, 0))
    assert torch.equal(torch.autograd.grad(y.sum(), x)[0], want)
