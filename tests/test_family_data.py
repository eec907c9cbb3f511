"""Conversation data for every vision-language family beyond Qwen2/2.5/3-VL and LLaVA: each family's tiny config,
processor, chat template and collated micro-batch, through the unsplit HF model's forward and backward."""

import functools
import importlib
import inspect
import json
import sys
import types

import PIL.Image
import pytest
import skimage
import torch
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer
from transformers.models.pixtral import image_processing_pil_pixtral
from transformers.utils import is_torchvision_available

from mpipe_hf.data import (ConversationCollator, build_processor, chat_template_for, default_chat_template,
                           load_conversation_dataset, qwen2_tokenizer)
from mpipe_hf.families.mistral import data as mistral_data, pixtral_processor
from mpipe_hf.data.processor import PROCESSOR_TYPES
from mpipe_hf.families import registry

QWEN_LIKE = ("qwen3_5", "qwen3_5_moe", "qwen3_vl_moe", "glm4v", "glm4v_moe")
# the other vision-language families with a processor here (their tiny configs from their group packages)
TINY_VLMS = {t: registry.tiny_config(t) for t in ("gemma3", "paligemma", "internvl", "mistral3", "llava_next",
                                                   "llava_onevision", "idefics3", "smolvlm")}
FAMILIES = sorted([*QWEN_LIKE, *TINY_VLMS])
# the forward inputs each family's micro-batch carries beside input_ids, attention_mask and labels
QWEN_KEYS = {"mm_token_type_ids", "pixel_values", "image_grid_thw"}
EXTRA_KEYS = {**dict.fromkeys(QWEN_LIKE, QWEN_KEYS), "gemma3": {"token_type_ids", "pixel_values"},
              "paligemma": {"token_type_ids", "pixel_values"}, "internvl": {"pixel_values"},
              "mistral3": {"pixel_values", "image_sizes"}, "llava_next": {"pixel_values", "image_sizes"},
              "llava_onevision": {"pixel_values", "image_sizes", "batch_num_images"},
              "idefics3": {"pixel_values", "pixel_attention_mask"}, "smolvlm": {"pixel_values", "pixel_attention_mask"}}
# what add_generation_prompt appends, in the Qwen2 vocabulary (Gemma's <start_of_turn> stands as <|im_start|>)
PROMPTS = {**dict.fromkeys(["qwen3_5", "qwen3_5_moe", "qwen3_vl_moe", "internvl"], "<|im_start|>assistant\n"),
           "glm4v": "<|assistant|>\n", "glm4v_moe": "<|assistant|>\n", "gemma3": "<|im_start|>model\n",
           "llava_onevision": "<|im_start|>assistant\n", "idefics3": "Assistant:", "smolvlm": "Assistant:",
           "paligemma": "", "mistral3": "", "llava_next": ""}
ANSWERS = ["A cup of coffee.", "Yes, on a saucer.", "Hello there!"]


def conversation(with_image: bool) -> dict:
    if not with_image:
        return {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
                             {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[2]}]}], "images": []}
    photo = PIL.Image.fromarray(skimage.data.coffee())  # 400 x 600: not square
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[0]}]},
                         {"role": "user", "content": [{"type": "text", "text": "On a plate?"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[1]}]}],
            "images": [photo]}


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


def tiny_config(model_type, tokenizer, num_layers=4):
    if model_type in TINY_VLMS:
        return TINY_VLMS[model_type](tokenizer, num_layers=num_layers)
    return registry.tiny_config(model_type)(tokenizer, num_layers=num_layers)


def label_runs(ids, labels):
    runs, current = [], []
    for token, label in zip(ids.tolist(), labels.tolist()):
        if label != -100:
            assert label == token
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def spy_image_features(model):
    """Count the feature vectors the vision side hands the language model (``get_image_features``)."""
    inner, seen = model.model, []
    original = inner.get_image_features

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        pooled = out.pooler_output if hasattr(out, "pooler_output") else out
        parts = pooled if isinstance(pooled, (list, tuple)) else [pooled]
        seen.append(sum(p.numel() for p in parts) // model.config.get_text_config().hidden_size)
        return out
    inner.get_image_features = spy
    return seen


@pytest.mark.parametrize("model_type", FAMILIES)
def test_family_micro_batch_trains(model_type, tokenizer):
    config = tiny_config(model_type, tokenizer)
    assert config.model_type == model_type and config.get_text_config().vocab_size == len(tokenizer)
    processor = build_processor(config, tokenizer)
    assert len(processor.tokenizer) == len(tokenizer)  # no token added, the shared tokenizer left unnamed
    assert not hasattr(tokenizer, "image_token")
    rows = [conversation(True), conversation(False)]
    collator = ConversationCollator(processor, None, model_type=model_type)
    batch = collator(rows)
    assert set(batch) == {"input_ids", "attention_mask", "labels"} | EXTRA_KEYS[model_type]

    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    image = ids == config.image_token_id
    assert image[0].any() and not image[1].any()
    assert (labels[image] == -100).all() and (labels[mask == 0] == -100).all()
    runs = [label_runs(ids[i], labels[i]) for i in range(2)]
    got = [[processor.tokenizer.decode(run, skip_special_tokens=True).strip() for run in row] for row in runs]
    assert got == [ANSWERS[:2], ANSWERS[2:]]  # -100 everywhere but the assistant turns and their end token
    # each answer's labels end with a special token (ChatML's <|im_end|>, GLM-4V's eos...): what teaches it to stop
    special = set(processor.tokenizer.all_special_ids)
    assert all(run[-1] in special for row in runs for run in row)
    if model_type == "gemma3":  # 1 on the image tokens, as Gemma3Processor writes them
        assert torch.equal(batch["token_type_ids"], image.long())
    if model_type == "paligemma":  # the bidirectional prefix ends where the first answer starts
        first = (labels != -100).int().argmax(1)
        for i in range(2):
            assert batch["token_type_ids"][i].tolist() == [int(j >= first[i]) for j in range(ids.shape[1])]

    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    assert set(batch) <= set(inspect.signature(model.forward).parameters)
    seen = spy_image_features(model)
    loss = model(**batch).loss
    assert torch.isfinite(loss)
    assert seen == [int(image.sum())]  # one feature vector per image token
    loss.backward()
    # the photo reaches the loss: the vision side (tower or projector; Gemma 3's projector starts at zero, so its
    # tower's gradients do too) gets a gradient
    vision = [p for n, p in model.named_parameters() if any(k in n for k in ("vision", "visual", "projector",
                                                                                "connector"))]
    assert vision and any(p.grad is not None and p.grad.abs().sum() > 0 for p in vision)
    check_at_load(model, batch, image)


def check_at_load(model, batch, image):
    """The family's load-time check (``split(...).validate_micro``) passes the micro-batch and refuses it with one
    image token lost, before any device sees it (stage 0 would otherwise end a GPU run with a device assert)."""
    from mpipe_hf.models import split
    from mpipe_hf.schedule import ScheduleConfig
    validate = split(model, ScheduleConfig(1, 2, 1, "identity"), 0).validate_micro
    validate(batch)
    broken = batch["input_ids"].clone()
    broken[tuple(image.nonzero()[0])] = 0
    with pytest.raises(ValueError, match="image-token count"):
        validate({**batch, "input_ids": broken})


@pytest.mark.parametrize("model_type", FAMILIES)
def test_load_time_tokens_and_saved_processor(model_type, tokenizer, tmp_path):
    config = tiny_config(model_type, tokenizer, num_layers=1)
    processor = build_processor(config, tokenizer)
    collator = ConversationCollator(processor, None, model_type=model_type)
    rows = [conversation(True), conversation(False)]
    batch = collator(rows)
    # the tokens counted at load from the image's size alone are the collated ones
    encoder, photo = collator.encoder, rows[0]["images"][0]
    expansions = encoder.image_replacements_for_sizes([(photo.height, photo.width)])
    encoded = encoder.encode(rows[0]["messages"], expansions, "row 0")
    assert encoded.ids == batch["input_ids"][0, :int(batch["attention_mask"][0].sum())].tolist()
    # the saved processor (tokenizer, image processor, chat template) gives the same micro-batch back
    saved = processor.save_pretrained(str(tmp_path))
    assert {"preprocessor_config.json", "tokenizer.json", "chat_template.jinja"} <= set(saved)
    with open(tmp_path / "chat_template.jinja") as f:
        assert f.read() == chat_template_for(processor, model_type)
    again = build_processor(config, AutoTokenizer.from_pretrained(str(tmp_path)),
                            AutoImageProcessor.from_pretrained(str(tmp_path)))
    reloaded = ConversationCollator(again, None, model_type=model_type)(rows)
    assert sorted(reloaded) == sorted(batch)
    assert all(torch.equal(reloaded[k], batch[k]) for k in batch)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_template_renders_two_turns_with_a_generation_prompt(model_type, tokenizer):
    assert model_type in PROCESSOR_TYPES
    template = default_chat_template(model_type, tokenizer=tokenizer)
    messages = conversation(True)["messages"][:3]
    render = functools.partial(tokenizer.apply_chat_template, chat_template=template, tokenize=False)
    done, prompt = render(messages), render(messages, add_generation_prompt=True)
    assert prompt == done + PROMPTS[model_type]
    assert done.startswith(render(messages[:1], add_generation_prompt=True))  # how the labels are found
    assert "On a plate?" in done and done.count(ANSWERS[0]) == 1


def test_markers_missing_from_the_vocabulary_are_stood_in(tokenizer):
    hub = default_chat_template("gemma3")
    here = default_chat_template("gemma3", tokenizer=tokenizer)
    assert "<start_of_turn>" in hub and "<end_of_turn>" in hub and "<start_of_image>" in hub
    assert "<start_of_turn>" not in here and "<|im_start|>" in here and "<|im_end|>" in here
    assert "<|begin_of_image|>" in default_chat_template("glm4v")
    assert "<|vision_start|>" in default_chat_template("glm4v", tokenizer=tokenizer)


PIXTRAL = "transformers.models.pixtral.processing_pixtral"
PIXTRAL_IMAGES = "transformers.models.pixtral.image_processing_pixtral"


@pytest.fixture
def stock_pixtral():
    """The stock ``PixtralProcessor`` class. Without torchvision its module is imported with
    ``image_processing_pixtral`` (which imports torchvision) replaced by the one name it takes from it,
    ``get_resize_output_image_size``, from the PIL module (the same function), and removed again afterwards."""
    if is_torchvision_available():
        yield importlib.import_module(PIXTRAL).PixtralProcessor
        return
    stand_in = types.ModuleType(PIXTRAL_IMAGES)
    stand_in.get_resize_output_image_size = image_processing_pil_pixtral.get_resize_output_image_size
    assert PIXTRAL not in sys.modules and PIXTRAL_IMAGES not in sys.modules
    sys.modules[PIXTRAL_IMAGES] = stand_in
    try:
        yield importlib.import_module(PIXTRAL).PixtralProcessor
    finally:
        for name in (PIXTRAL, PIXTRAL_IMAGES):
            sys.modules.pop(name, None)
        vars(sys.modules["transformers.models.pixtral"]).pop("processing_pixtral", None)


def pixtral_photos():
    """Three photos of different non-square sizes (wide, tall, nearly square), none a multiple of the patch."""
    return [PIL.Image.fromarray(skimage.data.coffee()).resize((90, 37)),
            PIL.Image.fromarray(skimage.data.astronaut()).resize((21, 70)),
            PIL.Image.fromarray(skimage.data.chelsea()).resize((61, 50))]


def test_mistral3_without_torchvision_expands_images_as_the_stock_processor(tokenizer, stock_pixtral, monkeypatch):
    monkeypatch.setattr(mistral_data, "is_torchvision_available", lambda: False)
    config = tiny_config("mistral3", tokenizer, num_layers=1)
    ours = build_processor(config, tokenizer)
    assert isinstance(ours, pixtral_processor.PilPixtralProcessor)
    stock = stock_pixtral(ours.image_processor, ours.tokenizer, patch_size=ours.patch_size,
                          spatial_merge_size=ours.spatial_merge_size, image_token=ours.image_token,
                          image_break_token=ours.image_break_token, image_end_token=ours.image_end_token)
    photos = pixtral_photos()
    text = ["Look: " + ours.image_token + " and " + ours.image_token, "and " + ours.image_token + " too."]
    kwargs = dict(text=text, images=[photos[:2], photos[2:]], padding=True, return_tensors="pt")
    mine, theirs = ours(**kwargs), stock(**kwargs)
    assert sorted(mine) == sorted(theirs) == ["attention_mask", "image_sizes", "input_ids", "pixel_values"]
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    # the stock class's own count per image size: transformers 5.25 counts the [IMG] tokens alone, earlier
    # releases the rows of [IMG] with one [IMG_BREAK] / [IMG_END] each
    sizes = [(p.height, p.width) for p in photos]
    markers = [ours.image_token_id, ours.image_break_token_id, ours.image_end_token_id]
    counted = int(torch.isin(mine["input_ids"], torch.tensor(markers)).sum())
    images_only = int((mine["input_ids"] == ours.image_token_id).sum())
    assert images_only < counted
    assert sum(stock._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens) in (images_only, counted)


def test_mistral3_image_tokens_are_the_model_features_per_image(tokenizer, monkeypatch):
    monkeypatch.setattr(mistral_data, "is_torchvision_available", lambda: False)
    config = tiny_config("mistral3", tokenizer, num_layers=1)
    processor = build_processor(config, tokenizer)
    photos = pixtral_photos()
    out = processor(text=[processor.image_token * len(photos)], images=[photos], return_tensors="pt",
                    return_text_replacement_offsets=True)
    assert len({tuple(size) for size in out["image_sizes"].tolist()}) == 3  # three different grids
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    with torch.no_grad():
        features = model.model.get_image_features(out["pixel_values"], out["image_sizes"]).pooler_output
    expansions = [item["replacement"] for item in out["text_replacement_offsets"][0]]
    per_image = [len(processor.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in expansions]
    image = [processor.tokenizer(text, add_special_tokens=False)["input_ids"].count(processor.image_token_id)
             for text in expansions]
    assert image == [f.shape[0] for f in features]  # one [IMG] per feature vector of its image
    # each row of [IMG] ends in [IMG_BREAK], the last in [IMG_END]: one marker per row
    rows = [h // (config.vision_config.patch_size * config.spatial_merge_size) for h, _ in out["image_sizes"].tolist()]
    assert [n - i for n, i in zip(per_image, image)] == rows
    with torch.no_grad():  # and the whole row goes through the forward (placeholders == features)
        assert torch.isfinite(model(**{k: v for k, v in out.items() if k != "text_replacement_offsets"}).logits).all()


def test_mistral3_load_time_counts_are_the_collated_ones(tokenizer, tmp_path):
    config = tiny_config("mistral3", tokenizer, num_layers=1)
    processor = build_processor(config, tokenizer)
    for i, photo in enumerate(pixtral_photos()):
        photo.save(tmp_path / f"{i}.png")
    rows = [{"messages": [{"role": "user", "content": "<image><image>Which is wider?"},
                          {"role": "assistant", "content": "The first."}], "images": ["0.png", "1.png"]},
            {"messages": conversation(False)["messages"]},
            {"messages": [{"role": "user", "content": "What is this? <image>"},
                          {"role": "assistant", "content": "A cat."}], "images": ["2.png"]}]
    with open(tmp_path / "rows.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    ds = load_conversation_dataset(str(tmp_path / "rows.jsonl"), processor, 4096, model_type="mistral3")
    batch = ConversationCollator(processor, 4096, model_type="mistral3")([ds[i] for i in range(len(ds))])
    # counted at load from the image headers: each row's tokens, and its images' ([IMG] rows, [IMG_BREAK]s, [IMG_END])
    assert ds.num_tokens == batch["attention_mask"].sum(1).tolist()
    markers = torch.isin(batch["input_ids"], torch.tensor(processor.image_token_ids)) & batch["attention_mask"].bool()
    assert ds.image_tokens == markers.sum(1).tolist()
    assert ds.image_tokens[0] > ds.image_tokens[2] > ds.image_tokens[1] == 0


@pytest.mark.parametrize("model_type", FAMILIES)
def test_a_text_only_first_row_collates_as_the_rows_alone(model_type, tokenizer):
    """A micro-batch whose first row has no image (InternVL's processor then failed to convert its replacement
    offsets to tensors, and the micro-batch could not load) holds each row's own tokens and labels and the
    images in row order, as the rows collated one by one."""
    collate = ConversationCollator(build_processor(tiny_config(model_type, tokenizer), tokenizer), None,
                                   model_type=model_type)
    rows = [conversation(False), conversation(True)]
    batch, alone = collate(rows), [collate([row]) for row in rows]
    for i, one in enumerate(alone):
        n = one["input_ids"].shape[1]
        assert torch.equal(batch["input_ids"][i, :n], one["input_ids"][0])
        assert torch.equal(batch["labels"][i, :n], one["labels"][0])
    pixels, own = batch["pixel_values"], alone[1]["pixel_values"]
    if model_type in ("idefics3", "smolvlm"):  # (B, tiles, C, h, w): row 1's tiles, row 0's all zero
        pixels, own = pixels[1, :own.shape[1]], own[0]
        assert not batch["pixel_values"][0].any()
    assert torch.equal(pixels, own)
