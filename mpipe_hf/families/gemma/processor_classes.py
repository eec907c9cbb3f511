"""The Gemma models' processor classes for conversations: thin subclasses of the stock ``transformers`` classes that
take the image markers the tokenizer names (:func:`~mpipe_hf.data.markers.named_tokenizer`) instead of adding
tokens to it, and go without the audio feature extractor and video processor that the image path never uses."""

from __future__ import annotations

from transformers import (Gemma4Processor, Gemma4UnifiedProcessor, MuseGlimmerProcessor, MuseSparkProcessor,
                          PaliGemmaProcessor)
from transformers.processing_utils import ProcessorMixin


class ConversationPaliGemmaProcessor(PaliGemmaProcessor):
    """PaliGemma's processor for conversations: the image marker the tokenizer names (no ``<image>``, ``<loc>``
    or ``<seg>`` token added), the text as the chat template renders it (no BOS or newline written here), rows
    without images accepted, and no ``labels``/``token_type_ids`` (the collator writes both from the assistant
    turns, :class:`~mpipe_hf.data.conversation_collator.ConversationCollator`). ``image_processor.image_seq_length``:
    the tokens an image takes (as the hub's ``preprocessor_config.json`` holds it)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_seq_length = image_processor.image_seq_length
        self.image_token, self.image_token_id = tokenizer.image_token, tokenizer.image_token_id
        tokenizer.add_bos_token = tokenizer.add_eos_token = False  # as the stock one: the template writes them
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    def __call__(self, images=None, text=None, **kwargs):
        return ProcessorMixin.__call__(self, images=images, text=text, **kwargs)

    def prepare_inputs_layout(self, images=None, text=None, **kwargs):
        return ProcessorMixin.prepare_inputs_layout(self, images=images, text=text, **kwargs)

    def validate_inputs(self, images=None, text=None, **kwargs):
        return ProcessorMixin.validate_inputs(self, images=images, text=text, **kwargs)


class NamedGemma4Processor(Gemma4Processor):
    """Gemma 4's processor for images over the markers the tokenizer names: the stock ``__init__`` adds
    ``<|video|>`` to the tokenizer; here the video token is the one the tokenizer names, and the audio feature
    extractor may be ``None`` (no audio markers)."""

    def __init__(self, feature_extractor=None, image_processor=None, tokenizer=None, video_processor=None,
                 chat_template=None, image_seq_length: int = 280, audio_seq_length: int = 750,
                 audio_ms_per_token: int = 40, **kwargs):
        self.image_seq_length, self.audio_seq_length = image_seq_length, audio_seq_length
        self.audio_ms_per_token = audio_ms_per_token
        self.image_token, self.image_token_id = tokenizer.image_token, tokenizer.image_token_id
        self.boi_token, self.eoi_token = tokenizer.boi_token, tokenizer.eoi_token
        self.video_token, self.video_token_id = tokenizer.video_token, tokenizer.video_token_id
        self.audio_token = self.audio_token_id = None
        # the stock validate_inputs refuses every call when these are None (an operator-precedence slip in
        # transformers 5.25); the hub's markers, never written here (audio is refused)
        self.boa_token, self.eoa_token = "<|audio>", "<audio|>"
        ProcessorMixin.__init__(self, feature_extractor, image_processor, tokenizer, video_processor,
                                chat_template=chat_template, **kwargs)

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "feature_extractor" and argument is None:
            return type(None)
        return super().check_argument_for_proper_class(argument_name, argument)


class NamedGemma4UnifiedProcessor(Gemma4UnifiedProcessor):
    """Gemma 4 Unified's processor over the markers the tokenizer names, no token added, the feature extractor
    optional (:class:`NamedGemma4Processor`'s set-up; the image text is the stock class's)."""

    __init__ = NamedGemma4Processor.__init__

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "feature_extractor" and argument is None:
            return type(None)
        return super().check_argument_for_proper_class(argument_name, argument)


class NamedMuseGlimmerProcessor(MuseGlimmerProcessor):
    """``MuseGlimmerProcessor`` writing each image with the markers the tokenizer names (the stock ``__init__``
    sets the hub's literal strings, which a vocabulary without them would split into text)."""

    def __init__(self, image_processor=None, video_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.image_token_id = tokenizer.image_token, tokenizer.image_token_id
        self.image_start_token, self.image_start_token_id = tokenizer.image_start_token, tokenizer.image_start_token_id
        self.image_end_token, self.image_end_token_id = tokenizer.image_end_token, tokenizer.image_end_token_id
        self.video_token, self.video_token_id = tokenizer.video_token, tokenizer.video_token_id
        ProcessorMixin.__init__(self, image_processor=image_processor, video_processor=video_processor,
                                tokenizer=tokenizer, chat_template=chat_template, **kwargs)


class ImageMuseSparkProcessor(MuseSparkProcessor):
    """``MuseSparkProcessor`` for images: the audio feature extractor may be ``None`` (audio rows are refused)."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "feature_extractor" and argument is None:
            return type(None)
        return super().check_argument_for_proper_class(argument_name, argument)
