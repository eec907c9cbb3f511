"""Write a ~1.2B-parameter Qwen2.5-VL checkpoint with random weights, for the load-memory benchmark and test.

Usage: python scripts/make/make_1b.py OUT_DIR [--dtype bfloat16|float32] [--zeros]

The config is the real ``Qwen2_5_VLConfig`` at a size between Qwen2.5-VL-3B and a 1.5B text model: text hidden
1536, 12 decoder layers, 12 heads (2 key-value heads), MLP 8960, the real 151,936-entry vocabulary, untied
embeddings; an 8-block, 1280-wide visual tower as in Qwen2.5-VL. It is saved with ``save_pretrained`` in shards
of at most 500 MB, as the hub serves a checkpoint (bf16 by default). ``--zeros`` writes zeros instead of
random values (seconds instead of a minute), for tests that only count bytes.
"""

import argparse
import contextlib

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.initialization import no_init_weights


def config_1b() -> Qwen2_5_VLConfig:
    """The ~1.2B Qwen2.5-VL config (see the module docstring)."""
    return Qwen2_5_VLConfig(
        text_config=dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=12,
                         num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
                         bos_token_id=151643, eos_token_id=151645, tie_word_embeddings=False),
        vision_config=dict(depth=8, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14,
                           temporal_patch_size=2, spatial_merge_size=2, window_size=112, out_hidden_size=1536,
                           fullatt_block_indexes=[3, 7]),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        tie_word_embeddings=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--zeros", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    with no_init_weights() if args.zeros else contextlib.nullcontext():
        model = Qwen2_5_VLForConditionalGeneration(config_1b()).to(getattr(torch, args.dtype))
    if args.zeros:
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    model.save_pretrained(args.out, max_shard_size="500MB")
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: Qwen2.5-VL, {n / 1e9:.2f}B parameters, {args.dtype}")


if __name__ == "__main__":
    main()
