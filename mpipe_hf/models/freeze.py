"""What trains, by pattern: ``train.freeze`` / ``train.trainable`` module patterns and the shortcuts
users know from ms-swift and LLaMA-Factory, ``freeze_vit``, ``freeze_aligner`` and ``freeze_llm``.

A pattern names a parameter or a module by its name in the HF model (``model.visual``, ``model.visual.merger``,
``lm_head.weight``), or matches names as a shell glob (``*.self_attn.*``). The parts behind the shortcuts are read
from the family's declaration: ``llm`` is its text model and ``lm_head``; ``aligner`` the parts of its vision
FQNs named as projectors (:data:`ALIGNER_NAMES`: LLaVA's ``multi_modal_projector``, Qwen-VL's ``visual.merger``
and DeepStack mergers, Idefics3's ``connector``); ``vit`` the rest of the vision FQNs. Frozen first by the
shortcuts and ``freeze``; ``trainable`` then gives back its matches, among what the split and the adapter left
trainable.

With the ViT frozen and the merger trained, ``P`` is trainable (``parallel.preprocess: trainable``), but nothing
before the merger needs a gradient: autograd records no ViT operation, so ``P`` keeps no ViT activation and its
backward runs through the merger alone (SPEC.md, "Trainable preprocess").
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass

from torch import nn

ALIGNER_NAMES = ("multi_modal_projector", "merger", "deepstack_merger_list", "connector", "mm_projector",
                 "projector", "aligner", "embed_vision", "mm_input_projection", "vision_projection")
"""Module names that are a family's projector (aligner) between its ViT and its language model."""
SHORTCUTS = ("freeze_vit", "freeze_aligner", "freeze_llm")


@dataclass(frozen=True, kw_only=True)
class Trainable:
    """Which parameters train, besides what the split (a frozen ``P``) and a LoRA adapter freeze.

    Attributes:
        freeze: patterns of parameters to freeze (module or parameter names, or shell globs).
        trainable: patterns given back after ``freeze`` and the shortcuts (e.g. ``freeze: [model.visual]``,
            ``trainable: [model.visual.merger]``).
        freeze_vit, freeze_aligner, freeze_llm: freeze the vision tower without its projector, the projector
            (merger), or the language model with its head.

    Raises:
        ValueError: a pattern list that is not a list of non-empty strings; a shortcut that is not a boolean.
    """

    freeze: tuple[str, ...] = ()
    trainable: tuple[str, ...] = ()
    freeze_vit: bool = False
    freeze_aligner: bool = False
    freeze_llm: bool = False

    def __post_init__(self):
        for key in ("freeze", "trainable"):
            value = getattr(self, key)
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, (list, tuple)) or any(not isinstance(p, str) or not p.strip() for p in value):
                raise ValueError(f"train.{key} must be a list of module or parameter name patterns, got {value!r}")
            object.__setattr__(self, key, tuple(value))
        for key in SHORTCUTS:
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"train.{key} must be true or false, got {getattr(self, key)!r}")

    def freezes(self) -> bool:
        """Whether any pattern or shortcut is set."""
        return bool(self.freeze or self.trainable or any(getattr(self, k) for k in SHORTCUTS))


def matches(name: str, pattern: str) -> bool:
    """Whether parameter ``name`` is ``pattern``, lies under the module ``pattern``, or matches it as a glob."""
    return name == pattern or name.startswith(pattern + ".") or fnmatch.fnmatchcase(name, pattern)


def parts(family, model: nn.Module) -> dict[str, list[str]]:
    """``{"vit": FQNs, "aligner": FQNs, "llm": FQNs}`` of ``model`` under ``family`` (a declared
    :class:`~.family.Family`; module docstring).

    Raises:
        ValueError: ``family`` is not a declaration (a registered splitter names no parts).
    """
    vision = getattr(family, "vision", None)
    if vision is None:
        raise ValueError(f"{type(model).__name__}'s family is a registered splitter, not a declaration: "
                         f"train.freeze_vit / freeze_aligner / freeze_llm cannot name its parts; use train.freeze")
    vit, aligner = [], []
    for fqn in vision:
        if fqn.rsplit(".", 1)[-1] in ALIGNER_NAMES:
            aligner.append(fqn)
            continue
        module = _module_or_none(model, fqn)
        children = [n for n, _ in module.named_children()] if module is not None else []
        inner = [f"{fqn}.{n}" for n in children if n in ALIGNER_NAMES]
        aligner += inner
        vit += [f"{fqn}.{n}" for n in children if n not in ALIGNER_NAMES] if inner else [fqn]
    return {"vit": vit, "aligner": aligner, "llm": [family.text, family.head]}


def _module_or_none(model: nn.Module, fqn: str) -> nn.Module | None:
    try:
        return model.get_submodule(fqn)
    except AttributeError:  # a bare parameter (LLaVA-Next's image_newline)
        return None


def apply_trainable(model: nn.Module, family, spec: Trainable, split_frozen=(), tied=(), strict: bool = True
                    ) -> list[str]:
    """Freeze ``model``'s parameters as ``spec`` says, in place. A tied pair (``tied``: ``[(embedding, lm_head)]``
    names, the split's two copies of one HF parameter) is frozen together when either name matches, whichever
    copy this rank holds, as the one HF parameter is. Patterns are matched against names alone, so each rank of
    a split applies them to its own share; ``strict`` (the whole model, checked before launch) also requires
    every pattern to match.

    Returns:
        the names frozen here, sorted.

    Raises:
        ValueError: with ``strict``, patterns that match no parameter (every one, each with the nearest names:
            :func:`unmatched_text`), or a shortcut whose part is empty (a
            decoder-only LM has no ViT); a ``trainable`` pattern whose matches the split or an adapter froze
            (``split_frozen``: :attr:`~.base.SplitModel.frozen` FQNs), naming the recipe field that trains them.
    """
    params = dict(model.named_parameters())
    before = {n for n, p in params.items() if p.requires_grad}
    freeze = list(spec.freeze)
    named = parts(family, model) if any(getattr(spec, k) for k in SHORTCUTS) else {}
    for key in SHORTCUTS:
        part = named.get(key.removeprefix("freeze_"), [])
        if getattr(spec, key) and strict and not any(matches(n, p) for n in params for p in part):
            raise ValueError(f"train.{key}: {type(model).__name__} has no {key.removeprefix('freeze_')} "
                             f"parameters (the parts its family names: {part})")
        freeze += part if getattr(spec, key) else []
    frozen, missed = _matched(params, freeze, "train.freeze", spec.freeze if strict else ())
    given, also = _matched(params, spec.trainable, "train.trainable", spec.trainable if strict else ())
    if missed or also:
        raise ValueError(unmatched_text(params, missed + also))
    blocked = sorted(n for n in given if n not in before)
    if blocked:
        in_p = any(matches(n, f) for n in blocked for f in split_frozen)
        raise ValueError(f"train.trainable gives back {blocked[:3]}, which "
                         + ("the frozen preprocess freezes: set parallel.preprocess: trainable" if in_p else
                            "the LoRA adapter freezes: list the module in lora.modules_to_save"))
    names = (frozen - given) & before
    for embed, head in tied:
        if any(matches(t, p) for t in (embed, head) for p in freeze) and not any(
                matches(t, p) for t in (embed, head) for p in spec.trainable):
            names |= {embed, head} & before
    for name in names:
        params[name].requires_grad_(False)
    return sorted(names)


def _matched(params: dict, patterns, field: str, required: tuple[str, ...]) -> tuple[set[str], list]:
    """``(names, missed)``: the names of ``params`` matching any of ``patterns``, and ``[(field, pattern)]`` for
    each of ``required`` that matches none."""
    out, missed = set(), []
    for pattern in patterns:
        hit = {n for n in params if matches(n, pattern)}
        if not hit and pattern in required:
            missed.append((field, pattern))
        out |= hit
    return out, missed


def nearest_names(names, pattern: str, count: int = 3) -> list[str]:
    """The ``count`` names closest to ``pattern`` among ``names`` and the modules holding them (every dotted
    prefix), by :class:`difflib.SequenceMatcher`'s ratio (closest first), so a misspelt module name is answered
    with the module, not with the first parameters of the model in sorted order."""
    candidates = {".".join(name.split(".")[:k]) for name in names for k in range(1, name.count(".") + 2)}
    return difflib.get_close_matches(pattern, sorted(candidates), n=count, cutoff=0.0)


def unmatched_text(params: dict, missed: list) -> str:
    """The one-line error for patterns that match no parameter: each ``(field, pattern)`` of ``missed`` with the
    nearest names of ``params`` (:func:`nearest_names`), joined by ``"; "``."""
    return "; ".join(f"{field}: {pattern!r} matches no parameter of the model (nearest: "
                     f"{nearest_names(params, pattern)})" for field, pattern in missed)


def check_trainable(config, cfg, spec: Trainable, adapter=None, text_layers: int = 0) -> None:
    """Apply ``spec`` to ``config``'s whole model on the meta device (with ``adapter``, a ``peft.LoraConfig``,
    put in first), split as ``cfg`` freezes it: the check a run makes before any process group.

    Raises:
        ValueError: as :func:`apply_trainable` with ``strict``; ``cfg.preprocess`` ``trainable`` with nothing in
            ``P`` left trainable, or nothing trainable at all.
    """
    from ..schedule import ScheduleConfig
    from .load import _adapt_on_meta, meta_model
    from .registry import get_family, split
    if not spec.freezes():
        return
    model = meta_model(config)
    _adapt_on_meta(model, adapter)
    whole = ScheduleConfig(1, 1, 1, cfg.preprocess)  # every layer on one rank: every name is there
    carved = split(model, whole, 0, None, text_layers)
    apply_trainable(carved.model, get_family(config.model_type), spec, carved.frozen, carved.tied)
    if spec.freeze_vit and not spec.freeze_aligner and cfg.transposed and cfg.preprocess == "frozen":
        raise ValueError("train.freeze_vit trains the projector (merger) with the language model, but "
                         "parallel.preprocess: frozen freezes the whole preprocess, projector included: set "
                         "parallel.preprocess: trainable")
    trained = carved.trainable_parameters(whole, 0)
    if not trained:
        raise ValueError("train.freeze and the freeze_* shortcuts leave no parameter to train")
    in_p = [n for n in trained if any(matches(n, f) for f in carved.preprocess_fqns)]
    if cfg.transposed and cfg.preprocess == "trainable" and not in_p:
        raise ValueError("parallel.preprocess is 'trainable', but train.freeze and the freeze_* shortcuts leave "
                         "nothing in the preprocess (vision tower and projector) to train: set parallel.preprocess: "
                         "frozen")
