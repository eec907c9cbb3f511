"""Every script that README.md, BENCHMARKS.md or docs/ cite starts: ``--help`` prints its usage and exits 0, with
no traceback and no file written (a script that took ``--help`` for an output folder would write one). One Python
process runs every script's ``--help`` (a process start costs seconds of CPU; CI's time is counted); a script
without a ``__main__`` block (a module the benchmarks import) must import. The runs with tiny arguments are in the
full suite (``tests/test_scripts_smoke.py``)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]

# Run in one child process, in an empty working directory: each script's --help as __main__ (argparse exits 0),
# or its import when it has no __main__ block; prints one line per script, "ok NAME" or "FAIL NAME: why".
DRIVER = r"""
import contextlib, io, runpy, sys, traceback
for path in sys.argv[1:]:
    name, text = path.rsplit("/", 1)[-1], open(path).read()
    main = "__name__ == \"__main__\"" in text
    out, code = io.StringIO(), None
    sys.argv = [path, "--help"]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__" if main else "imported")
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        print(f"FAIL {name}: " + traceback.format_exc().replace("\n", " | "), flush=True)
        continue
    if main and (code not in (0, None) or not out.getvalue().strip()):
        print(f"FAIL {name}: exit {code!r}, printed {out.getvalue()[:200]!r}", flush=True)
    elif main and code is None:
        print(f"FAIL {name}: --help ran the script instead of printing its usage", flush=True)
    else:
        print(f"ok {name}", flush=True)
"""


def cited_scripts() -> list[Path]:
    """The scripts the docs name (``scripts/FOLDER/NAME.py``), sorted; fails on a cited script that does not exist
    (a path from before the scripts were grouped by purpose, ``scripts/NAME.py``, is one)."""
    names = set()
    for doc in DOCS:
        names.update(re.findall(r"scripts/((?:[a-z]+/)?[A-Za-z0-9_]+\.py)", doc.read_text()))
    missing = sorted(n for n in names if not (ROOT / "scripts" / n).is_file())
    assert not missing, f"the docs cite scripts that do not exist: {missing}"
    return sorted(ROOT / "scripts" / n for n in names)


def run_help(scripts: list[Path], cwd: Path) -> dict[str, str]:
    """``{script name: "ok" or the failure}`` of the driver over ``scripts``, run in ``cwd``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", DRIVER, *map(str, scripts)], capture_output=True, text=True,
                         cwd=cwd, timeout=600, env=env)
    lines = [line for line in run.stdout.splitlines() if line.startswith(("ok ", "FAIL "))]
    got = {line.split(" ", 1)[1].split(":", 1)[0]: ("ok" if line.startswith("ok ") else line) for line in lines}
    assert run.returncode == 0 and len(got) == len(scripts), (run.stdout[-3000:], run.stderr[-3000:])
    return got


def test_every_cited_script_starts(tmp_path):
    """Each cited script's ``--help`` exits 0 with its usage, writes nothing; a negative control in the same
    process: a script that takes ``--help`` for its output folder and one that fails at import are caught."""
    scripts = cited_scripts()
    assert len(scripts) >= 25, scripts  # the docs cite about 30; a broken pattern would find none
    bad_dir, crash = tmp_path / "controls" / "writes_help_dir.py", tmp_path / "controls" / "crashes.py"
    bad_dir.parent.mkdir()
    bad_dir.write_text("import os, sys\nif __name__ == \"__main__\":\n    os.makedirs(sys.argv[1] + '.control')\n")
    crash.write_text("import no_such_module_here\nif __name__ == \"__main__\":\n    pass\n")
    work = tmp_path / "cwd"
    work.mkdir()
    got = run_help([*scripts, bad_dir, crash], work)
    assert got.pop("writes_help_dir.py").startswith("FAIL") and got.pop("crashes.py").startswith("FAIL")
    assert all(v == "ok" for v in got.values()), [v for v in got.values() if v != "ok"]
    written = sorted(p.name for p in work.iterdir())
    assert written == ["--help.control"], written  # the control's folder, nothing from the cited scripts


def test_every_cited_script_has_a_smoke_run_or_a_reason():
    """Each cited script is run with tiny arguments in the full suite (``tests/test_scripts_smoke.py``'s
    ``SMOKE``) or named in its ``RUN_ELSEWHERE`` (the test that runs it, or why none can here); neither table
    names a script the docs do not cite."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_scripts_smoke import RUN_ELSEWHERE, SMOKE
    cited = {p.relative_to(ROOT / "scripts").as_posix() for p in cited_scripts()}
    assert not set(SMOKE) & set(RUN_ELSEWHERE), set(SMOKE) & set(RUN_ELSEWHERE)
    assert cited == set(SMOKE) | set(RUN_ELSEWHERE), (cited - set(SMOKE) - set(RUN_ELSEWHERE),
                                                      (set(SMOKE) | set(RUN_ELSEWHERE)) - cited)


def index_problems(index: str, folders: dict[str, set[str]]) -> list[str]:
    """What ``scripts/README.md``'s text ``index`` gets wrong about ``folders`` (``{folder: its file names}``): a
    folder without its line or section, a file its section does not list, a listed file that is not there."""
    problems = [f"no line for {name}/" for name in folders if f"- `{name}/`:" not in index]
    sections = dict(re.findall(r"^## (\w+)/\n(.*?)(?=^## |\Z)", index, re.M | re.S))
    for name, files in sorted(folders.items()):
        if name not in sections:
            problems.append(f"no section for {name}/")
            continue
        listed = set(re.findall(r"^- `([\w.]+)`", sections[name], re.M))
        listed |= set(re.findall(r"\(\+ `([\w.]+)/?`", sections[name]))
        problems += [f"{name}/{f} is not listed" for f in sorted(files - listed)]
        problems += [f"{name}/{f} is listed but not there" for f in sorted(listed - files)]
    return problems


def test_the_scripts_index_lists_every_script():
    """``scripts/README.md`` has one line per folder and per file of each (a module the scripts import included);
    negative controls: the index with a line dropped, and a folder holding a file the index does not list."""
    index = (ROOT / "scripts" / "README.md").read_text()
    folders = {d.name: {p.name for p in d.iterdir() if p.name != "__pycache__"}
               for d in sorted((ROOT / "scripts").iterdir()) if d.is_dir() and d.name != "__pycache__"}
    assert set(folders) >= {"bench", "make", "check", "report"}, folders
    assert index_problems(index, folders) == []
    dropped = index.replace("- `bench_lora.py`:", "- bench_lora:")
    assert index_problems(dropped, folders) == ["bench/bench_lora.py is not listed"]
    extra = {**folders, "make": folders["make"] | {"make_new_thing.py"}}
    assert index_problems(index, extra) == ["make/make_new_thing.py is not listed"]
