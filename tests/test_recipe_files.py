"""Recipe files: relative paths resolve against the recipe's folder, the bundled recipes run from any working
directory, an unreadable recipe is one ``ValueError`` line naming the file (the library and every command), and
every ``--help`` shows its defaults."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
import yaml

from mpipe_hf.train.recipe import load_recipe, parse_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(os.path.dirname(sys.executable), "mpipe-hf")


def test_relative_paths_resolve_against_the_recipe_folder(tmp_path, monkeypatch):
    """Every path field of a recipe file, written relative, names the file beside the recipe, whatever the working
    directory; ``resume: auto`` stays a keyword and an absolute path stays as written."""
    project = tmp_path / "project"
    (project / "recipes").mkdir(parents=True)
    (project / "cfg").mkdir()
    (project / "cfg" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (project / "tok").mkdir()
    for name in ("train.jsonl", "eval.jsonl", "profile.yaml"):
        (project / name).write_text("{}\n")
    (project / "ckpt").mkdir()
    raw = {"model": {"config": "../cfg/config.json", "tokenizer": "../tok"},
           "data": {"path": "../train.jsonl", "eval_path": "../eval.jsonl"},
           "parallel": {"pp_size": 1, "profile": "../profile.yaml"},
           "train": {"output_dir": "../outputs/run", "resume": "../ckpt"}}
    (project / "recipes" / "r.yaml").write_text(yaml.safe_dump(raw))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for path in (str(project / "recipes" / "r.yaml"), os.path.join("..", "project", "recipes", "r.yaml")):
        recipe = load_recipe(path)
        assert recipe.model.config == str(project / "cfg" / "config.json")
        assert recipe.model.tokenizer == str(project / "tok")
        assert recipe.data.path == str(project / "train.jsonl")
        assert recipe.data.eval_path == str(project / "eval.jsonl")
        assert recipe.parallel.profile == str(project / "profile.yaml")
        assert recipe.train.output_dir == str(project / "outputs" / "run")
        assert recipe.train.resume == str(project / "ckpt")
    (project / "ckpt" / "config.json").write_text("{}")
    (project / "ckpt" / "model.safetensors").write_bytes(b"")
    absolute = str(tmp_path / "out")
    shorthand = {"model": "../ckpt", "data": "../train.jsonl", "parallel": {"pp_size": 1},
                 "train": {"resume": "auto", "output_dir": absolute}}
    (project / "recipes" / "s.yaml").write_text(yaml.safe_dump(shorthand))
    recipe = load_recipe(str(project / "recipes" / "s.yaml"))
    assert recipe.model.name_or_path == str(project / "ckpt") and recipe.data.path == str(project / "train.jsonl")
    assert recipe.train.resume == "auto" and recipe.train.output_dir == absolute
    # a mapping has no file: its relative paths stay relative to the working directory
    monkeypatch.chdir(project)
    assert parse_recipe({**shorthand, "model": "ckpt", "data": "train.jsonl"}).model.name_or_path == "ckpt"


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "recipes", "*.yaml"))
                                        + glob.glob(os.path.join(ROOT, "recipes", "presets", "*.yaml"))),
                         ids=lambda p: os.path.relpath(p, os.path.join(ROOT, "recipes")))
def test_bundled_recipes_name_the_repository_from_any_working_directory(path, tmp_path, monkeypatch):
    """The shipped recipes name the repository's ``demo/``, ``data/`` and ``outputs/`` (and the presets their own
    configs) relative to their folder: from any working directory they point where they did from the repository
    root (``mpipe-hf train recipes/qwen2_5_vl_demo.yaml`` still writes ``<repo>/outputs/qwen2_5_vl_demo``)."""
    from mpipe_hf.train.recipe_paths import PATH_FIELDS, resolve_paths
    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load(open(path))
    resolved = resolve_paths(raw, os.path.dirname(path))
    name = os.path.splitext(os.path.basename(path))[0]
    assert resolved["train"]["output_dir"] == os.path.join(ROOT, "outputs", name)
    for section, keys in PATH_FIELDS.items():
        value = resolved.get(section)
        values = [value] if isinstance(value, str) else [value.get(k) for k in keys] if isinstance(value, dict) else []
        for v in values:
            assert v is None or v == "auto" or v.startswith(ROOT + os.sep), (section, v)
    if "presets" in path:  # their configs are in the repository: the whole recipe loads
        recipe = load_recipe(os.path.relpath(path))
        assert recipe.model.config == os.path.join(ROOT, "recipes", "presets", name, "config.json")
        assert os.path.isfile(recipe.model.config)


def bad_recipes(tmp_path) -> dict[str, str]:
    """A recipe path that is missing, a directory, not YAML, and YAML that is not a mapping."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "broken.yaml").write_text("model: demo\n  data: [\n")
    (tmp_path / "list.yaml").write_text("- model\n- data\n")
    return {"missing": str(tmp_path / "nope.yaml"), "directory": str(tmp_path / "folder"),
            "not-yaml": str(tmp_path / "broken.yaml"), "not-a-mapping": str(tmp_path / "list.yaml")}


@pytest.mark.parametrize("kind", ["missing", "directory", "not-yaml", "not-a-mapping"])
def test_an_unreadable_recipe_is_a_value_error_naming_the_file(kind, tmp_path):
    path = bad_recipes(tmp_path)[kind]
    with pytest.raises(ValueError) as info:
        load_recipe(path)
    assert path in str(info.value) and "\n" not in str(info.value)


def run_cli(args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("command", ["train", "plan", "profile"])
def test_the_cli_reports_a_bad_recipe_in_one_line(command, tmp_path):
    """``mpipe-hf train`` on a missing recipe and on YAML that is not a mapping, ``plan`` and ``profile`` on a file
    that is not YAML (every kind goes through the same ``load_recipe``: the test above): exit status 1 or 2 and one
    line ``mpipe-hf: error: ...`` naming the file, no traceback."""
    for kind, path in bad_recipes(tmp_path).items():
        if kind not in ("missing", "not-a-mapping") if command == "train" else kind != "not-yaml":
            continue  # each process costs seconds: the other kinds go through the same load_recipe (test above)
        proc = run_cli([CLI, command, path], tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, (kind, proc.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith("mpipe-hf: error: ") and path in lines[0], (kind, lines)


def test_the_per_process_entry_point_reports_a_bad_recipe_in_one_line(tmp_path):
    """``python -m mpipe_hf.train RECIPE`` (what torchrun starts) as ``mpipe-hf``: one line, no traceback (one
    case: the entry point imports the whole trainer, which takes seconds)."""
    path = bad_recipes(tmp_path)["not-a-mapping"]
    proc = run_cli([sys.executable, "-m", "mpipe_hf.train", path], tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("mpipe-hf: error: ") and path in lines[0], lines


def test_every_help_shows_the_defaults_in_plain_text(capsys):
    """``mpipe-hf --help`` and every subcommand's: each option with a default shows it, and no reST markup."""
    import argparse

    from mpipe_hf.cli import _parser, main
    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"train", "schedule", "simulate", "plot", "plan", "profile"} <= set(commands)
    for argv in ([], *([name] for name in commands)):
        with pytest.raises(SystemExit) as info:
            main([*argv, "--help"])
        assert info.value.code == 0
        text = capsys.readouterr().out
        for markup in ("``", ":func:", ":class:", ":mod:", ":meth:", ":data:"):
            assert markup not in text, (argv, markup)
        if argv:
            defaults = [a for a in commands[argv[0]]._actions
                        if a.default not in (None, argparse.SUPPRESS) and a.help is not None]
            assert defaults, argv
            for action in defaults:
                assert f"(default: {action.default})" in " ".join(text.split()), (argv, action.dest)
