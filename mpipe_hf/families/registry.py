"""Which package declares each ``model_type``, and the one place that looks a family up: its split declaration
(:class:`~mpipe_hf.models.family.Family`), its data path (:class:`~mpipe_hf.data.family_data.FamilyData`), its
tiny config and, for a type that cannot be split, the reason.

A family group is a package ``mpipe_hf/families/<group>/`` (docs/adding_a_family.md) with the same parts:

- ``split.py``: ``FAMILIES`` (``{model_type: Family}``) and ``REFUSED`` (``{model_type: reason}``);
- ``data.py``: ``DATA`` (``{model_type: FamilyData}``) for the types with a torchvision-free data path here;
- ``tiny.py``: ``TINY`` (``{model_type: tiny_<type>_config(tokenizer, num_layers=8, hidden_size=64, ...)}``).

:data:`GROUPS` names each group's types, so a lookup imports the one group asked for (a family's transformers
classes take seconds to import), as transformers' auto classes import one model's module. The generic machinery in
:mod:`mpipe_hf.models` and :mod:`mpipe_hf.data` reaches a family only through the functions here.
"""

from __future__ import annotations

import importlib
from typing import Iterable

GROUPS: dict[str, tuple[str, ...]] = {
    "qwen": ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen2_5_omni_thinker",
             "qwen3_omni_moe_thinker", "qwen4_exp"),
    "glm": ("glm4v", "glm4v_moe", "glm46v", "glm_ocr", "glmga", "glm5_next"),
    "qwen_like": ("cosmos3_edge", "cosmos3_omni", "exaone4_5", "llava_onevision1_5", "paddleocr_vl", "video_llama_3",
                  "ernie4_5_vl_moe", "hunyuan_vl", "hyperclovax_vision_v2", "lfm3_vl", "minicpmv4_6", "minicpmv4_7",
                  "minicpm_ocr", "kimi_k25", "ovis2_5", "hy_v4_vl"),
    "gemma": ("gemma3", "paligemma", "shieldgemma2", "gemma3n", "gemma3n_text", "gemma4", "gemma4_unified",
              "muse_glimmer", "muse_spark", "diffusion_gemma"),
    "llava": ("llava", "llava_next", "llava_next_video", "llava_onevision", "vipllava", "video_llava", "aya_vision",
              "cohere2_vision", "aria", "fast_vlm", "perception_lm", "llama4", "lfm2_vl", "molmo2", "step3p7",
              "minimax_m3_vl", "fuyu", "ovis2"),
    "mistral": ("mistral3", "mistral4", "lighton_ocr", "mistral_large4"),
    "idefics": ("idefics2", "idefics3", "smolvlm"),
    "internvl": ("internvl", "qianfan_ocr"),
    "deepseek": ("deepseek_vl", "deepseek_vl_hybrid", "janus", "deepseek_ocr2"),
    "ocr": ("got_ocr2", "pp_chart2table", "unlimited_ocr"),
    "inkling": ("inkling_mm_model", "inkling2", "inkling2_loop"),
    "nemotron": ("nemotron_h_omni",),
    "text": ("llama", "qwen2", "qwen3"),
}
"""``group`` -> the model types its package declares or refuses."""

_GROUP_OF = {model_type: group for group, types in GROUPS.items() for model_type in types}
_REGISTERED: dict[str, object] = {}  # register()'s splitters, ahead of the declarations


def group_of(model_type: str) -> str | None:
    """The group package that declares or refuses ``model_type`` (``None``: no group does)."""
    return _GROUP_OF.get(model_type)


def _table(group: str, part: str, name: str) -> dict:
    """``mpipe_hf.families.<group>.<part>.<name>``, the group's table of that part (imported on first use; every
    group has every part, ``tests/test_family_packages.py``)."""
    return getattr(importlib.import_module(f"{__package__}.{group}.{part}"), name)


def _lookup(model_type: str, part: str, name: str):
    group = _GROUP_OF.get(model_type)
    return _table(group, part, name).get(model_type) if group else None


def family(model_type: str):
    """The split declaration of ``model_type`` (a registered splitter first), or ``None``."""
    if model_type in _REGISTERED:
        return _REGISTERED[model_type]
    return _lookup(model_type, "split", "FAMILIES")


def family_data(model_type: str):
    """The :class:`~mpipe_hf.data.family_data.FamilyData` of ``model_type``, or ``None`` (no data path here)."""
    return _lookup(model_type, "data", "DATA")


def tiny_config(model_type: str):
    """``tiny(tokenizer, num_layers=8, hidden_size=64, ...)`` -> the scaled-down real config of ``model_type``, or
    ``None``."""
    return _lookup(model_type, "tiny", "TINY")


def refusal(model_type: str) -> str | None:
    """Why ``model_type`` cannot be split, in the user's terms, or ``None`` (declared, or unknown here)."""
    group = _GROUP_OF.get(model_type)
    found = _table(group, "split", "REFUSED").get(model_type) if group else None
    if found is None:
        from .refused import REFUSED
        found = REFUSED.get(model_type)
    return found


def register(model_types: str | Iterable[str], splitter) -> None:
    """Make ``splitter`` the family of ``model_types`` ahead of any declaration (see :func:`mpipe_hf.models.register`,
    which checks it)."""
    for model_type in [model_types] if isinstance(model_types, str) else model_types:
        _REGISTERED[model_type] = splitter


def unregister(model_types: str | Iterable[str]) -> None:
    """Drop the splitters :func:`register` gave ``model_types`` (their declarations, if any, serve again)."""
    for model_type in [model_types] if isinstance(model_types, str) else model_types:
        _REGISTERED.pop(model_type, None)


def _every(part: str, name: str) -> dict:
    out = {}
    for group in GROUPS:
        out.update(_table(group, part, name))
    return out


def all_families() -> dict:
    """``{model_type: Family}`` of every group (each imported), registered splitters included."""
    return {**_every("split", "FAMILIES"), **_REGISTERED}


def all_data() -> dict:
    """``{model_type: FamilyData}`` of every group (each imported)."""
    return _every("data", "DATA")


def all_tiny() -> dict:
    """``{model_type: tiny config builder}`` of every group (each imported)."""
    return _every("tiny", "TINY")


def all_refused() -> dict[str, str]:
    """``{model_type: reason}``: every group's refusals and those of :mod:`.refused`."""
    from .refused import REFUSED
    return {**REFUSED, **_every("split", "REFUSED")}
