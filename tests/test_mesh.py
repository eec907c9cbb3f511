"""The mesh order (``parallel.mesh_order``): the two numberings of the ``(dp, pp)`` mesh, which
traffic each keeps inside a node, and ``auto``'s choice by the at-scale simulator, with the times that decide
it. Pure and fast: the 4-process ``dp_inner`` run is ``tests/test_data_parallel.py``'s two-node test."""

from __future__ import annotations

import dataclasses
import json
import os
import types

import pytest

from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.schedule.cluster import Cluster
from mpipe_hf.schedule.hardware import figures_estimate
from mpipe_hf.schedule.layout import balanced_layers
from mpipe_hf.schedule.mesh_order import (choose_mesh_order, exchange_seconds, global_rank, position, rank_params,
                                          within_nodes)
from mpipe_hf.schedule.shapes import TextShape, Workload
from mpipe_hf.train.recipe_data import DataSection
from mpipe_hf.train.recipe_parallel import ParallelSection, resolve_mesh_order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def preset_text(name: str) -> TextShape:
    """The decoder sizes of a preset's ``config.json`` (no transformers import)."""
    with open(os.path.join(ROOT, "recipes", "presets", name, "config.json")) as f:
        t = json.load(f)["text_config"]
    return TextShape(hidden=t["hidden_size"], intermediate=t["intermediate_size"], layers=t["num_hidden_layers"],
                     heads=t["num_attention_heads"], kv_heads=t["num_key_value_heads"], vocab=t["vocab_size"])


def test_the_two_numberings():
    """``pp_inner``: ``d * pp + p``; ``dp_inner``: ``p * dp + d``; :func:`position` inverts both; which groups
    one node of 8 holds at ``pp = dp = 4``, and that one node of 16 holds everything in either order."""
    assert [[global_rank("pp_inner", d, p, 2, 3) for p in range(2)] for d in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert [[global_rank("dp_inner", d, p, 2, 3) for p in range(2)] for d in range(3)] == [[0, 3], [1, 4], [2, 5]]
    for order in ("pp_inner", "dp_inner"):
        assert sorted(position(order, g, 4, 3) for g in range(12)) == [(d, p) for d in range(3) for p in range(4)]
        assert all(global_rank(order, *position(order, g, 4, 3), 4, 3) == g for g in range(12))
        assert within_nodes(order, 4, 4, 16) == (True, True)
    assert within_nodes("pp_inner", 4, 4, 8) == (True, False)  # pipelines inside nodes, dp groups across
    assert within_nodes("dp_inner", 4, 4, 8) == (False, True)
    with pytest.raises(ValueError, match="resolve 'auto' first"):
        position("auto", 0, 2, 2)


def chosen(cfg, text, tokens: int, cluster):
    """The estimate of ``text`` at ``tokens`` tokens per micro-batch on 4 replicas, and the order chosen."""
    est = figures_estimate(text, None, Workload(tokens=tokens, images=0), cluster, 4)
    choice = choose_mesh_order(cfg, 4, est, cluster)
    print(choice.describe())
    return est, choice


def test_auto_picks_dp_inner_where_the_gradient_exchange_dominates():
    """Qwen2.5-VL-7B's decoder, ``pp = dp = 4`` on two nodes of 8, micro-batches of 1,024 tokens: a rank's
    data-parallel exchange (its 1.9 B parameters' bf16 gather and fp32 reduce-scatter) takes InfiniBand in
    ``pp_inner`` and NVLink in ``dp_inner``; the pipeline's transfers over InfiniBand cost ``dp_inner`` far
    less than that saves."""
    cluster, cfg = Cluster(), ScheduleConfig(4, 2, 8, "frozen")
    est, choice = chosen(cfg, preset_text("qwen2_5_vl_7b"), 1024, cluster)
    pp, dp = "pp_inner", "dp_inner"
    assert choice.order == dp and choice.step_s[dp] < choice.step_s[pp]
    saved = choice.exchange_s[pp] - choice.exchange_s[dp]
    cost = choice.pipeline_s[dp] - choice.pipeline_s[pp]
    assert 0 < cost < saved / 10, (cost, saved)
    # the exchange is the slowest rank's rings, bandwidth-bound: the links' ratio apart (360 GB/s NVLink against
    # 40 GB/s InfiniBand, 0.8 of each line rate)
    params = rank_params(cfg, balanced_layers(28, cfg.num_stages), est)
    assert choice.exchange_s[dp] == max(exchange_seconds(p, 4, cluster, True) for p in params)
    assert choice.exchange_s[pp] == max(exchange_seconds(p, 4, cluster, False) for p in params)
    assert choice.exchange_s[pp] / choice.exchange_s[dp] == pytest.approx(9.0, rel=0.01)


def test_auto_picks_pp_inner_where_the_pipeline_traffic_dominates():
    """A small decoder (hidden 256, 8 layers) on micro-batches of 8,192 tokens: a rank's weights are a few MB,
    while each of the step's 32 x 2 x 7 activation transfers is as big; over InfiniBand they stretch the
    pipeline by more than ``dp_inner``'s faster exchange saves."""
    cluster, cfg = Cluster(), ScheduleConfig(4, 2, 32, "identity")
    text = TextShape(hidden=256, intermediate=704, layers=8, heads=4, kv_heads=4, vocab=1000)
    _, choice = chosen(cfg, text, 8192, cluster)
    pp, dp = "pp_inner", "dp_inner"
    assert choice.order == pp and choice.step_s[pp] < choice.step_s[dp]
    saved = choice.exchange_s[pp] - choice.exchange_s[dp]
    cost = choice.pipeline_s[dp] - choice.pipeline_s[pp]
    assert 0 < saved < cost, (saved, cost)


def test_one_node_is_pp_inner_and_either_order_takes_the_same_time():
    cluster, cfg = Cluster(), ScheduleConfig(2, 1, 4, "frozen")
    est = figures_estimate(preset_text("qwen2_5_vl_7b"), None, Workload(tokens=512, images=0), cluster, 2)
    choice = choose_mesh_order(cfg, 4, est, cluster)
    assert choice.order == "pp_inner" and choice.step_s["pp_inner"] == choice.step_s["dp_inner"]


def tiny_config():
    """An HF-like config object with a decoder's sizes (what ``shapes_from_config`` reads)."""
    text = types.SimpleNamespace(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=300, head_dim=None, tie_word_embeddings=False,
                                 attention_bias=True)
    return types.SimpleNamespace(get_text_config=lambda: text, tie_word_embeddings=False)


def test_resolve_mesh_order():
    """An explicit order is kept; ``auto`` is ``pp_inner`` without a simulation for one replica or one node,
    needs the model's config across nodes, and simulates there (the default)."""
    data = DataSection(path="x", max_length=256)
    par = ParallelSection(pp_size=2, num_micro=4, dp_size=2)
    assert par.mesh_order == "auto"
    assert resolve_mesh_order(dataclasses.replace(par, mesh_order="dp_inner"), None, data, 4, 2) == ("dp_inner",
                                                                                                   None)
    assert resolve_mesh_order(par, None, data, 4, 8) == ("pp_inner", None)  # one node
    assert resolve_mesh_order(dataclasses.replace(par, dp_size=1), None, data, 2, 1) == ("pp_inner", None)
    with pytest.raises(ValueError, match="needs the model's config"):
        resolve_mesh_order(par, None, data, 4, 2)
    order, choice = resolve_mesh_order(par, tiny_config(), data, 4, 2)
    assert order == choice.order and set(choice.step_s) == {"pp_inner", "dp_inner"}
    with pytest.raises(ValueError, match=r"parallel.mesh_order must be one of \('pp_inner', 'dp_inner', 'auto'\)"):
        ParallelSection(pp_size=2, mesh_order="dp_outer")


def test_auto_order_across_nodes_reads_moe_configs():
    """``auto`` across nodes on the real MoE configs: Qwen3.5-MoE has no dense ``intermediate_size`` (its MLP is
    routed experts and a shared expert), which the simulator reads as the width a token runs through
    (``token_mlp_width``: top-k experts' width plus the shared expert's)."""
    from mpipe_hf.data import qwen2_tokenizer
    from mpipe_hf.families.qwen import tiny as qwen_tiny
    from mpipe_hf.schedule.shapes import token_mlp_width
    tok = qwen2_tokenizer(5120)
    data = DataSection(path="x", max_length=256)
    par = ParallelSection(pp_size=2, num_micro=4, dp_size=2)
    for config in (qwen_tiny.tiny_qwen3_5_config(tok, num_layers=4, moe=True), qwen_tiny.tiny_qwen3_vl_moe_config(tok)):
        text = config.get_text_config()
        shared = getattr(text, "shared_expert_intermediate_size", 0) or 0
        want = getattr(text, "intermediate_size", None) or (
            text.moe_intermediate_size * text.num_experts_per_tok + shared)
        assert token_mlp_width(text) == want > 0
        order, choice = resolve_mesh_order(par, config, data, 4, 2)
        assert order in ("pp_inner", "dp_inner") and order == choice.order
