"""Nemotron-H Omni through the real data path: its torchvision-free image processor
(``mpipe_hf/data/image_processor_nemotron_h_omni.py``, equal to the stock class bit for bit:
``tests/test_stock_recorded.py``) under the stock ``NemotronH_Omni_Reasoning_V3Processor`` and the family's chat
template (``mpipe_hf/data/processors_nemotron_h_omni.py``) collates a conversation with an image that the unsplit
tiny model trains on, whose image-token count is what the image processor's grid gives and what the load-time
check takes, and one image token off is refused. A saved snapshot loads back without torchvision as the processor
that saved it; ``mpipe-hf train`` on this data path equals one process (``MPIPE_HF_FULL=1``). The split is exact in
CI on vision inputs built directly (``tests/dist/pools_without_processor.py``)."""

import json
import os

import PIL.Image
import pytest
import skimage
import torch
from transformers import AutoModelForImageTextToText
from transformers.utils import is_torchvision_available

from mpipe_hf.data import ConversationCollator, build_processor, load_checkpoint_processor, qwen2_tokenizer
from mpipe_hf.models.tiny_all import TINY_MODELS
from mpipe_hf.train.sources import micro_validator

MODEL_TYPE = "nemotron_h_omni"
ANSWERS = ["A cup of coffee.", "Hello there!"]


def rows() -> list[dict]:
    photo = PIL.Image.fromarray(skimage.data.coffee()).resize((120, 80))  # a 6 x 8 patch grid: 12 image tokens
    image = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[0]}]}], "images": [photo]}
    text = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
                         {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[1]}]}], "images": []}
    return [image, text]


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


def test_a_conversation_trains_and_passes_the_load_check(tokenizer):
    """The image's tokens are its patch grid over the pixel shuffle's area, wrapped in ``<img>`` ... ``</img>``
    (the Qwen2 vocabulary's vision start and end); the answers alone are labelled, after the empty reasoning
    block of the non-thinking mode."""
    torch.manual_seed(0)
    config = TINY_MODELS[MODEL_TYPE](tokenizer, num_layers=6)
    processor = build_processor(config, tokenizer)
    assert len(processor.tokenizer) == len(tokenizer)  # no token added
    assert type(processor.image_processor).__name__.endswith("NoTV")
    batch = ConversationCollator(processor, None, model_type=MODEL_TYPE)(rows())
    ids, labels = batch["input_ids"], batch["labels"]
    image = ids == config.image_token_id
    count = int(batch["image_grid_hw"].prod(-1).sum()) * round(1 / config.downsample_ratio) ** -2
    assert count > 1 and int(image[0].sum()) == count and not image[1].any() and (labels[image] == -100).all()
    first, last = image[0].nonzero()[[0, -1], 0].tolist()
    start, end = tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>"])
    assert ids[0, first - 1] == start and ids[0, last + 1] == end
    answered = [processor.tokenizer.decode(ids[i][labels[i] != -100], skip_special_tokens=True).strip()
                for i in range(2)]
    assert answered == ANSWERS
    prompt = processor.tokenizer.decode(ids[1][:int((labels[1] != -100).nonzero()[0, 0])])
    assert prompt.startswith("<|im_start|>system\n<|im_end|>\n") and prompt.endswith("assistant\n<think></think>")
    model = AutoModelForImageTextToText.from_config(config)
    assert torch.isfinite(model(**batch).loss)
    validate = micro_validator(config)
    validate(batch)
    text = (~image[0] & (labels[0] == -100) & batch["attention_mask"][0].bool()).nonzero()[:, 0]
    less, more = ids.clone(), ids.clone()
    less[0, first] = ids[0, text[0]]  # one image token less
    more[0, text[text > last + 1][0]] = config.image_token_id  # one more: the prompt's first text token after it
    for broken in (less, more):
        with pytest.raises(ValueError, match="image-token count"):
            validate({**batch, "input_ids": broken})


def test_a_saved_snapshot_loads_back_without_torchvision(tokenizer, tmp_path):
    """``save_pretrained`` names the stock classes (``AutoProcessor`` builds them where torchvision is installed);
    without torchvision ``load_checkpoint_processor`` builds ours over the snapshot's settings, which processes a
    conversation as the processor that saved it."""
    config = TINY_MODELS[MODEL_TYPE](tokenizer)
    processor = build_processor(config, tokenizer)
    config.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert saved["image_processor_type"] == processor.image_processor.stock_class_name
    if is_torchvision_available():
        pytest.skip("with torchvision the snapshot loads as the stock classes")
    loaded = load_checkpoint_processor(str(tmp_path))
    assert type(loaded.image_processor) is type(processor.image_processor)
    text = loaded.apply_chat_template(rows()[0]["messages"][:1], tokenize=False, add_generation_prompt=True)
    got, want = (p(text=[text], images=rows()[0]["images"], return_tensors="pt") for p in (loaded, processor))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.skipif(os.environ.get("MPIPE_HF_FULL") != "1",
                    reason="the full suite (MPIPE_HF_FULL=1): a torchrun launch; CI checks this family's data path "
                           "above and its split in test_numerics.py")
def test_mpipe_hf_train_through_the_torchvision_free_data_path(demo, tmp_path):
    """``mpipe-hf train`` on the tiny model over the demo's conversations, micro-batches built by the data path,
    equals the unsplit model on one process (``train_like_one_process``)."""
    from train_common import train_tiny_family_like_one_process
    processor, _, micro = train_tiny_family_like_one_process(demo, tmp_path, MODEL_TYPE, TINY_MODELS[MODEL_TYPE])
    assert type(processor.image_processor).__name__.endswith("NoTV") and "image_grid_hw" in micro


def test_a_config_file_with_an_infinite_float_loads(tokenizer, tmp_path):
    """A recipe's ``model.config`` file as ``save_pretrained`` writes it: Nemotron-H's ``time_step_limit`` of
    ``(0, inf)`` is saved tagged (``{"__float__": "Infinity"}``) and read back as ``inf`` (untagged, the config
    class refuses the tag: the tiny recipe stopped there)."""
    from mpipe_hf.train.recipe_model import ModelSource
    from mpipe_hf.train.sources import load_config
    TINY_MODELS[MODEL_TYPE](tokenizer).to_json_file(str(tmp_path / "config.json"))
    assert '"__float__": "Infinity"' in (tmp_path / "config.json").read_text()
    config = load_config(ModelSource(config=str(tmp_path / "config.json")))
    assert list(config.text_config.time_step_limit) == [0.0, float("inf")]
