"""The families of LLaVA's layout (a tower and a projector, the features at the image tokens): each family's tiny
config, processor and chat template collate a two-turn conversation with an image (and a text-only row), the
unsplit HF model trains on it, the split's load-time check takes it, and the video inputs of the video families
are refused by name."""

import functools

import PIL.Image
import pytest
import skimage
import torch
from transformers import AutoModelForImageTextToText

from mpipe_hf.data import ConversationCollator, build_processor, default_chat_template, qwen2_tokenizer
from mpipe_hf.families.llava.split import REFUSED
from mpipe_hf.families.registry import family, tiny_config
from mpipe_hf.models import split
from mpipe_hf.schedule import ScheduleConfig

# the families of LLaVA's layout (a tower, a projector, the features at the image tokens) this module covers, from
# several family groups; those whose stock image processor needs torchvision have ours
WITHOUT_PROCESSOR = ("cohere2_vision", "lfm2_vl", "step3p7", "minimax_m3_vl", "molmo2", "unlimited_ocr")
LLAVA_LIKE = ("vipllava", "shieldgemma2", "aya_vision", "qianfan_ocr", "got_ocr2", "pp_chart2table",
              "llava_next_video", "video_llava", "janus", "deepseek_vl", "deepseek_vl_hybrid", "aria", "idefics2",
              "deepseek_ocr2", "lighton_ocr", "llava_onevision", *WITHOUT_PROCESSOR)
FAMILIES = {t: family(t) for t in LLAVA_LIKE}
TINY = {t: tiny_config(t) for t in LLAVA_LIKE}
ANSWERS = ["A cup of coffee.", "Yes, on a saucer.", "Hello there!"]


def has_data_path(model_type: str) -> bool:
    """Whether the project has the family's chat template (and with it its processor)."""
    try:
        default_chat_template(model_type)
    except ValueError:
        return False
    return True


# the families whose stock image processor needs torchvision are split on micro-batches built directly
# (tests/dist/direct_llava_like.py) until the project has their processors
TYPES = sorted(t for t in FAMILIES if has_data_path(t))


def rows() -> list[dict]:
    photo = PIL.Image.fromarray(skimage.data.coffee())  # 400 x 600: not square
    image = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[0]}]},
                          {"role": "user", "content": [{"type": "text", "text": "On a plate?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[1]}]}],
             "images": [photo]}
    text = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
                         {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[2]}]}], "images": []}
    return [image, text]


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


def label_runs(ids, labels) -> list[list[int]]:
    runs, current = [], []
    for token, label in zip(ids.tolist(), labels.tolist()):
        if label != -100:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


@pytest.mark.parametrize("model_type", TYPES)
def test_conversation_trains_and_loads(model_type, tokenizer):
    # LFM2's every third layer attends (the others are convolutions): three layers hold one attention layer
    config = TINY[model_type](tokenizer, num_layers=3 if model_type == "lfm2_vl" else 2)
    assert config.model_type == model_type and config.get_text_config().vocab_size == len(tokenizer)
    processor = build_processor(config, tokenizer)
    assert len(processor.tokenizer) == len(tokenizer)  # no token added
    batch = ConversationCollator(processor, None, model_type=model_type)(rows())
    ids, labels = batch["input_ids"], batch["labels"]
    image = ids == config.image_token_id
    assert image[0].any() and not image[1].any() and (labels[image] == -100).all()
    got = [[processor.tokenizer.decode(run, skip_special_tokens=True).strip() for run in label_runs(ids[i], labels[i])]
           for i in range(2)]
    assert got == [ANSWERS[:2], ANSWERS[2:]]  # the assistant turns alone, each with its end token
    special = set(processor.tokenizer.all_special_ids)
    assert all(run[-1] in special for i in range(2) for run in label_runs(ids[i], labels[i]))

    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    loss = model(**batch).loss
    assert torch.isfinite(loss)
    loss.backward()
    vision = [p for n, p in model.named_parameters() if n.startswith(FAMILIES[model_type].vision)]
    assert vision and any(p.grad is not None and p.grad.abs().sum() > 0 for p in vision)
    validate = split(model, ScheduleConfig(1, 2, 1, "identity"), 0).validate_micro
    validate(batch)
    if FAMILIES[model_type].validate is not None:
        broken = ids.clone()
        broken[tuple(image.nonzero()[0])] = 0
        with pytest.raises(ValueError, match="image-token count"):
            validate({**batch, "input_ids": broken})


@pytest.mark.parametrize("model_type", TYPES)
def test_template_prefixes(model_type, tokenizer):
    template = default_chat_template(model_type, tokenizer=tokenizer)
    messages = rows()[0]["messages"][:3]
    render = functools.partial(tokenizer.apply_chat_template, chat_template=template, tokenize=False)
    done, prompt = render(messages), render(messages, add_generation_prompt=True)
    assert prompt.startswith(done) and done.startswith(render(messages[:1], add_generation_prompt=True))
    assert "On a plate?" in done and done.count(ANSWERS[0]) == 1


@pytest.mark.parametrize("model_type", ["llava_next_video", "video_llava"])
def test_videos_are_refused_by_name(model_type, tokenizer):
    model = AutoModelForImageTextToText.from_config(TINY[model_type](tokenizer, num_layers=2))
    validate = split(model, ScheduleConfig(1, 2, 1, "identity"), 0).validate_micro
    raw = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "pixel_values_videos": torch.zeros(1, 2, 3, 8, 8)}
    with pytest.raises(ValueError, match="video inputs"):
        validate(raw)


def test_only_the_families_whose_processor_needs_torchvision_lack_a_data_path():
    assert set(FAMILIES) - set(TYPES) <= set(WITHOUT_PROCESSOR)


def test_refusals_name_a_reason():
    assert not set(REFUSED) & set(FAMILIES)
    assert all(len(reason) > 40 for reason in REFUSED.values())
