"""One answer to where the LM head is (``mpipe_hf/models/lm_head.py``), read by the LoRA check and the
checkpoint loader alike: Llama 4's head sits inside its causal LM (``language_model.lm_head``), where a top-level
``model.lm_head`` finds nothing."""

import pytest
import torch

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.models.lm_head import output_head
from mpipe_hf.models.registry import get_family
from mpipe_hf.families.registry import tiny_config


def _tied(model_type: str):
    """The tiny ``model_type`` model with its head tied to the input embedding."""
    from transformers import AutoModelForImageTextToText
    config = tiny_config(model_type)(qwen2_tokenizer(5120))
    config.tie_word_embeddings = config.get_text_config().tie_word_embeddings = True
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    assert output_head(model)[1].weight is model.get_input_embeddings().weight
    return model


@pytest.mark.parametrize("model_type", ["llama4", "gemma3", "paligemma"])
def test_the_head_found_is_the_familys_declared_head(model_type):
    from mpipe_hf.models.load import meta_model
    model = meta_model(tiny_config(model_type)(qwen2_tokenizer(5120)))
    name, head = output_head(model)
    assert name == get_family(model_type).head and head is model.get_submodule(name)
    assert output_head(torch.nn.Linear(2, 2)) is None


def test_a_checkpoint_with_llama4s_own_head_loads_it_untied():
    """A config that ties Llama 4's head, with a checkpoint that stores ``language_model.lm_head.weight`` apart:
    the loader keeps the two apart (as for a top-level ``lm_head``), so neither overwrites the other."""
    from mpipe_hf.models.shards import untie_if_saved_apart
    model = _tied("llama4")
    embed = "language_model.model.embed_tokens.weight"
    source = {embed: embed, "language_model.lm_head.weight": "language_model.lm_head.weight"}
    with pytest.warns(UserWarning, match=r"stores language_model\.lm_head\.weight apart"):
        untie_if_saved_apart(model, source)
    assert model.language_model.lm_head.weight is not model.get_input_embeddings().weight
    kept = _tied("llama4")
    untie_if_saved_apart(kept, {embed: embed, "language_model.lm_head.weight": embed})  # saved tied: stays tied
    assert kept.language_model.lm_head.weight is kept.get_input_embeddings().weight


def test_lora_on_llama4s_tied_head_is_refused():
    """An adapter on Llama 4's tied head is refused as on any family's: the pipeline holds the tied weight as two
    copies on two ranks, which a wrapped layer cannot be."""
    from peft import LoraConfig, get_peft_model
    from mpipe_hf.models.adapters import check_adapted
    config = LoraConfig(r=2, target_modules=["q_proj", "lm_head"])
    model = get_peft_model(_tied("llama4"), config)
    with pytest.raises(ValueError, match="lm_head.*share one weight"):
        check_adapted(model, config)
