"""The data path of Nemotron-H Omni (``nemotron_h_omni``, :class:`~mpipe_hf.data.family_data.FamilyData`), whose
stock image processor exists in ``transformers`` only with a torchvision backend: here its torchvision-free version
(:mod:`.image_processor`, equal to the stock outputs bit for bit) under the stock
``NemotronH_Omni_Reasoning_V3Processor`` (images only: no video processor, no audio feature extractor; the
family refuses video and audio rows by name).

The image processor: the tower's patches, ``min_pixels`` to ``max_pixels`` px of them (the hub's 1,024 to 13,312
16-px patches), the grid's sides multiples of the pixel shuffle's ``1 / downsample_ratio``. The processor writes an
image ``<img>`` + ``<image>`` x (patches x ``downsample_ratio ** 2``) + ``</img>``. Turns as Nemotron 3 Nano's
ChatML in its non-thinking mode: an empty system turn where the conversation has none
(``<|im_start|>system\\n<|im_end|>\\n``), ``<|im_start|>user\\n...<|im_end|>\\n``, answers
``<|im_start|>assistant\\n<think></think>...<|im_end|>\\n`` (the empty reasoning block part of the prompt).
In the Qwen2 vocabulary of the tiny models ``<image>``, ``<img>`` and ``</img>`` are ``<|image_pad|>``,
``<|vision_start|>`` and ``<|vision_end|>``.
"""

from __future__ import annotations

from transformers import NemotronH_Omni_Reasoning_V3Processor

from ...data.family_data import FamilyData
from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class, tower_patch
from ...data.templates import roles
from .image_processor import NemotronHOmniImageProcessorNoTV

_ANSWER = "'<|im_start|>assistant\\n<think></think>'"
_NO_SYSTEM = ("{%- if not messages or messages[0]['role'] != 'system' -%}"
              "{{- '<|im_start|>system\\n<|im_end|>\\n' -}}{%- endif -%}")
_NEMOTRON = roles("'<|im_start|>user\\n'", _ANSWER, "'<|im_start|>system\\n'", "'<|im_end|>\\n'", "'<|im_end|>\\n'",
                   "'IMAGE_TOKEN'", _ANSWER, start=_NO_SYSTEM)


def _nemotron_images(config, min_pixels: int, max_pixels: int):
    """The tower's patches, ``min_pixels`` to ``max_pixels`` px of them (at least one pixel-shuffle block)."""
    patch = tower_patch(config)
    most = max(round(1 / config.downsample_ratio) ** 2, max_pixels // patch ** 2)
    return NemotronHOmniImageProcessorNoTV(patch_size=patch, downsample_ratio=config.downsample_ratio,
                                           min_num_patches=min(most, max(1, min_pixels // patch ** 2)),
                                           max_num_patches=most)


class _NemotronHOmniProcessor(NemotronH_Omni_Reasoning_V3Processor):
    """The stock processor without an audio feature extractor (the stock check asks for one; audio rows are
    refused before they reach it), returning each image's expansion where ``return_text_replacement_offsets`` asks
    (the stock ``__call__`` drops them; the collator reads ``type`` and ``replacement`` of each)."""

    def __call__(self, images=None, text=None, videos=None, audio=None, **kwargs):
        """The stock call; with ``return_text_replacement_offsets``, ``text_replacement_offsets``: per text, one
        ``{"type": "image", "replacement": ...}`` per image placeholder in order (the images in the texts' order,
        as the stock call counts them)."""
        offsets = kwargs.pop("return_text_replacement_offsets", False)
        out = super().__call__(images=images, text=text, videos=videos, audio=audio, **kwargs)
        if offsets:
            texts = text if isinstance(text, list) else [text]
            counts = [t.count(self.image_token) for t in texts]
            grids = {"image_grid_hw": out["image_grid_hw"]} if images is not None else {}
            starts = [sum(counts[:i]) for i in range(len(counts))]
            out["text_replacement_offsets"] = [
                [{"type": "image", "replacement": self.replace_image_token(grids, start + j)} for j in range(n)]
                for start, n in zip(starts, counts)]
        return out

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "feature_extractor" and argument is None:
            return type(None)
        return super().check_argument_for_proper_class(argument_name, argument)


def _nemotron(config, tokenizer, image_processor):
    return conversation_class(_NemotronHOmniProcessor, config.model_type)(
        image_processor=image_processor, tokenizer=named_tokenizer(tokenizer, config), video_processor=None)


DATA: dict[str, FamilyData] = {
    "nemotron_h_omni": FamilyData(_nemotron_images, _nemotron, _NEMOTRON, "<image>", tokens={
        "image_token": ("<image>", "<|image_pad|>"), "image_start_token": ("<img>", "<|vision_start|>"),
        "image_end_token": ("</img>", "<|vision_end|>"), "video_token": ("<video>", "<|video_pad|>")},
        config_ids={"image_token": "image_token_id", "video_token": "video_token_id"},
        no_torchvision_images=NemotronHOmniImageProcessorNoTV),
}
