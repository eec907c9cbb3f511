"""Every family's :class:`~.family_data.FamilyData` declared in a group module (issue 38), by ``model_type``."""

from __future__ import annotations

from .family_data import FamilyData
from .processors_llava_like import DATA as _LLAVA_LIKE
from .processors_qwen_like import DATA as _QWEN_LIKE
from .processors_new import DATA as _NEW
from .processors_torch_op_images import DATA as _TORCH_OP_IMAGES
from .processors_kimi_ocr import DATA as _KIMI_OCR
from .processors_molmo2_step3p7_minimax import DATA as _MOLMO2_STEP3P7_MINIMAX
from ..families.inkling.data import DATA as _INKLING
from ..families.nemotron.data import DATA as _NEMOTRON_H_OMNI

MORE: dict[str, FamilyData] = {**_LLAVA_LIKE, **_QWEN_LIKE, **_NEW, **_TORCH_OP_IMAGES}
MORE.update(_KIMI_OCR)
MORE.update(_MOLMO2_STEP3P7_MINIMAX)
MORE.update(_INKLING)
MORE.update(_NEMOTRON_H_OMNI)
