"""Gemma 3n across pipeline stages: AltUp's hidden-state streams, per-layer inputs, shared key/value states, and the
multimodal token embeddings, as ``Gemma3nModel.forward`` and ``Gemma3nTextModel.forward`` compute them.

- *AltUp*: every decoder layer reads and writes ``altup_num_inputs`` (4) streams ``(4, B, L, H)``: it predicts
  all of them from the active one (``altup_active_idx``, 0), runs attention, Laurel and the MLP on the active
  prediction, and corrects the others from its output. Here the stage's hidden state *is* the stack
  ``(4, B, L, H)`` (the point-to-point wire carries any shape): the front makes it from the input embeddings
  (stream 0, then ``altup_projections[i - 1]`` of them scaled to stream 0's root-mean-square, per token), every
  stage hands it on whole, and the last stage merges it (:class:`AltUpMerge`: ``altup_unembed_projections`` of
  streams 1..3 scaled to stream 0's magnitude, the mean of the four, the final norm) before the LM head. The masks
  are built from stream 0 (one ``(B, L, H)``), as the model builds them from its input embeddings.
- *Per-layer inputs* and *shared key/value states*: as Gemma 4's (:mod:`.shared_kv`), whose stage this one
  extends; Gemma 3n's token part reads every id outside ``embed_tokens_per_layer``'s table (the image and audio
  tokens) as id 0 (``get_per_layer_inputs``) and scales by the text model's own buffers.
- *Multimodal token embeddings* (the image-text model): ids in ``[embed_vision.vocab_offset,
  embed_audio.vocab_offset)`` (the image tokens and the end-of-image token) are embedded by ``embed_vision``'s
  hard-token table, ids from ``embed_audio.vocab_offset`` on by ``embed_audio``'s, before the image features are
  put at the image tokens (:class:`MultimodalTokens`, in stage 0's front).

A packed micro-batch is refused (the per-layer inputs and shared key/value states would have to be cut per row).
"""

from __future__ import annotations

import torch
from torch import nn

from ...models.decoder import CARRIED_KEYS, layer_type_masks
from .shared_kv import PER_LAYER_KEY, PER_LAYER_PARTS, SharedKVStage

Tensors = dict[str, torch.Tensor]
EMBED_PARTS = PER_LAYER_PARTS + ("altup_projections",)  # go wherever embed_tokens goes
HEAD_PARTS = ("altup_unembed_projections",)  # go wherever the final norm goes


def _to_magnitude(stream: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``stream`` ``(..., H)`` scaled per token to the root-mean-square ``target`` ``(..., 1)``, its own floored at
    ``sqrt(1e-5)``, in the model's order of operations (``stream * target / own``)."""
    own = torch.sqrt(torch.mean(stream ** 2, dim=-1, keepdim=True).clamp(min=1e-5))
    return stream * target / own


class MultimodalTokens(nn.Module):
    """``embed_tokens``, then the hard-token embeddings of ``Gemma3nModel.forward``: ``ids`` ``(B, L)`` ->
    ``(B, L, H)``, each id in an embedder's range (from its ``vocab_offset`` up to the next one's; the last to the
    end) replaced by that embedder's ``embedding``, norm and projection (the others look up the embedder's last
    entry, which ``torch.where`` discards, as the model does). ``embedders``: ``[embed_vision, embed_audio]``,
    in ascending ``vocab_offset``."""

    def __init__(self, embed_tokens: nn.Module, embedders: list[nn.Module]):
        super().__init__()
        self.embed_tokens, self.embedders = embed_tokens, nn.ModuleList(embedders)
        self.num_embeddings = embed_tokens.num_embeddings

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(ids)
        for i, embedder in enumerate(self.embedders):
            inside = ids >= embedder.vocab_offset
            if i + 1 < len(self.embedders):
                inside = torch.logical_and(inside, ids < self.embedders[i + 1].vocab_offset)
            dummy = embedder.vocab_offset + embedder.vocab_size - 1
            hard = embedder(input_ids=torch.where(inside, ids, dummy)).to(hidden.device, hidden.dtype)
            hidden = torch.where(inside.unsqueeze(-1), hard, hidden)
        return hidden


class AltUpFront(nn.Module):
    """Stage 0's front (or ``P``'s), then Gemma 3n's per-layer inputs and AltUp streams from its output.

    Inputs: the front's (``input_ids`` ``(B, L)``, ...). Output: the front's, with ``hidden_states`` the streams
    ``(4, B, L, H)`` made from its ``(B, L, H)`` (module docstring) and ``per_layer_inputs`` ``(B, L, layers,
    D)``: ``(norm(proj(h) * s) + embed(ids')) * r``, ``h`` the input embeddings with image features, ``ids'`` the
    ids with those outside the per-layer table read as 0, ``s`` and ``r`` the text model's scale buffers.

    Args:
        front: the :class:`~mpipe_hf.models.image_features.ImageFront`; text_model: ``Gemma3nTextModel`` (its per-layer and AltUp
            modules are held here, so that they are this stage's parameters).
    """

    def __init__(self, front: nn.Module, text_model: nn.Module):
        super().__init__()
        text = text_model.config
        self.front = front
        self.embed_tokens_per_layer = text_model.embed_tokens_per_layer
        self.per_layer_model_projection = text_model.per_layer_model_projection
        self.per_layer_projection_norm = text_model.per_layer_projection_norm
        self.altup_projections = text_model.altup_projections
        self.shape = (text.num_hidden_layers, text.hidden_size_per_layer_input)
        self.table = text.vocab_size_per_layer_input
        self.__dict__["_scales"] = text_model  # its buffers per_layer_projection_scale, per_layer_input_scale

    def per_layer_inputs(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """``(B, L, layers, D)`` for ``ids`` ``(B, L)`` and the input embeddings ``hidden`` ``(B, L, H)``."""
        in_table = torch.logical_and(ids >= 0, ids < self.table)
        token_part = self.embed_tokens_per_layer(torch.where(in_table, ids, 0)).reshape(*ids.shape, *self.shape)
        projected = self.per_layer_model_projection(hidden)
        projected = projected * self._scales.per_layer_projection_scale.to(device=projected.device, dtype=hidden.dtype)
        projected = self.per_layer_projection_norm(projected.reshape(*hidden.shape[:-1], *self.shape))
        return (projected + token_part) * self._scales.per_layer_input_scale.to(device=projected.device,
                                                                                        dtype=hidden.dtype)

    def forward(self, inputs: Tensors) -> Tensors:
        out = self.front(inputs)
        hidden = out["hidden_states"]
        per_layer = self.per_layer_inputs(inputs["input_ids"], hidden)  # first, as the model: autograd's order
        target = torch.mean(hidden ** 2, dim=-1, keepdim=True) ** 0.5
        streams = [hidden] + [_to_magnitude(proj(hidden).to(hidden.dtype), target) for proj in self.altup_projections]
        return {**out, "hidden_states": torch.stack(streams, dim=0), PER_LAYER_KEY: per_layer}


class AltUpMerge(nn.Module):
    """The last stage's merge of the streams ``(4, B, L, H)`` -> ``(B, L, H)``: stream 0, and each other stream
    through its ``altup_unembed_projections`` entry scaled to stream 0's root-mean-square per token; their mean;
    the text model's final ``norm``. It stands as the :class:`~mpipe_hf.models.decoder.LMHead`'s norm."""

    def __init__(self, unembed: nn.ModuleList, norm: nn.Module):
        super().__init__()
        self.altup_unembed_projections, self.norm = unembed, norm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        target = torch.mean(hidden[0] ** 2, dim=-1, keepdim=True) ** 0.5
        streams = [hidden[0]] + [_to_magnitude(proj(hidden[i]).to(hidden.dtype), target)
                                 for i, proj in enumerate(self.altup_unembed_projections, start=1)]
        return self.norm(torch.mean(torch.stack(streams), dim=0))


def first_stream_masks(masks):
    """A mask builder (:func:`~mpipe_hf.models.decoder.layer_type_masks`'s signature) that reads the streams' stream 0 ``(B, L,
    H)`` where it is handed the stack ``(4, B, L, H)``."""
    def build(text_config, hidden, *args):
        return masks(text_config, hidden[0] if hidden.dim() == 4 else hidden, *args)
    return build


class AltUpStage(SharedKVStage):
    """A Gemma 3n :class:`~.shared_kv.SharedKVStage` whose hidden state is the AltUp streams ``(4, B, L, H)``
    (module docstring): its front (stage 0, ``P``) is :class:`AltUpFront` (with :class:`MultimodalTokens` in the
    image front for the image-text model), its head (the last stage) merges the streams first.
    ``embedders``: ``[embed_vision, embed_audio]`` of the image-text model, ``[]`` for the language model; the
    other arguments are :class:`~.shared_kv.SharedKVStage`'s.

    Raises:
        ValueError: a packed micro-batch (at forward).
    """

    def __init__(self, front, layers, layer_ids, layer_types, rotary_emb, text_config, head=None,
                 carry=CARRIED_KEYS, masks=layer_type_masks, router=None, *, text_model=None, config=None,
                 embedders=()):
        if front is not None and embedders and not isinstance(front.embed_tokens, MultimodalTokens):
            front.embed_tokens = MultimodalTokens(front.embed_tokens, list(embedders))
        if head is not None and not isinstance(head.norm, AltUpMerge):
            head.norm = AltUpMerge(text_model.altup_unembed_projections, head.norm)
        super().__init__(front, layers, layer_ids, layer_types, rotary_emb, text_config, head, carry,
                         first_stream_masks(masks), router, text_model=text_model, config=config)

    def wrap_front(self, front: nn.Module, text_model: nn.Module, config) -> nn.Module:
        return AltUpFront(front, text_model)


def altup_stage(model: nn.Module):
    """``Family.stage`` of Gemma 3n (``Gemma3nForConditionalGeneration`` or ``Gemma3nForCausalLM``):
    :class:`AltUpStage` bound to ``model``'s text model, config and multimodal embedders."""
    inner = model.model
    text_model = getattr(inner, "language_model", inner)
    embedders = [inner.embed_vision, inner.embed_audio] if hasattr(inner, "embed_vision") else []

    def build(*args, **kwargs) -> AltUpStage:
        return AltUpStage(*args, **kwargs, text_model=text_model, config=model.config, embedders=embedders)
    return build
