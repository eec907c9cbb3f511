"""Data: the Qwen2 tokenizer, each family's processor, the collators and owner-only micro-batch loading."""

from .collate import CaptionCollator, TextCollator
from .owner import MicroBatchPlan, load_caption_dataset, load_text_dataset
from .processor import build_processor, image_processor_for, qwen2_5_vl_processor
from .tokenizer import qwen2_tokenizer

__all__ = ["CaptionCollator", "MicroBatchPlan", "TextCollator", "build_processor", "image_processor_for",
           "load_caption_dataset", "load_text_dataset", "qwen2_5_vl_processor", "qwen2_tokenizer"]
