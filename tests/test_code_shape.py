"""The package's size limits, read from the source: no function or method over 60 lines, no file over 400.

A function or file over its limit is one to split by concept: the limits are a sign to find the concept, not a
place to cut. Both checks parse the files with :mod:`ast`, so they import nothing of the package.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mpipe_hf"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400


def long_functions(source: str, where: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``"WHERE:LINE QUALNAME (N lines)"`` for each function or method of ``source`` longer than ``limit`` lines,
    counted from its ``def`` line to its last line (decorators excluded); nested functions are counted on their
    own and inside their parent."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                lines = child.end_lineno - child.lineno + 1
                if lines > limit:
                    found.append(f"{where}:{child.lineno} {name} ({lines} lines)")
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def long_files(paths: list[Path], root: Path, limit: int = MAX_FILE_LINES) -> list[str]:
    """``"PATH (N lines)"`` (``PATH`` relative to ``root``) for each file of ``paths`` longer than ``limit`` lines."""
    counts = {path: len(path.read_text().splitlines()) for path in paths}
    return [f"{path.relative_to(root)} ({n} lines)" for path, n in counts.items() if n > limit]


def package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_function_is_60_lines_or_fewer():
    found = [hit for path in package_files()
             for hit in long_functions(path.read_text(), str(path.relative_to(PACKAGE.parent)))]
    assert not found, "functions over 60 lines (split them by concept):\n" + "\n".join(found)


def test_every_file_is_400_lines_or_fewer():
    found = long_files(package_files(), PACKAGE.parent)
    assert not found, "files over 400 lines (find the concept to move out):\n" + "\n".join(found)


def test_the_checks_catch_a_long_method_a_nested_function_and_a_long_file(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(59))
    source = (f"class A:\n    @property\n    def fits(self):\n{body}\n"  # 60 lines; 61 with its decorator
              f"    def long(self):\n{body}        return 0\n"
              f"def outer():\n    def inner():\n{body}        return 1\n    return inner\n")
    assert long_functions(source, "x.py") == ["x.py:64 A.long (61 lines)", "x.py:125 outer (63 lines)",
                                              "x.py:126 outer.inner (61 lines)"]
    assert long_functions(source, "x.py", limit=63) == []
    short, tall = tmp_path / "short.py", tmp_path / "tall.py"
    short.write_text("x = 1\n" * MAX_FILE_LINES)
    tall.write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    assert long_files([short, tall], tmp_path) == ["tall.py (401 lines)"]


# a comment says the reason a line exists, which a reader can check, not a tracker number they cannot look up
TRACKER_NUMBER = re.compile(r"\b[Ii]ssues?" + r" \d+")
DATED_NAME = re.compile(r"_new$|^more_|_all$")  # a file named by when it came, not by what it holds


def tracker_numbers(paths: list[Path], root: Path) -> list[str]:
    """``"PATH:LINE"`` of each line citing a tracker number."""
    return [f"{path.relative_to(root)}:{i}" for path in paths
            for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if TRACKER_NUMBER.search(line)]


def test_no_tracker_numbers_and_no_dated_names(tmp_path):
    root = PACKAGE.parent
    paths = [p for top in ("mpipe_hf", "docs", "tests", "scripts") for p in (root / top).rglob("*")
             if p.suffix in (".py", ".md") and "__pycache__" not in p.parts]
    assert tracker_numbers(paths, root) == []
    assert [p.name for p in PACKAGE.rglob("*.py") if DATED_NAME.search(p.stem)] == []
    cited = tmp_path / "x.py"  # control: one cited number is found, by line
    cited.write_text("a = 1\n# see issue" + " 38\n")
    assert tracker_numbers([cited], tmp_path) == ["x.py:2"]
    assert DATED_NAME.search("families_new") and DATED_NAME.search("more_families") and DATED_NAME.search("tiny_all")
