"""The split declarations of the decoder-only language models: the text stack ``model`` and nothing else."""

from __future__ import annotations

from ...models.family import Family

DECODER_ONLY = Family(text="model")

FAMILIES: dict[str, Family] = {"llama": DECODER_ONLY, "qwen2": DECODER_ONLY, "qwen3": DECODER_ONLY}
REFUSED: dict[str, str] = {}
