"""What the data layer needs of a family: its image processor, processor, chat template and image markers, as one
:class:`FamilyData` per ``model_type``, declared in the family's package (``mpipe_hf/families/<group>/data.py``)
and found through :mod:`mpipe_hf.families.registry`. :func:`~.processor.build_processor`,
:func:`~.processor.image_processor_for`, :func:`~.templates.default_chat_template`, :func:`~.markers.named_tokenizer`
and :func:`~.hub.load_checkpoint_processor` read it; none of them names a family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class FamilyData:
    """One family's data path.

    Attributes:
        image_processor: ``image_processor(config, min_pixels, max_pixels)`` -> a PIL image processor (no
            torchvision), set from the config as the hub checkpoints set theirs.
        processor: ``processor(config, tokenizer, image_processor)`` -> the stock processor class (or a thin
            subclass, :func:`~.stock_classes.conversation_class`) over the tokenizer with the family's markers
            named (:func:`~.markers.named_tokenizer`); for a family with ``videos``,
            ``processor(config, tokenizer, image_processor, video_processor=None)`` (``None``: built from the image
            processor's settings, as ``AutoVideoProcessor`` builds the hub's).
        template: the family's Jinja chat template, ``IMAGE_TOKEN`` standing for the image placeholder and
            ``VIDEO_TOKEN`` for the video one (:mod:`.templates`).
        hub_image_token: the image placeholder of the hub checkpoints (``processor.image_token``).
        hub_video_token: the video placeholder of the hub checkpoints where the template writes ``VIDEO_TOKEN``.
        tokens: ``{tokenizer attribute: (hub token, Qwen2 special token standing in)}`` (:mod:`.markers`).
        config_ids: ``{tokenizer attribute: config attribute holding its id}`` (:mod:`.markers`).
        repeated: the processor writes an image as its placeholder repeated (Qwen-VL's ``<|image_pad|>`` x n), so
            the encoder may expand it by count (:data:`~.conversation_encoder.ConversationEncoder`).
        pixel_bounded: the image processor resizes to between ``min_pixels`` and ``max_pixels``.
        videos: the processor takes videos (its ``video_processor`` argument; docs/video.md).
        video_from_snapshot: ``video_from_snapshot(image_processor, config, settings)`` -> the torchvision-free
            video processor with a checkpoint's ``video_preprocessor_config.json`` settings (``None`` when it has
            none), for :func:`~.hub.load_checkpoint_processor`; ``None``: the processor builds its own.
        snapshot_video_class: the ``video_processor_type`` a saved snapshot names where the hub's snapshots hold a
            video processor file (:func:`~.hub.save_processor_files`).
        always_ours: a checkpoint's processor is always this one, even where torchvision would let the stock class
            load (the stock class adds tokens, rewrites the text, or needs torchvision for its videos).
        stock_classes: the stock processor classes (by name) that are this family's own, for a processor that
            ``AutoProcessor`` loaded (:func:`~.conversation_encoder.model_type_of`).
        no_torchvision_images: the family's torchvision-free image processor class where its stock one exists only
            with a torchvision backend: a checkpoint's settings load into it where torchvision does not import
            (:func:`~.stock_processor.checkpoint_image_processor`).
        template_owner: the template's format is this family's own: when a template renders as several families'
            do, the owners are named first (:func:`~.template_family.template_families`).
    """

    image_processor: Callable
    processor: Callable
    template: str
    hub_image_token: str = "<image>"
    tokens: dict = field(default_factory=dict)
    config_ids: dict = field(default_factory=dict)
    repeated: bool = False
    pixel_bounded: bool = False
    hub_video_token: str = "<|video|>"
    videos: bool = False
    video_from_snapshot: Callable | None = None
    snapshot_video_class: str | None = None
    always_ours: bool = False
    stock_classes: tuple[str, ...] = ()
    no_torchvision_images: type | None = None
    template_owner: bool = False
