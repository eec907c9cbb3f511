"""Mistral 3's processor without torchvision (:class:`PilPixtralProcessor`): what the stock ``PixtralProcessor``
does, over ``PixtralImageProcessorPil``. The stock class's module (``processing_pixtral``) imports
``image_processing_pixtral``, which imports torchvision, so where torchvision is missing this one stands in."""

from __future__ import annotations

from transformers.processing_utils import ProcessorMixin


class PilPixtralProcessor(ProcessorMixin):
    """Mistral 3's processor without torchvision: what ``PixtralProcessor`` (``transformers.models.pixtral.
    processing_pixtral``, whose module imports torchvision) does, over ``PixtralImageProcessorPil``: the same
    ``__init__`` arguments, ``_process_images`` and ``replace_image_token`` (mirrored from it), and
    ``ProcessorMixin.__call__`` as the stock class has it. An image the image processor resizes to ``(h, w)`` px
    becomes ``h // s`` rows of ``w // s`` image tokens, each row followed by ``image_break_token`` and the last by
    ``image_end_token`` instead (``s = patch_size * spatial_merge_size``); the call returns ``input_ids``,
    ``attention_mask``, ``pixel_values`` ``(images, C, H, W)`` (zero-padded to the largest) and ``image_sizes``
    ``(images, 2)`` (each image's ``(h, w)``). ``stock_class_name``: what a saved snapshot names (loaded as the
    stock class where torchvision is installed). Not mirrored: ``_get_num_multimodal_tokens`` (the encoder takes
    Mistral 3's expansions from the call: ``ConversationEncoder.image_replacements_for_sizes``).
    """

    stock_class_name = "PixtralProcessor"
    text_kwargs = {"return_tensors": "pt"}
    images_kwargs = {"return_tensors": "pt"}

    def __init__(self, image_processor=None, tokenizer=None, patch_size: int = 16, spatial_merge_size: int = 1,
                 chat_template=None, image_token="[IMG]", image_break_token="[IMG_BREAK]",
                 image_end_token="[IMG_END]", **kwargs):
        super().__init__(image_processor, tokenizer, chat_template=chat_template)
        self.patch_size, self.spatial_merge_size = patch_size, spatial_merge_size
        self.image_token, self.image_break_token, self.image_end_token = image_token, image_break_token, image_end_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.image_break_token_id = tokenizer.convert_tokens_to_ids(image_break_token)
        self.image_end_token_id = tokenizer.convert_tokens_to_ids(image_end_token)

    @property
    def image_token_ids(self) -> list[int]:
        """The ids of the three image markers: ``[IMG]``, ``[IMG_BREAK]``, ``[IMG_END]``."""
        return [self.image_token_id, self.image_break_token_id, self.image_end_token_id]

    def _process_images(self, images, **images_kwargs):
        images_kwargs["patch_size"] = self.patch_size * self.spatial_merge_size
        return super()._process_images(images, **images_kwargs)

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
        """Image ``image_idx``'s expansion: its rows of image tokens, broken and ended as the stock class writes
        them."""
        side = self.patch_size * self.spatial_merge_size
        height, width = image_inputs["image_sizes"][image_idx]
        rows = (self.image_token * (width // side) + self.image_break_token) * (height // side)
        return rows[:len(rows) - len(self.image_break_token)] + self.image_end_token
