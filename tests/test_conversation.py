"""Conversation data (TRL / LLaMA-Factory / ms-swift ``messages`` rows and the old caption rows): loading and its
checks, the chat templates, the collator's labels and image tokens, and ``max_length``."""

import copy
import json
import os
import shutil
import warnings

import pytest
import skimage
import torch
from PIL import Image

from mpipe_hf.data import (ConversationCollator, ConversationEncoder, build_processor, chat_template_for,
                           default_chat_template, load_conversation_dataset, qwen2_5_vl_processor, qwen2_tokenizer)

IMAGE = object()  # marks an image in the neutral conversations below
PHOTOS = ["astronaut.png", "coffee.png", "rocket.jpg", "chelsea.png"]

# Neutral conversations: (role, [text or IMAGE, ...]) turns, written out below in both content forms.
CONVERSATIONS = [
    [("user", ["Say hello."]), ("assistant", ["Hello there!"])],
    [("system", ["You describe photos."]), ("user", [IMAGE, "\nWhat is in the picture?"]),
     ("assistant", ["An astronaut in a white suit."])],
    [("user", [IMAGE, "What is this?"]), ("assistant", ["A cup of coffee."]),
     ("user", ["And this one: ", IMAGE, " ?"]), ("assistant", ["A rocket taking off, with smoke."]),
     ("user", ["Which is hotter?"]), ("assistant", ["The rocket exhaust, by far."])],
    [("user", [IMAGE, IMAGE, "Compare the two.\n"]), ("assistant", ["One is a cat, one is a cup."]),
     ("user", [IMAGE, "And the third?"]), ("assistant", ["A rocket."])],
]
IMAGES_OF = [[], ["astronaut.png"], ["coffee.png", "rocket.jpg"], ["chelsea.png", "coffee.png", "rocket.jpg"]]


def string_form(conversation, images):
    messages = [{"role": role, "content": "".join("<image>" if item is IMAGE else item for item in items)}
                for role, items in conversation]
    return {"messages": messages, **({"images": images} if images else {})}


def parts_form(conversation, images):
    messages = [{"role": role, "content": [{"type": "image"} if item is IMAGE else {"type": "text", "text": item}
                                           for item in items]} for role, items in conversation]
    return {"messages": messages, "images": images}


def write_jsonl(folder, name, rows):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def label_runs(ids, labels):
    """The labelled stretches of one row, as token id lists."""
    runs, current = [], []
    for token, label in zip(ids.tolist(), labels.tolist()):
        if label != -100:
            assert label == token, "a label must be the token at its position"
            current.append(label)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


@pytest.fixture(scope="module")
def processor(tokenizer):
    return qwen2_5_vl_processor(tokenizer)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A data folder with real photos from scikit-image (under ``img/``, so the JSONL paths are relative)."""
    root = tmp_path_factory.mktemp("conversations")
    os.makedirs(root / "img")
    source = os.path.join(os.path.dirname(skimage.__file__), "data")
    for name in PHOTOS:
        shutil.copy(os.path.join(source, name), root / "img" / name)
    return str(root)


def rows_of(form):
    return [form(conv, [f"img/{name}" for name in images]) for conv, images in zip(CONVERSATIONS, IMAGES_OF)]


def collated(folder, processor, name, rows, max_length=4096):
    ds = load_conversation_dataset(write_jsonl(folder, name, rows), processor, max_length)
    return ds, ConversationCollator(processor, max_length)([ds[i] for i in range(len(ds))])


def assert_same_batch(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_both_content_forms_give_identical_batches(folder, processor):
    _, by_string = collated(folder, processor, "strings.jsonl", rows_of(string_form))
    _, by_parts = collated(folder, processor, "parts.jsonl", rows_of(parts_form))
    assert_same_batch(by_string, by_parts)
    assert {"input_ids", "attention_mask", "labels", "pixel_values", "image_grid_thw"} <= set(by_parts)
    assert by_parts["image_grid_thw"].shape[0] == sum(map(len, IMAGES_OF))


def test_labels_are_exactly_each_assistant_turn_and_its_im_end(folder, processor, tokenizer):
    _, batch = collated(folder, processor, "labels.jsonl", rows_of(parts_form))
    for i, conversation in enumerate(CONVERSATIONS):
        got = [tokenizer.decode(run) for run in label_runs(batch["input_ids"][i], batch["labels"][i])]
        expected = ["".join(items) + "<|im_end|>" for role, items in conversation if role == "assistant"]
        assert got == expected
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()


def test_labels_keep_the_whitespace_of_an_answer(folder, processor, tokenizer):
    answers = ["  Two spaces first.\nSecond line.\n", "Tabs\tand  gaps ", "Ends on a blank line.\n\n"]
    row = with_messages(*[m for a in answers for m in ({"role": "user", "content": "Go on."},
                                                         {"role": "assistant", "content": a})])
    _, batch = collated(folder, processor, "spaces.jsonl", [row])
    got = [tokenizer.decode(run) for run in label_runs(batch["input_ids"][0], batch["labels"][0])]
    assert got == [a + "<|im_end|>" for a in answers]


def test_image_tokens_match_the_grid_and_the_load_time_count(folder, processor):
    ds, batch = collated(folder, processor, "grid.jsonl", rows_of(parts_form))
    merge = processor.image_processor.merge_size
    per_image = (batch["image_grid_thw"].prod(-1) // merge ** 2).tolist()
    pad = processor.image_token_id
    at = 0
    for i, images in enumerate(IMAGES_OF):
        assert int((batch["input_ids"][i] == pad).sum()) == sum(per_image[at:at + len(images)])
        at += len(images)
    # the token count made at load from the file headers only equals the processor's
    assert ds.num_tokens == batch["attention_mask"].sum(1).tolist()
    assert batch["pixel_values"].shape[0] == int(batch["image_grid_thw"].prod(-1).sum())


def test_rendered_text_is_apply_chat_template(folder, processor, tokenizer):
    ds, batch = collated(folder, processor, "render.jsonl", rows_of(parts_form))
    template = default_chat_template("qwen2_5_vl")
    for i in range(len(ds)):
        messages = ds[i]["messages"]
        text = processor.apply_chat_template(messages, chat_template=template, tokenize=False)
        images = [Image.open(p).convert("RGB") for p in ds[i]["images"]]
        alone = processor(text=[text], images=images or None, return_tensors="pt")
        n = int(batch["attention_mask"][i].sum())
        assert batch["input_ids"][i, :n].tolist() == alone["input_ids"][0].tolist()
    # the ChatML markup of the Qwen2.5-VL checkpoints, written out by hand
    vision = "<|vision_start|><|image_pad|><|vision_end|>"
    expected = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                f"<|im_start|>user\n{vision}What is this?<|im_end|>\n"
                "<|im_start|>assistant\nA cup of coffee.<|im_end|>\n"
                f"<|im_start|>user\nAnd this one: {vision} ?<|im_end|>\n"
                "<|im_start|>assistant\nA rocket taking off, with smoke.<|im_end|>\n"
                "<|im_start|>user\nWhich is hotter?<|im_end|>\n"
                "<|im_start|>assistant\nThe rocket exhaust, by far.<|im_end|>\n")
    assert ConversationEncoder(processor).render(ds[2]["messages"]) == expected
    with_prompt = processor.apply_chat_template(ds[0]["messages"][:1], chat_template=template, tokenize=False,
                                                add_generation_prompt=True)
    assert with_prompt.endswith("<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n")
    qwen3 = processor.apply_chat_template(ds[0]["messages"], chat_template=default_chat_template("qwen3_vl"),
                                          tokenize=False)
    assert qwen3 == "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\nHello there!<|im_end|>\n"
    with pytest.raises(ValueError, match="qwen2_5_vl"):
        default_chat_template("mistral")


def test_old_caption_rows_equal_their_messages_rows(folder, processor):
    old = [{"image": "img/astronaut.png", "prompt": "Describe the photo.", "caption": "An astronaut."},
           {"prompt": "Name a color.", "caption": "Blue."},
           {"image": "img/coffee.png", "prompt": "In one word, <image> is what?", "caption": "Coffee."}]
    new = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the "
                                                                                                  "photo."}]},
                         {"role": "assistant", "content": "An astronaut."}], "images": ["img/astronaut.png"]},
           {"messages": [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Blue."}]},
           {"messages": [{"role": "user", "content": "In one word, <image> is what?"},
                         {"role": "assistant", "content": "Coffee."}], "images": ["img/coffee.png"]}]
    _, a = collated(folder, processor, "old.jsonl", old)
    _, b = collated(folder, processor, "new.jsonl", new)
    assert_same_batch(a, b)


GOOD = {"messages": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "Hello."}],
        "images": ["img/coffee.png"]}


def with_messages(*messages, images=None):
    return {"messages": list(messages), **({"images": images} if images is not None else {})}


U = {"role": "user", "content": "Question?"}
A = {"role": "assistant", "content": "Answer."}
BAD_ROWS = {
    "placeholders": (with_messages({"role": "user", "content": "<image>Hi"}, A,
                                   images=["img/coffee.png", "img/rocket.jpg"]), "placeholder"),
    "placeholders_parts": (with_messages({"role": "user", "content": [{"type": "image"}, {"type": "image"}]}, A,
                                         images=["img/coffee.png"]), "placeholder"),
    "placeholders_old": ({"image": "img/coffee.png", "prompt": "<image> or <image>?", "caption": "x"},
                         "placeholder"),
    "missing_image": (with_messages({"role": "user", "content": "<image>Hi"}, A, images=["img/nope.png"]),
                      "not found"),
    "missing_image_old": ({"image": "img/nope.png", "prompt": "Hi", "caption": "x"}, "not found"),
    "empty_assistant": (with_messages(U, {"role": "assistant", "content": "  \n "}), "empty assistant"),
    "empty_assistant_old": ({"prompt": "Hi", "caption": ""}, "empty assistant"),
    "empty_text": (with_messages({"role": "user", "content": [{"type": "text", "text": "\t "}]}, A), "empty user"),
    "no_assistant": (with_messages(U), "no assistant"),
    "unknown_role": (with_messages(U, {"role": "bot", "content": "Answer."}), "unknown role"),
    "malformed_json": ('{"messages": [{"role": "user", "content": "Hi"}', "malformed JSON"),
    "neither_form": ({"question": "Hi", "answer": "Hello"}, "no known row layout has the keys"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_bad_row_is_refused_at_load_naming_its_line(folder, processor, case):
    row, reason = BAD_ROWS[case]
    path = write_jsonl(folder, f"bad_{case}.jsonl", [GOOD, "", row, GOOD])  # the bad row is on line 3
    with pytest.raises(ValueError, match=rf"bad_{case}\.jsonl:3: .*{reason}"):
        load_conversation_dataset(path, processor, 512)


def test_a_corrupt_image_fails_in_the_collator_naming_its_line(folder, processor):
    with open(os.path.join(folder, "img", "coffee.png"), "rb") as f:
        data = f.read()
    with open(os.path.join(folder, "img", "broken.png"), "wb") as f:
        f.write(data[:len(data) // 3])  # the header (and so the size) is intact, the pixels are not
    broken = {"messages": GOOD["messages"], "images": ["img/broken.png"]}
    ds = load_conversation_dataset(write_jsonl(folder, "broken.jsonl", [GOOD, broken]), processor, 512)
    collate = ConversationCollator(processor, 512)
    collate([ds[0]])
    with pytest.raises(ValueError, match=r"broken\.jsonl:2: cannot decode image"):
        collate([ds[0], ds[1]])


def test_max_length_drops_rows_cut_through_an_image_and_truncates_the_rest(folder, processor, tokenizer):
    words = " ".join(["lorem ipsum dolor"] * 12)
    cut_text = with_messages({"role": "user", "content": "<image>Describe."},
                             {"role": "assistant", "content": f"It shows {words}."}, images=["img/astronaut.png"])
    cut_image = with_messages({"role": "user", "content": f"Read this: {words}"}, A,
                              {"role": "user", "content": "<image>And this?"}, A, images=["img/coffee.png"])
    late_answer = with_messages({"role": "user", "content": f"{words} {words}"}, A)
    rows = [cut_text, cut_image, late_answer]
    full_ds, full = collated(folder, processor, "long_full.jsonl", rows)
    assert full_ds.num_dropped == 0
    pad = processor.image_token_id
    image_at = (full["input_ids"][1] == pad).nonzero().flatten().tolist()
    max_length = image_at[0] + 1  # inside row 2's image
    # preconditions, from the uncut batch: row 1 is cut in its answer only, row 3 has no label before max_length
    first_image = (full["input_ids"][0] == pad).nonzero().flatten().tolist()
    labelled = (full["labels"][0] != -100).nonzero().flatten().tolist()
    assert first_image[-1] < max_length and labelled[0] < max_length < labelled[-1]
    assert ((full["labels"][2] != -100).nonzero().min()) >= max_length

    path = write_jsonl(folder, "long.jsonl", rows)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = load_conversation_dataset(path, processor, max_length)
    messages = [str(w.message) for w in caught if "dropped" in str(w.message)]
    assert len(messages) == 1
    assert "dropped 2 of 3" in messages[0] and "long.jsonl:2 (" in messages[0] and "long.jsonl:3 (" in messages[0]
    assert ds.num_dropped == 2 and len(ds) == 1
    assert [(w.rsplit(":", 1)[1], why.split()[0]) for w, why in ds.dropped.items()] == [("2", f"max_length={max_length}"),
                                                                                       ("3", "every")]
    batch = ConversationCollator(processor, max_length)([ds[0]])
    assert batch["input_ids"].shape == (1, max_length)
    assert torch.equal(batch["input_ids"][0], full["input_ids"][0, :max_length])
    assert torch.equal(batch["labels"][0], full["labels"][0, :max_length])
    assert batch["attention_mask"].all()
    # a row that the loader did not check is refused rather than cut through its image
    with pytest.raises(ValueError, match=r"long_full\.jsonl:2: .*cuts through an image"):
        ConversationCollator(processor, max_length)([full_ds[1]])


HASH_TEMPLATE = ("{%- for m in messages -%}{{- '### ' + m['role'] + ':\\n' -}}"
                 "{%- for p in m['content'] -%}{%- if p['type'] == 'image' -%}"
                 "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
                 "{%- else -%}{{- p['text'] -}}{%- endif -%}{%- endfor -%}"
                 "{{- '<|endoftext|>\\n' if m['role'] == 'assistant' else '\\n\\n' -}}{%- endfor -%}"
                 "{%- if add_generation_prompt -%}{{- '### assistant:\\n' -}}{%- endif -%}")


def test_the_checkpoints_own_template_is_used_over_the_default(folder, tokenizer):
    own = copy.deepcopy(tokenizer)
    own.chat_template = HASH_TEMPLATE
    processor = qwen2_5_vl_processor(own)
    assert chat_template_for(processor, "qwen2_5_vl") == HASH_TEMPLATE
    assert chat_template_for(qwen2_5_vl_processor(tokenizer), "qwen2_5_vl") == default_chat_template("qwen2_5_vl")
    ds, batch = collated(folder, processor, "own.jsonl", rows_of(parts_form))
    text = tokenizer.decode(batch["input_ids"][2][batch["attention_mask"][2] == 1])
    assert text.startswith("### user:\n<|vision_start|><|image_pad|>") and "<|im_start|>" not in text
    for i, conversation in enumerate(CONVERSATIONS):
        got = [own.decode(run) for run in label_runs(batch["input_ids"][i], batch["labels"][i])]
        assert got == ["".join(items) + "<|endoftext|>" for role, items in conversation if role == "assistant"]
        rendered = own.apply_chat_template(ds[i]["messages"], tokenize=False)  # the tokenizer's own template
        assert rendered == ConversationEncoder(processor).render(ds[i]["messages"])


def test_llava_labels_end_with_the_eos(folder, tokenizer):
    from transformers import CLIPVisionConfig, LlavaConfig, Qwen2Config
    llava_tok = copy.deepcopy(tokenizer)
    llava_tok.add_tokens(["<image>"], special_tokens=True)
    config = LlavaConfig(vision_config=CLIPVisionConfig(image_size=56, patch_size=14),
                         text_config=Qwen2Config(vocab_size=len(llava_tok)),
                         image_token_id=llava_tok.convert_tokens_to_ids("<image>"))
    processor = build_processor(config, llava_tok)
    ds, batch = collated(folder, processor, "llava.jsonl", rows_of(parts_form))
    tokens_per_image = (56 // 14) ** 2  # CLIP patches, the CLS dropped by the "default" feature strategy
    for i, conversation in enumerate(CONVERSATIONS):
        assert int((batch["input_ids"][i] == config.image_token_id).sum()) == tokens_per_image * len(IMAGES_OF[i])
        got = [llava_tok.decode(run) for run in label_runs(batch["input_ids"][i], batch["labels"][i])]
        # "ASSISTANT: " and the answer's first word meet in one BPE token, which carries the space
        assert got == [" " + "".join(items) + llava_tok.eos_token for role, items in conversation
                       if role == "assistant"]
    assert ds.num_tokens == batch["attention_mask"].sum(1).tolist()
    text = ConversationEncoder(processor).render(ds[1]["messages"])
    assert text == ("You describe photos. USER: <image>\nWhat is in the picture? ASSISTANT: An astronaut in a "
                    f"white suit.{llava_tok.eos_token}")


def test_a_tokenizer_alone_takes_text_rows(folder, tokenizer):
    rows = rows_of(parts_form)[:1]
    ds = load_conversation_dataset(write_jsonl(folder, "text.jsonl", rows), tokenizer, 128)
    batch = ConversationCollator(tokenizer, 128)([ds[0]])
    assert sorted(batch) == ["attention_mask", "input_ids", "labels"]
    got = [tokenizer.decode(run) for run in label_runs(batch["input_ids"][0], batch["labels"][0])]
    assert got == ["Hello there!<|im_end|>"]
    with pytest.raises(ValueError, match=r"images\.jsonl:2: .*tokenizer"):
        load_conversation_dataset(write_jsonl(folder, "images.jsonl", rows_of(parts_form)[:2]), tokenizer, 128)
