"""The recipe's ``lora`` section (:class:`LoraSection`): a LoRA adapter through ``peft``, its fields
``peft.LoraConfig``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LoraSection:
    """``lora:`` a LoRA adapter (Hu et al., 2021) put into the model with ``peft`` before it is split; only the
    adapter (and ``modules_to_save``) trains, the base weights stay frozen, with no gradient and no optimizer
    state (README, "LoRA"). The fields are ``peft.LoraConfig``'s.

    Attributes:
        r: the adapter's rank.
        lora_alpha: the scale numerator: the update is ``lora_alpha / r * B @ A`` (``/ sqrt(r)`` with
            ``use_rslora``).
        lora_dropout: dropout on the adapter's input, in ``[0, 1)``.
        target_modules: the linear layers to adapt: a list of module-name suffixes (``[q_proj, v_proj]``), one
            regex matched against the whole name, ``all-linear``, or ``null`` for peft's default of the model
            type, or ``[]`` (none) beside ``target_parameters``. With ``parallel.preprocess: frozen`` no target may
            sit in the tower.
        target_parameters: parameters (not modules) to adapt, for MoE experts held as fused ``nn.Parameter``
            tensors of shape ``(E, out, in)`` rather than ``nn.Linear`` layers (``[mlp.experts.gate_up_proj,
            mlp.experts.down_proj]``): a list of parameter names or their last parts, as peft's
            ``LoraConfig.target_parameters`` (peft >= 0.17; no regex). Needs ``lora_dropout: 0``.
        exclude_modules: module-name suffixes or one regex that are never adapted.
        modules_to_save: modules trained and saved whole beside the adapter (the merger, ``lm_head``).
        use_rslora: rank-stabilised scaling.
        init_lora_weights: ``true`` (``A`` as ``nn.Linear``'s init, ``B = 0``), ``gaussian``, or ``false``
            (random ``B`` too; for tests).
        merge: besides the adapter checkpoint, write ``output_dir/merged``: the base with the adapter merged in,
            which ``from_pretrained`` loads.

    Raises:
        ValueError: an ``r`` that is not an integer >= 1; a ``lora_alpha`` that is not a finite number > 0; a
            ``lora_dropout`` outside ``[0, 1)``; a module list that is not a non-empty string or a list of them
            (or null); an ``init_lora_weights`` other than true, false or ``gaussian``; a flag that is not a
            boolean; ``target_parameters`` that is not a non-empty list of names, set with ``lora_dropout > 0``
            or with a peft that lacks it. (A target that matches nothing is an error of the adapted model,
            :func:`~mpipe_hf.models.adapters.check_adapted`.)
    """

    r: int = 8
    lora_alpha: float = 16
    lora_dropout: float = 0.0
    target_modules: list[str] | str | None = None
    target_parameters: list[str] | None = None
    exclude_modules: list[str] | str | None = None
    modules_to_save: list[str] | None = None
    use_rslora: bool = False
    init_lora_weights: bool | str = True
    merge: bool = False

    def __post_init__(self):
        if not isinstance(self.r, int) or isinstance(self.r, bool) or self.r < 1:
            raise ValueError(f"lora.r must be an integer >= 1, got {self.r!r}")
        for key, low, high in (("lora_alpha", 0.0, math.inf), ("lora_dropout", 0.0, 1.0)):
            value, number = getattr(self, key), math.nan
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                try:
                    number = float(value)
                except (ValueError, OverflowError):
                    pass
            ok = (number > low if key == "lora_alpha" else low <= number < high) and math.isfinite(number)
            if not ok:
                allowed = "a finite number > 0" if key == "lora_alpha" else "a number in [0, 1)"
                raise ValueError(f"lora.{key} must be {allowed}, got {value!r}")
            object.__setattr__(self, key, int(number) if key == "lora_alpha" and number == int(number) else number)
        for key in ("target_modules", "exclude_modules", "modules_to_save", "target_parameters"):
            value = getattr(self, key)
            listed = key in ("modules_to_save", "target_parameters")
            names = [value] if isinstance(value, str) and not listed else value
            empty_ok = key == "target_modules" and self.target_parameters  # peft's way to adapt parameters only
            if value is not None and (not isinstance(names, (list, tuple)) or not (names or empty_ok) or any(
                    not isinstance(n, str) or not n for n in names)):
                kind = {"modules_to_save": "a list of module names",
                        "target_parameters": "a list of parameter names"}.get(key, "a list of module names, one regex "
                                                                                   "string")
                raise ValueError(f"lora.{key} must be {kind} or null, got {value!r}")
            if isinstance(value, tuple):
                object.__setattr__(self, key, list(value))
        if self.target_parameters:
            _check_target_parameters(self.lora_dropout)
        for key in ("use_rslora", "merge"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"lora.{key} must be true or false, got {getattr(self, key)!r}")
        if self.init_lora_weights not in (True, False, "gaussian") or (
                not isinstance(self.init_lora_weights, (bool, str))):
            raise ValueError(f"lora.init_lora_weights must be true, false or 'gaussian', got "
                             f"{self.init_lora_weights!r}")

    def peft_config(self):
        """The ``peft.LoraConfig`` of these fields."""
        from peft import LoraConfig
        extra = {"target_parameters": list(self.target_parameters)} if self.target_parameters else {}
        return LoraConfig(r=self.r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
                          target_modules=self.target_modules, exclude_modules=self.exclude_modules,
                          modules_to_save=self.modules_to_save, use_rslora=self.use_rslora,
                          init_lora_weights=self.init_lora_weights, **extra)


def _check_target_parameters(dropout: float) -> None:
    """``lora.target_parameters`` needs a peft whose ``LoraConfig`` has the field, and no dropout (peft's
    ``lora.ParamWrapper`` cannot apply dropout to a weight: the update is folded into the parameter).

    Raises:
        ValueError: naming ``lora.target_parameters`` (and ``lora.lora_dropout``).
    """
    import dataclasses

    import peft
    if "target_parameters" not in {f.name for f in dataclasses.fields(peft.LoraConfig)}:
        raise ValueError(f"lora.target_parameters needs peft >= 0.17 (its LoraConfig.target_parameters); the "
                         f"installed peft {peft.__version__} lacks it")
    if dropout:
        raise ValueError(f"lora.target_parameters cannot be used with lora.lora_dropout {dropout} (peft adapts a "
                         f"parameter by adding B @ A to the weight, where no dropout applies); set lora_dropout: 0")
