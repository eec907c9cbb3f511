"""Write the presets in recipes/presets/: the real architecture of each model as its HF config class writes it,
and a recipe whose pipeline shape is chosen by ``mpipe-hf plan`` and the simulator to fit 80 GB GPUs.

Usage: python scripts/make_presets.py [--tokens 2048] [--image-tokens 1024]

For each model, every ``R`` in 2, 4, 8, 16, 32, ``V`` in 1, 2, 4 and both warm-ups (frozen visual tower, ``M = 4R``, layers
balanced by cost) is planned on the config-estimated profile (``tokens`` per micro-batch, H100 bf16 peak at
40% MFU); the preset takes the smallest ``R`` whose fullest rank fits 80 GiB with 10% headroom, and at that
``R`` the ``V`` with the shortest predicted step. The sizes are the public ones of each checkpoint's
config.json (hidden size, layers, heads, key-value heads, MLP width, vocabulary; the vision tower's depth,
width and patching).
"""

import argparse
import textwrap
import itertools
import os

from transformers import CLIPVisionConfig, LlavaConfig, Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(HERE), "recipes", "presets")
QWEN_IDS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                vision_end_token_id=151653)
QWEN25_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14,
                     temporal_patch_size=2, spatial_merge_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31])


RECIPE = """model:
  config: {name}/config.json
data:
  path: ../../data/train.jsonl
  micro_batch_size: 1
  min_pixels: 3136
  max_pixels: 1003520
parallel:
  pp_size: {pp}
  vpp: {vpp}
  num_micro: {micro}
  preprocess: frozen
  less_memory: {less}
  layers_per_stage: {layout}
train:
  max_steps: 1000
  learning_rate: 1.0e-5
  gradient_checkpointing: {ckpt}
  output_dir: ../../outputs/{name}
"""


def _qwen_text(hidden, inter, layers, heads, kv, vocab, tie, theta=1e6, mrope=(16, 24, 24), **extra):
    return dict(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tie, max_position_embeddings=128000,
                rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151645,
                rope_parameters={"rope_type": "default", "rope_theta": theta, "mrope_section": list(mrope)}, **extra)


def qwen2_5_vl(hidden, inter, layers, heads, kv, vocab, tie):
    return Qwen2_5_VLConfig(text_config=_qwen_text(hidden, inter, layers, heads, kv, vocab, tie),
                            vision_config={**QWEN25_VISION, "out_hidden_size": hidden}, tie_word_embeddings=tie,
                            **QWEN_IDS)


PRESETS = {
    "qwen2_5_vl_3b": ("Qwen/Qwen2.5-VL-3B-Instruct", lambda: qwen2_5_vl(2048, 11008, 36, 16, 2, 151936, True)),
    "qwen2_5_vl_7b": ("Qwen/Qwen2.5-VL-7B-Instruct", lambda: qwen2_5_vl(3584, 18944, 28, 28, 4, 152064, False)),
    "qwen2_5_vl_32b": ("Qwen/Qwen2.5-VL-32B-Instruct", lambda: qwen2_5_vl(5120, 27648, 64, 40, 8, 152064, False)),
    "qwen2_5_vl_72b": ("Qwen/Qwen2.5-VL-72B-Instruct", lambda: qwen2_5_vl(8192, 29568, 80, 64, 8, 152064, False)),
    "qwen2_vl_7b": ("Qwen/Qwen2-VL-7B-Instruct", lambda: Qwen2VLConfig(
        text_config=_qwen_text(3584, 18944, 28, 28, 4, 152064, False),
        vision_config=dict(depth=32, embed_dim=1280, hidden_size=3584, mlp_ratio=4, num_heads=16, patch_size=14,
                           temporal_patch_size=2, spatial_merge_size=2), tie_word_embeddings=False, **QWEN_IDS)),
    "qwen3_vl_8b": ("Qwen/Qwen3-VL-8B-Instruct", lambda: Qwen3VLConfig(
        text_config=_qwen_text(4096, 12288, 36, 32, 8, 151936, False, theta=5e6, mrope=(24, 20, 20), head_dim=128),
        vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
                           temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=4096,
                           num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24]),
        tie_word_embeddings=False, **QWEN_IDS)),
    "llava_1_5_7b": ("llava-hf/llava-1.5-7b-hf", lambda: LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                       num_attention_heads=16, image_size=336, patch_size=14,
                                       projection_dim=768).to_dict(),
        text_config=dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=32064, rms_norm_eps=1e-5,
                         max_position_embeddings=4096, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        image_token_id=32000, vision_feature_layer=-2, vision_feature_select_strategy="default",
        projector_hidden_act="gelu", tie_word_embeddings=False)),
}


def choose(config, tokens, image_tokens):
    """``(R, V, M, layout, plan, why)``: the smallest R that fits, and at that R the fastest V."""
    from mpipe_hf.models import get_family
    from mpipe_hf.schedule import ScheduleConfig
    from mpipe_hf.train.plan import estimate_profile, plan
    profile = estimate_profile(config, tokens, image_tokens if hasattr(config, "vision_config") else 0)
    tried = []
    for pp in (2, 4, 8, 16, 32):  # R = 1 is no pipeline
        fits, least = [], float("inf")
        for vpp, less, ckpt in itertools.product((1, 2, 4), (False, True), (False, True)):
            layers = config.get_text_config().num_hidden_layers
            if pp * vpp > layers:
                continue
            cfg = ScheduleConfig(pp, vpp, 4 * pp, "frozen", less_memory=less)
            layout = get_family(config.model_type).layer_counts(config, cfg)
            result = plan(config, cfg, profile, layout, gradient_checkpointing=ckpt)
            worst = max(r.total_bytes for r in result.ranks) / 2**30
            least = min(least, worst)
            if result.fits(80 * 2**30):
                fits.append((result.step_s, cfg, layout, result, worst, ckpt))
        tried.append(f"R={pp}: {least:.0f} GiB")
        if fits:
            step, cfg, layout, result, worst, ckpt = min(fits, key=lambda f: f[0])
            return cfg, layout, result, worst, ckpt, tried
    raise SystemExit(f"nothing fits: {tried}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--image-tokens", type=int, default=1024)
    args = parser.parse_args(argv)
    for name, (hub, build) in PRESETS.items():
        config = build()
        os.makedirs(os.path.join(OUT, name), exist_ok=True)
        config.to_json_file(os.path.join(OUT, name, "config.json"))
        cfg, layout, result, worst, ckpt, tried = choose(config, args.tokens, args.image_tokens)
        pp, vpp, micro = cfg.pp_size, cfg.vpp, cfg.num_micro
        fullest = max(result.ranks, key=lambda r: r.total_bytes)
        why = (f"R = {pp} is the fewest ranks whose fullest rank fits under 72 GiB (80 less 10% headroom): rank "
               f"{fullest.rank} needs {worst:.1f} GiB (params {fullest.param_bytes / 2**30:.1f}, grads "
               f"{fullest.grad_bytes / 2**30:.1f}, AdamW {fullest.optimizer_bytes / 2**30:.1f}, activations "
               f"{fullest.activation_bytes / 2**30:.1f}). At that R, V = {vpp}"
               f"{' with the shallow warm-up (less_memory)' if cfg.less_memory else ''}"
               f"{' and gradient checkpointing' if ckpt else ''} predicts the shortest step ({result.step_s:.2f} s, "
               f"bubble {result.bubble:.3f}); M = 4R keeps the bubble small."
               f"{' Without gradient checkpointing the activations do not fit.' if ckpt else ''} The layout is "
               f"balanced by cost: the LM head counts as the layers its matmul equals. The plan counts fp32 "
               f"activations; `train: {{bf16: true}}` (autocast) makes most of them bf16, and bf16 weights (not yet "
               f"in mpipe_hf) would halve the weights' share.")
        comment = "\n".join("# " + line for line in textwrap.wrap(why, 110))
        recipe = f"""# {hub}: MPipe Transpose fine-tuning preset (written by scripts/make_presets.py).
# The architecture is {name}/config.json, the checkpoint's real sizes. To fine-tune, replace `config:` by
# `name_or_path: /path/to/{hub.split('/')[-1]}` (the downloaded checkpoint) and point `data` at your JSONL.
# Relative paths are relative to this file's folder (recipes/presets/), not the working directory.
#
# Chosen with `mpipe-hf plan` and the simulator for 80 GB GPUs, {args.tokens} tokens ({args.image_tokens} image tokens)
# per micro-batch, fp32 weights, gradients and AdamW states (16 bytes per trained parameter). The least the fullest
# rank needs at each R: {', '.join(tried)}.
{comment}
"""
        with open(os.path.join(OUT, f"{name}.yaml"), "w") as f:
            f.write(recipe + RECIPE.format(name=name, pp=pp, vpp=vpp, micro=micro, layout=layout,
                                           less=str(cfg.less_memory).lower(), ckpt=str(ckpt).lower()))
        print(f"{name}: R={pp} V={vpp} M={micro} fullest rank {worst:.1f} GiB; step {result.step_s:.2f} s, "
              f"bubble {result.bubble:.3f}", flush=True)


if __name__ == "__main__":
    main()
