"""The data users already have, in every common layout and container, through one loader.

- Each (layout, container) case of :mod:`data_layouts` loads as the demo rows it was written from: every
  micro-batch (token ids, labels, masks, pixels, grids) equals the one the collator makes of the canonical rows,
  bit for bit; the same holds for the objects a ``Trainer`` user passes (a ``datasets.Dataset`` of TRL's layout
  read with ``load_dataset``, a list of rows).
- ``mpipe-hf train`` (a recipe mixing all six cases by weight) and ``MPipeTrainer`` (the same sources) train 2
  steps under torchrun and report the same first loss.
- ``mpipe-hf check-data`` lists five different bad rows of one file in one run, with their lines, writes the
  clean row list, and a run reading ``data.clean_rows`` gets exactly the good rows.

Run as a script by torchrun, this file is the ``MPipeTrainer`` side of the two-route test.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

sys.path.insert(0, os.path.dirname(__file__))
import data_layouts  # noqa: E402
from data_layouts import build_all  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cases(demo, tmp_path_factory):
    return build_all(os.path.join(demo, "data", "train.jsonl"), str(tmp_path_factory.mktemp("layouts")))


@pytest.fixture(scope="module")
def processor(demo):
    from mpipe_hf.data import load_checkpoint_processor
    return load_checkpoint_processor(os.path.join(demo, "model"))


def batches(collate, rows, size=2):
    return [collate(rows[i:i + size]) for i in range(0, len(rows), size)]


def assert_same_batches(got, want, name):
    assert len(got) == len(want), name
    for a, b in zip(got, want):
        assert sorted(a) == sorted(b), (name, sorted(a), sorted(b))
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)


def reference(rows):
    """The canonical rows as a user's conversation rows (image paths absolute)."""
    return [{"messages": r["messages"], "images": list(r["images"])} for r in rows]


def test_every_layout_and_container_loads_as_its_canonical_rows(cases, processor):
    from mpipe_hf.data import ConversationCollator, Source, load_sources
    collate = ConversationCollator(processor, 2048)
    assert len(cases) == 6
    for name, case in cases.items():
        loaded = load_sources([Source(case["path"], images=case["images"])], processor, 2048, "qwen2_5_vl")
        assert not loaded.bad and len(loaded) == len(case["rows"]) >= 4, (name, loaded.bad)
        assert any(len(r["images"]) > 1 for r in case["rows"]) or name.startswith(("caption", "trl"))
        assert_same_batches(batches(collate, [loaded[i] for i in range(len(loaded))]),
                            batches(collate, reference(case["rows"])), name)
        where = loaded.where(1)
        assert where == (f"{case['path']}:2" if name.endswith("jsonl") else f"{case['path']} row 1"), where


def test_trainer_objects_load_as_the_files_do(cases, processor):
    """What a Trainer user passes: TRL's parquet read with ``load_dataset`` (PIL images decoded by datasets), and
    a list of LLaVA rows in memory; both through MPipeTrainer's loader (:func:`trainer_rows`)."""
    import datasets
    from mpipe_hf.data import ConversationCollator
    from mpipe_hf.train.hf_parts import MPipeConfig
    from mpipe_hf.train.sources import trainer_rows
    collate = ConversationCollator(processor, 2048)
    data = MPipeConfig(pp_size=2).data()
    trl = datasets.load_dataset("parquet", data_files=cases["trl-parquet"]["path"], split="train")
    llava = json.load(open(cases["llava-json"]["path"]))
    cwd = os.getcwd()
    os.chdir(cases["llava-json"]["images"])  # a dataset object's image paths are relative to the working directory
    try:
        for name, obj in (("trl-parquet", trl), ("llava-json", llava)):
            loaded = trainer_rows(obj, processor, data, "qwen2_5_vl")
            assert_same_batches(batches(collate, [loaded[i] for i in range(len(loaded))]),
                                batches(collate, reference(cases[name]["rows"])), name)
    finally:
        os.chdir(cwd)


def test_unknown_layout_names_the_file_the_row_and_the_layouts(tmp_path, processor):
    from mpipe_hf.data import load_conversation_dataset
    path = tmp_path / "odd.json"
    path.write_text(json.dumps([{"question": "Hi?", "answer": "Hello."}], indent=2))
    with pytest.raises(ValueError, match=r"odd\.json row 0: no known row layout has the keys \['answer', "
                                         r"'question'\].*llava \(conversations \+ image\)"):
        load_conversation_dataset(str(path), processor, 2048)


def demo_rows(demo, n=4):
    """The first ``n`` demo rows with absolute image paths (as the loader gives them back)."""
    rows = [json.loads(line) for line in open(os.path.join(demo, "data", "train.jsonl")) if line.strip()][:n]
    return [{**r, "images": [os.path.join(demo, "data", p) for p in r.get("images", [])]} for r in rows]


def loaded_batches(loaded, collate):
    return batches(collate, [loaded[i] for i in range(len(loaded))])


def test_odd_json_files_load_or_are_refused_naming_the_file(demo, tmp_path, processor):
    """A byte order mark (JSONL and JSON list) and CRLF line ends load as the plain file; an empty list, an empty
    file, one pretty-printed object and a byte that is not UTF-8 deep in a JSONL are refused naming the file."""
    from mpipe_hf.data import ConversationCollator, Source, load_sources
    collate, rows = ConversationCollator(processor, 2048), demo_rows(demo)
    want = batches(collate, reference(rows))
    files = {"bom.jsonl": ("utf-8-sig", "".join(json.dumps(r) + "\n" for r in rows)),
             "crlf.jsonl": ("utf-8", "".join(json.dumps(r) + "\r\n" for r in rows)),
             "bom.json": ("utf-8-sig", json.dumps(rows, indent=2))}
    for name, (encoding, text) in files.items():
        (tmp_path / name).write_bytes(text.encode(encoding))
        loaded = load_sources([Source(str(tmp_path / name))], processor, 2048, "qwen2_5_vl")
        assert not loaded.bad and len(loaded) == len(rows), (name, loaded.bad)
        assert_same_batches(loaded_batches(loaded, collate), want, name)
    (tmp_path / "latin1.jsonl").write_bytes(("".join(json.dumps(r) + "\n" for r in rows * 600) + json.dumps(
        {"text": "caf\u00e9"}, ensure_ascii=False) + "\n").encode("latin-1"))
    refused = {"empty.json": ("[]", "an empty JSON list"), "empty.jsonl": ("\n \n", "the file is empty"),
               "one.json": (json.dumps(rows[0], indent=2), "one JSON object over several lines"),
               "latin1.jsonl": (None, f"line {len(rows) * 600 + 1} .* is not UTF-8")}
    for name, (text, reason) in refused.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=f"{tmp_path / name}: .*{reason}"):
            load_sources([Source(str(tmp_path / name))], processor, 2048, "qwen2_5_vl")


def test_a_list_of_rows_with_pil_images_and_both_content_forms(demo, processor, capsys):
    """MPipeTrainer's list of rows holding PIL images and bytes, a user turn of parts and an answer string (not
    one Arrow schema), or a pathlib path: the batches of the canonical rows (a last row too long for
    ``max_length`` is left out with a warning that names its reason); a streaming or split dataset is refused
    naming what to pass."""
    import pathlib
    import datasets
    from PIL import Image
    from mpipe_hf.data import ConversationCollator, Source, load_sources
    from mpipe_hf.train.hf_parts import MPipeConfig
    from mpipe_hf.train.sources import trainer_rows
    collate, data = ConversationCollator(processor, 2048), MPipeConfig(pp_size=2).data()
    rows = demo_rows(demo, 3)
    pil = [Image.open(r["images"][0]).convert("RGB") for r in rows]  # in memory, no file name
    user = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"Row {i}?"}]} for i in range(3)]
    given = [{"messages": [user[0], {"role": "assistant", "content": "A."}], "images": [pil[0]]},
             {"messages": [user[1], {"role": "assistant", "content": [{"type": "text", "text": "B."}]}],
              "images": [open(rows[1]["images"][0], "rb").read()]},
             {"messages": [user[2], {"role": "assistant", "content": "C."}], "images": [pil[2]]}]
    canonical = [{"messages": [user[i], {"role": "assistant", "content": [{"type": "text", "text": f"{t}."}]}],
                  "images": [im]} for i, (t, im) in enumerate(zip("ABC", [pil[0], Image.open(rows[1]["images"][0]),
                                                                         pil[2]]))]
    too_long = [{"role": "user", "content": [{"type": "text", "text": "word " * 2100}, {"type": "image"}]},
                {"role": "assistant", "content": "D."}]
    loaded = trainer_rows(given + [{"messages": too_long, "images": [pil[0]]}], processor, data, "qwen2_5_vl")
    assert_same_batches(loaded_batches(loaded, collate), batches(collate, canonical), "pil list")
    warned = capsys.readouterr().out
    assert "dropped 1 of 4 rows (1 over max_length=2048): " in warned, warned
    path = load_sources([Source(pathlib.Path(demo, "data", "train.jsonl"))], processor, 2048, "qwen2_5_vl")
    assert path.path == os.path.join(demo, "data", "train.jsonl") and len(path) == 89
    stream = datasets.Dataset.from_list([{"text": "x"}]).to_iterable_dataset()
    for obj, reason in ((stream, "IterableDataset"), (datasets.DatasetDict(), "pass one split")):
        with pytest.raises(ValueError, match=reason):
            trainer_rows(obj, processor, data, "qwen2_5_vl")


def test_sharegpt_speakers_in_any_case_and_role_content_turns(demo, tmp_path, processor):
    """ShareGPT turns written ``{from: Human/GPT}``, ``{from: user/assistant}`` or ``{role, content}`` give the
    batches of the same rows written as ``messages``."""
    from mpipe_hf.data import ConversationCollator, Source, load_sources
    collate = ConversationCollator(processor, 2048)
    rows = [r for r in demo_rows(demo, 12) if all(isinstance(m["content"], str) for m in r["messages"])][:3]
    names = [{"system": "system", "user": "Human", "assistant": "GPT"}, {"system": "SYSTEM", "user": "user",
                                                                         "assistant": "assistant"}]
    turns = [lambda m, n=n: {"from": n[m["role"]], "value": m["content"]} for n in names]
    turns.append(lambda m: {"role": m["role"], "content": m["content"]})
    for k, turn in enumerate(turns):
        path = tmp_path / f"sharegpt{k}.jsonl"
        path.write_text("".join(json.dumps({"conversations": [turn(m) for m in r["messages"]], "images": r["images"]})
                                + "\n" for r in rows))
        loaded = load_sources([Source(str(path))], processor, 2048, "qwen2_5_vl")
        assert not loaded.bad and len(loaded) == len(rows) == 3, loaded.bad
        assert_same_batches(loaded_batches(loaded, collate), batches(collate, reference(rows)), path.name)


def test_a_fixed_image_is_seen_by_the_next_check_and_source_errors_name_the_cause(demo, tmp_path, processor):
    """The cache keeps a row that failed for a missing image only while it still fails: the file added, the next
    load (same rows, same cache key) reads the row. A weight of 0, an image folder that is not one, a clean row
    list that is missing, a forced layout that fits no row, a source of a mix with no row left, and text rows for
    a vision-language processor are refused naming the cause."""
    from mpipe_hf.data import Source, load_sources
    rows = demo_rows(demo, 2)
    os.makedirs(tmp_path / "images")
    shutil.copy(rows[0]["images"][0], tmp_path / "images" / "a.png")
    given = [{**rows[0], "images": ["images/a.png"]}, {**rows[1], "images": ["images/b.png"]}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in given))
    source = Source(str(tmp_path / "d.jsonl"))
    first = load_sources([source], processor, 2048, "qwen2_5_vl")
    assert len(first) == 1 and "images/b.png' not found" in first.bad[0][1]
    shutil.copy(rows[1]["images"][0], tmp_path / "images" / "b.png")
    again = load_sources([source], processor, 2048, "qwen2_5_vl")
    assert len(again) == 2 and not again.bad and again[1]["images"] == [str(tmp_path / "images" / "b.png")]
    errors = [([source, Source(source.path, weight=0)], {}, "weight must be a finite number > 0, got 0"),
              ([Source(source.path, images=str(tmp_path / "no"))], {}, "is not a folder"),
              ([source], {"clean_rows": str(tmp_path / "none.json")}, "data.clean_rows .*none.json: cannot read"),
              ([Source(source.path, "sharegpt")], {}, "no row left.*the first: .*d.jsonl:1: a sharegpt row needs"),
              ([source, Source(str(tmp_path / "bad.jsonl"))], {}, r"bad.jsonl \(one of the data sources\): no row "
                                                                 r"left.*bad.jsonl:1: .*no assistant turn"),
              ([Source(os.path.join(demo, "data", "text.jsonl"))], {}, "text rows .* train a decoder-only LM")]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    for sources, extra, reason in errors:
        with pytest.raises(ValueError, match=reason):
            load_sources(sources, processor, 2048, "qwen2_5_vl", **extra)


def write_bad_rows(demo, folder):
    """A JSONL of good rows and five different bad ones (their 1-based lines: the returned mapping)."""
    rows = [json.loads(line) for line in open(os.path.join(demo, "data", "train.jsonl")) if line.strip()][:8]
    shutil.copytree(os.path.join(demo, "data", "images"), os.path.join(folder, "images"))
    data = open(os.path.join(folder, "images", "coffee.png"), "rb").read()
    open(os.path.join(folder, "images", "truncated.png"), "wb").write(data[:len(data) // 3])
    user = {"role": "user", "content": "<image>What is it?"}
    bad = {
        "cannot decode image": {"messages": [user, {"role": "assistant", "content": "Coffee."}],
                                "images": ["images/truncated.png"]},
        "not found": {"messages": [user, {"role": "assistant", "content": "A cat."}], "images": ["images/no.png"]},
        "no assistant turn": {"messages": [user], "images": ["images/coffee.png"]},
        "placeholder(s) but 2 image(s)": {"messages": [user, {"role": "assistant", "content": "Two."}],
                                          "images": ["images/coffee.png", "images/rocket.png"]},
        "empty user text": {"messages": [{"role": "user", "content": " "}, {"role": "assistant", "content": "Hm."}]},
    }
    lines, out = {}, []
    for reason, row in bad.items():
        out += rows[:1] + [row]
        rows = rows[1:]
        lines[reason] = len(out)
    out += rows
    with open(os.path.join(folder, "train.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in out)
    return lines, len(out)


def test_check_data_lists_every_bad_row_in_one_run_and_writes_the_clean_rows(demo, tmp_path, processor):
    lines, total = write_bad_rows(demo, str(tmp_path))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model": os.path.join(demo, "model"), "data": {"path": "train.jsonl"},
                                      "parallel": {"pp_size": 2, "num_micro": 2}}))
    clean = tmp_path / "clean.json"
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "check-data", str(recipe),
                           "--num-proc", "2", "--write-clean", str(clean)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    path = os.path.join(str(tmp_path), "train.jsonl")
    listed = [line for line in proc.stdout.splitlines() if line.startswith(f"{path}:")]
    assert len(listed) == 5, proc.stdout
    for reason, line in lines.items():
        assert any(text.startswith(f"{path}:{line}: ") and reason in text for text in listed), (reason, listed)
    assert f"{total} rows; 5 bad" in proc.stdout and "5 bad row(s)" in proc.stdout
    assert "images per row: min 1" in proc.stdout and "tokens per row: min" in proc.stdout
    from mpipe_hf.train.recipe import load_recipe
    from mpipe_hf.train.sources import load_data
    keep = json.load(open(clean))["sources"][path]["keep"]
    assert sorted(set(range(total)) - set(keep)) == sorted(line - 1 for line in lines.values())
    raw = yaml.safe_load(recipe.read_text())
    raw["data"]["clean_rows"] = str(clean)
    recipe.write_text(yaml.safe_dump(raw))
    dataset, _ = load_data(load_recipe(str(recipe)), check_data_config(demo), processor, quiet=True)
    assert len(dataset) == total - 5 and not dataset.bad  # the truncated image is left out by the list


def check_data_config(demo):
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(os.path.join(demo, "model"))


def trainer_worker(model_dir: str, out: str, sources: str) -> None:
    """Run by torchrun (this file as a script, 2 processes): ``MPipeTrainer`` for 2 steps on the sources (a JSON
    list of ``[path, image folder, weight]``) mixed by weight, with the recipe route's settings."""
    from transformers import AutoModelForImageTextToText, TrainingArguments
    from mpipe_hf import MPipeConfig, MPipeTrainer
    from mpipe_hf.data import Source, load_checkpoint_processor
    processor = load_checkpoint_processor(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.model.visual.requires_grad_(False)
    args = TrainingArguments(output_dir=out, max_steps=2, per_device_train_batch_size=3,
                             gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1, report_to="none",
                             remove_unused_columns=False, train_sampling_strategy="sequential", use_cpu=True, seed=0)
    trainer = MPipeTrainer(model=model, args=args, mpipe_config=MPipeConfig(pp_size=2, vpp=2, timeout_s=120),
                           train_dataset=[Source(path, images=images, weight=weight)
                                          for path, images, weight in json.loads(sources)],
                           processing_class=processor)
    trainer.train()
    trainer.save_state()


def test_mpipe_hf_train_and_mpipe_trainer_read_the_same_mix(demo, cases, tmp_path):
    """The six cases mixed by weight: 2 steps through ``mpipe-hf train`` and through ``MPipeTrainer`` under
    torchrun, with the same first loss (fp32; both normalise by the micro-batches' means, the Trainer's for
    Qwen2.5-VL)."""
    # weights: TRL's case twice the others' (with the seed 0 mix, every case then has rows in the first 2 steps)
    sources = [[c["path"], c["images"], 2 if name.startswith("trl") else 1] for name, c in cases.items()]
    from mpipe_hf.data import Source, load_checkpoint_processor, load_sources
    mixed = load_sources([Source(p, images=i, weight=w) for p, i, w in sources],
                         load_checkpoint_processor(os.path.join(demo, "model")), 2048, "qwen2_5_vl")
    first_steps = [mixed.where(i) for i in range(2 * 2 * 3)]  # 2 steps of M = 2 micro-batches of 3 rows
    assert all(any(w.startswith(p) for w in first_steps) for p, _, _ in sources), first_steps  # every case trains
    recipe = tmp_path / "mix.yaml"
    recipe.write_text(yaml.safe_dump({
        "model": os.path.join(demo, "model"),
        "data": {"sources": [{"path": p, "weight": w, **({"images": i} if i else {})} for p, i, w in sources],
                 "micro_batch_size": 3, "shuffle": False},
        "parallel": {"pp_size": 2, "vpp": 2, "num_micro": 2, "timeout_s": 120},
        "train": {"max_steps": 2, "learning_rate": 1e-3, "loss_normalization": "micro",
                  "output_dir": str(tmp_path / "cli")}}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train", str(recipe)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-5000:]
    hf = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                         os.path.abspath(__file__), os.path.join(demo, "model"), str(tmp_path / "hf"),
                         json.dumps(sources)], capture_output=True, text=True, timeout=600, env=env)
    assert hf.returncode == 0, hf.stdout[-3000:] + hf.stderr[-5000:]
    cli_losses = [json.loads(line)["loss"] for line in open(tmp_path / "cli" / "metrics.jsonl")]
    state = json.load(open(tmp_path / "hf" / "trainer_state.json"))
    hf_losses = [h["loss"] for h in state["log_history"] if "loss" in h]
    assert len(cli_losses) == len(hf_losses) == 2
    assert abs(cli_losses[0] - hf_losses[0]) <= 1e-5 * cli_losses[0], (cli_losses, hf_losses)


if __name__ == "__main__":
    trainer_worker(*sys.argv[1:4])


def test_images_named_inside_their_parts_load_as_an_images_column(cases, processor, tmp_path):
    """``{"type": "image", "image": "file://..."}`` parts (apply_chat_template's form) give the same micro-batches
    as the ``images`` column; a row naming its images both ways is a bad row."""
    from mpipe_hf.data import ConversationCollator, Source, load_sources
    rows = cases["llava-json"]["rows"]
    inline = []
    for row in rows:
        images = iter(row["images"])
        inline.append({"messages": [{"role": m["role"], "content": [
            {"type": "image", "image": "file://" + next(images)} if p["type"] == "image" else p
            for p in data_layouts.parts_of(m["content"])]} for m in row["messages"]]})
    both = dict(inline[1], images=rows[1]["images"])
    path = tmp_path / "inline.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in inline + [both]))
    loaded = load_sources([Source(str(path))], processor, 2048, "qwen2_5_vl")
    assert loaded.bad == [(f"{path}:{len(inline) + 1}", "images named both inside the message parts and in "
                                                         "'images'; give them once")]
    collate = ConversationCollator(processor, 2048)
    assert_same_batches(batches(collate, [loaded[i] for i in range(len(loaded))]),
                        batches(collate, reference(rows)), "inline")
