"""Every recipe key given a wrong type or value fails in :func:`parse_recipe`, before any process starts, with a
``ValueError`` whose message names the key as ``section.key``: no ``TypeError``, no other exception, no silent
acceptance.

The table is built from the schema itself: every field of every section class in ``SECTIONS`` gets wrong values
derived from its annotated type (and, where the annotation does not say it, from the small classification below),
plus explicit rows for the constraints the docstrings state. A new field that the classification does not know
fails :func:`test_the_table_covers_every_field_of_every_section`.

Not here: that ``data.path`` and ``data.eval_path`` exist, which :func:`mpipe_hf.train.trainer.check` checks
(``mpipe-hf plan`` and the presets parse without the data), and that ``train.output_dir`` is writable (also
``check``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing

import pytest
import yaml

from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.schedule.swap import SwapConfig
from mpipe_hf.train.recipe import SECTIONS, DataSection, ModelSource, ParallelSection, TrainSection, load_recipe, \
    parse_recipe

# What the annotations leave out. The least value of each integer field (train.max_steps also takes -1):
INT_MIN = {
    "data.micro_batch_size": 1, "data.min_pixels": 1, "data.max_pixels": 1, "data.max_length": 1,
    "data.max_bad_rows": 1, "data.max_bad_steps": 1, "data.num_proc": 1, "data.max_tokens_per_micro": 1,
    "data.video_max_pixels": 1, "data.max_frames": 2, "data.max_visual_tokens": 1,
    "parallel.pp_size": 1, "parallel.vpp": 1,
    "parallel.num_micro": 1, "parallel.text_layers": 0, "train.max_steps": 1, "train.logging_steps": 1,
    "train.warmup_steps": 0, "train.seed": 0, "train.save_steps": 0, "train.save_total_limit": 1, "train.eval_steps": 0, "parallel.dp_size": 1,
    "parallel.ep_size": 1, "parallel.cp_size": 1,
    "lora.r": 1, "swap.min_swap_gap": 2, "swap.min_bytes": 0,
}
FLOAT_POSITIVE = {"train.num_train_epochs", "parallel.timeout_s", "lora.lora_alpha"}  # > 0; other floats >= 0
# module names for peft: a list of non-empty names, or (where the annotation allows a str) one regex
MODULE_LISTS = {"lora.target_modules", "lora.exclude_modules", "lora.modules_to_save", "lora.target_parameters"}
PATTERN_LISTS = {"train.freeze", "train.trainable"}  # parameter name patterns: a list of non-empty strings, or one
CHOICES = {"data.on_bad_sample", "parallel.preprocess", "parallel.overflow", "parallel.placement",
           "parallel.mesh_order", "parallel.owners", "train.lr_scheduler_type",
           "train.loss_normalization", "data.format", "data.mix_stopping", "data.video_decoder"}  # a fixed set
PATHS = {"model.name_or_path", "model.config", "model.tokenizer", "data.path", "data.eval_path", "parallel.profile",
         "train.resume", "train.output_dir", "data.images", "data.clean_rows"}  # a string naming a file or directory
NAMES = {"data.split"}  # a non-empty string of the user's choosing
MUST_EXIST = {"model.name_or_path", "model.config", "model.tokenizer", "parallel.profile", "train.resume"}
# a deprecated key: its value goes to the new key (with a FutureWarning), whose name the error gives
ALIASES = {"data.max_bad_steps": "data.max_bad_rows"}

# Paths resolved in the test's temporary directory (see ``env``), and how a test id shows them.
TMP = "{tmp}"
PATH_LABELS = {f"{TMP}/nowhere": "missing-path", f"{TMP}/data.jsonl": "a-file", TMP: "a-directory",
               f"{TMP}/empty": "dir-without-config.json"}


def minimal() -> dict:
    """The smallest valid recipe: a config for random init, a data file, one pipeline rank."""
    return {"model": {"config": f"{TMP}/config.json"}, "data": {"path": f"{TMP}/data.jsonl"},
            "parallel": {"pp_size": 1}, "train": {"output_dir": f"{TMP}/out"}}


def label(value) -> str:
    """A short, readable test id for ``value``: a plain word bare, anything else as its ``repr``."""
    if isinstance(value, str) and value in PATH_LABELS:
        return PATH_LABELS[value]
    if isinstance(value, str) and value.isidentifier() and value not in ("nan", "inf", "True", "False", "None"):
        return value
    return repr(value).replace(" ", "")


@dataclasses.dataclass(frozen=True)
class Case:
    """One row: ``edits`` applied to the minimal recipe make it wrong; the ``ValueError`` names every one of
    ``expect``. ``field`` is the ``section.key`` the row tests, when it tests one field."""

    id: str
    edits: tuple
    expect: tuple
    field: str | None = None


def schema() -> list[tuple[str, object]]:
    """``[("section.key", annotated type)]`` for every field of every section."""
    return [(f"{name}.{f.name}", typing.get_type_hints(cls)[f.name]) for name, cls in SECTIONS.items()
            for f in dataclasses.fields(cls)]


def split_optional(hint) -> tuple[object, bool]:
    """``(the type, whether None is allowed)`` of an annotation ``T`` or ``T | None``."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        assert len(rest) == 1, hint
        return rest[0], True
    return hint, False


def wrong_values(name: str, hint) -> list:
    """Wrong values for the field ``name`` of annotated type ``hint``; ``[]`` for a type or field this table does
    not classify (the coverage test then names it)."""
    if name in MODULE_LISTS:
        takes_str = str in typing.get_args(hint)
        values = [5, True, 1.5, [], [5], [""], {"a": 1}, [["q_proj"]]] + ([""] if takes_str else ["q_proj"])
    elif name == "lora.init_lora_weights":  # true, false or "gaussian"
        values = [None, "pissa", "", 5, 1.5, ["gaussian"]]
    else:
        base, optional = split_optional(hint)
        values = [] if optional else [None]
    if name in MODULE_LISTS or name == "lora.init_lora_weights":
        pass
    elif base is bool:
        values += ["yes", "true", 1, 0]
    elif base is int:
        if name not in INT_MIN:
            return []
        values += ["banana", "3", 1.5, True, [1], {"a": 1}, INT_MIN[name] - 1, -5]
    elif base is float:
        values += ["banana", True, [1.0], {"a": 1}, math.nan, math.inf, -5] + ([0] if name in FLOAT_POSITIVE else [])
    elif base is str and name in CHOICES:
        values += [5, True, "bogus", "", ["bogus"]]
    elif base is str and name in NAMES:
        values += [5, True, 1.5, "", ["x"]]
    elif name == "data.sources":  # a list of mappings with a path (the whole data mapping is replaced)
        values += [5, "x.jsonl", [], {"path": "x"}, [5], [{"pth": "x"}], [{"path": ""}], [{"path": "x", "weight": 0}],
                   [{"path": "x", "format": "bogus"}], [{"path": "x", "split": ""}]]
    elif base is str and name in PATHS:
        values += [5, True, 1.5, "", ["x"]] + ([f"{TMP}/nowhere"] if name in MUST_EXIST else [])
    elif name == "swap.ranks":  # distinct pipeline ranks (the minimal recipe has one: rank 0)
        values += [5, "banana", {"a": 1}, ["bogus"], [True], [1.5], [0, 0], [-1], [1]]
    elif typing.get_origin(base) is list and typing.get_args(base) == (int,):
        values += [5, "banana", {"a": 1}, ["bogus"], [0], [True], [1.5], [1, 1]]  # the minimal recipe has 1 stage
    elif name in PATTERN_LISTS:  # whether a pattern matches is checked against the model (tests/test_freeze.py)
        values += [5, True, 1.5, {"a": 1}, [5], [""], [["x"]]]
    elif typing.get_origin(base) is list and typing.get_args(base) == (str,):
        values += [5, "bogus", {"wandb": 1}, ["bogus"], [5], [["wandb"]]]
    else:
        return []
    unique = {}
    for value in values:
        unique.setdefault(label(value), value)
    return list(unique.items())


def field_edit(name: str, value) -> tuple:
    """The edits that give field ``name`` the value ``value``: a model key replaces the whole model mapping (one of
    ``name_or_path`` and ``config``, so the error is about the key itself)."""
    section, key = name.split(".")
    if name == "data.sources":  # data.path and data.sources exclude each other
        return (("data", {"sources": value}),)
    if section != "model":
        return ((name, value),)
    if key == "tokenizer":
        return (("model", {"config": f"{TMP}/config.json", "tokenizer": value}),)
    return (("model", {key: value}),)


def field_cases() -> list[Case]:
    return [Case(f"{name}={text}", field_edit(name, value), (ALIASES.get(name, name),), name)
            for name, hint in schema() for text, value in wrong_values(name, hint)]


EXTRA = [  # the constraints the docstrings state, beyond each field's type
    Case("train.adam_beta1=1.0", (("train.adam_beta1", 1.0),), ("train.adam_beta1 must be in [0, 1)",),
         "train.adam_beta1"),
    Case("train.adam_beta2=1", (("train.adam_beta2", 1),), ("train.adam_beta2 must be in [0, 1)",),
         "train.adam_beta2"),
    Case("train.warmup_ratio=1.5", (("train.warmup_ratio", 1.5),), ("train.warmup_ratio must be in [0, 1]",),
         "train.warmup_ratio"),
    Case("train.seed=2**32", (("train.seed", 2 ** 32),), ("train.seed must be an integer in [0, 2**32)",),
         "train.seed"),
    Case("train.max_steps=-2", (("train.max_steps", -2),), ("train.max_steps", "or -1"), "train.max_steps"),
    Case("train.learning_rate=10**400", (("train.learning_rate", 10 ** 400),), ("train.learning_rate",),
         "train.learning_rate"),
    Case("train.learning_rate='-1e-4'", (("train.learning_rate", "-1e-4"),), ("train.learning_rate",),
         "train.learning_rate"),
    Case("train.weight_decay='nan'", (("train.weight_decay", "nan"),), ("train.weight_decay",), "train.weight_decay"),
    Case("train.resume=a-file", (("train.resume", f"{TMP}/data.jsonl"),), ("train.resume",), "train.resume"),
    Case("train.output_dir=a-file", (("train.output_dir", f"{TMP}/data.jsonl"),), ("train.output_dir",),
         "train.output_dir"),
    Case("lora.lora_dropout=1", (("lora.lora_dropout", 1),), ("lora.lora_dropout must be a number in [0, 1)",),
         "lora.lora_dropout"),
    Case("lora.lora_alpha='16'", (("lora.lora_alpha", "-16"),), ("lora.lora_alpha",), "lora.lora_alpha"),
    Case("parallel.timeout_s=1e300", (("parallel.timeout_s", 1e300),), ("parallel.timeout_s",), "parallel.timeout_s"),
    Case("parallel.timeout_s='-5'", (("parallel.timeout_s", "-5"),), ("parallel.timeout_s",), "parallel.timeout_s"),
    Case("parallel.profile=a-directory", (("parallel.profile", TMP),), ("parallel.profile",), "parallel.profile"),
    Case("parallel.placement=fill,preprocess=trainable",
         (("parallel.preprocess", "trainable"), ("parallel.placement", "fill")), ("parallel.placement 'fill'",),
         "parallel.placement"),
    Case("parallel.placement=fill,preprocess=identity",
         (("parallel.preprocess", "identity"), ("parallel.placement", "fill")), ("parallel.placement 'fill'",),
         "parallel.placement"),
    Case("parallel.owners=balanced,overflow=min", (("parallel.overflow", "min"), ("parallel.owners", "balanced")),
         ("parallel.owners 'balanced' needs overflow 'full'",), "parallel.owners"),
    Case("parallel.owner_backward=True,preprocess=frozen", (("parallel.owner_backward", True),),
         ("parallel.owner_backward needs preprocess 'trainable'",), "parallel.owner_backward"),
    Case("parallel.text_layers=1,preprocess=identity",
         (("parallel.preprocess", "identity"), ("parallel.text_layers", 1)),
         ("parallel.text_layers = 1 needs preprocess",), "parallel.text_layers"),
    Case("parallel.layers_per_stage=[2],vpp=2", (("parallel.vpp", 2), ("parallel.layers_per_stage", [2])),
         ("parallel.layers_per_stage must be null or a list of 2 integers",), "parallel.layers_per_stage"),
    Case("parallel.pp_size=missing", (("parallel", {}),), ("'parallel'", "pp_size"), "parallel.pp_size"),
    Case("data.min_pixels>max_pixels", (("data.min_pixels", 20000), ("data.max_pixels", 10000)),
         ("data.min_pixels (20000) exceeds data.max_pixels",), "data.min_pixels"),
    Case("data.path=missing", (("data", {"micro_batch_size": 2}),), ("'data'", "path"), "data.path"),
    Case("model.name_or_path=dir-without-config.json", (("model", {"name_or_path": f"{TMP}/empty"}),),
         ("model.name_or_path", "no config.json"), "model.name_or_path"),
    Case("model.name_or_path=a-file", (("model", {"name_or_path": f"{TMP}/data.jsonl"}),), ("model.name_or_path",),
         "model.name_or_path"),
    Case("model.tokenizer=a-file", (("model", {"config": f"{TMP}/config.json", "tokenizer": f"{TMP}/data.jsonl"}),),
         ("model.tokenizer",), "model.tokenizer"),
    Case("model.name_or_path+config", (("model", {"name_or_path": TMP, "config": f"{TMP}/config.json"}),),
         ("model needs exactly one of name_or_path",)),
    Case("model={}", (("model", {}),), ("model needs exactly one of name_or_path",)),
    Case("model=''", (("model", ""),), ("model.name_or_path",)),
    # a section of the wrong type, an unknown or moved key, an unknown or missing section
    *[Case(f"{name}={label(value)}", ((name, value),), (f"section {name!r} must be a mapping",))
      for name in ("data", "parallel", "train", "lora", "swap") for value in (5, [], False, [{"a": 1}])],
    Case("data=None", (("data", None),), ("section 'data' must be a mapping",)),
    Case("train='x'", (("train", "x"),), ("section 'train' must be a mapping",)),
    *[Case(f"model={label(value)}", (("model", value),), ("model must be a checkpoint path or a mapping",))
      for value in (5, None, [], True)],
    Case("model.bogus", (("model", {"config": f"{TMP}/config.json", "bogus": 1}),),
         ("model must be a checkpoint path or a mapping with keys",)),
    *[Case(f"{name}.bogus", ((f"{name}.bogus", 1),), (f"unknown key {name}.bogus",))
      for name in ("data", "parallel", "train", "lora", "swap")],
    Case("train.pp_size", (("train.pp_size", 2),), ("unknown key train.pp_size; it lives at parallel.pp_size",)),
    Case("parallel.lr", (("parallel.lr", 1e-4),), ("unknown key parallel.lr; it lives at train.learning_rate",)),
    Case("bogus-section", (("bogus", {}),), ("unknown section 'bogus'",)),
    Case("top-level-seed", (("seed", 3),), ("'seed' now lives in the 'train' section",)),
    Case("no-parallel-section", (("-parallel", None),), ("missing the 'parallel' section",)),
    Case("recipe=[]", (("", []),), ("a recipe is a mapping of sections",)),
]
CASES = field_cases() + EXTRA


def resolve(value, tmp: str):
    """``value`` with ``{tmp}`` replaced by the temporary directory, in strings, lists and mappings."""
    if isinstance(value, str):
        return value.replace(TMP, tmp)
    if isinstance(value, list):
        return [resolve(v, tmp) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, tmp) for k, v in value.items()}
    return value


def build(edits, tmp: str):
    """The minimal recipe with ``edits``: ``(section.key, v)`` sets a key, ``(section, v)`` a whole section,
    ``(-section, _)`` removes one, ``("", v)`` replaces the recipe."""
    raw = resolve(minimal(), tmp)
    for path, value in edits:
        value = resolve(value, tmp)
        if path == "":
            raw = value
        elif path.startswith("-"):
            del raw[path[1:]]
        elif "." in path:
            section, key = path.split(".")
            raw.setdefault(section, {})[key] = value  # a lora key adds the (optional) lora section
        else:
            raw[path] = value
    return raw


@pytest.fixture
def env(tmp_path):
    """The temporary directory as a string, holding what the minimal recipe names."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "data.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    (tmp_path / "empty").mkdir()
    return str(tmp_path)


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_the_table_covers_every_field_of_every_section():
    """Each field has wrong values of its own; a new field this table cannot classify (an integer without a least
    value, a string that is neither a choice nor a path, a type not handled) fails here."""
    unclassified = [name for name, hint in schema() if not wrong_values(name, hint)]
    assert not unclassified, f"add these fields to the classification of {__name__}: {unclassified}"
    fields = {name for name, _ in schema()}
    covered = {c.field for c in CASES if c.field}
    assert fields - covered == set()
    assert covered - fields == set(), "a row names a field that no section has"
    for name in fields:  # the wrong types and the out-of-range values
        assert sum(c.field == name for c in CASES) >= 4, name


def test_the_minimal_recipe_parses(env):
    recipe = parse_recipe(build((), env))
    assert isinstance(recipe.model, ModelSource) and recipe.model.config == f"{env}/config.json"
    assert isinstance(recipe.data, DataSection) and recipe.data.path == f"{env}/data.jsonl"
    assert isinstance(recipe.parallel, ParallelSection) and recipe.parallel.pp_size == 1
    assert isinstance(recipe.train, TrainSection) and recipe.train.output_dir == f"{env}/out"
    assert recipe.lora is None  # no lora section: full fine-tuning
    assert recipe.swap == SwapConfig()  # no swap section: swap off
    edits = (("lora", {}), ("swap", {}))  # `lora: {}`: LoRA with every default; `swap: {}`: its defaults (off)
    recipe = parse_recipe(build(edits, env))
    for section, cls in SECTIONS.items():  # every other key keeps its default
        given = build(edits, env)[section]
        for f in dataclasses.fields(cls):
            if f.name not in given:
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                assert getattr(getattr(recipe, section), f.name) == default, f"{section}.{f.name}"


def test_what_yaml_writes_still_parses(env, tmp_path):
    """YAML reads ``1e-4`` (no dot) as a string: the float fields take numeric strings; the shorthands of a
    section (a checkpoint path for ``model``, a path for ``data``, an empty ``train:``) parse."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"")
    (tmp_path / "recipe.yaml").write_text(
        f"model: {env}/ckpt\ndata: {env}/data.jsonl\nparallel: {{pp_size: 2, vpp: 2, layers_per_stage: [1, 2, 2, 1],"
        f" timeout_s: 1e3}}\ntrain: {{learning_rate: 1e-4, adam_epsilon: 1e-6, num_train_epochs: 2, "
        f"report_to: tensorboard, resume: auto, output_dir: {env}/out}}\n")
    recipe = load_recipe(str(tmp_path / "recipe.yaml"))
    assert recipe.model.name_or_path == f"{env}/ckpt" and recipe.data.path == f"{env}/data.jsonl"
    assert recipe.parallel.timeout_s == 1000.0 and recipe.parallel.layers_per_stage == [1, 2, 2, 1]
    assert recipe.train.learning_rate == 1e-4 and recipe.train.adam_epsilon == 1e-6
    assert recipe.train.num_train_epochs == 2.0 and recipe.train.report_to == ["tensorboard"]
    for empty in (None, {}):
        assert parse_recipe({**build((), env), "train": empty}).train == TrainSection()


def test_bad_values_in_a_yaml_recipe_name_the_key(env, tmp_path):
    """``timeout_s: -5`` and ``seed: banana`` as a recipe file gives them."""
    for section, text, name in (("parallel", "{pp_size: 1, timeout_s: -5}", "parallel.timeout_s"),
                                ("train", "{seed: banana}", "train.seed")):
        raw = build((), env)
        raw[section] = yaml.safe_load(text)
        (tmp_path / "r.yaml").write_text(yaml.safe_dump(raw))
        with pytest.raises(ValueError, match=name):
            load_recipe(str(tmp_path / "r.yaml"))


def test_schedule_config_keeps_its_own_messages():
    """Only the recipe's ``parallel`` section names ``parallel.<key>``; :class:`ScheduleConfig` itself (the CLI's
    ``schedule`` and ``simulate``) keeps the bare field name."""
    with pytest.raises(ValueError, match=r"^pp_size must be an integer >= 1, got 0$"):
        ScheduleConfig(pp_size=0)
    with pytest.raises(ValueError, match=r"^placement 'fill' moves"):
        ScheduleConfig(2, 1, 2, "trainable", placement="fill")
    with pytest.raises(ValueError, match=r"^parallel\.pp_size must be an integer >= 1, got 0$"):
        ParallelSection(pp_size=0)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_wrong_value_is_a_value_error_naming_the_key(env, case):
    raw = build(case.edits, env)
    try:
        parse_recipe(raw)
    except ValueError as err:
        assert type(err) is ValueError, f"{type(err).__name__}: {err}"
        for fragment in case.expect:
            assert fragment in str(err), f"{fragment!r} not in the message: {err}"
    except Exception as err:  # noqa: BLE001 - the point: anything else is a bug
        pytest.fail(f"{case.id}: {type(err).__name__} instead of a ValueError: {err}")
    else:
        pytest.fail(f"{case.id}: accepted {raw!r}")
