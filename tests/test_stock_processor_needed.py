"""The families whose stock image processor exists only with torchvision and that mpipe_hf has no
torchvision-free version of: with torchvision, training uses the checkpoint's own processor; without it,
``mpipe-hf check`` / ``train`` stop before any process starts, naming the fix (``mpipe_hf/data/
stock_processor.py``)."""

import pytest
from transformers.utils import is_torchvision_available

from mpipe_hf.data.processor import PROCESSOR_TYPES
from mpipe_hf.data.stock_processor import needs_stock_processor, processor_problem

def test_the_families_needing_the_stock_processor_are_those_without_ours():
    # Llama 4, LFM2-VL and Cohere2-Vision have torchvision-free image processors; the PIL families need none
    assert not any(needs_stock_processor(t) for t in ("llama4", "lfm2_vl", "cohere2_vision", "qwen2_vl", "gemma3"))
    assert {"llama4", "lfm2_vl", "cohere2_vision"} <= set(PROCESSOR_TYPES)
    # Gemma 4 Unified, Muse Glimmer and Muse Spark: theirs too (mpipe_hf/families/gemma/data.py)
    assert not any(needs_stock_processor(t) for t in ("gemma4_unified", "muse_glimmer", "muse_spark"))
    assert {"gemma4_unified", "muse_glimmer", "muse_spark"} <= set(PROCESSOR_TYPES)
    # Kimi K2.5, MiniCPM-OCR and Unlimited-OCR: theirs too (mpipe_hf/families/qwen_like/data.py, families/ocr/data.py)
    assert not any(needs_stock_processor(t) for t in ("kimi_k25", "minicpm_ocr", "unlimited_ocr"))
    assert {"kimi_k25", "minicpm_ocr", "unlimited_ocr"} <= set(PROCESSOR_TYPES)
    # Molmo2, Step3p7 and MiniMax-M3-VL: theirs too (mpipe_hf/families/llava)
    assert not any(needs_stock_processor(t) for t in ("molmo2", "step3p7", "minimax_m3_vl"))
    assert {"molmo2", "step3p7", "minimax_m3_vl"} <= set(PROCESSOR_TYPES)
    # Inkling: its own too (mpipe_hf/families/inkling/data.py)
    assert not needs_stock_processor("inkling_mm_model") and "inkling_mm_model" in PROCESSOR_TYPES
    # Nemotron-H Omni: its own too (mpipe_hf/families/nemotron/data.py)
    assert not needs_stock_processor("nemotron_h_omni") and "nemotron_h_omni" in PROCESSOR_TYPES


@pytest.fixture
def kimi_without_ours(monkeypatch):
    """Kimi K2.5 as a family whose stock image processor (``Kimi_K25ImageProcessor``, torchvision only) had no
    torchvision-free version here, so that the refusals below keep a family to refuse."""
    import mpipe_hf.data.stock_processor as module
    needed = module.needs_stock_processor
    monkeypatch.setattr(module, "needs_stock_processor", lambda t: t == "kimi_k25" or needed(t))


def test_the_problem_names_the_fix(kimi_without_ours):
    problem = processor_problem("kimi_k25", "some/checkpoint")
    if is_torchvision_available():
        assert problem is None
        assert "model.name_or_path" in processor_problem("kimi_k25", None)
    else:
        assert "install torchvision" in problem and "kimi_k25" in problem
    assert processor_problem("llama4", None) is None and processor_problem("qwen2_vl", None) is None


def test_check_refuses_before_any_process_without_torchvision(monkeypatch, kimi_without_ours):
    """``check_processor`` (run by ``check``, what ``mpipe-hf check`` and ``train`` run first) raises the reason
    for a Kimi K2.5 config without torchvision, and passes Llama 4's (its processor is torchvision-free)."""
    from mpipe_hf.data import qwen2_tokenizer
    from mpipe_hf.families.registry import tiny_config
    from mpipe_hf.train.checks import check_processor
    monkeypatch.setattr("transformers.utils.is_torchvision_available", lambda: False)
    tokenizer = qwen2_tokenizer(5120)
    with pytest.raises(ValueError, match="Kimi_K25ImageProcessor.*install torchvision"):
        check_processor(tiny_config("kimi_k25")(tokenizer), "some/checkpoint")
    check_processor(tiny_config("llama4")(tokenizer), None)


@pytest.mark.parametrize("checkpoint", [None, "some/checkpoint"])
def test_loading_the_processor_raises_the_reason_before_reading_a_checkpoint(checkpoint, kimi_without_ours):
    """``stock_processor`` (what ``load_processor`` calls for these families, from check-data, profile and plan as
    well as train) states the problem before it reads anything: a model built from its config (no
    ``model.name_or_path``) is told to set it, not handed transformers' error for ``from_pretrained(None)``."""
    from mpipe_hf.data.stock_processor import stock_processor
    if checkpoint is not None and is_torchvision_available():
        pytest.skip("with torchvision and a checkpoint there is no problem to state")
    with pytest.raises(ValueError) as err:
        stock_processor("kimi_k25", checkpoint)
    assert str(err.value) == processor_problem("kimi_k25", checkpoint)


def test_the_timm_tower_families_train_through_their_checkpoints_processor():
    """FastVLM, Perception-LM and Gemma 3n (exact by ``scripts/check/check_timm_families.py``) have no processor here:
    their data path is the checkpoint's own, which a recipe without ``model.name_or_path`` cannot give (named);
    decoder-only types need none."""
    for model_type in ("fast_vlm", "perception_lm", "gemma3n"):
        assert needs_stock_processor(model_type) and model_type not in PROCESSOR_TYPES
        assert "model.name_or_path" in processor_problem(model_type, None) or not is_torchvision_available()
    assert processor_problem("gemma3n", "some/checkpoint") is None  # a PIL backend: no torchvision needed
    assert not any(needs_stock_processor(t) for t in ("gemma3n_text", "mistral4"))
