"""The data path of the llava_like families added in issue 38 (:class:`~.family_data.FamilyData` each)."""

from __future__ import annotations

from .family_data import FamilyData

DATA: dict[str, FamilyData] = {}
