"""Every tiny config builder by ``model_type`` (:mod:`.tiny_vlms` and issue 38's group modules): ``build(tokenizer,
num_layers=8)`` -> a scaled-down config of the real Hugging Face class. The llava_like builders are gathered here,
not beside their declarations, so that loading the families does not import every config class they name."""

from __future__ import annotations

from . import tiny_llava_like
from .families_gemma3n import tiny_gemma3n_config
from .families_llava_like import FAMILIES as _LLAVA_LIKE_FAMILIES, TIMM_FAMILIES
from .families_new import TINY as _NEW
from .families_qwen_like import TINY as _QWEN_LIKE
from .tiny_vlms import TINY_VLMS, tiny_llava_onevision_config

# model_type -> tiny_<type>_config(tokenizer, num_layers=8, ...) of the llava_like families (issue 38)
LLAVA_LIKE = {t: getattr(tiny_llava_like, f"tiny_{t}_config") for t in _LLAVA_LIKE_FAMILIES
              if t != "llava_onevision"}
LLAVA_LIKE["llava_onevision"] = tiny_llava_onevision_config
TINY_MODELS = {**TINY_VLMS, **LLAVA_LIKE, **_QWEN_LIKE, **_NEW}
# model_type -> tiny config builder of the timm-tower families (building their model needs timm; the configs do not)
TIMM_TINY = {t: getattr(tiny_llava_like, f"tiny_{t}_config", None) for t in TIMM_FAMILIES}
TIMM_TINY["gemma3n"] = tiny_gemma3n_config
