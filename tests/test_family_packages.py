"""Every family group is a package with the same parts (docs/adding_a_family.md), the registry's table names exactly
what the packages declare, a lookup imports only the group asked for, and the generic code names no family."""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

from mpipe_hf.families.registry import GROUPS

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAMILIES_DIR = ROOT / "mpipe_hf" / "families"
PARTS = {"split.py": ("FAMILIES", "REFUSED"), "data.py": ("DATA",), "tiny.py": ("TINY",)}


def missing_parts(package: pathlib.Path) -> list[str]:
    """What ``package`` lacks of a family group's parts: a docstring in ``__init__.py``, and each part module with
    its tables assigned at module level (read from the source, nothing imported)."""
    problems = []
    init = package / "__init__.py"
    if not init.is_file() or not ast.get_docstring(ast.parse(init.read_text())):
        problems.append(f"{package.name}/__init__.py: no docstring saying what the group shares")
    for part, names in PARTS.items():
        path = package / part
        if not path.is_file():
            problems.append(f"{package.name}/{part}: missing")
            continue
        assigned = {target.id for node in ast.parse(path.read_text()).body
                    if isinstance(node, (ast.Assign, ast.AnnAssign))
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                    if isinstance(target, ast.Name)}
        problems += [f"{package.name}/{part}: no {name}" for name in names if name not in assigned]
    return problems


def test_the_part_check_finds_what_a_package_lacks(tmp_path):
    """Control: a package without a docstring, tiny.py, or REFUSED is named for each."""
    package = tmp_path / "fake"
    package.mkdir()
    (package / "__init__.py").write_text("x = 1\n")
    (package / "split.py").write_text("FAMILIES = {}\n")
    (package / "data.py").write_text("DATA: dict = {}\n")
    assert missing_parts(package) == ["fake/__init__.py: no docstring saying what the group shares",
                                      "fake/split.py: no REFUSED", "fake/tiny.py: missing"]


def test_every_group_folder_is_in_the_registry_and_back():
    folders = {p.name for p in FAMILIES_DIR.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(GROUPS)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_a_group_has_the_same_parts_and_declares_what_the_registry_says(group):
    from mpipe_hf.data.stock_processor import needs_stock_processor
    assert missing_parts(FAMILIES_DIR / group) == []
    split = importlib.import_module(f"mpipe_hf.families.{group}.split")
    data = importlib.import_module(f"mpipe_hf.families.{group}.data")
    tiny = importlib.import_module(f"mpipe_hf.families.{group}.tiny")
    declared, refused = set(split.FAMILIES), set(split.REFUSED)
    assert not declared & refused, f"{group}: both declared and refused: {sorted(declared & refused)}"
    assert declared | refused == set(GROUPS[group]), f"{group}: the registry's table differs from the package"
    assert set(tiny.TINY) == declared, f"{group}: tiny configs for {sorted(tiny.TINY)}, declared {sorted(declared)}"
    assert set(data.DATA) <= declared
    for model_type in declared - set(data.DATA):  # no data path here: the stock processor's, or a text model
        assert needs_stock_processor(model_type) or split.FAMILIES[model_type].vision == (), model_type


def test_a_lookup_imports_only_its_group():
    code = ("import sys; from mpipe_hf.families import registry; registry.family('idefics3'); "
            "registry.family_data('idefics3'); registry.tiny_config('idefics3'); "
            "print(sorted({m.split('.')[2] for m in sys.modules if m.startswith('mpipe_hf.families.') "
            "and m.count('.') >= 3}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["['idefics']"]


def family_imports(source: pathlib.Path) -> list[str]:
    """The imports of a family group package (``mpipe_hf.families.<group>``) in the modules under ``source``."""
    found = []
    for path in sorted(source.rglob("*.py")):
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                parts = name.split(".")
                if parts[:2] == ["mpipe_hf", "families"] and len(parts) > 2 and parts[2] in GROUPS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
                    break
    return found


def test_the_generic_code_imports_no_family():
    """models/ and data/ reach a family only through the registry."""
    assert family_imports(ROOT / "mpipe_hf" / "models") + family_imports(ROOT / "mpipe_hf" / "data") == []


def test_the_family_import_check_sees_one(tmp_path, monkeypatch):
    """Control: a generic module importing a group package is named."""
    fake = tmp_path / "mpipe_hf" / "data"
    fake.mkdir(parents=True)
    (fake / "x.py").write_text("from ..families.idefics import split\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert family_imports(fake) == ["mpipe_hf/data/x.py:1 imports mpipe_hf.families.idefics"]
