"""Every state load names where its tensors go.

``torch.load`` without ``map_location`` puts each tensor back on the device index that saved it: on a resume
that changes the layout, that is another process's GPU (or a GPU this process cannot see). safetensors'
``load_file`` and ``safe_open`` default to the CPU, but a load that names no device is one edit away from the
same mistake, so they must name one as well.

The scan reads the source (AST), so it sees every call, run by a test or not: each ``torch.load(`` under
``mpipe_hf/`` and ``scripts/`` must pass ``map_location=`` by keyword, each ``load_file(`` its ``device``
(keyword or second argument) and each ``safe_open(`` its ``device`` (keyword or third argument). An offender is
named as ``path:line``.
"""

from __future__ import annotations

import ast
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = ("mpipe_hf", "scripts")
# the commit before the fix of unmapped loads (e6ac317): state loads without map_location, safetensors reads
# without device
BEFORE_FIX = "d6177cf~1"
# safetensors readers: the positional index of their ``device`` argument
SAFETENSORS = {"load_file": 1, "safe_open": 2}


def _aliases(tree: ast.AST) -> tuple[set[str], set[str], dict[str, str]]:
    """``(names bound to the torch module, names bound to torch.load, {name: safetensors reader})`` of a module,
    from its imports (anywhere in it, a function's local imports included)."""
    torch_names, load_names, readers = {"torch"}, set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch":
                    torch_names.add(alias.asname or "torch")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                bound = alias.asname or alias.name
                if node.module == "torch" and alias.name == "load":
                    load_names.add(bound)
                elif node.module.startswith("safetensors") and alias.name in SAFETENSORS:
                    readers[bound] = alias.name
    return torch_names, load_names, readers


def _offence(call: ast.Call, torch_names, load_names, readers, uses_safetensors: bool) -> str | None:
    """What ``call`` lacks, or ``None`` when it is not a load or names its device."""
    func, keywords = call.func, {k.arg for k in call.keywords}
    is_torch_load = (isinstance(func, ast.Attribute) and func.attr == "load" and isinstance(func.value, ast.Name)
                     and func.value.id in torch_names) or (isinstance(func, ast.Name) and func.id in load_names)
    if is_torch_load:
        return None if "map_location" in keywords else "torch.load without map_location="
    reader = readers.get(func.id) if isinstance(func, ast.Name) else None
    if reader is None and uses_safetensors and isinstance(func, ast.Attribute) and func.attr in SAFETENSORS:
        reader = func.attr  # safetensors.torch.load_file(...), safetensors.safe_open(...)
    if reader is None:
        return None
    positional = len(call.args) > SAFETENSORS[reader]
    return None if "device" in keywords or positional else f"safetensors {reader} without a device"


def scan_source(text: str, name: str) -> list[str]:
    """``["name:line: what is missing", ...]`` for every load in the Python source ``text`` that names no
    device.

    Raises:
        SyntaxError: ``text`` is not Python.
    """
    tree = ast.parse(text, filename=name)
    torch_names, load_names, readers = _aliases(tree)
    uses_safetensors = "safetensors" in text
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            offence = _offence(node, torch_names, load_names, readers, uses_safetensors)
            if offence:
                found.append(f"{name}:{node.lineno}: {offence}")
    return sorted(found, key=lambda s: (s.split(":")[0], int(s.split(":")[1])))


def scan_tree(read, paths) -> list[str]:
    """Offenders over ``paths`` (relative to the repository root), each read by ``read(path) -> str``."""
    return [hit for path in sorted(paths) if path.endswith(".py") for hit in scan_source(read(path), path)]


def working_tree_paths() -> list[str]:
    """Every ``.py`` under :data:`SCANNED` in the working tree, relative to the repository root."""
    out = []
    for top in SCANNED:
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            out += [os.path.relpath(os.path.join(folder, f), ROOT) for f in files if f.endswith(".py")]
    return out


def read_working(path: str) -> str:
    """The working tree's text of ``path`` (relative to the repository root)."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def scan_commit(rev: str) -> list[str]:
    """Offenders in the files of :data:`SCANNED` at git revision ``rev`` (read with ``git show``, not checked
    out)."""
    listing = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, *SCANNED], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()

    def read(path):
        return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout
    return scan_tree(read, [p for p in listing if p.endswith(".py")])


def test_every_state_load_names_its_device():
    offenders = scan_tree(read_working, working_tree_paths())
    assert not offenders, "loads that name no device (add map_location= / device=):\n" + "\n".join(offenders)


@pytest.mark.parametrize("source, expected", [
    ("import torch\nx = torch.load(p)\n", ["m.py:2: torch.load without map_location="]),
    ("import torch\nx = torch.load(p, weights_only=True)\n", ["m.py:2: torch.load without map_location="]),
    ("import torch as th\ndef f():\n    return th.load(p, 'cpu')\n", ["m.py:3: torch.load without map_location="]),
    ("from torch import load\nload(p)\n", ["m.py:2: torch.load without map_location="]),
    ("import torch\ntorch.load(p, map_location='cpu')\n", []),
    ("import torch\ntorch.load(p, map_location=dev, weights_only=False, mmap=True)\n", []),
    ("import json\njson.load(f)\nProfile.load(p)\n", []),
    ("from safetensors.torch import load_file\nload_file(f)\n", ["m.py:2: safetensors load_file without a device"]),
    ("from safetensors.torch import load_file\nload_file(f, 'cpu')\nload_file(f, device=d)\n", []),
    ("from safetensors import safe_open\nwith safe_open(f, 'pt') as g:\n    pass\n",
     ["m.py:2: safetensors safe_open without a device"]),
    ("from safetensors import safe_open\nsafe_open(f, 'pt', device='cpu')\nsafe_open(f, 'pt', 'cpu')\n", []),
    ("import safetensors.torch\nsafetensors.torch.load_file(f)\n", ["m.py:2: safetensors load_file without a device"]),
    ("def load_file(f):\n    pass\nload_file(f)\n", []),  # not safetensors'
])
def test_scan_finds_each_kind_of_offender(source, expected):
    assert scan_source(source, "m.py") == expected


def test_scan_finds_the_unmapped_loads_of_an_older_commit():
    """At the commit before the fix of unmapped loads the scan names the state loads it fixed (optimizer and
    scheduler state loaded without ``map_location``): the scan can fail on real code, not only on the snippets above."""
    try:
        offenders = scan_commit(BEFORE_FIX)
    except (OSError, subprocess.CalledProcessError) as err:  # a shallow clone, or no git
        pytest.skip(f"git history before {BEFORE_FIX} is not here: {err}")
    torch_loads = [o for o in offenders if "torch.load" in o]
    assert "mpipe_hf/train/state.py:77: torch.load without map_location=" in torch_loads, offenders
    assert any(o.startswith("mpipe_hf/train/hf.py:560:") for o in torch_loads), offenders
    assert len(torch_loads) == 4, torch_loads
