"""Show what the demo's fine-tuning changed: the model's reply about an image no training row uses, before and after.

Loads the demo's initial checkpoint (``demo/model``) and the trained one (``outputs/qwen2_5_vl_demo/checkpoint``)
as a user would, with ``AutoModelForImageTextToText`` and ``mpipe_hf.data.load_checkpoint_processor`` (the stock
``AutoProcessor`` where torchvision is installed, else the image-only processor from the checkpoint's tokenizer,
image processor and chat template), asks each about ``demo/data/held_out/motorcycle_right.png`` and prints its
greedy reply. The demo's rows answer in one fixed form (``In one word: <word>.``, scripts/make/make_demo_data.py): the
untrained model answers with noise, the trained one in that form.

Usage: python scripts/report/demo_reply.py [--before DIR] [--after DIR] [--image PNG] [--question TEXT]
"""

import argparse

import torch
from transformers import AutoModelForImageTextToText

from mpipe_hf.data import load_checkpoint_processor


def reply(checkpoint: str, image: str, question: str, max_new_tokens: int = 16) -> str:
    """The greedy reply of the checkpoint in directory ``checkpoint`` to ``question`` about the image file
    ``image``: the new tokens only, special tokens left out. Raises ``OSError`` when a file is missing."""
    model = AutoModelForImageTextToText.from_pretrained(checkpoint).eval()
    processor = load_checkpoint_processor(checkpoint)
    messages = [{"role": "user", "content": [{"type": "image", "path": image}, {"type": "text", "text": question}]}]
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return processor.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="demo/model", help="the checkpoint before training")
    parser.add_argument("--after", default="outputs/qwen2_5_vl_demo/checkpoint", help="the trained checkpoint")
    parser.add_argument("--image", default="demo/data/held_out/motorcycle_right.png", help="an image to ask about")
    parser.add_argument("--question", default="What is shown here?")
    args = parser.parse_args(argv)
    print(f"{args.question} ({args.image}, not in the training rows)")
    for name, checkpoint in (("before", args.before), ("after", args.after)):
        print(f"  {name} training: {reply(checkpoint, args.image, args.question)!r}")


if __name__ == "__main__":
    main()
