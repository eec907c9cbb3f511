"""What the plan's count of one decoder layer (:func:`~.plan_estimate.meta_activation_bytes`) hands the layer beyond its
hidden state, and what crosses a stage boundary, for the families whose layers read more than ``(B, L, H)``:

- Gemma 3n's AltUp streams: the hidden state is the stack ``(altup_num_inputs, B, L, H)`` (4 streams) at every
  layer and at every stage boundary (:mod:`~mpipe_hf.families.gemma.altup`); its head merges the streams first.
- Gemma 3n's and Gemma 4's per-layer inputs ``(B, L, layers, hidden_size_per_layer_input)``: each layer reads its
  slice, and the whole tensor crosses every boundary (:mod:`~mpipe_hf.families.gemma.shared_kv`).
- Their shared key/value states: the last layers (``num_kv_shared_layers``) ``"reuse"`` the keys and values one
  earlier layer of their attention type ``"store"``\\ s (``config.kv_sharing_modes``). Such a config cannot be cut
  to fewer layers (transformers checks that every reused type has a producer), so its layers are counted in the
  full-depth model, in order, the producers filling the dict the consumers read; a consumer's saved keys and
  values are the producer's storages, counted once (the producer's).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ..runtime.memory import saved_bytes, storage_ids


def kv_modes(text) -> list[str | None]:
    """Each layer's key/value sharing mode (``None``, ``"store"``, ``"reuse"``); all ``None`` where the config
    shares none."""
    if not getattr(text, "num_kv_shared_layers", 0):
        return [None] * text.num_hidden_layers
    return list(text.kv_sharing_modes)


def shares_kv(text) -> bool:
    """Whether some layer reuses another's keys and values (the config cannot then be cut to fewer layers)."""
    return "reuse" in kv_modes(text)


def streams(text) -> int:
    """Hidden-state streams a layer reads and writes: Gemma 3n's ``altup_num_inputs`` (4), else 1."""
    return getattr(text, "altup_num_inputs", None) or 1


def per_layer_width(text) -> int:
    """``hidden_size_per_layer_input`` (Gemma 3n, Gemma 4 E-models), 0 where the model has no per-layer inputs."""
    return getattr(text, "hidden_size_per_layer_input", None) or 0


def boundary_bytes(text, tokens: int) -> float:
    """fp32 bytes that cross a stage boundary per micro-batch of ``tokens`` tokens (and that a layer keeps under
    gradient checkpointing): the hidden streams ``streams * tokens * H`` and the per-layer inputs ``tokens *
    layers * D``. Shared key/value states are left out (a few layers' keys and values, while they are carried)."""
    return 4.0 * tokens * (streams(text) * text.hidden_size + text.num_hidden_layers * per_layer_width(text))


def layer_bytes(inner: nn.Module, text, layer_ids: list[int], hidden: torch.Tensor, rope_of, params: set[int],
                tokens: int, position_ids: torch.Tensor | None = None) -> list[int]:
    """Bytes each layer of ``layer_ids`` (ascending) of the text model ``inner`` saves for backward, called with
    ``hidden`` (``(B, L, H)``, or the streams ``(S, B, L, H)``), its rotary embedding ``rope_of(i)``, and where
    its ``forward`` takes them a per-layer input ``(B, L, D)`` and the shared key/value dict (module docstring),
    and ``position_ids`` ``(B, L)`` as a stage hands them (``None`` with M-RoPE; Mistral 4 scales its queries by
    them); ``params``: storages left out (:func:`~mpipe_hf.runtime.memory.storage_ids`)."""
    from transformers.cache_utils import KVSharingDict
    shared, modes, width = KVSharingDict(), kv_modes(text), per_layer_width(text)
    out = []
    for i in layer_ids:
        accepts = inspect.signature(inner.layers[i].forward).parameters
        extra = {}
        if "per_layer_input" in accepts and width:
            extra["per_layer_input"] = torch.empty(1, tokens, width, device=hidden.device,
                                                   requires_grad=hidden.requires_grad)
        if "shared_kv_states" in accepts:
            extra["shared_kv_states"] = shared
        skip = params | storage_ids(t for kv in shared.values() for t in kv) if modes[i] == "reuse" else params
        out.append(saved_bytes(lambda: inner.layers[i](hidden, attention_mask=None, position_embeddings=rope_of(i),
                                                       position_ids=position_ids, **extra), skip))
    return out


def rope_of(inner: nn.Module, hidden: torch.Tensor, positions: torch.Tensor, types: list[str]):
    """``i -> layer i's rotary embedding`` as a stage hands it: one per layer type where the rotary module takes
    the type (Gemma 3), ``None`` for a type it has none for (LFM3's short convolutions) and for a text model with
    no rotary embedding (Inkling)."""
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is None:
        return lambda i: None
    if "layer_type" not in inspect.signature(rotary.forward).parameters:
        return lambda i: rotary(hidden, positions)
    known = getattr(rotary, "layer_types", None)
    return lambda i: rotary(hidden, positions, types[i]) if known is None or types[i] in known else None


def _declared(model: nn.Module):
    """``model``'s registered family, or ``None`` (a bare HF config the cost model is asked about)."""
    from ..models import get_family
    try:
        return get_family(model.config.model_type)
    except ValueError:
        return None


def decoder_of(model: nn.Module) -> nn.Module:
    """The text model whose ``layers`` the family splits (``Family.text``: Llama 4's and Nemotron-H Omni's sit
    inside their causal LM, where ``get_decoder`` does not reach); an unregistered model's ``get_decoder()``."""
    family = _declared(model)
    return model.get_submodule(family.text) if family else model.get_decoder()


def head_of(model: nn.Module) -> nn.Module:
    """The LM head the family declares (``Family.head``); an unregistered model's output embeddings."""
    family = _declared(model)
    return model.get_submodule(family.head) if family else model.get_output_embeddings()


def head_norm(model: nn.Module, text) -> nn.Module:
    """The module between the last layer and the LM head: the family's final norm (``Family.norm``: LFM2's is
    ``embedding_norm``; an unregistered model's ``norm``), behind Gemma 3n's merge of its streams
    (:class:`~mpipe_hf.families.gemma.altup.AltUpMerge`)."""
    family, inner = _declared(model), decoder_of(model)
    norm = inner.get_submodule(family.norm if family else "norm")
    if streams(text) == 1:
        return norm
    from ..families.gemma.altup import AltUpMerge
    return AltUpMerge(inner.altup_unembed_projections, norm)
