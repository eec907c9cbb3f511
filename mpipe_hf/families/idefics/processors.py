"""The Idefics group's processor classes for conversations: the stock classes over the markers a tokenizer names
(:func:`~mpipe_hf.data.markers.named_tokenizer`) instead of the tokens they would add to it.

- :class:`_NamedIdefics3Processor`: Idefics3's (the stock one adds ``<fake_token_around_image>``, ``<image>`` and
  ``<end_of_utterance>`` to the tokenizer);
- :class:`_SmolVLMProcessor`: SmolVLM's for images (the stock one refuses to start without ``num2words`` and
  renders chats with its video processor's frame settings, both for videos only);
- :class:`_ConversationIdefics2Processor`: Idefics2's, whose call returns each image's replacement.
"""

from __future__ import annotations

from transformers import Idefics2Processor, Idefics3Processor, SmolVLMProcessor
from transformers.processing_utils import ProcessorMixin


def idefics_markers(processor, tokenizer, image_seq_len: int) -> None:
    """Set Idefics3/SmolVLM's image markers on ``processor`` from the names on ``tokenizer``
    (:func:`~mpipe_hf.data.markers.named_tokenizer`), and its ``image_seq_len`` (tokens a tile)."""
    processor.fake_image_token, processor.image_token = tokenizer.fake_image_token, tokenizer.image_token
    processor.end_of_utterance_token = tokenizer.end_of_utterance_token
    processor.global_image_token = processor.global_image_tag = tokenizer.global_image_token
    processor.image_token_id, processor.fake_image_token_id = tokenizer.image_token_id, tokenizer.fake_image_token_id
    processor.global_image_token_id = tokenizer.global_image_token_id
    processor.image_seq_len = image_seq_len


class _NamedIdefics3Processor(Idefics3Processor):
    """Idefics3's processor over the markers the tokenizer names (the stock one adds ``<fake_token_around_image>``,
    ``<image>`` and ``<end_of_utterance>`` to it). Tiles are tagged ``<row_i_col_j>`` in plain text, as the stock
    processor writes them (tokens of their own only where the vocabulary has them)."""

    def __init__(self, image_processor, tokenizer=None, image_seq_len: int = 169, chat_template=None, **kwargs):
        idefics_markers(self, tokenizer, image_seq_len)
        self.row_col_ids = [tokenizer.convert_tokens_to_ids(f"<row_{i + 1}_col_{j + 1}>") for i in range(6)
                            for j in range(6)]
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


class _SmolVLMProcessor(SmolVLMProcessor):
    """SmolVLM's processor for images: the stock one refuses to start without ``num2words`` and renders chats with
    its video processor's frame settings, both for videos only."""

    def __init__(self, image_processor, tokenizer, video_processor, image_seq_len: int = 169, chat_template=None,
                 **kwargs):
        idefics_markers(self, tokenizer, image_seq_len)
        self.video_token = tokenizer.video_token
        ProcessorMixin.__init__(self, image_processor, tokenizer, video_processor, chat_template=chat_template)

    def apply_chat_template(self, conversation, chat_template=None, **kwargs):
        """``ProcessorMixin.apply_chat_template`` (the stock one reads the video processor's frame settings)."""
        return ProcessorMixin.apply_chat_template(self, conversation, chat_template, **kwargs)


class _ConversationIdefics2Processor(Idefics2Processor):
    """Idefics2's processor for conversations: the markers the tokenizer names (the stock one adds
    ``<fake_token_around_image>``, ``<image>`` and ``<end_of_utterance>`` to it), and ``ProcessorMixin``'s call,
    which returns each image's replacement (``text_replacement_offsets``; the stock call returns none): as the
    stock call writes an image, ``<fake_token_around_image>`` then, per view (5 with ``do_image_splitting``: 4
    crops and the image), ``image_seq_len`` image tokens and ``<fake_token_around_image>``. Not done here: the
    stock call's merging of the boundary tokens of two adjacent images and its space after an image that a word
    follows, both outside an image's own replacement."""

    def __init__(self, image_processor, tokenizer=None, image_seq_len: int = 64, chat_template=None, **kwargs):
        self.fake_image_token, self.image_token = tokenizer.image_boundary_token, tokenizer.image_token
        self.image_token_id, self.end_of_utterance_token = tokenizer.image_token_id, tokenizer.end_of_utterance_token
        self.image_seq_len = image_seq_len
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    def __call__(self, images=None, text=None, **kwargs):
        return ProcessorMixin.__call__(self, images=images, text=text, **kwargs)

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
        """Image ``image_idx``'s expansion: its views' image tokens between boundary tokens."""
        views = 5 if self.image_processor.do_image_splitting else 1
        return self.fake_image_token + (self.image_token * self.image_seq_len + self.fake_image_token) * views
