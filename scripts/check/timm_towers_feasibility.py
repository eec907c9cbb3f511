"""Whether the three model types whose vision tower is a timm model (``fast_vlm``, ``perception_lm``, ``gemma3n``)
build from their real config classes scaled down, and train a step on a CPU. Needs timm, so it runs in the second
environment (docs/design.md, "Against the stock processor", has its set-up)::

    python scripts/check/timm_towers_feasibility.py

Each type: the real ``*Config`` class over a small timm architecture of the family the hub checkpoint names
(FastViT MCi for FastVLM, a PE-core ViT for Perception LM, MobileNet-V5's encoder for Gemma 3n), a 2-layer text
model of width 64, a forward with ``labels`` and a backward; it prints the parameter counts, the image tokens and
how many tower parameters got no gradient. Found on 2026-12-07 (torch 2.14.1, timm 1.0.31, transformers
5.25.0): all three build and train. What a pipeline split of each needs is in the printed notes.
"""

from __future__ import annotations

import argparse
import sys
import time

TEXT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
            vocab_size=512, head_dim=16)
IMAGE_TOKEN = 500

NOTES = {
    "fast_vlm": "tower output (B, C, H, W) flattened to H*W tokens (a conv tower: a ViT's (B, N, C) would be "
                "permuted wrongly); the projector is linear-GELU-linear; the text model is Qwen2's: a split as "
                "LLaVA's (vision_tower + multi_modal_projector in the preprocess, language_model.layers).",
    "perception_lm": "pixel_values (B, tiles, 3, S, S) flattened to tiles; CLS token dropped; the projector pools "
                     "2 x 2; the text model is Llama's: a split as LLaVA's. The timm ViT's attn_pool (13 "
                     "tensors) is off the path to last_hidden_state and never gets a gradient: the split must "
                     "expect it (as the stock model leaves it).",
    "gemma3n": "the tower's MSFA output is 2048 channels at a fixed grid (msfa_output_resolution squared must equal "
               "vision_soft_tokens_per_image); embed_vision maps it to the text width. The text model is the hard "
               "part: AltUp carries altup_num_inputs copies of the hidden state between layers (the stage boundary "
               "tensor is (altup_num_inputs, B, T, H)), per_layer_inputs (B, T, layers, 256) built from input_ids "
               "at the embedding feed every layer (send them along or rebuild them on each stage: the per-layer "
               "embedding table is large), and the last num_kv_shared_layers layers read the keys and values of an "
               "earlier layer (shared_kv_states): a boundary must not fall between a sharing layer and its source, "
               "or those tensors must cross it; the audio tower is a refusal or a frozen preprocess.",
}


def _run(name: str, model, pixel_values, tokens: int, image_token: int = IMAGE_TOKEN) -> None:
    import torch
    model.train()
    ids = torch.tensor([[1, 2] + [image_token] * tokens + [3, 4, 5]])
    start = time.time()
    out = model(input_ids=ids, pixel_values=pixel_values, labels=ids)
    out.loss.backward()
    tower = [(n, p) for n, p in model.named_parameters() if "vision_tower" in n]
    without = [n for n, p in tower if p.grad is None or not p.grad.abs().sum()]
    total = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"OK {name}: {total:.2f}M parameters ({sum(p.numel() for _, p in tower) / 1e6:.2f}M in the tower), "
          f"{tokens} image tokens, loss {out.loss.item():.4f}, step {time.time() - start:.1f} s, "
          f"tower parameters without a gradient: {len(without)} of {len(tower)}")
    print(f"   split: {NOTES[name]}")


def fast_vlm():
    import torch
    from transformers import AutoModelForImageTextToText, FastVlmConfig
    config = FastVlmConfig(
        vision_config={"model_type": "timm_wrapper", "architecture": "fastvit_mci0", "do_pooling": False,
                       "hidden_size": 128, "model_args": {"inference_mode": True, "layers": (1, 1, 1, 1),
                                                          "embed_dims": (8, 16, 32, 64)}},
        text_config={"model_type": "qwen2", **TEXT}, image_token_index=IMAGE_TOKEN)
    model = AutoModelForImageTextToText.from_config(config)
    pixels = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        tokens = model.model.get_image_features(pixels).pooler_output.shape[1]
    _run("fast_vlm", model, pixels, tokens)


def perception_lm():
    import torch
    from transformers import AutoModelForImageTextToText, PerceptionLMConfig
    config = PerceptionLMConfig(
        vision_config={"model_type": "timm_wrapper", "architecture": "vit_pe_core_tiny_patch16_384",
                       "hidden_size": 192,
                       "model_args": {"img_size": 64, "depth": 2, "embed_dim": 192, "num_heads": 3}},
        text_config={"model_type": "llama", **TEXT}, vision_use_cls_token=True, projector_pooling_ratio=2,
        image_token_id=IMAGE_TOKEN)
    model = AutoModelForImageTextToText.from_config(config)
    pixels = torch.randn(1, 1, 3, 64, 64)
    with torch.no_grad():
        tokens = model.model.get_image_features(pixels).pooler_output.reshape(-1, TEXT["hidden_size"]).shape[0]
    _run("perception_lm", model, pixels, tokens)


def gemma3n():
    import torch
    from transformers import AutoModelForImageTextToText, Gemma3nConfig
    text = dict(TEXT, vocab_size_per_layer_input=512, hidden_size_per_layer_input=8, num_kv_shared_layers=0,
                laurel_rank=4, altup_num_inputs=2, activation_sparsity_pattern=[0.0, 0.0],
                layer_types=["sliding_attention", "full_attention"], sliding_window=16)
    config = Gemma3nConfig(
        text_config=text,
        vision_config={"architecture": "mobilenetv5_300m_enc", "hidden_size": 2048, "vocab_size": 16,
                       "vocab_offset": 480, "model_args": {"channel_multiplier": 0.0625, "msfa_output_resolution": 2}},
        audio_config={"hidden_size": 32, "vocab_size": 16, "vocab_offset": 496, "conf_num_hidden_layers": 1,
                      "conf_num_attention_heads": 2, "input_feat_size": 16, "sscp_conv_channel_size": [8, 8]},
        vision_soft_tokens_per_image=4, image_token_id=470, boi_token_id=471, eoi_token_id=472, audio_token_id=473,
        boa_token_id=474, eoa_token_id=475)
    model = AutoModelForImageTextToText.from_config(config)
    _run("gemma3n", model, torch.randn(1, 3, 64, 64), 4, image_token=470)


def main(argv: list[str]) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    import torch
    torch.manual_seed(0)
    failed = 0
    for build in (fast_vlm, perception_lm, gemma3n):
        try:
            build()
        except Exception as err:  # noqa: BLE001 - each type's verdict is printed, the others still run
            failed += 1
            print(f"FAILED {build.__name__}: {type(err).__name__}: {str(err)[:300]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
