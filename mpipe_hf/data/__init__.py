"""Data: the Qwen2 tokenizer, each family's processor, chat templates, the collators and owner-only micro-batch
loading.

The names below are imported on first use (PEP 562), as in :mod:`mpipe_hf.models`: a light submodule (the
recipe's :mod:`.budgets`) does not load transformers' processors."""

from __future__ import annotations

import importlib

_LAZY = {"TextCollator": ".collate", "MicroBatchPlan": ".owner", "load_checkpoint_processor": ".hub",
         **dict.fromkeys(["ConversationCollator", "ConversationDataset", "ConversationEncoder", "Source",
                          "load_conversation_dataset", "load_sources"], ".conversation"),
         **dict.fromkeys(["PackedCollate", "PackedPlan", "pack_micro"], ".packing"),
         **dict.fromkeys(["build_processor", "image_processor_for"], ".processor"),
         "qwen2_5_vl_processor": "..families.qwen.data",
         **dict.fromkeys(["chat_template_for", "default_chat_template"], ".templates"),
         "qwen2_tokenizer": ".tokenizer"}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)
