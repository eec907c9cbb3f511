"""Issue 28: the data users already have, in every common layout and container, through one loader.

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
from data_layouts import build_all  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    import runpy
    out = str(tmp_path_factory.mktemp("demo"))
    runpy.run_path(os.path.join(ROOT, "scripts", "make_demo.py"))["main"]([out])
    return out


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
