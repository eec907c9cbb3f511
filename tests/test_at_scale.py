"""The closed forms of ``mpipe_hf.schedule.hardware`` against independent counts on scaled-down real HF
Qwen2.5-VL modules: matmul FLOPs by ``torch.utils.flop_counter.FlopCounterMode`` (forward, and forward with
backward), parameters by ``numel``, saved activation bytes by the meta-device count of ``mpipe-hf plan``; and the
profile built from them against what the simulator predicts."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.schedule.hardware import (Cluster, Workload, attention_flops, decoder_layer_activation_bytes,
                                        decoder_layer_flops, decoder_layer_matmul_params, decoder_layer_params, figures_estimate,
                                        head_activation_bytes, head_flops, head_params, shapes_from_config,
                                        vision_flops, vision_params, window_lengths, zero1_state_bytes,
                                        zero1_sync_seconds)
from mpipe_hf.schedule.tune import predict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET_7B = os.path.join(ROOT, "recipes", "presets", "qwen2_5_vl_7b")
MM = {torch.ops.aten.mm, torch.ops.aten.addmm}
BMM = {torch.ops.aten.bmm}


def small_config(fullatt=(1, 3)) -> Qwen2_5_VLConfig:
    """A scaled-down ``Qwen2_5_VLConfig``: 4 query heads of 16 over 2 key-value heads, an MLP width that is not a
    multiple of the hidden size, a 4-block tower with the real patching and window size."""
    return Qwen2_5_VLConfig(
        text_config=dict(vocab_size=300, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2]},
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None),
        vision_config=dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=14,
                           temporal_patch_size=2, spatial_merge_size=2, window_size=112, out_hidden_size=64,
                           fullatt_block_indexes=list(fullatt)),
        image_token_id=290, video_token_id=291, vision_start_token_id=292, vision_end_token_id=293,
        tie_word_embeddings=False)


@pytest.fixture(scope="module")
def model():
    config = small_config()
    config._attn_implementation = "eager"  # masked matmuls: FlopCounterMode sees every score
    for sub in (config.text_config, config.vision_config):
        sub._attn_implementation = "eager"
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def count(fn):
    """``(all FLOPs, mm/addmm FLOPs, bmm FLOPs)`` of running ``fn`` under ``FlopCounterMode``."""
    with FlopCounterMode(display=False) as counter:
        fn()
    ops = counter.get_flop_counts()["Global"]
    return (counter.get_total_flops(), sum(v for k, v in ops.items() if k in MM),
            sum(v for k, v in ops.items() if k in BMM))


def test_decoder_layer_flops_match_flop_counter(model):
    text, _ = shapes_from_config(model.config)
    inner = model.model.language_model
    layer, seq, batch = inner.layers[0], 37, 2
    hidden = torch.randn(batch, seq, text.hidden, requires_grad=True)
    positions = torch.arange(seq).expand(3, batch, seq)
    rope = inner.rotary_emb(hidden, positions)
    mask = torch.triu(torch.full((seq, seq), float("-inf")), 1).expand(batch, 1, seq, seq)
    total, linear, attention = count(lambda: layer(hidden, attention_mask=mask, position_embeddings=rope))
    expected = decoder_layer_flops(text, seq, batch, causal=False)  # the eager kernel computes every score
    assert total == expected.forward
    assert linear == expected.weight == 2 * decoder_layer_matmul_params(text) * seq * batch
    assert attention == attention_flops(text.heads * text.dim, [seq] * batch, causal=False)
    both, _, _ = count(lambda: layer(hidden, attention_mask=mask, position_embeddings=rope).sum().backward())
    assert both == expected.forward + expected.backward  # backward = 2 x forward
    causal = decoder_layer_flops(text, seq, batch)
    assert causal.forward == linear + attention / 2 and causal.backward == 2 * causal.forward


def test_head_flops_and_params(model):
    text, _ = shapes_from_config(model.config)
    hidden = torch.randn(1, 23, text.hidden, requires_grad=True)
    total, _, _ = count(lambda: model.lm_head(model.model.language_model.norm(hidden)))
    assert total == head_flops(text, 23).forward
    assert head_params(text) == sum(p.numel() for p in model.lm_head.parameters()) + text.hidden
    assert decoder_layer_params(text) == sum(p.numel() for p in model.model.language_model.layers[0].parameters())


@pytest.mark.parametrize("grids", [[(1, 16, 24)], [(1, 16, 24), (1, 8, 12), (2, 4, 4)]])
def test_vision_flops_match_flop_counter(model, grids):
    """Full attention per frame on blocks 1 and 3, windows elsewhere (the 8 x 12 image: windows of 64 and 32
    patches; the 2-frame clip: one 16-patch window per frame)."""
    _, vision = shapes_from_config(model.config)
    patches = sum(t * h * w for t, h, w in grids)
    pixels = torch.randn(patches, 3 * 2 * 14 * 14)
    grid = torch.tensor(grids)
    total, _, attention = count(lambda: model.model.visual(pixels, grid_thw=grid))
    expected = vision_flops(vision, grids)
    assert attention == expected.forward - expected.weight
    assert total == expected.forward
    assert vision_params(vision) == sum(p.numel() for p in model.model.visual.parameters())


def test_window_lengths_cut_at_the_image_edge():
    _, vision = shapes_from_config(small_config())
    assert window_lengths(vision, (1, 16, 16)) == [64] * 4
    assert window_lengths(vision, (1, 8, 12)) == [64, 32]
    assert window_lengths(vision, (2, 4, 6)) == [24, 24]  # one 2 x 3 window of merged tokens per frame
    assert window_lengths(vision, (1, 10, 18)) == [64, 64, 16, 16, 16, 4]  # 5 x 9 merged: 4 + 1 by 4 + 4 + 1


def test_activation_bytes_match_the_meta_count():
    """The closed forms equal what ``mpipe-hf plan`` counts under ``saved_tensors_hooks`` for one decoder layer
    and the head (fused attention), in fp32 and under the bf16 autocast policy."""
    from mpipe_hf.train.plan_estimate import meta_activation_bytes
    config = small_config()
    text, _ = shapes_from_config(config)
    for tokens in (16, 96):
        layer, head = meta_activation_bytes(config, tokens)
        assert layer == decoder_layer_activation_bytes(text, tokens, dtype_bytes=4)
        assert head == head_activation_bytes(text, tokens, dtype_bytes=4)
        layer, head = meta_activation_bytes(config, tokens, bf16=True)  # the bf16 policy's own list
        assert layer == decoder_layer_activation_bytes(text, tokens, dtype_bytes=2)
        assert head == head_activation_bytes(text, tokens, dtype_bytes=2)


def test_qwen2_5_vl_7b_figures():
    """The real 7B sizes (the preset's config): a layer's forward at 4096 tokens, the tower on four 448 x 448
    images, and their times at 50% of 989.4 TFLOPS."""
    config = Qwen2_5_VLConfig.from_pretrained(PRESET_7B)
    text, vision = shapes_from_config(config)
    assert (text.hidden, text.intermediate, text.layers, text.heads, text.kv_heads, text.vocab) == (
        3584, 18944, 28, 28, 4, 152064)
    weights = 2 * 3584 * 3584 + 2 * 3584 * 512 + 3 * 3584 * 18944
    assert decoder_layer_flops(text, 4096).forward == 2 * weights * 4096 + 2 * 3584 * 4096**2
    workload = Workload()
    assert workload.image_tokens(vision) == 1024 and workload.patches(vision) == 4096
    est = figures_estimate(text, vision, workload, Cluster(), pp_size=4)
    rate = 989.4e12 * 0.5
    assert est.profile.layer_forward_s == pytest.approx(decoder_layer_flops(text, 4096).forward / rate)
    assert est.profile.layer_backward_s == pytest.approx(2 * est.profile.layer_forward_s)
    assert est.layer_weight_s == pytest.approx(2 * weights * 4096 / rate)
    assert est.profile.activation_bytes == 4096 * 3584 * 2
    assert est.profile.bandwidth_bytes_per_s == pytest.approx(360e9)  # NVLink inside a node
    assert figures_estimate(text, vision, workload, Cluster(), pp_size=16).profile.bandwidth_bytes_per_s == \
        pytest.approx(40e9)  # a pipeline across nodes: InfiniBand


def test_figures_profile_runs_the_simulator():
    """The estimate is a Profile the tuner's simulator takes: with free links, the step lies between the
    busiest rank's compute and all of it run in series."""
    text, vision = shapes_from_config(small_config())
    free = dataclasses.replace(Cluster(), nvlink_latency_s=0.0, nvlink_bytes_per_s=float("inf"))
    est = figures_estimate(text, vision, Workload(tokens=512, images=1, image_height=224, image_width=224),
                           free, pp_size=2)
    cfg = ScheduleConfig(2, 1, 4, "frozen")
    result = predict(est.profile, cfg)
    p = est.profile
    busy = 4 * (2 * (p.layer_forward_s + p.layer_backward_s) + p.head_forward_s + p.head_backward_s
                + p.preprocess_forward_s)
    assert busy / 2 <= result.step_s <= busy


def test_zero1_accounting():
    """2 + 2 + 12 / dp bytes per trained parameter (ZeRO stage 1), and a ring's two passes of
    ``(dp - 1) / dp`` of the bf16 gradients."""
    assert zero1_state_bytes(1e9, 1) == 16e9
    assert zero1_state_bytes(1e9, 4, frozen_params=1e9) == 7e9 + 2e9
    cluster = dataclasses.replace(Cluster(), ib_latency_s=0.0)
    assert zero1_sync_seconds(1e9, 4, cluster, within_node=False) == pytest.approx(2 * 3 / 4 * 2e9 / 40e9)
    assert zero1_sync_seconds(1e9, 1, cluster, within_node=False) == 0.0


def test_script_prints_a_table_from_a_measured_profile(tmp_path, capsys):
    """``scripts/bench/sim_at_scale.py --profile`` reads a profile YAML as ``mpipe-hf profile`` writes it (here one
    built from the figures, its layer time doubled) and the config for the parameter counts."""
    config = small_config()
    config.save_pretrained(tmp_path)
    text, vision = shapes_from_config(config)
    profile = figures_estimate(text, vision, Workload(tokens=512, images=1, image_height=224, image_width=224),
                               Cluster(), pp_size=2).profile
    profile = dataclasses.replace(profile, layer_forward_s=1e-3, layer_backward_s=2e-3)
    profile.save(str(tmp_path / "profile.yaml"))
    path = os.path.join(ROOT, "scripts", "bench", "sim_at_scale.py")
    spec = importlib.util.spec_from_file_location("sim_at_scale", path)
    script = importlib.util.module_from_spec(spec)
    sys.modules["sim_at_scale"] = script  # its dataclasses look their module up
    spec.loader.exec_module(script)
    script.main(["--profile", str(tmp_path / "profile.yaml"), "--config", str(tmp_path), "--gpus", "4",
                 "--pp", "2", "--global-batch", "8", "--images", "1", "--image-size", "224", "--tokens", "512",
                 "--vpp", "1", "--towers", "frozen", "--jobs", "1"])
    out = capsys.readouterr().out
    assert "a layer 1.0 ms forward / 2.0 ms backward" in out
    row = next(line for line in out.splitlines() if line.startswith("| 4 | 2 x 2 | 4 |"))
    assert "OOM" not in row and "capped" not in row
    with pytest.raises(SystemExit):  # a profile of another model
        script.main(["--profile", str(tmp_path / "profile.yaml"), "--config", PRESET_7B])
