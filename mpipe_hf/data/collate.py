"""The text collator of a decoder-only LM (plain ``{"text"}`` rows), and the label that carries no loss."""

from __future__ import annotations

import torch

IGNORE = -100


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

    def null_batch(self) -> dict[str, torch.Tensor]:
        """A micro-batch that trains nothing: one short text row whose labels are all ``-100`` (``(1, L)``
        tensors). It adds 0 to the step's loss sum and label tokens and exactly zero gradients; what stands in
        for a micro-batch none of whose rows could be loaded (:meth:`~.owner.MicroBatchPlan.load_rows`)."""
        return nothing_to_learn(self([{"text": NULL_TEXT}]))


NULL_TEXT = "Nothing to learn here."


def nothing_to_learn(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``batch`` with every label ``-100`` (a null micro-batch: no label token)."""
    return {**batch, "labels": torch.full_like(batch["labels"], IGNORE)}
