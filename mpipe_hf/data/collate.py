"""Turn caption rows into a micro-batch with the HF processor (chat format, labels on the answer only)."""

from __future__ import annotations

import torch

IGNORE = -100


class CaptionCollator:
    """Rows ``{"image": PIL image or None, "prompt": str, "caption": str}`` -> a micro-batch.

    Returns a dict with ``input_ids``, ``attention_mask``, ``mm_token_type_ids``, ``labels`` ``(B, L)`` and, when
    some row has an image, ``pixel_values`` ``(patches, C*T*p*p)`` and ``image_grid_thw`` ``(images, 3)``.
    ``labels`` is ``-100`` everywhere except the assistant's answer and its ``<|im_end|>``.
    """

    def __init__(self, processor):
        self.processor = processor
        tok = processor.tokenizer
        self.im_start = tok.convert_tokens_to_ids("<|im_start|>")
        self.header_len = 1 + len(tok("assistant\n").input_ids)  # <|im_start|>assistant\n

    def text(self, row) -> str:
        vision = "<|vision_start|><|image_pad|><|vision_end|>" if row.get("image") is not None else ""
        return (f"<|im_start|>user\n{vision}{row['prompt']}<|im_end|>\n"
                f"<|im_start|>assistant\n{row['caption']}<|im_end|>")

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        images = [row["image"].convert("RGB") for row in rows if row.get("image") is not None]
        batch = self.processor(text=[self.text(r) for r in rows], images=images or None, padding=True,
                               return_tensors="pt")
        ids = batch["input_ids"]
        labels = ids.masked_fill(batch["attention_mask"] == 0, IGNORE)
        for i in range(ids.shape[0]):
            answer = int((ids[i] == self.im_start).nonzero()[-1]) + self.header_len
            labels[i, :answer] = IGNORE
        out = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
        out["labels"] = labels
        return out
