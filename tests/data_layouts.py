"""Test data: the demo's conversation rows written again in each layout other tools use (LLaVA-Instruct, ShareGPT,
TRL prompt-completion, captions, messages with images as bytes) and in each container (a JSON list, JSONL,
parquet, arrow, a ``save_to_disk`` folder, a hub-layout folder), with the canonical rows each must load as.

The converters here are the inverse of :mod:`mpipe_hf.data.layouts`, written independently from the layouts'
public descriptions (LLaVA's ``conversations`` with ``from``/``value`` and ``<image>`` placeholders, TRL's
``prompt``/``completion`` message lists with an ``images`` column of PIL images, ...).
"""

import json
import os
import shutil

import datasets
import PIL.Image


def text_of(content) -> str:
    """A message content (a string or parts) as a string with ``<image>`` placeholders."""
    if isinstance(content, str):
        return content
    return "".join("<image>" if p["type"] == "image" else p["text"] for p in content)


def parts_of(content) -> list[dict]:
    """A message content as a list of parts (the ``messages`` layout's list form)."""
    out = []
    for i, piece in enumerate(text_of(content).split("<image>")):
        if i:
            out.append({"type": "image", "text": None})
        if piece:
            out.append({"type": "text", "text": piece})
    return out


def read_rows(jsonl: str) -> list[dict]:
    """The demo's rows, with image paths made absolute."""
    folder = os.path.dirname(jsonl)
    rows = [json.loads(line) for line in open(jsonl) if line.strip()]
    for row in rows:
        row["images"] = [os.path.join(folder, p) for p in row.get("images", [])]
    return rows


def single_answer(row) -> bool:
    return [m["role"] for m in row["messages"]].count("assistant") == 1 and row["messages"][-1]["role"] == "assistant"


def captionable(row) -> bool:
    return [m["role"] for m in row["messages"]] == ["user", "assistant"] and len(row["images"]) <= 1


def to_llava(i, row):
    speakers = {"system": "system", "user": "human", "assistant": "gpt"}
    out = {"id": f"row-{i}", "conversations": [{"from": speakers[m["role"]], "value": text_of(m["content"])}
                                               for m in row["messages"]]}
    images = [os.path.basename(p) for p in row["images"]]  # relative to the image folder, LLaVA's COCO folder
    if images:
        out["image"] = images[0] if len(images) == 1 else images
    return out


def to_sharegpt(row):
    messages = row["messages"]
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    turns = [{"from": "human" if m["role"] == "user" else "gpt", "value": text_of(m["content"])}
             for m in messages if m["role"] != "system"]
    return {"conversations": turns, **({"system": system} if system else {}),
            "images": [os.path.basename(p) for p in row["images"]]}


def to_trl(row):
    messages = [{"role": m["role"], "content": parts_of(m["content"])} for m in row["messages"]]
    return {"prompt": messages[:-1], "completion": messages[-1:],
            "images": [PIL.Image.open(p).convert("RGB") for p in row["images"]]}


def to_caption(row):
    user, answer = row["messages"]
    out = {"prompt": text_of(user["content"]), "caption": text_of(answer["content"])}
    if row["images"]:
        out["image"] = os.path.basename(row["images"][0])
    return out


def to_messages_bytes(row):
    return {"messages": [{"role": m["role"], "content": parts_of(m["content"])} for m in row["messages"]],
            "images": [{"bytes": open(p, "rb").read(), "path": None} for p in row["images"]]}


def to_messages_paths(row, folder):
    return {"messages": [{"role": m["role"], "content": parts_of(m["content"])} for m in row["messages"]],
            "images": [f"{folder}/{os.path.basename(p)}" for p in row["images"]]}


def build_all(demo_jsonl: str, out: str, per_layout: int = 6) -> dict[str, dict]:
    """Each (layout, container) case under ``out``: ``{name: {"path", "images", "rows": canonical rows}}``.

    ``images`` is the folder the case's image paths are relative to (``None``: the file's own folder)."""
    rows = read_rows(demo_jsonl)
    images = os.path.join(out, "photos")
    shutil.copytree(os.path.dirname(rows[0]["images"][0]), images)
    # every kind of row: a system turn, 2 and 3 images, several turns, text only (the demo's rows 0, 54, 55, 78, 84)
    mixed = [rows[i] for i in (0, 54, 78, 84, 55, 3, 86, 79) if i < len(rows)]
    picks = {"any": mixed, "single": [r for r in mixed if single_answer(r)],
             "caption": [r for r in rows[1::7] if captionable(r)][:per_layout]}
    os.makedirs(out, exist_ok=True)
    cases = {}

    llava = os.path.join(out, "llava.json")  # a pretty-printed JSON list, images in their own folder
    json.dump([to_llava(i, r) for i, r in enumerate(picks["any"])], open(llava, "w"), indent=2)
    cases["llava-json"] = {"path": llava, "images": images, "rows": picks["any"]}

    sharegpt = os.path.join(out, "sharegpt.jsonl")
    with open(sharegpt, "w") as f:
        for r in picks["any"]:
            f.write(json.dumps(to_sharegpt(r)) + "\n")
    cases["sharegpt-jsonl"] = {"path": sharegpt, "images": images, "rows": picks["any"]}

    trl = os.path.join(out, "trl.parquet")  # TRL's layout: images as a column of PIL images
    features = datasets.Features({"prompt": datasets.List({"role": datasets.Value("string"), "content": datasets.List(
        {"type": datasets.Value("string"), "text": datasets.Value("string")})}),
        "completion": datasets.List({"role": datasets.Value("string"), "content": datasets.List(
            {"type": datasets.Value("string"), "text": datasets.Value("string")})}),
        "images": datasets.List(datasets.Image())})
    datasets.Dataset.from_list([to_trl(r) for r in picks["single"]], features=features).to_parquet(trl)
    cases["trl-parquet"] = {"path": trl, "images": None, "rows": picks["single"]}

    saved = os.path.join(out, "messages_bytes")  # images as bytes, in a single .arrow file
    datasets.Dataset.from_list([to_messages_bytes(r) for r in picks["any"]]).save_to_disk(saved)
    arrow = os.path.join(out, "messages.arrow")
    shutil.copy(next(os.path.join(saved, n) for n in os.listdir(saved) if n.endswith(".arrow")), arrow)
    cases["messages-bytes-arrow"] = {"path": arrow, "images": None, "rows": picks["any"]}

    disk = os.path.join(out, "captions_disk")
    datasets.Dataset.from_list([to_caption(r) for r in picks["caption"]]).save_to_disk(disk)
    cases["caption-save_to_disk"] = {"path": disk, "images": images, "rows": picks["caption"]}

    hub = os.path.join(out, "hub_messages")  # the hub's layout: data/train-*.parquet, images beside the data
    os.makedirs(os.path.join(hub, "data"))
    shutil.copytree(images, os.path.join(hub, "photos"))
    datasets.Dataset.from_list([to_messages_paths(r, "photos") for r in picks["any"]]).to_parquet(
        os.path.join(hub, "data", "train-00000-of-00001.parquet"))
    cases["messages-hub_folder"] = {"path": hub, "images": None, "rows": picks["any"]}
    return cases
