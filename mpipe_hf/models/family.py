"""A model family as data: the short declaration the generic splitter (:mod:`.generic`) reads.

A :class:`Family` names where a Hugging Face model keeps its parts and which of transformers' own functions
compute what the model's ``forward`` computes around its decoder layers: the vision call
(``get_image_features`` with the family's input keys and config arguments), the positions (1-D, 1-D from one, or
the family's ``get_rope_index`` computed on the host), the masks (transformers' builder per layer type, or the
model class's ``create_masks_for_generate`` with its token-type overlay), the rotary embedding per layer type,
the MoE routers (:mod:`.moe`). Family code exists only where an architecture truly differs (Qwen-VL's host
metadata, DeepStack).

A declaration is its own splitter (the registry's protocol, :mod:`.registry`): its :meth:`Family.layer_counts`
and :meth:`Family.split` run the generic splitter over it. The modules every vision family's split shares (``P``'s
vision part, stage 0's front) are in :mod:`.image_features`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .generic import layer_counts, split_family


@dataclass(frozen=True)
class Family:
    """How the generic splitter reads one family of HF models (see the module docstring).

    Attributes:
        text: FQN of the text model (``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``).
        vision: FQNs of ``P``'s vision part (tower, projector, bare parameters such as LLaVA-Next's
            ``model.image_newline``); empty for a decoder-only LM, whose ``P`` is the embedding and ``T >= 1``
            decoder layers.
        image_inputs: raw keys ``get_image_features`` takes, under its own argument names (``pixel_values``,
            ``image_grid_thw``, ``image_sizes``, ``pixel_attention_mask``, ``batch_num_images``).
        list_inputs: keys of ``image_inputs`` that ``get_image_features`` takes as Python lists (Unlimited-OCR's
            ``num_local_patches`` and ``patches_grid``): a micro-batch carries them as int64 tensors, handed over
            as ``tolist()``.
        image_meta: raw keys ``P``'s vision part reads that ``host`` computed (the tower's precomputed keyword
            arguments, :mod:`.host_metadata`).
        video_inputs: raw keys ``get_video_features`` takes, under its own argument names (``pixel_values_videos``,
            ``video_grid_thw``); empty: the family takes no video, and a micro-batch with ``pixel_values_videos``
            is refused at load naming the model type (:func:`.generic.micro_check`).
        video_meta: raw keys of the tower's precomputed keyword arguments for the video call, computed by ``host``
            from ``video_grid_thw`` (:data:`~.host_metadata.VIDEO_META_KEYS`).
        mask_inputs: raw keys every stage's masks read (``token_type_ids``); they travel with the hidden states.
        stage0_inputs: raw keys stage 0 reads besides ``input_ids``, ``attention_mask`` and ``labels``.
        positions: ``"arange"`` (``(1, L)``), ``"arange1"`` (from one, PaliGemma) or ``"host"`` (``position_ids``
            computed at load by ``host``).
        host: ``host(model) -> (raw -> more raw inputs)`` run on the owner's host at load, or ``None``;
            host_keys: ``host_keys(model) -> keys`` kept on the host for the owner's own ``P``.
        masks: ``masks(model) -> builder`` (:func:`~.decoder.layer_type_masks`'s signature), or ``None`` for
            transformers' builder per layer type.
        deepstack: Qwen3-VL's DeepStack features are added after the first decoder layers (:mod:`.deepstack`).
        softcap: the head applies ``final_logit_softcapping`` (PaliGemma).
        logit_scale: the head multiplies the logits by the text config's ``logit_scale`` (Aya Vision), or by the
            text config field it names (Muse Glimmer's ``"output_multiplier"``), before any soft-capping.
        unused: FQNs of modules the split never runs (Video-LLaVA's video tower, Janus's image-generation
            head): frozen (they get no gradient in the unsplit model either) and kept with stage 0, whose rank
            saves them.
        validate: ``validate(model) -> (raw -> None)`` raising ``ValueError`` for a micro-batch that does not fit,
            checked at load; ``None``: stage 0's image-token count check alone.
        embed_parts: children of the text model that go wherever its ``embed_tokens`` goes (Gemma 4's per-layer
            embedding and projection).
        head_parts: children of the text model that go wherever its final norm goes (Gemma 3n's AltUp
            unembedding projections).
        stage: ``stage(model) -> cls``, a :class:`~.decoder.DecoderStage` subclass (or a callable taking its
            arguments) for every stage and ``P``'s text block; ``None``: ``DecoderStage`` (``DeepStackStage`` with
            ``deepstack``).
        norm: the text model's final norm, under ``text`` (LFM3's is ``embedding_norm``).
        checkpoint: ``(class name, attribute)``: the family's checkpoints hold transformers' class ``name``, whose
            ``attribute`` is this model (ShieldGemma 2's are ``ShieldGemma2ForImageClassification``'s), so their
            names are read through that class's conversion mapping; ``None``: this model's own.
        media_apart: the model cannot take images and videos in one forward (GLM-4.xV finds a video's tokens with
            the image tokens' mask): the loader's planner and packer put image rows and video rows in different
            micro-batches (:mod:`mpipe_hf.data.apart`), and ``validate`` refuses a micro-batch holding both.
        head: FQN of the LM head (Llama 4's is ``language_model.lm_head``, inside its causal LM).
        embed: the text model's token embedding, under ``text`` (Nemotron-H's is ``embeddings``).
        tower_division: ``tower_division(model) ->`` how the tower's work divides over a context-parallel group
            by images and frames (:mod:`.tower_division`; Qwen-VL's :mod:`mpipe_hf.families.qwen.tower_share`);
            ``None``: under ``cp_size > 1`` the tower runs whole on every CP rank.
    """

    text: str = "model.language_model"
    vision: tuple[str, ...] = ()
    image_inputs: tuple[str, ...] = ("pixel_values",)
    list_inputs: tuple[str, ...] = ()
    image_meta: tuple[str, ...] = ()
    video_inputs: tuple[str, ...] = ()
    video_meta: tuple[str, ...] = ()
    mask_inputs: tuple[str, ...] = ()
    stage0_inputs: tuple[str, ...] = ()
    positions: str = "arange"
    host: Callable | None = None
    host_keys: Callable | None = None
    masks: Callable | None = None
    deepstack: bool = False
    softcap: bool = False
    logit_scale: bool | str = False
    unused: tuple[str, ...] = ()
    validate: Callable | None = None
    embed_parts: tuple[str, ...] = ()
    head_parts: tuple[str, ...] = ()
    stage: Callable | None = None
    norm: str = "norm"
    checkpoint: tuple[str, str] | None = None
    media_apart: bool = False
    head: str = "lm_head"
    embed: str = "embed_tokens"
    tower_division: Callable | None = None

    def layer_counts(self, config, cfg, layers_per_stage=None, text_layers: int = 0) -> list[int]:
        """Decoder layers per stage (the registry protocol; :func:`.generic.layer_counts`)."""
        return layer_counts(self, config, cfg, layers_per_stage, text_layers)

    def split(self, model, cfg, rank, layers_per_stage=None, text_layers: int = 0):
        """Carve ``model`` for ``rank`` (the registry protocol; :func:`.generic.split_family`)."""
        return split_family(self, model, cfg, rank, layers_per_stage, text_layers)
