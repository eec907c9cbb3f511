"""GLM-4.1V, GLM-4.5V and GLM-4.6V processors with videos, without torchvision (docs/video.md).

The stock ``Glm4vProcessor`` (GLM-4.1V, GLM-4.5V) and ``Glm46VProcessor`` (GLM-4.6V) take the torchvision-free
video processors of :mod:`.video_processor` and process text, images and videos as the stock classes do,
with one difference in where two ids come from: the stock ``__init__`` reads the ids of ``<|begin_of_video|>``
and ``<|end_of_video|>`` from the tokenizer by those names, and ``create_mm_token_type_ids`` marks the image tokens
between them as video tokens (``mm_token_type_ids`` 2, which ``get_rope_index`` needs to place each temporal
patch as a video's). A vocabulary without these tokens (the Qwen2 one of the tiny models) gives ``None`` for both,
and every video token would be typed as an image's. Here the ids are those of the tokens the tokenizer names
``video_start_token`` / ``video_end_token`` (:func:`~mpipe_hf.data.markers.named_tokenizer`: the config's
``video_start_token_id`` / ``video_end_token_id``, else the hub token, else the Qwen2 stand-in of
:data:`GLM_VIDEO_TOKENS`), the same the chat template writes around a video (:mod:`.data`); with a GLM
tokenizer they are the stock ids.
"""

from __future__ import annotations

# tokenizer attribute -> (the hub checkpoints' token, the Qwen2 special token standing in), and the config
# attributes holding their ids (the tiny configs map them onto these stand-ins: .tiny)
GLM_VIDEO_TOKENS = {"video_start_token": ("<|begin_of_video|>", "<|box_start|>"),
                    "video_end_token": ("<|end_of_video|>", "<|box_end|>")}
GLM_VIDEO_IDS = {"video_start_token": "video_start_token_id", "video_end_token": "video_end_token_id"}


def with_video_markers(base: type) -> type:
    """``base`` (``Glm4vProcessor`` or ``Glm46VProcessor``) whose ``video_start_id`` / ``video_end_id`` are the ids
    of the tokenizer's ``video_start_token`` / ``video_end_token`` where it names them (module docstring), else the
    stock ones."""

    def __init__(self, image_processor=None, tokenizer=None, video_processor=None, chat_template=None, **kwargs):
        base.__init__(self, image_processor, tokenizer, video_processor, chat_template=chat_template, **kwargs)
        for attr, name in (("video_start_id", "video_start_token"), ("video_end_id", "video_end_token")):
            token_id = getattr(tokenizer, f"{name}_id", None)
            if token_id is not None:
                setattr(self, attr, int(token_id))

    return type(base.__name__, (base,), {"__init__": __init__, "__module__": __name__,
                                          "__doc__": with_video_markers.__doc__})


def glm_processor(cls: type, config, tokenizer, image_processor, video_processor=None):
    """A GLM-4.xV processor of class ``cls`` (:func:`with_video_markers` of the stock class) over ``tokenizer``
    (already named, :func:`~mpipe_hf.data.markers.named_tokenizer`) and ``image_processor``, with ``video_processor``
    (``None``: :func:`~.video_processor.glm_video_processor_from_image` of the image processor, GLM-4.6V's
    class for ``glm46v``)."""
    from .video_processor import glm_video_processor_from_image
    if video_processor is None:
        video_processor = glm_video_processor_from_image(image_processor, config.model_type)
    return cls(image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor)
