"""Which model family a chat template belongs to, and the check that a model is not given another family's.

A template carries the family's turn markers and image placeholder (Qwen's ChatML writes an image as
``<|vision_start|><|image_pad|><|vision_end|>``, Gemma 3 writes ``<start_of_turn>user`` and the processor's
begin-of-image token): a Gemma 3 model given the Qwen template (say through a recipe's ``model.tokenizer`` copied from
``recipes/qwen3_5.yaml``) finds none of its image tokens in any row, and every image row fails at load.

:func:`template_families` recognises a template by what it renders, not by its text: a fixed probe conversation (a
system turn, a user turn with an image and a text, an answer, a second exchange) is rendered with the template and
with each family's :func:`~.templates.default_chat_template`, in the hub markers and with the Qwen2 stand-ins of
:data:`~.templates.STAND_INS`; the template belongs to every family whose rendering equals its own, the family's
image placeholder matching any one run of non-space characters (the placeholder is the processor's and differs
between a hub checkpoint and a tiny one). The system turn is there so that a default system prompt (Qwen2.5-VL's,
not Qwen3-VL's) does not set two families of the same format apart. A template that renders the probe as no family
does (a user's own, a hub template with more to it) belongs to none and is accepted.
"""

from __future__ import annotations

import functools
import re

PROBE_IMAGE = "<<mpipe-image>>"  # stands for the family's image placeholder in its rendering
_PROBE = [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is shown here?"}]},
          {"role": "assistant", "content": "A red cup."},
          {"role": "user", "content": "And its colour?"},
          {"role": "assistant", "content": "Red."}]
PROBES = (_PROBE, [m for m in _PROBE if m["role"] != "system"])  # the second for a template refusing system turns
_SPECIALS = {"bos_token": "<<bos>>", "eos_token": "<<eos>>"}


def _render(template: str, messages: list[dict]) -> str | None:
    """``template``'s rendering of ``messages`` (no generation prompt), or ``None`` when it fails to render."""
    from transformers.utils.chat_template_utils import render_jinja_template
    try:
        rendered, _ = render_jinja_template(conversations=[messages], chat_template=template, **_SPECIALS)
    except Exception:  # noqa: BLE001 - a template that raises (on a system turn, say) does not render the probe
        return None
    return rendered[0]


def _pattern(rendered: str) -> re.Pattern:
    """``rendered`` as a regular expression whose first :data:`PROBE_IMAGE` matches a run of non-space characters
    and every later one the same run."""
    parts = [re.escape(part) for part in rendered.split(PROBE_IMAGE)]
    if len(parts) == 1:
        return re.compile(parts[0], re.DOTALL)
    return re.compile(parts[0] + r"(\S+?)" + r"\1".join(parts[1:]), re.DOTALL)


def _stood_in(template: str) -> str:
    """``template`` with every hub marker of :data:`~.templates.STAND_INS` written as its stand-in."""
    from .templates import STAND_INS
    for marker, stand_in in STAND_INS.items():
        template = template.replace(marker, stand_in)
    return template


@functools.lru_cache(maxsize=1)
def _family_patterns() -> dict[str, list[tuple[int, re.Pattern]]]:
    """``{model_type: [(probe index, pattern)]}`` for every family with a default chat template: its renderings of
    the first probe it renders, in the hub markers and with the stand-ins."""
    from ..families.registry import all_data
    from .templates import default_chat_template
    patterns = {}
    for model_type in sorted(all_data()):
        hub = default_chat_template(model_type, PROBE_IMAGE)
        for index, probe in enumerate(PROBES):
            renderings = {_render(t, probe) for t in (hub, _stood_in(hub))} - {None}
            if renderings:
                patterns[model_type] = [(index, _pattern(r)) for r in sorted(renderings)]
                break
    return patterns


def template_families(template) -> list[str]:
    """The model types whose chat template renders as ``template`` does (module docstring), those of
    the owners of the format first (``FamilyData.template_owner``: ``qwen2_5_vl`` before a family that took up
    its format), each group sorted; ``[]`` for a
    template of no known family, an empty one, or one that is not a string (a dict of named templates: its
    ``default``)."""
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or not template.strip():
        return []
    from ..families.registry import family_data
    renderings = [_render(template, probe) for probe in PROBES]
    return sorted((model_type for model_type, patterns in _family_patterns().items()
                   if any(renderings[i] is not None and p.fullmatch(renderings[i]) for i, p in patterns)),
                  key=lambda model_type: (not family_data(model_type).template_owner, model_type))


def _is_own_default(template, model_type: str) -> bool:
    """Whether ``template`` (or a dict's ``default``) is ``model_type``'s own default chat template, as the hub
    writes it or with every stand-in of :data:`~.templates.STAND_INS`: a string comparison, no rendering."""
    from .templates import default_chat_template
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str):
        return False
    try:
        hub = default_chat_template(model_type)
    except ValueError:  # no default here: the full check decides
        return False
    return template in (hub, _stood_in(hub))


def check_template_family(template, model_type: str, where: str = "the tokenizer") -> None:
    """Refuse a chat template that belongs to another family than ``model_type`` (:func:`template_families`).

    Args:
        template: the chat template the run would render its rows with (a string, a dict of named ones, or
            ``None``: the family's own default then renders, nothing to check).
        model_type: the model's ``config.model_type``. A family without a default chat template here (a
            decoder-only LM) is not checked.
        where: what carries the template, for the message (``model.tokenizer '/path'``).

    Raises:
        ValueError: ``template`` belongs to one or more families and ``model_type`` is not among them; the message
            names both families and the fix.
    """
    if _is_own_default(template, model_type):  # the common case, without rendering every family's template
        return
    patterns = _family_patterns()
    if model_type not in patterns:
        return
    families = template_families(template)
    if not families or model_type in families:
        return
    raise ValueError(
        f"{where} carries the chat template of {families[0]}"
        f"{' (the same format as ' + ', '.join(families[1:]) + ')' if len(families) > 1 else ''}, not of "
        f"{model_type}, the model's model_type: its turns and image placeholder are not {model_type}'s, so every "
        f"image row would fail at load. Fix: point model.tokenizer at a {model_type} tokenizer (a checkpoint's; "
        f"scripts/make/make_tiny_models.py writes tiny/{model_type}) or at one without a chat template (the demo's "
        f"demo/tokenizer), or remove its chat template (chat_template.jinja, or chat_template in "
        f"tokenizer_config.json), so that {model_type}'s own default renders the rows")
