"""No import circle anywhere in ``mpipe_hf/``, and imports point down the layers only.

The import graph is built from the source (AST), so it sees every import whether a test runs it or not:

* each ``import a.b.c`` and ``from a.b import c`` anywhere in a module: at module level, inside a function, under
  ``if TYPE_CHECKING:`` or ``try:``. Lazy (function-level) imports count: one that closes a circle still makes two
  modules that cannot be read, changed or moved apart, whatever the import order at run time.
  ``importlib.import_module("literal", __name__)`` counts too; only a name built at run time (the PEP 562
  ``__getattr__`` of :mod:`mpipe_hf.models` and :mod:`mpipe_hf.data`) is no edge;
* ``from a.b import c`` is an edge to the module ``a.b.c`` if there is one, else to ``a.b``; relative imports are
  resolved against the importer's package;
* importing a submodule runs its packages' ``__init__`` first, so each package above the target that is not an
  ancestor of the importer is an edge as well.

Circles are the strongly connected components of that graph (Tarjan); each is named as a closed walk
``a -> b -> c -> a`` through all its modules, every edge with the ``file:line`` of its import.

The layers (SPEC.md's layout, arrows down only): ``schedule`` (pure Python, no ``torch.distributed``) ->
``runtime`` -> ``models`` / ``data`` / ``families`` -> ``train`` -> ``cli``. A module imports its own layer or
lower ones. The package's ``__init__`` sits in the ``train`` layer (it hands out ``MPipeTrainer``).
"""

from __future__ import annotations

import ast
import os
from collections import deque

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "mpipe_hf"
# lowest first; a module imports modules of its own rank or lower ones
LAYERS = {"schedule": 0, "runtime": 1, "models": 2, "data": 2, "families": 2, "train": 3, "cli": 4,
          "cli_train": 4, "": 3}


def package_modules(top: str, package: str = PACKAGE) -> dict[str, str]:
    """``{dotted module name: path}`` of every ``.py`` under ``top/package`` (a package's ``__init__.py`` is the
    package's own name)."""
    out = {}
    for folder, _, files in os.walk(os.path.join(top, package)):
        for name in files:
            if name.endswith(".py"):
                parts = os.path.relpath(os.path.join(folder, name), top)[:-3].split(os.sep)
                out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = os.path.join(folder, name)
    return out


def _base(importer: str, is_package: bool, module: str | None, level: int) -> str:
    """The absolute name ``from <level dots><module> import ...`` refers to, in ``importer``."""
    if level == 0:
        return module or ""
    parts = importer.split(".") if is_package else importer.split(".")[:-1]
    parts = parts[:len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def _literal_import_module(node: ast.Call, importer: str, is_package: bool) -> str | None:
    """The absolute name ``importlib.import_module("<literal>"[, anchor])`` imports, the anchor a literal,
    ``__name__`` or ``__package__`` (resolved as importlib resolves it); ``None`` for a name built at run time (no
    edge) or any other call."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called != "import_module" or not node.args or not isinstance(node.args[0], ast.Constant) \
            or not isinstance(node.args[0].value, str):
        return None
    name = node.args[0].value
    level = len(name) - len(name.lstrip("."))
    if not level:
        return name
    anchor = node.args[1] if len(node.args) > 1 else None
    own_package = importer if is_package else importer.rpartition(".")[0]
    anchors = {"__name__": importer, "__package__": own_package}
    if isinstance(anchor, ast.Constant) and isinstance(anchor.value, str):
        anchor = anchor.value
    elif isinstance(anchor, ast.Name) and anchor.id in anchors:
        anchor = anchors[anchor.id]
    else:
        return None
    base = anchor.rsplit(".", level - 1)[0] if level > 1 else anchor
    return f"{base}.{name[level:]}" if name[level:] else base


def imported_names(tree: ast.AST, importer: str, is_package: bool) -> list[tuple[str, int, list[str]]]:
    """``[(absolute module, line, [names imported from it]), ...]`` for every import in ``tree``, at any depth.
    ``import a.b`` gives ``("a.b", line, [])``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _base(importer, is_package, node.module, node.level)
            found.append((base, node.lineno, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Call) and (literal := _literal_import_module(node, importer, is_package)):
            found.append((literal, node.lineno, []))
    return found


def _targets(base: str, names: list[str], modules, importer: str) -> list[str]:
    """The package modules one import runs: each ``base.name`` that is a module (else ``base``), and every
    package above them that is not an ancestor of ``importer``."""
    hit = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules]
    if len(hit) < len(names) or not names:
        hit.append(base)
    out = []
    for target in hit:
        parts = target.split(".")
        for depth in range(1, len(parts) + 1):
            name = ".".join(parts[:depth])
            ancestor = importer == name or importer.startswith(name + ".")
            if name in modules and (depth == len(parts) or not ancestor) and name not in out:
                out.append(name)
    return out


def import_graph(top: str, package: str = PACKAGE):
    """``(edges, external)`` of the package under ``top``: ``edges[a][b] = "path:line"`` where module ``a``
    imports package module ``b``; ``external[a] = [(absolute name, "path:line"), ...]`` for imports from outside
    the package (e.g. ``torch.distributed``).

    Raises:
        SyntaxError: a module of the package is not Python.
    """
    modules = package_modules(top, package)
    edges, external = {m: {} for m in modules}, {m: [] for m in modules}
    for importer, path in sorted(modules.items()):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        where_prefix = os.path.relpath(path, top)
        is_package = path.endswith("__init__.py")
        for base, line, names in imported_names(tree, importer, is_package):
            where = f"{where_prefix}:{line}"
            if base != package and not base.startswith(package + "."):
                external[importer] += [(f"{base}.{n}" if n != "*" else base, where) for n in names] or [(base, where)]
                continue
            for target in _targets(base, names, modules, importer):
                if target != importer or not is_package:
                    edges[importer].setdefault(target, where)
    return edges, external


def strongly_connected(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``edges`` (iterative, so a deep chain does not reach the
    recursion limit), each sorted; only the circles: components of two or more modules, or one that imports
    itself."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root), on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while not component or component[-1] != node:
                        component.append(stack.pop()), on_stack.discard(component[-1])
                    found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child), on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(c for c in found if len(c) > 1 or c[0] in edges[c[0]])


def _path(edges, start: str, goals: set[str], inside: set[str]) -> list[str]:
    """The shortest import path from ``start`` to the nearest of ``goals``, through ``inside`` only."""
    before, queue = {start: None}, deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node]):
            if child in inside and child not in before:
                before[child] = node
                if child in goals:
                    path = [child]
                    while path[-1] != start:
                        path.append(before[path[-1]])
                    return path[::-1]
                queue.append(child)
    raise AssertionError(f"{sorted(goals)} cannot be reached from {start}: not one component")


def name_circle(edges, component: list[str]) -> str:
    """One closed walk ``a -> b -> ... -> a`` through every module of ``component``, then each import it
    follows, one a line, with its ``file:line``."""
    inside, walk = set(component), [component[0]]
    left = inside - {component[0]}
    while left:
        walk += _path(edges, walk[-1], left, inside)[1:]
        left -= set(walk)
    selfloop = len(component) == 1
    walk += [walk[0]] if selfloop else _path(edges, walk[-1], {component[0]}, inside)[1:]
    steps = dict.fromkeys(zip(walk, walk[1:]))
    return " -> ".join(walk) + "".join(f"\n    {a} -> {b} at {edges[a][b]}" for a, b in steps)


def circles(edges: dict[str, dict[str, str]]) -> list[str]:
    """Every import circle of the graph ``edges`` (:func:`import_graph`), named by :func:`name_circle`."""
    return [name_circle(edges, c) for c in strongly_connected(edges)]


def layer_of(module: str, package: str = PACKAGE) -> tuple[str, int | None]:
    """``(layer name, rank in LAYERS)`` of ``module``: its first name under the package (``""``: the package's
    ``__init__``); the rank is ``None`` for a name :data:`LAYERS` does not place."""
    name = module[len(package) + 1:].split(".")[0] if module != package else ""
    return name or "__init__", LAYERS.get(name)


def layer_breaches(edges, external, package: str = PACKAGE) -> list[str]:
    """``["a (layer r) imports b (layer r') at file:line", ...]`` for each import that points up the layers, each
    module in no layer, and each import of ``torch.distributed`` from the pure-Python ``schedule`` layer."""
    found = [f"{a} is in no layer: place {layer_of(a, package)[0]!r} in LAYERS" for a in sorted(edges)
             if layer_of(a, package)[1] is None]
    for a in sorted(edges):
        (name_a, rank_a), targets = layer_of(a, package), edges[a]
        for b, where in sorted(targets.items()):
            name_b, rank_b = layer_of(b, package)
            deeper = any(c.startswith(b + ".") and w == where for c, w in targets.items())  # named once, deepest
            if None not in (rank_a, rank_b) and rank_b > rank_a and not deeper:
                found.append(f"{a} ({name_a}, layer {rank_a}) imports {b} ({name_b}, layer {rank_b}) at {where}")
    found += [f"{a} (schedule, pure Python) imports {name} at {where}" for a in sorted(external)
              if layer_of(a, package)[0] == "schedule" for name, where in external[a]
              if name == "torch.distributed" or name.startswith("torch.distributed.")]
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT)


def test_no_import_circle(graph):
    found = circles(graph[0])
    if found:
        pytest.fail(f"{len(found)} import circle(s) in {PACKAGE}/:\n" + "\n".join(found), pytrace=False)


def test_imports_point_down_the_layers(graph):
    found = layer_breaches(*graph)
    if found:
        pytest.fail("imports against the layers:\n" + "\n".join(found), pytrace=False)


def test_the_graph_holds_the_imports_that_run_later():
    """Lazy imports are in the graph, and the package's own split entry point reaches the splitter."""
    edges, external = import_graph(ROOT)
    assert f"{PACKAGE}.train.hf" in edges[PACKAGE]  # ``__getattr__``'s function-level import
    assert f"{PACKAGE}.models.generic" in edges[f"{PACKAGE}.models.family"]
    assert any(name.startswith("torch.distributed") for m in external if m.startswith(f"{PACKAGE}.runtime")
               for name, _ in external[m])


def _write(top, files: dict[str, str]) -> str:
    """A fake package under ``top``: ``{relative path: source}``; returns ``top`` as a string."""
    for path, text in files.items():
        target = top / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return str(top)


FAKE = {  # a fake mpipe_hf: every kind of import, and no circle
    "mpipe_hf/__init__.py": "def __getattr__(name):\n    from .train import hf\n    return getattr(hf, name)\n",
    "mpipe_hf/schedule/__init__.py": "from .actions import Action\n",
    "mpipe_hf/schedule/actions.py": "import torch\nAction = tuple\n",
    "mpipe_hf/runtime/__init__.py": "",
    "mpipe_hf/runtime/p2p.py": "import torch.distributed as dist\nfrom ..schedule import actions\n",
    "mpipe_hf/models/__init__.py": "import importlib\n\n\ndef __getattr__(name):\n"
                                   "    return importlib.import_module('.' + name, __name__)\n",
    "mpipe_hf/models/family.py": "from . import generic\nfrom .generic import split_family\n",
    "mpipe_hf/models/generic.py": "from mpipe_hf.runtime.p2p import dist\nfrom .image_features import Front\n",
    "mpipe_hf/models/image_features.py": "Front = object\n",
    "mpipe_hf/data/__init__.py": "import importlib\n\nimportlib.import_module('.video', __name__)\n",
    "mpipe_hf/data/video.py": "def load():\n    import importlib\n"
                              "    return importlib.import_module('.image_ops', 'mpipe_hf.data')\n",
    "mpipe_hf/data/image_ops.py": "",
    "mpipe_hf/train/__init__.py": "",
    "mpipe_hf/train/hf.py": "from mpipe_hf.models import family\nfrom ..data.video import load\n",
}


def test_the_graph_reads_each_kind_of_import(tmp_path):
    edges, external = import_graph(_write(tmp_path, FAKE))
    p = PACKAGE
    assert edges[p] == {f"{p}.train.hf": "mpipe_hf/__init__.py:2", f"{p}.train": "mpipe_hf/__init__.py:2"}
    assert set(edges[f"{p}.train.hf"]) == {f"{p}.models", f"{p}.models.family", f"{p}.data", f"{p}.data.video"}
    assert set(edges[f"{p}.models.family"]) == {f"{p}.models.generic"}  # its own package is no edge
    assert set(edges[f"{p}.models.generic"]) == {f"{p}.runtime", f"{p}.runtime.p2p", f"{p}.models.image_features"}
    assert set(edges[f"{p}.schedule"]) == {f"{p}.schedule.actions"}
    assert edges[f"{p}.models"] == {}  # a name built at run time is no edge
    assert set(edges[f"{p}.data.video"]) == {f"{p}.data.image_ops"}  # a literal one is, inside a function too
    assert set(edges[f"{p}.data"]) == {f"{p}.data.video"}  # relative to the package's own __name__
    assert external[f"{p}.runtime.p2p"] == [("torch.distributed", "mpipe_hf/runtime/p2p.py:1")]
    assert circles(edges) == [] and layer_breaches(edges, external) == []


@pytest.mark.parametrize("module, line, circle", [
    ("mpipe_hf/models/image_features.py", "from .family import Family\n",  # a circle of three
     "mpipe_hf.models.family -> mpipe_hf.models.generic -> mpipe_hf.models.image_features -> mpipe_hf.models.family"),
    ("mpipe_hf/data/image_ops.py", "def f():\n    from .video import load\n",  # closed by a lazy import
     "mpipe_hf.data.image_ops -> mpipe_hf.data.video -> mpipe_hf.data.image_ops"),
    ("mpipe_hf/schedule/actions.py", "from . import Action\n",  # through a package's __init__
     "mpipe_hf.schedule -> mpipe_hf.schedule.actions -> mpipe_hf.schedule"),
    ("mpipe_hf/runtime/p2p.py", "import mpipe_hf.runtime.p2p\n", "mpipe_hf.runtime.p2p -> mpipe_hf.runtime.p2p"),
])
def test_an_added_circle_is_found_and_named(tmp_path, module, line, circle):
    files = dict(FAKE, **{module: FAKE[module] + line})
    found = circles(import_graph(_write(tmp_path, files))[0])
    assert len(found) == 1 and found[0].split("\n")[0] == circle, found
    assert f"at {module}:" in found[0]


@pytest.mark.parametrize("module, line, breach", [
    ("mpipe_hf/runtime/p2p.py", "from ..models import generic\n",
     "mpipe_hf.runtime.p2p (runtime, layer 1) imports mpipe_hf.models.generic (models, layer 2) at "
     "mpipe_hf/runtime/p2p.py:3"),
    ("mpipe_hf/data/image_ops.py", "def f():\n    from mpipe_hf.train import hf\n",
     "mpipe_hf.data.image_ops (data, layer 2) imports mpipe_hf.train.hf (train, layer 3) at "
     "mpipe_hf/data/image_ops.py:2"),
    ("mpipe_hf/schedule/actions.py", "from torch.distributed import ProcessGroup\n",
     "mpipe_hf.schedule.actions (schedule, pure Python) imports torch.distributed.ProcessGroup at "
     "mpipe_hf/schedule/actions.py:3"),
    ("mpipe_hf/helpers/__init__.py", "", "mpipe_hf.helpers is in no layer: place 'helpers' in LAYERS"),
])
def test_an_import_up_the_layers_is_found(tmp_path, module, line, breach):
    files = dict(FAKE, **{module: FAKE.get(module, "") + line})
    edges, external = import_graph(_write(tmp_path, files))
    assert layer_breaches(edges, external) == [breach]
