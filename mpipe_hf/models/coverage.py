"""Every model type transformers maps to ``AutoModelForImageTextToText``: split exactly, or refused with the reason
in the user's terms. ``docs/models.md``'s table is generated from here (``scripts/report/model_table.py``).

A type is *declared* when its family group declares it (:func:`mpipe_hf.families.registry.family`); it is
*refused* with the reason its group, or :mod:`mpipe_hf.families.refused`, gives (the architecture in a few words:
why there is no decoder stack to cut, or what it would need that the splitter has not). A type that is neither is
refused as not declared yet.
"""

from __future__ import annotations

from ..families.registry import all_refused, family
from ..families.registry import refusal as declared_refusal

NOTES: dict[str, str] = {
}
"""``model_type`` -> what a declared type without a CI case has been checked for."""

NOT_DECLARED = "not declared yet: no family declaration reads this architecture"


def __getattr__(name: str):
    if name == "REFUSED":  # every group's refusals (each group imported on first use)
        return all_refused()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def image_text_types() -> dict[str, str]:
    """``{model_type: model class name}`` of the installed transformers' ``AutoModelForImageTextToText`` map."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    return dict(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def refusal(model_type: str) -> str | None:
    """Why ``model_type`` is refused (``None`` when it has a declaration)."""
    if family(model_type) is not None:
        return None
    return declared_refusal(model_type) or NOT_DECLARED
