"""What the data layer needs of a family declared in a module of its own (issue 38): the processor, the image
processor, the chat template and the image markers, as one :class:`FamilyData` per ``model_type``.

The families of :mod:`.processors_vlm` and :mod:`.processor` predate this declaration and keep their tables; the
families added since declare a :class:`FamilyData` in a group module (``processors_<group>.py``), gathered in
:data:`mpipe_hf.data.more_families.MORE`, which :func:`~.processor.build_processor`,
:func:`~.processor.image_processor_for`, :func:`~.templates.default_chat_template` and
:func:`~.processors_vlm.named_tokenizer` read.
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
            subclass, :func:`~.processors_vlm.conversation_class`) over the tokenizer with the family's markers
            named (:func:`~.processors_vlm.named_tokenizer`).
        template: the family's Jinja chat template, ``IMAGE_TOKEN`` standing for the image placeholder
            (:mod:`.templates`).
        hub_image_token: the image placeholder of the hub checkpoints (``processor.image_token``).
        tokens: ``{tokenizer attribute: (hub token, Qwen2 special token standing in)}``, as
            :data:`~.processors_vlm.FAMILY_TOKENS`.
        config_ids: ``{tokenizer attribute: config attribute holding its id}``, as
            :data:`~.processors_vlm.CONFIG_TOKEN_IDS`.
        repeated: the processor writes an image as its placeholder repeated (Qwen-VL's ``<|image_pad|>`` x n), so
            the encoder may expand it by count (:data:`~.conversation_encoder.REPEATED`).
        pixel_bounded: the image processor resizes to between ``min_pixels`` and ``max_pixels``.
    """

    image_processor: Callable
    processor: Callable
    template: str
    hub_image_token: str = "<image>"
    tokens: dict = field(default_factory=dict)
    config_ids: dict = field(default_factory=dict)
    repeated: bool = False
    pixel_bounded: bool = False
