"""``mpipe-hf plan`` under context parallelism (``parallel.cp_size``): a CP rank's share of the saved activations,
the repeated KV heads, Ulysses' all-to-alls on the hardware model and in the simulator, and where a CP group
lies. The measured side is ``scripts/bench/context_parallel_memory.py`` (a 32k-token video row at cp 1, 2, 4)."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import Qwen2_5_VLConfig

from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.schedule.tune import Profile
from mpipe_hf.train.plan import plan
from mpipe_hf.train.plan_context_parallel import FRONT_BYTES_PER_TOKEN, context_plan

TOKENS, HIDDEN = 4096, 64


def config(kv_heads: int) -> Qwen2_5_VLConfig:
    """A scaled-down Qwen2.5-VL: 4 layers of hidden 64, 4 heads of 16, ``kv_heads`` KV heads."""
    text = dict(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=kv_heads, vocab_size=1000,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]})
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=HIDDEN,
                  fullatt_block_indexes=[1])
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)


def profile() -> Profile:
    return Profile(num_layers=4, layer_forward_s=1e-3, layer_backward_s=2e-3, head_forward_s=1e-3,
                   head_backward_s=2e-3, preprocess_forward_s=5e-3, preprocess_backward_s=0.0,
                   activation_bytes=4.0 * TOKENS * HIDDEN, feature_bytes=4.0 * TOKENS * HIDDEN,
                   layer_activation_bytes=3e6, head_activation_bytes=5e6, latency_s=1e-5,
                   bandwidth_bytes_per_s=5e10)


def test_a_cp_rank_holds_its_share_of_the_saved_activations():
    """At cp 2 and 4 each pipeline rank's activation peak is cp 1's over ``cp`` plus what stays whole (the
    front's token ids and image mask on the first stage) plus, a layer, the gathered attention output (a storage of
    its own under Ulysses) and, where ``cp`` does not divide the KV heads, the repeated keys and values (2 KV heads
    at cp 4: each repeated twice)."""
    cfg = ScheduleConfig(pp_size=2, vpp=1, num_micro=4, preprocess="frozen")
    for kv_heads in (4, 2):
        one = plan(config(kv_heads), cfg, profile(), [2, 2])
        for cp in (2, 4):
            split = plan(config(kv_heads), cfg, profile(), [2, 2], cp_size=cp)
            repeats = 2 if (kv_heads, cp) == (2, 4) else 1
            output = TOKENS / cp * 4 * 16 * 4  # this rank's slice of every head, fp32
            repeat = output + 2 * (repeats - 1) * TOKENS / cp * kv_heads * 16 * 4  # and k and v repeated, a layer
            assert split.context.repeats == repeats
            for r, (a, b) in enumerate(zip(one.ranks, split.ranks)):
                whole = FRONT_BYTES_PER_TOKEN * TOKENS if r == 0 else 0.0
                expected = a.activation_bytes / cp + b.peak_in_flight * (2 * repeat + whole)
                assert b.peak_in_flight == a.peak_in_flight
                assert b.activation_bytes == pytest.approx(expected, abs=1), (kv_heads, cp, r)


def test_ulysses_all_to_alls_on_the_hardware_model_and_in_the_step():
    """Each attention layer's forward and backward take four all-to-alls each: the query's and output's of a rank's
    slice of every head, the key's and value's of its KV heads; the simulated step at cp 2 is the step of the
    halved compute plus those seconds on the critical path (more than without them, less than cp 1's here)."""
    from mpipe_hf.schedule.cluster import Cluster
    from mpipe_hf.schedule.hardware import all_to_all_seconds, ulysses_seconds
    c = Cluster()
    query, kv = TOKENS / 2 * 4 * 16 * 4, TOKENS / 2 * 2 * 16 * 4
    forward, backward = ulysses_seconds(query, kv, 2, c)
    assert forward == backward == pytest.approx(2 * all_to_all_seconds(query, 2, c) + 2 * all_to_all_seconds(kv, 2, c))
    assert ulysses_seconds(query, kv, 1) == (0.0, 0.0)
    context = context_plan(config(2), profile(), [2, 2], 0, 2)
    assert (context.query_bytes, context.kv_bytes, context.forward_s) == (query, kv, pytest.approx(forward))
    assert context.stage_seconds() == ((2 * forward, 2 * forward), (2 * backward, 2 * backward))
    cfg = ScheduleConfig(pp_size=2, vpp=1, num_micro=4, preprocess="frozen")
    one = plan(config(2), cfg, profile(), [2, 2])
    slow = dataclasses.replace(profile(), bandwidth_bytes_per_s=1e6)  # links that the all-to-alls would crawl on
    two = plan(config(2), cfg, profile(), [2, 2], cp_size=2)
    assert two.step_s < one.step_s
    assert plan(config(2), cfg, slow, [2, 2], cp_size=2, cp_within_node=False).step_s > two.step_s
    assert "cp_size 2" in two.table()


def test_where_a_cp_group_lies_and_what_cp_refuses():
    """A CP group lies in a node of 8 when its block of processes (``cp_size`` with ``dp_inner``, ``cp_size *
    pp_size`` with ``pp_inner``) divides 8; a cp that does not divide the heads is refused by name."""
    from mpipe_hf.train.recipe_parallel import ParallelSection, groups_within_node
    for (order, pp, cp), within in {("pp_inner", 2, 4): True, ("pp_inner", 4, 4): False, ("dp_inner", 4, 4): True,
                                    ("dp_inner", 2, 16): False}.items():
        parallel = ParallelSection(pp_size=pp, num_micro=pp, cp_size=cp, mesh_order=order)
        assert groups_within_node(parallel, None, None)[1] is within, (order, pp, cp)
    with pytest.raises(ValueError, match="divide the attention heads"):
        context_plan(config(2), profile(), [2, 2], 0, 3)


def test_a_cp_ranks_slices_keep_no_storage_of_the_whole_sequence():
    """What a stage cuts (hidden states, rotary tables, text positions, shifted labels) is a copy of this rank's
    slice alone: a slice of a batch of one along its sequence is contiguous already, so ``contiguous()`` leaves it a
    view, and whatever autograd saves of it keeps the whole sequence alive (the control below)."""
    import torch
    from mpipe_hf.models.sequence_split import local_positions, local_rotary, local_shift_labels, own_slice
    from mpipe_hf.runtime.context_parallel import SequenceSplit
    split = SequenceSplit(None, (6, 4), 1)
    hidden, cos = torch.randn(1, 10, 8), torch.randn(3, 1, 10, 16)
    assert split.local(hidden).contiguous().untyped_storage().nbytes() == hidden.nbytes  # the control: a view
    cut = [own_slice(split, hidden), *local_rotary((cos, cos.clone()), split),
           local_positions(torch.arange(10).view(1, 10), split), local_shift_labels(torch.arange(10).view(1, 10), split)]
    for t in cut:
        assert t.untyped_storage().nbytes() == t.nbytes and t.shape[-1 if t.dim() == 2 else -2 if t.dim() == 4
                                                                       else 1] == 4, tuple(t.shape)
    assert torch.equal(cut[0], hidden[:, 6:]) and torch.equal(cut[1], cos[..., 6:, :])
    assert cut[-1].tolist() == [[7, 8, 9, -100]]


def test_nccl_buffers_count_the_cp_group_and_the_dp_x_cp_reduction():
    """With ``cp_size`` a rank joins the CP group (Ulysses' all-to-all: every other member a peer) and sums over the
    flattened ``dp x cp`` ranks (a ring) where it summed over dp; its world ring spans the CP ranks too."""
    from mpipe_hf.train.plan_nccl import PER_PEER, communicators, nccl_bytes
    assert communicators(1, 2, dp_size=2, cp_size=4) == {
        "pipeline pairs": (2, 2), "pipeline collectives": (1, 1), "world": (1, 2), "data x context parallel": (1, 2),
        "context parallel": (1, 3)}
    # the CP pair, the reduction ring and the world ring of 4 ranks (two neighbours, where 2 ranks had one)
    assert nccl_bytes(0, 2, cp_size=2) == nccl_bytes(0, 2) + 3 * PER_PEER
    assert communicators(0, 2, dp_size=2) == communicators(0, 2, dp_size=2, cp_size=1)  # cp 1: as before
