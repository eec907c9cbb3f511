"""Inkling through the real data path: its torchvision-free image processor
(``mpipe_hf/data/image_processor_inkling_mm_model.py``, equal to the stock ``InklingImageProcessor`` bit for bit:
``tests/test_stock_recorded.py``) under the stock ``InklingProcessor`` and the family's chat template
(``mpipe_hf/data/processors_inkling.py``) collates a conversation with an image that the unsplit tiny model trains
on, whose image-token count is the image processor's square count (one token a square) and what the load-time
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

FAMILY = "inkling_mm_model"
ANSWERS = ["A cup of coffee.", "Hello there!"]


def rows() -> list[dict]:
    photo = PIL.Image.fromarray(skimage.data.coffee()).resize((200, 120))  # to 0.2: 40 x 24 px, 6 x 11 squares
    image = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[0]}]}], "images": [photo]}
    text = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
                         {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[1]}]}], "images": []}
    return [image, text]


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


def test_a_conversation_trains_and_passes_the_load_check(tokenizer):
    torch.manual_seed(0)
    config = TINY_MODELS[FAMILY](tokenizer, num_layers=4)
    processor = build_processor(config, tokenizer)
    assert len(processor.tokenizer) == len(tokenizer)  # no token added
    assert type(processor.image_processor).__name__ == "InklingImageProcessorNoTV"
    batch = ConversationCollator(processor, None, model_type=FAMILY)(rows())
    ids, labels = batch["input_ids"], batch["labels"]
    image = ids == config.image_token_id
    assert batch["pixel_values"].shape == (6 * 11, 2, 4, 4, 3)  # rows ceil(24 / 4), columns 40 // 4 + 1
    assert int(image[0].sum()) == 66 and not image[1].any() and (labels[image] == -100).all()
    first = image[0].nonzero()[0, 0]
    assert ids[0, first - 1] == config.image_bos_token_id  # the image-start marker before its squares
    answered = [processor.tokenizer.decode(ids[i][labels[i] != -100], skip_special_tokens=True).strip()
                for i in range(2)]
    assert answered == ANSWERS
    model = AutoModelForImageTextToText.from_config(config)
    assert torch.isfinite(model(**batch).loss)
    validate = micro_validator(config)
    validate(batch)
    last = image[0].nonzero()[-1, 0]
    text = (~image[0] & (labels[0] == -100) & batch["attention_mask"][0].bool()).nonzero()[:, 0]
    less, more = ids.clone(), ids.clone()
    less[0, first] = ids[0, text[0]]  # one image token less
    more[0, text[text > last][0]] = config.image_token_id  # one more: the prompt's first text token after it
    for broken in (less, more):
        with pytest.raises(ValueError, match="image-token count"):
            validate({**batch, "input_ids": broken})


def test_a_saved_snapshot_loads_back_without_torchvision(tokenizer, tmp_path):
    """``save_pretrained`` names the stock class (``AutoProcessor`` builds it where torchvision is installed);
    without torchvision ``load_checkpoint_processor`` builds ours over the snapshot's settings, which processes a
    conversation as the processor that saved it."""
    config = TINY_MODELS[FAMILY](tokenizer)
    processor = build_processor(config, tokenizer)
    config.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert saved["image_processor_type"] == "InklingImageProcessor" and saved["rescale_image_frac"] == 0.2
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
    """``mpipe-hf train`` on the tiny model over the demo's conversations, micro-batches built by the data path
    (the torch-operation image processor under the stock processor class), equals the unsplit model on one
    process (losses, gradient norms, the reloaded checkpoint's logits: ``train_like_one_process``)."""
    from train_common import train_tiny_family_like_one_process
    processor, _, micro = train_tiny_family_like_one_process(demo, tmp_path, FAMILY, TINY_MODELS[FAMILY])
    assert type(processor.image_processor).__name__.endswith("NoTV") and "pixel_values" in micro
