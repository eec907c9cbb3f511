"""The stock ``transformers`` processor classes made ready for conversations (:func:`conversation_class`), and the
tower sizes (:func:`tower_side`, :func:`tower_patch`) that a family's image processor and processor read from its
config, as the hub checkpoints' processor files hold them."""

from __future__ import annotations

import inspect

from transformers.video_processing_utils import VideoProcessorMixin


def conversation_class(base: type, model_type: str) -> type:
    """``base`` (a stock processor class) with ``video_processor=None`` (or a torchvision-free one,
    :class:`~.video_processor.QwenVideoProcessor`) accepted and ``save_pretrained`` writing what a hub snapshot
    holds (:func:`~.hub.save_processor`); ``model_type`` is its family (``mpipe_model_type``)."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and (argument is None or isinstance(argument, VideoProcessorMixin)):
            return type(argument)  # transformers names VideoProcessorMixin for this check only with torchvision
        return base.check_argument_for_proper_class(self, argument_name, argument)

    def save_pretrained(self, save_directory, **kwargs):
        """What a hub snapshot holds for the processor (:func:`mpipe_hf.data.hub.save_processor`: the stock class's
        name, so that ``AutoProcessor`` loads it where torchvision is installed), with the chat template."""
        from .hub import save_processor
        from .templates import chat_template_for
        return save_processor(save_directory, self, model_type, chat_template_for(self, model_type))

    # "ImageOnly" where the stock class takes a video processor that this one may go without
    prefix = "ImageOnly" if "video_processor" in inspect.signature(base.__init__).parameters else ""
    members = {"check_argument_for_proper_class": check_argument_for_proper_class,
               "save_pretrained": save_pretrained, "mpipe_model_type": model_type}
    return type(f"{prefix}{base.__name__.lstrip('_')}", (base,), members)


def tower_side(config) -> int:
    """The vision tower's input side in px (an int, or InternVL's ``[h, w]``)."""
    size = config.vision_config.image_size
    return int(size[0] if isinstance(size, (list, tuple)) else size)


def tower_patch(config) -> int:
    """The vision tower's patch side in px (an int, or the first of a ``[h, w]`` pair)."""
    size = config.vision_config.patch_size
    return int(size[0] if isinstance(size, (list, tuple)) else size)

