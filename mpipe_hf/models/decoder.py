"""The decoder part every family shares: a run of HF decoder layers, and the LM head with the summed loss.

A :class:`DecoderStage` mirrors the loop of a Hugging Face text model's ``forward`` (``LlamaModel``,
``Qwen3_5TextModel``, ``Gemma3TextModel``, ...): masks per layer type from the padding mask (transformers' own
builder for each type, ``LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING``: full, sliding, chunked, linear attention), or
the family's own builder where the model overlays token types (Gemma 3's bidirectional image blocks,
PaliGemma's prefix); rotary embeddings from the position ids, one per layer type where the rotary module takes
one (Gemma 3); then the layers. A family supplies the *front* (what turns raw inputs into the first hidden states
and position ids: embedding, image features, M-RoPE ids) and decides which layers go where.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from typing import Callable

import torch
from torch import nn
from transformers.masking_utils import LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING, packed_sequence_mask_function

from .moe import ROUTER_KEYS, RouterSums, aux_loss, counted_once
from .packed import (PACKED_KEYS, RECURRENT, ROW_BLIND, row_ids, flash_kwargs, per_row, row_blind, row_lengths,
                     row_slice, uses_flash)
from .sequence_split import (SPLIT_KEY, local_positions, local_rotary, local_shift_labels, own_slice, stage_split,
                             whole_like)

Tensors = dict[str, torch.Tensor]
# raw keys that travel with the hidden states to the last stage
CARRIED_KEYS = ("attention_mask", "labels") + PACKED_KEYS
MaskBuilder = Callable[..., dict]


class LMHead(nn.Module):
    """Final norm, ``lm_head`` and the token loss summed over the micro-batch (the executor divides by the step's
    label-token count). ``hidden`` ``(B, L, H)``, ``labels`` ``(B, L)`` -> ``{"loss": (), "num_tokens": ()}``,
    and ``"aux_loss"`` ``()`` (``router_aux_loss_coef`` times the load-balancing loss, :mod:`.moe`) when the
    model adds one. ``softcap``: the logits pass ``tanh(x / c) * c`` first with ``c =
    final_logit_softcapping`` (PaliGemma's head does; Gemma 3's conditional model does not). ``scale``: the
    logits are multiplied by it first (Aya Vision's ``logit_scale``)."""

    def __init__(self, model: nn.Module, norm: nn.Module, vocab_size: int, softcap: float | None = None,
                 router: tuple[int, float] | None = None, scale: float | None = None,
                 lm_head: nn.Module | None = None):
        super().__init__()
        head = model.lm_head if lm_head is None else lm_head  # Llama 4's sits inside its language_model
        self.norm, self.lm_head, self.vocab_size, self.softcap = norm, head, vocab_size, softcap
        self.router, self.scale = router, scale  # (E, coefficient)
        self.__dict__["_loss_function"] = model.loss_function  # reads only the config; not a submodule

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor, sums: Tensors | None = None,
                split=None) -> Tensors:
        """``split``: under context parallelism the micro's :class:`~mpipe_hf.runtime.context_parallel.SequenceSplit`
        (``hidden`` this rank's ``(B, L_r, H)`` slice, ``labels`` the whole ``(B, L)``): the loss and token count
        of this rank's tokens, the labels shifted on the whole sequence, and ``"micro_tokens"`` ``()``, the whole
        micro's label tokens (a per-micro mean's divisor on every CP rank)."""
        logits = self.lm_head(self.norm(hidden))
        if self.scale is not None:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        shifted = local_shift_labels(labels, split) if split is not None else None
        extra = {"shift_labels": shifted} if shifted is not None else {}
        loss = self._loss_function(logits=logits, labels=labels, vocab_size=self.vocab_size, num_items_in_batch=1,
                                   **extra)  # reduction "sum"
        counted = shifted if shifted is not None else labels[..., 1:]
        out = {"loss": loss, "num_tokens": (counted != -100).sum()}
        if split is not None:
            out["micro_tokens"] = (labels[..., 1:] != -100).sum()
        if self.router is not None and sums:
            out["aux_loss"] = self.router[1] * aux_loss(sums, self.router[0], split)  # summed over cp
        return out


def split_positions(position_ids: torch.Tensor, rope_axes: int = 3) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(rotary positions, text positions)``, as the HF text models split them: ``(4, B, L)`` ids are text
    positions then 3 M-RoPE axes (Qwen3.5, GLM-4.xV); ``(3, B, L)`` M-RoPE ids have no text row (``None``);
    ``(B, L)``-like ids are both. ``rope_axes``: the model's M-RoPE axes (HunYuan-VL's XD-RoPE has 4, so its
    ``(5, B, L)`` ids have a text row and its ``(4, B, L)`` ids none)."""
    if position_ids.dim() == 3 and position_ids.shape[0] == rope_axes + 1:
        return position_ids[1:], position_ids[0]
    return position_ids, (position_ids if position_ids.dim() == 2 else None)


def layer_type_masks(text_config, hidden: torch.Tensor, padding: torch.Tensor | None,
                     text_positions: torch.Tensor | None, state: Tensors, types: set[str]) -> dict:
    """``{layer type: mask}`` for ``types``, each from transformers' builder for that type. Without padding the
    builders may skip the mask (SDPA's ``is_causal``); with padding their skip test would read the mask back to
    the host once per stage and micro-batch, so it is off. ``text_positions``: the text row of ``(4, B, L)``
    ids, which the HF models hand to their builders; ``None`` otherwise (a model's 1-D ``arange`` positions say
    nothing a builder needs, and would be searched for packed sequences on the device). ``types`` are checked
    when the stage is built (:func:`check_layer_types`).

    A packed micro of several rows (``state["packed_lengths"]``, on the host) under SDPA or eager attention: each
    builder ANDs in transformers' ``packed_sequence_mask_function`` over the rows' ids (:func:`~.packed.row_ids`),
    so a token attends to its own row only: one block-causal (or block-sliding) mask, made without searching the
    positions on the device (transformers' search reads its result back to the host).
    """
    lengths = row_lengths(state)
    rows = row_ids(lengths, hidden.device) if lengths is not None and not uses_flash(text_config) else None
    masks = {}
    for layer_type in sorted(types):
        kwargs = dict(config=text_config, inputs_embeds=hidden, attention_mask=padding, cache=None,
                      position_ids=text_positions)
        skip, ands = MASK_BUILDERS[layer_type]
        if skip:
            kwargs["allow_is_causal_skip"] = padding is None
        if rows is not None and ands:
            kwargs["and_mask_function"] = packed_sequence_mask_function(rows)
        masks[layer_type] = LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING[layer_type](**kwargs)
    return masks


def model_class_masks(model: nn.Module, key: str = "token_type_ids"):
    """``family.masks`` from the model class's own ``create_masks_for_generate`` with the token types under ``key``
    (Gemma 3's ``token_type_ids``: full attention OR a bidirectional block per image, the sliding layers AND their
    window; Gemma 4's and Molmo2's ``mm_token_type_ids``), as its ``forward`` builds them for a first (uncached)
    pass: ``masks(text_config, hidden, padding, text_row, state, types) -> {layer type: mask}``."""
    build, config = type(model).create_masks_for_generate, model.config

    def masks(text_config, hidden, padding, text_row, state, types) -> dict:
        out = build(config, inputs_embeds=hidden, attention_mask=padding, cache=None, position_ids=text_row,
                    is_first_iteration=True, **{key: state.get(key)})
        return out if isinstance(out, dict) else {t: out for t in types}
    # transformers remaps a packed micro's indices to positions before the token-type overlay reads them: the
    # image blocks would be looked up at the wrong tokens, so a packed micro runs row by row
    setattr(masks, ROW_BLIND, True)
    return masks


setattr(model_class_masks, ROW_BLIND, True)  # every builder it makes is (the launch check reads the factory)


def _takes(build) -> tuple[bool, bool]:
    params = inspect.signature(getattr(build, "func", build)).parameters
    return "allow_is_causal_skip" in params, "and_mask_function" in params


# layer type -> whether transformers' builder for it takes (allow_is_causal_skip, and_mask_function), read once
MASK_BUILDERS = {t: _takes(b) for t, b in LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING.items() if callable(b)}


def check_layer_types(types: list[str]) -> None:
    """Raise ``ValueError`` for a layer type transformers has no single mask builder for (checked when a stage is
    built, before any step)."""
    unknown = sorted(set(types) - set(MASK_BUILDERS))
    if unknown:
        raise ValueError(f"layer types {unknown} have no mask builder in transformers' "
                         f"LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING; supported: {sorted(MASK_BUILDERS)}")


class DecoderStage(nn.Module):
    """Decoder layers with an optional front and an optional head: one pipeline stage, or a text preprocess.

    Inputs: the front's raw keys when ``front`` is set, else ``hidden_states`` ``(B, L, H)`` and
    ``position_ids`` (``(B, L)``-like, ``(3, B, L)`` M-RoPE or ``(4, B, L)`` text + M-RoPE); always
    ``attention_mask`` ``(B, L)`` (absent: no padding), ``labels`` ``(B, L)`` on a stage, and the family's
    mask inputs (``token_type_ids``). Outputs: ``{"loss", "num_tokens"}`` (and ``"aux_loss"``) with a head, else
    ``hidden_states``, ``position_ids``, the ``carry`` keys and the MoE running sums (:mod:`.moe`).

    A family that feeds something into the residual stream between layers (Qwen3-VL's DeepStack) overrides
    :meth:`after_layer`.

    Args:
        front: ``front(inputs) -> {"hidden_states": (B, L, H), "position_ids": ..., **extra keys}``, or ``None``.
        layers: the HF decoder layers of this stage, in order; layer_ids: their indices in the text model.
        layer_types: each layer's attention type (``config.layer_types``: ``full_attention``,
            ``sliding_attention``, ``linear_attention``, ...).
        rotary_emb: the text model's rotary embedding module; text_config: the text model's config.
        head: the :class:`LMHead` on the last stage, else ``None``; carry: input keys passed on unchanged.
        masks: ``masks(text_config, hidden, padding, text_positions, state, types) -> {type: mask}``
            (:func:`layer_type_masks`, or the family's builder).
        router: the stage's :class:`~.moe.RouterSums` when the model adds the load-balancing loss.

    ``rope_axes``: the M-RoPE axes of ``(axes [+ 1], B, L)`` position ids (:func:`split_positions`); a family
    with more than 3 sets it on its subclass.
    """

    rope_axes = 3
    sequence_group = None  # the CP group whose ranks split each micro's sequence (:mod:`.sequence_split`)

    def __init__(self, front: nn.Module | None, layers: list[nn.Module], layer_ids: list[int],
                 layer_types: list[str], rotary_emb: nn.Module, text_config, head: LMHead | None = None,
                 carry: tuple[str, ...] = CARRIED_KEYS, masks: MaskBuilder = layer_type_masks,
                 router: RouterSums | None = None):
        super().__init__()
        self.front, self.layers, self.layer_ids, self.layer_types = front, nn.ModuleList(layers), layer_ids, layer_types
        self.rotary_emb, self.text_config, self.head, self.carry = rotary_emb, text_config, head, carry
        self.masks, self.router = masks, router
        self.per_type_rotary = "layer_type" in inspect.signature(rotary_emb.forward).parameters

    def layer_kwargs(self, layer_id: int, state: Tensors) -> dict:
        """More keyword arguments for decoder layer ``layer_id`` (Gemma 4's per-layer input and shared key/value
        states), or ones that replace the stage's (Muse Glimmer's ``position_embeddings=None`` on its no-RoPE
        layers); none by default."""
        return {}

    def after_layer(self, layer_id: int, hidden: torch.Tensor, state: Tensors) -> torch.Tensor:
        """What enters the residual stream after decoder layer ``layer_id``; nothing by default."""
        return hidden

    def row_state(self, state: Tensors, start: int, length: int) -> Tensors:
        """What the layers read of packed row ``[start, start + length)`` of ``state`` (:func:`~.packed.row_slice`);
        a family that relays more per-token data (DeepStack) cuts that too."""
        return row_slice(state, start, length)

    def run_layers(self, hidden: torch.Tensor, state: Tensors, padding: torch.Tensor | None) -> torch.Tensor:
        """The layers over ``hidden`` ``(B, L, H)``, as the HF text model's loop. A packed micro-batch of several
        rows (:mod:`.packed`) goes through them in one pass, each row seen as the unpacked model sees it alone:
        the mask builders find the rows from their own positions (transformers' ``find_packed_sequence_indices``:
        one block-causal mask; FlashAttention's varlen kernel instead) and each linear-attention layer runs per
        row. A family whose masks cannot see the rows (:data:`~.packed.ROW_BLIND`: PaliGemma's prefix) runs the
        rows one by one."""
        lengths = row_lengths(state)
        if lengths is None or uses_flash(self.text_config) or not row_blind(self.masks):
            return self._layers(hidden, state, padding, lengths, "packed_lengths" not in state)
        outs, start = [], 0
        for n in lengths:  # a row is one sequence: nothing for the mask builders to search its positions for
            outs.append(self._layers(hidden[:, start:start + n], self.row_state(state, start, n), None, None, False))
            start += n
        return torch.cat(outs, dim=1)

    def _layers(self, hidden: torch.Tensor, state: Tensors, padding: torch.Tensor | None,
                lengths: list[int] | None, search: bool = True) -> torch.Tensor:
        """:meth:`run_layers` over one sequence, or one packed micro of ``lengths`` rows in one pass (the masks keep
        its rows apart, :func:`layer_type_masks`); ``search``: hand the builders the text-position row of
        ``(4, B, L)`` ids, as the HF models do."""
        rope_positions, text_positions = split_positions(state["position_ids"], self.rope_axes)
        types, split = set(self.layer_types), state.get(SPLIT_KEY)
        text_row = text_positions if search and lengths is None and state["position_ids"].dim() == 3 else None
        whole = whole_like(hidden, split.total) if split is not None else hidden  # masks, rotary: whole sequence
        masks = self.masks(self.text_config, whole, padding, text_row, state, types)
        if self.per_type_rotary:
            rotary = {t: self.rotary_emb(whole, rope_positions, t) for t in sorted(types)}
        else:
            shared = self.rotary_emb(whole, rope_positions)
            rotary = {t: shared for t in types}
        varlen = flash_kwargs(self.text_config, lengths, hidden.device)
        if split is not None:  # built on the whole sequence, then cut: this rank's tokens
            rotary = {t: local_rotary(r, split) for t, r in rotary.items()}
            text_positions, varlen = local_positions(text_positions, split), {SPLIT_KEY: split}
        for layer_id, layer, layer_type in zip(self.layer_ids, self.layers, self.layer_types):
            if lengths is not None and layer_type in RECURRENT:  # its state starts afresh at every packed row
                hidden = per_row(layer, hidden, lengths, rotary[layer_type], text_positions,
                                 attention_mask=masks[layer_type], cache=None, use_cache=False)
            else:  # layer_kwargs may override these (a layer without rotary embedding: position_embeddings None)
                kwargs = dict(attention_mask=masks[layer_type], position_embeddings=rotary[layer_type],
                              position_ids=text_positions, cache=None, use_cache=False, **varlen)
                hidden = layer(hidden, **{**kwargs, **self.layer_kwargs(layer_id, state)})
            hidden = self.after_layer(layer_id, hidden, state)
        return hidden

    def forward(self, inputs: Tensors) -> Tensors:
        state = {**inputs, **self.front(inputs)} if self.front is not None else inputs
        hidden = state["hidden_states"]
        split = stage_split(self.sequence_group, state["position_ids"])
        if split is not None:
            check_packed_split(self, state)
            state = {**state, SPLIT_KEY: split}
            if hidden.shape[1] == split.total:  # whole, from a front or P: this rank's slice
                hidden = own_slice(split, hidden)
                state = {**state, **counted_once(state, split)}  # P's router sums: once over the CP group
        padding = inputs.get("attention_mask")  # absent: no padding (the loader's host knew; see handlers)
        sums = {k: state[k] for k in ROUTER_KEYS if k in state}
        if self.layers:
            collect = (self.router.collect(state, padding, hidden, split) if self.router is not None
                       else nullcontext({}))
            with collect as new_sums:
                hidden = self.run_layers(hidden, state, padding)
            sums = {**sums, **new_sums}
        if self.head is not None:
            return self.head(hidden, inputs["labels"], sums, split)
        carried = {k: state[k] for k in self.carry if k in state}  # an all-ones mask was dropped at load
        relayed = {k: handed_on(t) for k, t in {**carried, **sums}.items()}
        return {"hidden_states": hidden, "position_ids": state["position_ids"], **relayed}


def check_packed_split(stage: DecoderStage, state: Tensors) -> None:
    """Raise NotImplementedError, naming the stage and its mask builder, for a packed micro of several rows that
    context parallelism cannot split exactly: a family whose masks cannot see the rows (:data:`~.packed.ROW_BLIND`)
    runs them one by one, each cut from the whole sequence, which a rank holding only its slice cannot do. Any
    other packed micro is split as one sequence: Ulysses gives every rank the whole sequence for its heads, so the
    rows' block-diagonal mask, built on the whole sequence from the host's ``packed_lengths``, stays exact and a
    row may cross the split (the recurrent layer types and FlashAttention are refused before launch)."""
    if row_lengths(state) is not None and row_blind(stage.masks):
        name = getattr(stage.masks, "__qualname__", type(stage.masks).__name__)
        raise NotImplementedError(f"context parallelism does not split a packed micro-batch of {type(stage).__name__}"
                                  f", whose masks ({name}) cannot see packed rows and run them one by one; set "
                                  f"data.packing: false or parallel.cp_size: 1")


def handed_on(t: torch.Tensor) -> torch.Tensor:
    """A tensor a stage passes on unchanged (a relayed key, a running sum), as a tensor of its own: a copy when it
    is a view that autograd tracks. FSDP2 hands a wrapped stage its inputs as views of the caller's tensors, and a
    view returned from the unit would lose the unit's pre-backward hook to any in-place op on it; a copy of these
    (DeepStack's ``(K, n, H)`` features, a few sums) is small. Anything else is returned as it is."""
    return t.clone() if isinstance(t, torch.Tensor) and t.requires_grad and t._base is not None else t


def layer_types(text_config) -> list[str]:
    """Attention type of every decoder layer: ``config.layer_types``; else all sliding-window attention when the
    config sets ``sliding_window`` (and does not turn it off with ``use_sliding_window``), as ``MistralModel``
    does; else all full attention."""
    types = getattr(text_config, "layer_types", None)
    if types:
        return list(types)
    sliding = getattr(text_config, "sliding_window", None) is not None and getattr(
        text_config, "use_sliding_window", True)
    return ["sliding_attention" if sliding else "full_attention"] * text_config.num_hidden_layers


def decoder_stage(text_model: nn.Module, text_config, layer_ids: list[int], front: nn.Module | None = None,
                  head: LMHead | None = None, carry: tuple[str, ...] = CARRIED_KEYS,
                  cls: type[DecoderStage] = DecoderStage, masks: MaskBuilder = layer_type_masks,
                  router: tuple | None = None) -> DecoderStage:
    """A :class:`DecoderStage` (or subclass ``cls``) over layers ``layer_ids`` of ``text_model`` (an HF text model
    with ``layers`` and ``rotary_emb``); ``router``: :func:`~.moe.router_spec`'s tuple, or ``None``.

    Raises:
        ValueError: with transformers' masks, a layer type it has no mask builder for (:func:`check_layer_types`).
    """
    types = layer_types(text_config)
    if masks is layer_type_masks:
        check_layer_types([types[i] for i in layer_ids])
    layers = [text_model.layers[i] for i in layer_ids]
    sums = RouterSums(layers, *router[:4]) if router is not None else None
    rotary = getattr(text_model, "rotary_emb", None)  # None: a position-free model's stage class supplies its own
    return cls(front, layers, list(layer_ids), [types[i] for i in layer_ids], rotary, text_config,
               head, carry + (ROUTER_KEYS if router is not None and head is None else ()), masks, sums)


# the layer types packed exactly; Nemotron-H's MLP and MoE blocks (layer types of their own) mix no tokens
PACKABLE = ("full_attention", "sliding_attention", *sorted(RECURRENT), "mlp", "moe")


def check_packable(text_config) -> None:
    """Raise ``ValueError`` when a model with ``text_config``'s decoder layers cannot be packed exactly: only full,
    sliding-window attention and the recurrent types (linear attention, short convolution) can (with FlashAttention a chunked layer's chunks would count from the
    start of the packed sequence, so a row would be chunked differently than alone)."""
    other = sorted(set(layer_types(text_config)) - set(PACKABLE))
    if other:
        raise ValueError(f"data.packing: layers of type {other} cannot be packed exactly (supported: "
                         f"{list(PACKABLE)}); set data.packing: false")
