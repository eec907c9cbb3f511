"""PEFT adapters (LoRA) on the Hugging Face model before it is split (README, "LoRA").

The adapter is put in by ``peft.get_peft_model``, the call a user makes on one process, on the whole model while
it is still on the meta device (:func:`~.load.split_from_checkpoint`, :func:`~.load.split_from_config`); the
split then carves the adapted model, so every stage, ``P`` included, holds its own layers' adapters. peft leaves
the base weights with ``requires_grad=False``: they get no gradient and no optimizer state.

Names: in the model, an adapted linear layer ``X`` holds ``X.base_layer.weight`` (the checkpoint's ``X.weight``)
and ``X.lora_A.default.weight``, ``X.lora_B.default.weight``; a module of ``modules_to_save`` holds its frozen
original under ``X.original_module`` and the trained copy under ``X.modules_to_save.default``. A parameter of
``target_parameters`` (an MoE layer's fused experts, ``E.gate_up_proj`` of shape ``(n_experts, out, in)``) is
adapted by peft's ``lora.ParamWrapper``, which takes the place of the module ``E`` that holds it: the parameter
moves to ``E.base_layer.gate_up_proj`` and the adapter is ``E.lora_A.default.weight`` ``(n_experts * r, in)``,
``E.lora_B.default.weight`` ``(out, n_experts * r)``. A second parameter of ``E`` wraps that wrapper: its adapter
is ``E.lora_A...``, the first one's moves to ``E.base_layer.lora_A...``, both parameters to
``E.base_layer.base_layer.*``. In PEFT's files
(``adapter_model.safetensors``) the keys are ``base_model.model.X.lora_A.weight`` and so on: peft's own
``get_peft_model_state_dict`` and ``set_peft_model_state_dict`` translate.
"""

from __future__ import annotations

import copy
import re
import warnings

import torch
from torch import nn

from .lm_head import output_head

ADAPTER = "default"  # the adapter's name inside the model (peft's default)
PEFT_PREFIX = "base_model.model."  # the PeftModel's prefix of the HF model's names
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's SAFETENSORS_WEIGHTS_NAME: an adapter checkpoint's one file
_WRAPPED = re.compile(rf"\.(base_layer|original_module|modules_to_save\.{ADAPTER})(?=\.|$)")


def apply_adapter(model: nn.Module, peft_config):
    """``peft.get_peft_model(model, peft_config)`` on a copy of the config: the adapter goes into ``model`` in
    place (its linear layers become peft's ``lora.Linear``), and the returned ``PeftModel`` wraps it. The new
    tensors follow their base layer's device (meta stays meta) and draw their initial values from the torch
    generator, as on one process.

    Raises:
        ValueError: peft's own, as one line naming ``lora.target_modules`` (a target that matches no module, a
            module type peft cannot adapt); those of :func:`check_adapted`.
    """
    from peft import get_peft_model
    try:
        with warnings.catch_warnings():  # peft asks the model the v4 name, is_gradient_checkpointing
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            peft_model = get_peft_model(model, copy.deepcopy(peft_config))
    except ValueError as err:
        text = " ".join(str(err).split())
        fields = "lora.target_modules" + (" / lora.target_parameters" if getattr(peft_config, "target_parameters",
                                                                                  None) else "")
        raise ValueError(f"lora: peft cannot put the adapter into {type(model).__name__} ({fields}): {text}") from err
    check_adapted(model, peft_config)
    return peft_model


def _unwrapped(module: nn.Module) -> nn.Module:
    """The module peft wrapped (a LoRA layer's base layer, a ``modules_to_save`` wrapper's original)."""
    if hasattr(module, "get_base_layer"):
        return module.get_base_layer()
    return getattr(module, "original_module", module)


def check_adapted(model: nn.Module, peft_config) -> None:
    """What the pipeline needs of an adapted model (``model``: the HF model peft changed in place).

    Raises:
        ValueError: no tensor trains (an adapter in inference mode); an adapter or ``modules_to_save`` on a tied
            input embedding or ``lm_head`` (the pipeline holds the tied weight as two copies on two ranks,
            which a wrapped layer cannot be); a ``modules_to_save`` or ``target_parameters`` entry that names no
            module or parameter (peft itself ignores one while another target matches).
    """
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("lora: the adapted model trains no tensor (a PeftModel in inference mode?); load the "
                         "adapter with is_trainable=True, or give it target_modules")
    wrapped = {n: m for n, m in model.named_modules() if isinstance(m, (LoraLayer, ModulesToSaveWrapper))}
    embed, head = model.get_input_embeddings(), (output_head(model) or (None, None))[1]
    if head is not None and _unwrapped(embed).weight is _unwrapped(head).weight:
        on_tied = sorted(n for n, m in wrapped.items() if m is embed or m is head)
        if on_tied:
            raise ValueError(f"lora: {', '.join(on_tied)} share one weight (tie_word_embeddings), which the "
                             f"pipeline holds as two copies on two ranks; drop them from lora.target_modules and "
                             f"lora.modules_to_save")
    for entry in getattr(peft_config, "modules_to_save", None) or []:
        if not any(isinstance(m, ModulesToSaveWrapper) and (n == entry or n.endswith("." + entry))
                   for n, m in wrapped.items()):
            raise ValueError(f"lora.modules_to_save: {entry!r} names no module of {type(model).__name__} "
                             f"(a module name or its last parts, e.g. model.visual.merger)")
    reached = adapted_parameters(model)
    for entry in getattr(peft_config, "target_parameters", None) or []:
        if not any(n == entry or n.endswith("." + entry) for n in reached):
            raise ValueError(f"lora.target_parameters: {entry!r} names no parameter of {type(model).__name__} peft "
                             f"could adapt (a parameter name or its last parts, e.g. mlp.experts.gate_up_proj; a 2-D "
                             f"or 3-D nn.Parameter of a module that target_modules does not adapt)")


def adapted_parameters(model: nn.Module) -> dict[str, nn.Module]:
    """The parameters adapted through ``target_parameters``: ``{checkpoint name of the parameter (e.g.
    model.language_model.layers.0.mlp.experts.gate_up_proj): its peft lora.ParamWrapper}``; empty for a peft
    without ``ParamWrapper``."""
    from peft.tuners.lora import layer
    wrapper = getattr(layer, "ParamWrapper", None)
    if wrapper is None:
        return {}
    return {f"{base_name(n)}.{m.parameter_name}": m for n, m in model.named_modules() if isinstance(m, wrapper)}


def check_mergeable(model: nn.Module) -> None:
    """``merge: true`` needs every adapted layer to be plain LoRA on a linear layer or on a parameter of
    ``target_parameters`` (what :func:`merged_state` merges).

    Raises:
        ValueError: naming the first other adapted layer.
    """
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer
    wrappers = {id(m) for m in adapted_parameters(model).values()}
    for name, module in model.named_modules():
        if id(module) in wrappers:
            continue
        if isinstance(module, LoraLayer) and (not isinstance(module, LoraLinear) or module.use_dora.get(ADAPTER)
                                              or module.lora_bias.get(ADAPTER)):
            raise ValueError(f"lora.merge: {name} is a {type(module).__name__} adapter; merging supports plain "
                             f"LoRA on linear layers (drop it from lora.target_modules, or set merge: false)")


def base_name(name: str) -> str:
    """The name a tensor of the adapted model has in the base checkpoint (``X.base_layer.weight`` ->
    ``X.weight``; both copies of a ``modules_to_save`` module -> the module's own name); an adapter tensor
    (``lora_A``, ``lora_B``) keeps its name (no checkpoint holds it)."""
    return _WRAPPED.sub("", name)


def is_adapter_tensor(name: str) -> bool:
    """Whether ``name`` is a tensor the adapter trains and saves (``lora_*`` or a ``modules_to_save`` copy)."""
    return ".lora_" in name or f".modules_to_save.{ADAPTER}." in name


def check_adapter_placement(trained: set[str], frozen: list[str], preprocess_fqns: list[str],
                            preprocess: str) -> None:
    """The adapter must train where the split puts it.

    Args:
        trained: names of the tensors peft left trainable (``named_parameters`` of the adapted model), taken
            before the split.
        frozen: module FQNs the split froze (``SplitModel.frozen``): a frozen (or ``identity``) ``P`` runs
            without a graph.
        preprocess_fqns: the modules of ``P``.
        preprocess: ``parallel.preprocess``.

    Raises:
        ValueError: an adapter tensor (or ``modules_to_save`` copy) inside a module the split freezes, which
            would never train; or ``preprocess: trainable`` with no trainable tensor in ``P`` (its backward
            would run for nothing). The message names the tensors and what to change.
    """
    def under(name, fqns):
        return any(name.startswith(f + ".") for f in fqns)
    inside = sorted(n for n in trained if under(n, frozen))
    if inside:
        raise ValueError(f"lora: {len(inside)} adapter tensors sit in modules parallel.preprocess {preprocess!r} "
                         f"freezes ({', '.join(inside[:3])}{' ...' if len(inside) > 3 else ''}), so they would "
                         f"never train; narrow lora.target_modules (a regex such as "
                         f"'.*language_model.*\\.(q_proj|v_proj)', or lora.exclude_modules) and "
                         f"lora.modules_to_save, or set parallel.preprocess: trainable")
    if preprocess == "trainable" and preprocess_fqns and not any(under(n, preprocess_fqns) for n in trained):
        raise ValueError(f"lora: parallel.preprocess is 'trainable', but no adapter tensor sits in P "
                         f"({', '.join(preprocess_fqns)}); set parallel.preprocess: frozen, or target P's modules "
                         f"with lora.target_modules or lora.modules_to_save")


def adapter_state(peft_model, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of ``state`` (a rank's share, HF model names) under the keys of PEFT's
    ``adapter_model.safetensors`` (``base_model.model.X.lora_A.weight``), by peft's
    ``get_peft_model_state_dict``. peft reads every wrapped module the model holds, so it is given all the rank
    holds (``P``'s replica included), with ``state``'s tensors in place of their own; only ``state``'s come
    back."""
    from peft import get_peft_model_state_dict
    mine = {id(t) for n, t in state.items() if is_adapter_tensor(n)}
    if not mine:
        return {}
    held = {**peft_model.base_model.model.state_dict(), **state}
    out = get_peft_model_state_dict(peft_model, state_dict={PEFT_PREFIX + n: t for n, t in held.items()},
                                    adapter_name=ADAPTER, save_embedding_layers=False)
    return {k: t for k, t in out.items() if id(t) in mine}


def load_adapter_state(peft_model, weights: dict[str, torch.Tensor], owned: list[str]) -> None:
    """Copy PEFT-format ``weights`` (``adapter_model.safetensors``) into ``peft_model``'s tensors in place (the
    optimizer keeps its parameters), through peft's ``set_peft_model_state_dict``; a rank holds only its share,
    so keys of layers it does not hold are left over.

    Args:
        owned: the names (HF model names) this rank must find in ``weights``.

    Raises:
        ValueError: an owned adapter tensor ``weights`` lacks (another adapter: other target modules or rank).
    """
    from peft import set_peft_model_state_dict
    result = set_peft_model_state_dict(peft_model, weights, adapter_name=ADAPTER)
    missing = sorted({k.removeprefix(PEFT_PREFIX) for k in result.missing_keys} & set(owned))
    if missing:
        raise ValueError(f"the adapter checkpoint lacks {len(missing)} adapter tensors this rank holds "
                         f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}); it was saved with "
                         f"another lora section (target_modules, r or modules_to_save)")


def merged_state(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (a rank's share of the adapted model, whole tensors) with the adapter merged in, under the base
    checkpoint's names, as ``merge_and_unload`` leaves the model: ``W + scaling * B @ A`` (transposed for
    ``fan_in_fan_out``) for each adapted linear layer, peft's own ``ParamWrapper.get_delta_weight`` (one
    ``(out, in)`` block per expert) added to each parameter of ``target_parameters``, the trained copy of each
    ``modules_to_save`` module.

    Raises:
        ValueError: an adapted layer that is not a LoRA linear layer or parameter (:func:`check_mergeable`).
    """
    from peft.tuners.lora import Linear as LoraLinear
    check_mergeable(model)
    out = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLinear) or f"{name}.base_layer.weight" not in state:
            continue
        a, b = state[f"{name}.lora_A.{ADAPTER}.weight"], state[f"{name}.lora_B.{ADAPTER}.weight"]
        delta = (b.float() @ a.float()) * module.scaling[ADAPTER]
        base = state[f"{name}.base_layer.weight"]
        out[f"{name}.weight"] = (base.float() + (delta.T if module.fan_in_fan_out else delta)).to(base.dtype)
    keys = {base_name(k): k for k in state if ".lora_" not in k}
    named = {id(m): n for n, m in model.named_modules()}
    for plain, module in adapted_parameters(model).items():
        if plain in keys:
            name, base = named[id(module)], state[keys[plain]]
            factors = {f"m.lora_{x}.{ADAPTER}.weight": state[f"{name}.lora_{x}.{ADAPTER}.weight"].float()
                       for x in "AB"}
            delta = _delta(module, factors)
            out[plain] = (base.float() + delta.float()).to(base.dtype)
    for key, t in state.items():
        if ".lora_" in key or ".original_module." in key:
            continue
        out.setdefault(base_name(key), t)
    return out


def _delta(module: nn.Module, factors: dict[str, torch.Tensor]) -> torch.Tensor:
    """peft's ``ParamWrapper.get_delta_weight`` of ``module`` on ``factors`` (``{m.lora_A/B...: tensor}``), with
    the wrapper's ``num_experts`` (which it reshapes by) read from the given ``lora_A`` ``(E r, in)`` for the call:
    under expert parallelism the wrapper counts its rank's experts while the factors are the gathered ``E``."""
    a = factors[f"m.lora_A.{ADAPTER}.weight"]
    held = module.num_experts
    module.num_experts = a.shape[0] // module.r[ADAPTER]  # 1 for a 2-D parameter's (r, in)
    try:
        return torch.func.functional_call(_Delta(module), factors, ())
    finally:
        module.num_experts = held


class _Delta(nn.Module):
    """``m.get_delta_weight(ADAPTER)`` as a module's forward, so that ``torch.func.functional_call`` can run it
    on given ``lora_A`` / ``lora_B`` tensors (a rank's gathered share) in place of the module's own."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.m = module

    def forward(self) -> torch.Tensor:
        return self.m.get_delta_weight(ADAPTER)
