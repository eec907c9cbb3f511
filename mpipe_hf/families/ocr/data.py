"""The data path of the OCR group (:class:`~mpipe_hf.data.family_data.FamilyData` each): the stock processor class
over a torchvision-free image processor, the family's chat template and its image markers.

- ``got_ocr2``, ``pp_chart2table``: GOT-OCR2's processor (PP-Chart2Table is the same model, whose stock processor
  takes no conversation, so GOT-OCR2's serves) over the PIL ``GotOcr2ImageProcessorPil`` at the tower's side, one
  tile an image. No hub template (the layout their processors build): ChatML with GOT's system message, each image
  ``<img>`` + its tokens + ``</img>\\n`` (``<img>`` and ``</img>`` plain text in the Qwen2 vocabulary).
- ``unlimited_ocr``: ``UnlimitedOcrProcessor`` over :class:`~.image_processor_unlimited_ocr.
  UnlimitedOcrImageProcessorNoTV` (equal to the stock, torchvision-only, outputs bit for bit: a global view of the
  SAM tower's side padded square and, for an image larger than a tile, 2 to ``max_pixels / tile ** 2`` (at most 32)
  tiles of 3/4 of that side, the hub's 640 px of 1,024 scaled as the tiny towers are); DeepSeek-OCR-2's turns
  (DeepSeek-VL2's format, ``<|User|>: <image>\\n...\\n\\n<|Assistant|>: answer`` and the eos, ``<|User|>`` and
  ``<|Assistant|>`` plain text in the Qwen2 vocabulary), which Unlimited-OCR's model code derives from;
  ``num_local_patches`` and ``patches_grid`` come as tensors.
"""

from __future__ import annotations

import torch
from transformers import GotOcr2Processor, UnlimitedOcrProcessor
from transformers.processing_utils import ProcessorMixin

from ...data.family_data import FamilyData
from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class, tower_side
from ...data.templates import BOS, chatml, roles
from .image_processor_unlimited_ocr import UnlimitedOcrImageProcessorNoTV


class _ConversationGotOcr2Processor(GotOcr2Processor):
    """GOT-OCR2's processor for conversations: the image token the tokenizer names (the stock one reads
    ``<imgpad>``), ``image_seq_length`` tokens a tile (as the hub's ``processor_config.json`` sets
    ``num_image_tokens``), and rows without images accepted (the stock call builds its own OCR prompt and requires
    images). Images batched per row are taken in order, as one list (the stock call nests them for multi-page
    OCR only)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, image_seq_length: int = 256,
                 **kwargs):
        super().__init__(image_processor, tokenizer, chat_template=chat_template, **kwargs)
        self.image_token, self.image_token_id = tokenizer.image_token, tokenizer.image_token_id
        self.image_seq_length = image_seq_length

    def __call__(self, images=None, text=None, **kwargs):
        if isinstance(images, (list, tuple)) and images and isinstance(images[0], (list, tuple)):
            images = [image for row in images for image in row] or None
        return super().__call__(images=images, text=text, num_image_tokens=self.image_seq_length, **kwargs)

    def prepare_inputs_layout(self, images=None, text=None, **kwargs):
        if images is None:
            return ProcessorMixin.prepare_inputs_layout(self, images=images, text=text, **kwargs)
        return super().prepare_inputs_layout(images=images, text=text, **kwargs)


def _got_images(config, min_pixels, max_pixels):
    """One tower-side square an image (no tiling); ``min_pixels`` / ``max_pixels`` do not apply."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
    side = tower_side(config)
    return GotOcr2ImageProcessorPil(size={"height": side, "width": side}, crop_to_patches=False)


def _got(config, tokenizer, image_processor):
    return conversation_class(_ConversationGotOcr2Processor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), image_seq_length=config.image_seq_length)


def _ocr_images(config, min_pixels: int, max_pixels: int):
    """The SAM tower's side, tiles of 3/4 of it (2 to ``max_pixels / tile ** 2``, at most 32, the hub's)."""
    side = config.vision_config.sam_config.image_size
    tile = side * 3 // 4
    return UnlimitedOcrImageProcessorNoTV(size={"height": side, "width": side}, tile_size=tile,
                                          max_patches=min(32, max(2, max_pixels // tile ** 2)))


class _TensorGridsOcrProcessor(UnlimitedOcrProcessor):
    """``UnlimitedOcrProcessor`` returning ``num_local_patches`` ``(images,)`` and ``patches_grid`` ``(images, 2)``
    as ``int64`` tensors where tensors are asked for: the stock class keeps them Python lists, which a micro-batch
    cannot carry (the splitter hands them to the model as lists again, ``Family.list_inputs``)."""

    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        if kwargs.get("return_tensors") is not None:
            for key in ("num_local_patches", "patches_grid"):
                if key in out and not isinstance(out[key], torch.Tensor):
                    out[key] = torch.tensor(out[key], dtype=torch.long)
        return out


def _ocr(config, tokenizer, image_processor):
    return conversation_class(_TensorGridsOcrProcessor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), patch_size=config.vision_config.sam_config.patch_size,
        downsample_ratio=4)  # the tower's two stride-2 convolutions


_GOT = chatml("You should follow the instructions carefully and explain your answers in detail.",
              "'<img>IMAGE_TOKEN</img>\\n'")
_GOT_TOKENS = {"image_token": ("<imgpad>", "<|image_pad|>")}
_DEEPSEEK_VL2 = roles("'<|User|>: '", "'<|Assistant|>: '", "''", "'\\n\\n'", "eos_token", "'IMAGE_TOKEN\\n'",
                      "'<|Assistant|>:'", BOS)

DATA: dict[str, FamilyData] = {
    "got_ocr2": FamilyData(_got_images, _got, _GOT, "<imgpad>", tokens=_GOT_TOKENS,
                           config_ids={"image_token": "image_token_id"}, repeated=True),
    "pp_chart2table": FamilyData(_got_images, _got, _GOT, "<imgpad>", tokens=_GOT_TOKENS,
                                 config_ids={"image_token": "image_token_id"}, repeated=True),
    "unlimited_ocr": FamilyData(_ocr_images, _ocr, _DEEPSEEK_VL2, tokens={"image_token": ("<image>", "<|image_pad|>")},
                                config_ids={"image_token": "image_token_id"}, repeated=True,
                                no_torchvision_images=UnlimitedOcrImageProcessorNoTV),
}
