"""Data: the Qwen2 tokenizer, the processor, the caption collator and owner-only micro-batch loading."""

from .collate import CaptionCollator
from .owner import MicroBatchPlan, load_caption_dataset
from .processor import qwen2_5_vl_processor
from .tokenizer import qwen2_tokenizer

__all__ = ["CaptionCollator", "MicroBatchPlan", "load_caption_dataset", "qwen2_5_vl_processor", "qwen2_tokenizer"]
