"""Turn caption rows into a micro-batch with the HF processor (chat format, labels on the answer only)."""

from __future__ import annotations

import torch

from .processor import image_placeholder

IGNORE = -100


class CaptionCollator:
    """Rows ``{"image": PIL image or None, "prompt": str, "caption": str}`` -> a micro-batch, in the ChatML markup
    (``<|im_start|>user ... <|im_end|>``) that the Qwen tokenizers know.

    Returns a dict with ``input_ids``, ``attention_mask``, ``labels`` ``(B, L)`` and the processor's image keys when
    some row has an image (Qwen: ``mm_token_type_ids`` ``(B, L)``, ``pixel_values`` ``(patches, C*T*p*p)``,
    ``image_grid_thw`` ``(images, 3)``; LLaVA: ``pixel_values`` ``(images, C, h, w)``). ``labels`` is ``-100``
    everywhere except the assistant's answer and its ``<|im_end|>``.
    """

    def __init__(self, processor):
        self.processor = processor
        tok = processor.tokenizer
        self.im_start = tok.convert_tokens_to_ids("<|im_start|>")
        self.header_len = 1 + len(tok("assistant\n").input_ids)  # <|im_start|>assistant\n
        self.placeholder = image_placeholder(processor)

    def text(self, row) -> str:
        vision = self.placeholder if row.get("image") is not None else ""
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


class TextCollator:
    """Rows ``{"text": str}`` -> a padded micro-batch for a causal LM: ``input_ids``, ``attention_mask`` and
    ``labels`` ``(B, L)``, with ``labels`` ``-100`` on padding. Texts longer than ``max_length`` tokens are cut."""

    def __init__(self, tokenizer, max_length: int = 512):
        self.tokenizer, self.max_length = tokenizer, max_length

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = self.tokenizer([row["text"] for row in rows], padding=True, truncation=True,
                               max_length=self.max_length, return_tensors="pt")
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": labels}
