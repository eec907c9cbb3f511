"""The llava_like families added in issue 38: declarations (:class:`~.family.Family`) and tiny configs."""

from __future__ import annotations

from .family import Family

FAMILIES: dict[str, Family] = {}
TINY: dict = {}  # model_type -> tiny_<type>_config(tokenizer, num_layers=8, ...)
