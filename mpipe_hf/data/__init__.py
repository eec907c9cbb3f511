"""Data: the Qwen2 tokenizer, each family's processor, chat templates, the collators and owner-only micro-batch
loading."""

from .collate import TextCollator
from .conversation import (ConversationCollator, ConversationDataset, ConversationEncoder, Source,
                           load_conversation_dataset, load_sources)
from .hub import load_checkpoint_processor
from .owner import MicroBatchPlan
from .packing import PackedCollate, PackedPlan, pack_micro
from .processor import build_processor, image_processor_for, qwen2_5_vl_processor
from .templates import chat_template_for, default_chat_template
from .tokenizer import qwen2_tokenizer

__all__ = ["ConversationCollator", "ConversationDataset", "ConversationEncoder", "MicroBatchPlan", "PackedCollate",
           "PackedPlan", "Source", "TextCollator", "build_processor", "chat_template_for", "default_chat_template",
           "image_processor_for", "load_checkpoint_processor", "load_conversation_dataset", "load_sources",
           "pack_micro", "qwen2_5_vl_processor", "qwen2_tokenizer"]
