"""Every tiny config builder by ``model_type`` (:mod:`.tiny_vlms` and issue 38's group modules): ``build(tokenizer,
num_layers=8)`` -> a scaled-down config of the real Hugging Face class."""

from __future__ import annotations

from .families_llava_like import TINY as _LLAVA_LIKE
from .families_new import TINY as _NEW
from .families_qwen_like import TINY as _QWEN_LIKE
from .tiny_vlms import TINY_VLMS

TINY_MODELS = {**TINY_VLMS, **_LLAVA_LIKE, **_QWEN_LIKE, **_NEW}
