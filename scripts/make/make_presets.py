"""Write the presets in recipes/presets/: the real architecture of each model as its HF config class writes it,
and a recipe whose pipeline shape is chosen by ``mpipe-hf plan`` and the simulator to fit 80 GB GPUs.

Usage: python scripts/make/make_presets.py [--tokens 2048] [--image-tokens 1024] [--only NAME ...]

``--only`` writes just the named presets (the others' files stay as they are).

For each model, every ``R`` in 2, 4, 8, 16, 32, ``V`` in 1, 2, 4 and both warm-ups (frozen visual tower, ``M = 4R``, layers
balanced by cost) is planned on the config-estimated profile (``tokens`` per micro-batch, H100 bf16 peak at
40% MFU); the preset takes the smallest ``R`` whose fullest rank fits 80 GiB with 10% headroom, and at that
``R`` the ``V`` with the shortest predicted step. A mixture-of-experts model also tries expert
parallelism, ``ep_size`` in 1, 2, 4, 8 dividing its experts (``dp_size = ep_size`` replicas, ``mesh_order:
dp_inner`` so that an EP group's all-to-all stays within an 8-GPU node): the preset takes the fewest GPUs
(``R * ep_size``) that fit, and among those the shape with the most micro-batches per second (``ep_size * M``
over the predicted step, the all-to-alls charged). A preset in :data:`FIXED` keeps a published layout instead.
The sizes are the public ones of each checkpoint's
config.json (hidden size, layers, heads, key-value heads, MLP width, vocabulary; the vision tower's depth,
width and patching; experts and linear-attention heads). Hubs are out of reach here, so each newer preset names
the public text its sizes were read from (two that agree where one did not give every field).
"""

import argparse
import textwrap
import itertools
import os

from transformers import (CLIPVisionConfig, Gemma3Config, InternVLConfig, LlavaConfig, Qwen2_5_VLConfig,
                          Qwen2VLConfig, Qwen3_5Config, Qwen3_5MoeConfig, Qwen3VLConfig, Qwen3VLMoeConfig)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "recipes", "presets")
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
{ep_lines}train:
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


# Qwen3.5's tower (Qwen3_5VisionConfig) and the linear-attention widths shared by the family.
QWEN35_VISION = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
                     temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=2304,
                     deepstack_visual_indexes=[])
QWEN35_ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
               "mrope_section": [11, 11, 10], "mrope_interleaved": True}
QWEN35_LINEAR = dict(linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                     linear_num_key_heads=16, max_position_embeddings=262144, rms_norm_eps=1e-6,
                     eos_token_id=248044, tie_word_embeddings=False, rope_parameters=QWEN35_ROPE)


def qwen3_5_27b():
    """Qwen/Qwen3.5-27B. Text: THUDM/slime scripts/models/qwen3.5-27B.sh (64 layers, hidden 5120, MLP 17408, 24
    heads over 4 KV groups of 256, vocabulary 248320, rope base 1e7 on a quarter of each head) and, with the
    linear-attention heads (16 key, 48 value, 128 wide, kernel 4, every 4th layer full) and the tower, a
    Qwen3_5Config transcribed in public code (code search: "linear_num_value_heads": 48, hidden_size 5120)."""
    return Qwen3_5Config(text_config=dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                                          num_attention_heads=24, num_key_value_heads=4, head_dim=256,
                                          vocab_size=248320, linear_num_value_heads=48, **QWEN35_LINEAR),
                         vision_config={**QWEN35_VISION, "out_hidden_size": 5120}, tie_word_embeddings=False)


def qwen3_5_35b_a3b():
    """Qwen/Qwen3.5-35B-A3B. THUDM/slime scripts/models/qwen3.5-35B-A3B.sh: 40 layers, hidden 2048, 16 heads over
    2 KV groups of 256, 256 experts of 512 with top 8 and a shared expert of 512 (gated) in every layer, linear
    attention 16 key / 32 value heads of 128 every 3 of 4 layers, vocabulary 248320; the same figures and the
    tower (out_hidden_size 2048) in public notes comparing its config.json with Qwen3.6-35B-A3B's."""
    return Qwen3_5MoeConfig(text_config=dict(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                                             num_key_value_heads=2, head_dim=256, vocab_size=248320,
                                             num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                                             shared_expert_intermediate_size=512, linear_num_value_heads=32,
                                             **QWEN35_LINEAR),
                            vision_config={**QWEN35_VISION, "out_hidden_size": 2048}, tie_word_embeddings=False)


def qwen3_vl_30b_a3b():
    """Qwen/Qwen3-VL-30B-A3B-Instruct: its config.json as transcribed in public code (commit 1fc78ad of the hub
    repo): 48 layers, hidden 2048, 32 heads over 4 KV of 128, 128 experts of 768, top 8, no shared expert,
    rope base 5e6 with M-RoPE [24, 20, 20]; the Qwen3-VL tower of depth 27 and width 1152. THUDM/slime
    scripts/models/qwen3-vl-30b-a3b.sh gives the same text sizes."""
    return Qwen3VLMoeConfig(
        text_config={**_qwen_text(2048, 6144, 48, 32, 4, 151936, False, theta=5e6, mrope=(24, 20, 20),
                                  head_dim=128, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                                  decoder_sparse_step=1, mlp_only_layers=[]), "max_position_embeddings": 262144},
        vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
                           temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=2048,
                           num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24]),
        tie_word_embeddings=False, **QWEN_IDS)


def qwen3_vl_235b_a22b():
    """Qwen/Qwen3-VL-235B-A22B-Instruct. Text: THUDM/slime scripts/models/qwen3-vl-235b-a22b.sh (94 layers, hidden
    4096, 64 heads over 4 KV groups of 128, 128 experts of 1536 with top 8 in every layer, rope base 5e6,
    vocabulary 151936, untied head); the tower of the Qwen3-VL 8B and 30B-A3B presets (depth 27, width 1152,
    DeepStack at blocks 8, 16 and 24), projecting to the text width 4096 as the 8B's does."""
    return Qwen3VLMoeConfig(
        text_config={**_qwen_text(4096, 12288, 94, 64, 4, 151936, False, theta=5e6, mrope=(24, 20, 20),
                                  head_dim=128, moe_intermediate_size=1536, num_experts=128, num_experts_per_tok=8,
                                  decoder_sparse_step=1, mlp_only_layers=[]), "max_position_embeddings": 262144},
        vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
                           temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=4096,
                           num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24]),
        tie_word_embeddings=False, **QWEN_IDS)


def internvl3_8b():
    """OpenGVLab/InternVL3-8B-hf. Text (Qwen2.5-7B): Ascend/MindSpeed-MM examples/internvl3/model_8B.json (28
    layers, hidden 3584, MLP 18944, 28 heads over 4 KV, vocabulary 151674, rope base 1e6 with dynamic factor 2,
    QKV bias, image context token 151667); tower InternViT-300M-448px (24 layers, width 1024, MLP 4096, 16
    heads, 448 px in patches of 14, QKV bias), pixel shuffle 0.5: transformers' InternVLVisionConfig defaults
    (checkpoint InternVL3-1B-hf, the same tower) and hf-internal-testing/tiny-processor-internvl's layout."""
    return InternVLConfig(
        text_config=dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                         num_attention_heads=28, num_key_value_heads=4, vocab_size=151674,
                         max_position_embeddings=32768, rms_norm_eps=1e-6, bos_token_id=151643,
                         eos_token_id=151645, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}),
        vision_config=dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                           image_size=[448, 448], patch_size=[14, 14], attention_bias=True, use_qk_norm=False,
                           norm_type="layer_norm", layer_scale_init_value=0.1),
        image_token_id=151667, downsample_ratio=0.5, projector_hidden_act="gelu", vision_feature_layer=-1,
        tie_word_embeddings=False)


def gemma3_12b():
    """google/gemma-3-12b-it, its config.json as mirrored in unsloth/gemma-3-12b-it-GGUF and
    mlx-community/gemma-3-12b-pt-4bit: 48 layers, hidden 3840, MLP 15360, 16 heads over 8 KV of 256, 5 sliding
    (window 1024, rope base 1e4) to 1 full layer (rope base 1e6, linear factor 8), vocabulary 262208; SigLIP
    tower 27 layers of 1152 (MLP 4304, 16 heads) on 896 px in patches of 14, pooled to 256 tokens an image."""
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    return Gemma3Config(
        text_config=dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256, sliding_window=1024,
                         sliding_window_pattern=6, vocab_size=262208, max_position_embeddings=131072,
                         rms_norm_eps=1e-6, rope_parameters=rope, bos_token_id=2, eos_token_id=106,
                         pad_token_id=0),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304,
                           num_hidden_layers=27, num_attention_heads=16, image_size=896, patch_size=14,
                           vision_use_head=False),
        mm_tokens_per_image=256, boi_token_index=255999, eoi_token_index=256000, image_token_index=262144)


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
    "qwen3_5_27b": ("Qwen/Qwen3.5-27B", qwen3_5_27b),
    "qwen3_5_35b_a3b": ("Qwen/Qwen3.5-35B-A3B", qwen3_5_35b_a3b),
    "qwen3_vl_30b_a3b": ("Qwen/Qwen3-VL-30B-A3B-Instruct", qwen3_vl_30b_a3b),
    "qwen3_vl_235b_a22b": ("Qwen/Qwen3-VL-235B-A22B-Instruct", qwen3_vl_235b_a22b),
    "internvl3_8b": ("OpenGVLab/InternVL3-8B-hf", internvl3_8b),
    "gemma3_12b": ("google/gemma-3-12b-it", gemma3_12b),
}


# presets that keep a published layout ``(R, ep_size)`` rather than the fewest GPUs, and why
FIXED = {"qwen3_vl_235b_a22b": ((16, 8), "R = 16 and ep_size = 8 are Megatron-Bridge's pipeline and expert "
                                         "parallel sizes for this model on H100s (its recipe "
                                         "qwen3_vl_235b_a22b_pretrain_256gpu_h100_bf16_mock_config, with TP 4 and "
                                         "CP 2 besides: mpipe_hf has no TP, and its CP is parallel.cp_size, below)")}


def shapes(config, name):
    """``[(R, ep_size), ...]`` to try, by GPUs ``R * ep_size`` then ``R``: ``FIXED[name]`` alone; else every ``R``
    in 2 to 32 with ``ep_size`` 1 (a dense model), or 1, 2, 4, 8 dividing its experts (a MoE one)."""
    if name in FIXED:
        return [FIXED[name][0]]
    from mpipe_hf.models.expert_parallel import num_experts
    experts = num_experts(config) or 0
    eps = [ep for ep in (1, 2, 4, 8) if ep == 1 or (experts and experts % ep == 0)]
    return sorted(((pp, ep) for pp in (2, 4, 8, 16, 32) for ep in eps), key=lambda s: (s[0] * s[1], s[0]))


def choose(config, tokens, image_tokens, name=""):
    """``(cfg, ep_size, layout, plan, worst GiB, checkpointing, tried)``: among :func:`shapes` the fewest GPUs
    that fit and, there, the most micro-batches per second (``ep_size * M`` over the predicted step: for one
    ``R``, the fastest ``V``)."""
    from mpipe_hf.models import get_family
    from mpipe_hf.schedule import ScheduleConfig
    from mpipe_hf.train.plan import plan
    from mpipe_hf.train.plan_estimate import estimate_profile
    profile = estimate_profile(config, tokens, image_tokens if hasattr(config, "vision_config") else 0)
    tried, fits, world = [], [], None
    for pp, ep in shapes(config, name):
        if fits and pp * ep > world:
            break
        least = float("inf")
        for vpp, less, ckpt in itertools.product((1, 2, 4), (False, True), (False, True)):
            if pp * vpp > config.get_text_config().num_hidden_layers:
                continue
            cfg = ScheduleConfig(pp, vpp, 4 * pp, "frozen", less_memory=less)
            layout = get_family(config.model_type).layer_counts(config, cfg)
            result = plan(config, cfg, profile, layout, gradient_checkpointing=ckpt, ep_size=ep)
            worst = max(r.total_bytes for r in result.ranks) / 2**30
            least = min(least, worst)
            if result.fits(80 * 2**30):
                fits.append((ep * cfg.num_micro / result.step_s, cfg, ep, layout, result, worst, ckpt))
                world = pp * ep
        tried.append(f"R={pp}: {least:.0f} GiB" if ep == 1 else f"R={pp}, ep_size={ep}: {least:.0f} GiB")
    if not fits:
        raise SystemExit(f"nothing fits: {tried}")
    return *max(fits, key=lambda f: f[0])[1:], tried


CP_SIZES = (2, 4, 8)  # the context-parallel sizes a preset's comment reports


def context_parallel_sizes(config) -> list[int]:
    """The ``parallel.cp_size`` values of :data:`CP_SIZES` whose split the model's attention takes
    (:func:`~mpipe_hf.train.checks.check_context_parallel`: heads, KV heads, no layer with a state along the
    sequence)."""
    from mpipe_hf.train.checks import check_context_parallel
    sizes = []
    for cp in CP_SIZES:
        try:
            check_context_parallel(config, cp)
        except ValueError:
            continue
        sizes.append(cp)
    return sizes


def context_parallel_note(config) -> str:
    """The preset's comment on ``parallel.cp_size`` (docs/context_parallel.md): the sizes its heads split into
    (:func:`context_parallel_sizes`), or why none runs."""
    from mpipe_hf.models.decoder import layer_types
    from mpipe_hf.models.packed import RECURRENT
    text = config.get_text_config()
    kv = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head = ("Rows longer than one GPU's activations hold: context parallelism (`parallel.cp_size`, "
            "docs/context_parallel.md)")
    recurrent = sorted(set(layer_types(text)) & set(RECURRENT))
    if recurrent:
        return (f"{head} is refused for this model: its {', '.join(recurrent)} layers carry a state along the "
                f"sequence.")
    sizes = context_parallel_sizes(config)
    if not sizes:
        return f"{head} is refused for this model: no cp_size in {list(CP_SIZES)} divides its heads."
    return (f"{head} splits its {text.num_attention_heads} attention heads ({kv} KV heads) over cp_size "
            f"{' or '.join(map(str, sizes))} ranks (pp_size * dp_size * cp_size processes); what its stages cannot "
            f"cut yet is refused by name at launch.")


def explain(name, cfg, ep, result, worst, ckpt) -> str:
    """Why the preset has its shape (the recipe's comment)."""
    pp, vpp = cfg.pp_size, cfg.vpp
    fullest = max(result.ranks, key=lambda r: r.total_bytes)
    needs = (f"rank {fullest.rank} needs {worst:.1f} GiB (params {fullest.param_bytes / 2**30:.1f}, grads "
             f"{fullest.grad_bytes / 2**30:.1f}, AdamW {fullest.optimizer_bytes / 2**30:.1f}, activations "
             f"{fullest.activation_bytes / 2**30:.1f}"
             + (f", all-to-all buffers {fullest.all_to_all_bytes / 2**30:.2f}" if ep > 1 else "") + ")")
    shape = (f"V = {vpp}{' with the shallow warm-up (less_memory)' if cfg.less_memory else ''}"
             f"{' and gradient checkpointing' if ckpt else ''}")
    if name in FIXED:
        head = (f"{FIXED[name][1]}; {pp * ep} GPUs, dp_size = ep_size = {ep} replicas. Under 72 GiB (80 less 10% "
                f"headroom) {needs}. There, {shape} predicts the most micro-batches a second")
    elif ep == 1:
        head = (f"R = {pp} is the fewest ranks whose fullest rank fits under 72 GiB (80 less 10% headroom): {needs}. "
                f"At that R, {shape} predicts the shortest step")
    else:
        head = (f"R = {pp} with ep_size = {ep} (dp_size = {ep} replicas, each EP rank holding 1/{ep} of the "
                f"experts of its stages; {pp * ep} GPUs) is among the fewest GPUs whose fullest rank fits under 72 "
                f"GiB (80 less 10% headroom): {needs}. Of those shapes, {shape} predicts the most micro-batches a "
                f"second, {ep} replicas of M = {cfg.num_micro} a step")
    return (f"{head} ({result.step_s:.2f} s, bubble {result.bubble:.3f}"
            + (f"; the all-to-alls {1e3 * result.experts.forward_s:.2f} ms forward and "
               f"{1e3 * result.experts.backward_s:.2f} ms backward a MoE layer and micro-batch" if ep > 1 else "")
            + "); M = 4R keeps the bubble small."
            f"{' Without gradient checkpointing the activations do not fit.' if ckpt else ''} The layout is "
            f"balanced by cost: the LM head counts as the layers its matmul equals. The plan counts fp32 "
            f"activations; `train: {{bf16: true}}` (autocast) makes most of them bf16, and bf16 weights (not yet "
            f"in mpipe_hf) would halve the weights' share.")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--image-tokens", type=int, default=1024)
    parser.add_argument("--only", nargs="+", choices=sorted(PRESETS), help="write only these presets")
    args = parser.parse_args(argv)
    for name in args.only or PRESETS:
        hub, build = PRESETS[name]
        config = build()
        os.makedirs(os.path.join(OUT, name), exist_ok=True)
        config.to_json_file(os.path.join(OUT, name, "config.json"))
        cfg, ep, layout, result, worst, ckpt, tried = choose(config, args.tokens, args.image_tokens, name)
        pp, vpp, micro = cfg.pp_size, cfg.vpp, cfg.num_micro
        least = f"rank needs at each {'R' if ep == 1 else 'shape'}: {', '.join(tried)}."
        notes = (least, explain(name, cfg, ep, result, worst, ckpt), context_parallel_note(config))
        comment = "\n".join("# " + line for text in notes for line in textwrap.wrap(text, 110))
        recipe = f"""# {hub}: MPipe Transpose fine-tuning preset (written by scripts/make/make_presets.py).
# The architecture is {name}/config.json, the checkpoint's real sizes. To fine-tune, replace `config:` by
# `name_or_path: /path/to/{hub.split('/')[-1]}` (the downloaded checkpoint) and point `data` at your JSONL.
# Relative paths are relative to this file's folder (recipes/presets/), not the working directory.
#
# Chosen with `mpipe-hf plan` and the simulator for 80 GB GPUs, {args.tokens} tokens ({args.image_tokens} image tokens)
# per micro-batch, fp32 weights, gradients and AdamW states (16 bytes per trained parameter). The least the fullest
{comment}
"""
        ep_lines = f"  dp_size: {ep}\n  ep_size: {ep}\n  mesh_order: dp_inner\n" if ep > 1 else ""
        with open(os.path.join(OUT, f"{name}.yaml"), "w") as f:
            f.write(recipe + RECIPE.format(name=name, pp=pp, vpp=vpp, micro=micro, layout=layout, ep_lines=ep_lines,
                                           less=str(cfg.less_memory).lower(), ckpt=str(ckpt).lower()))
        print(f"{name}: R={pp} V={vpp} M={micro} ep_size={ep} fullest rank {worst:.1f} GiB; step "
              f"{result.step_s:.2f} s, bubble {result.bubble:.3f}", flush=True)


if __name__ == "__main__":
    main()
