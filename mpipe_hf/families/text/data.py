"""The decoder-only language models have no data path here: their rows are text, tokenized by
:class:`~mpipe_hf.data.collate.TextCollator` with the model's own tokenizer (no image processor, processor or
vision chat template)."""

from __future__ import annotations

from ...data.family_data import FamilyData

DATA: dict[str, FamilyData] = {}
