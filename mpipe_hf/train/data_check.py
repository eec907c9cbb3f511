"""``mpipe-hf check-data RECIPE``: every row of a recipe's data read on this machine, in parallel, before anything
is launched, with every bad row listed in one pass, the counts, and optionally the clean row list a run can train
on (``data.clean_rows``). ``mpipe-hf train`` runs the same check (images read to their headers only) before it
launches the processes, which then read its cache.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field

from ..data.conversation import Source, column, read_source
from .recipe import Recipe
from .sources import load_config, load_data, load_processor

STATUSES = ("ok", "cut", "dropped", "bad")


@dataclass
class SourceReport:
    """One source's check: ``counts`` per status (:data:`STATUSES`), the ``bad`` rows ``[(where, reason)]``, the
    rows ``dropped`` for ``max_length`` ``[(where, reason)]``, per kept row ``images`` and ``tokens``, and the kept
    row indices with the raw rows' fingerprint (for the clean row list)."""

    path: str
    layout: str
    counts: dict[str, int]
    bad: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    images: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    keep: list[int] = field(default_factory=list)
    fingerprint: str = ""


def _spread(values: list[int]) -> str:
    if not values:
        return "-"
    return f"min {min(values)}, median {statistics.median(values):g}, max {max(values)}"


def check_source(source: Source, processor, recipe: Recipe, config, decode: bool, num_proc: int | None
                 ) -> SourceReport:
    """Every row of ``source`` checked (:func:`~mpipe_hf.data.conversation.read_source`; ``decode``: every image
    decoded in full) and summed up."""
    done = read_source(source, processor, recipe.data.row_length, config.model_type, decode=decode,
                       num_proc=num_proc)
    table = {name: column(done.rows, name) for name in ("where", "status", "error", "num_images", "num_tokens")}
    status = table["status"]
    report = SourceReport(source.path, done.layout, {s: status.count(s) for s in STATUSES},
                          fingerprint=done.fingerprint)
    for i, s in enumerate(status):
        if s == "bad":
            report.bad.append((table["where"][i], table["error"][i]))
        elif s == "dropped":
            report.dropped.append((table["where"][i], table["error"][i]))
        elif s in ("ok", "cut"):
            report.keep.append(i)
            report.images.append(table["num_images"][i])
            report.tokens.append(table["num_tokens"][i])
    return report


def check_data(recipe: Recipe, decode: bool = True, num_proc: int | None = None) -> list[SourceReport]:
    """Every source of ``recipe.data`` (and its ``eval_path``) checked on this process (``num_proc``: the
    processes ``datasets.map`` uses; ``None``: ``data.num_proc``, else up to 8)."""
    config = load_config(recipe.model)
    processor = load_processor(recipe, config)
    sources = list(recipe.data.all_sources)  # DataSource has Source's fields
    if recipe.data.eval_path is not None:
        sources.append(Source(recipe.data.eval_path))
    return [check_source(s, processor, recipe, config, decode, num_proc or recipe.data.num_proc) for s in sources]


def precheck(recipe: Recipe) -> None:
    """The training start's check, on the launching process before any worker starts: every source read, its
    rows checked (images to their headers) and tokenised into the cache the workers then read
    (:func:`~.sources.load_data`), the warnings printed once.

    Raises:
        ValueError: as :func:`~.sources.load_data` (bad rows past the policy, a source that cannot be read).
    """
    config = load_config(recipe.model)
    processor = load_processor(recipe, config)
    load_data(recipe, config, processor)
    if recipe.data.eval_path is not None:
        load_data(recipe, config, processor, path=recipe.data.eval_path)


def format_report(reports: list[SourceReport], max_length: int) -> str:
    """The check as text: every bad row (``where: reason``), then per source the counts."""
    lines = []
    for r in reports:
        lines += [f"{where}: {why}" for where, why in r.bad]
    for r in reports:
        n = sum(r.counts.values())
        lines.append(f"{r.path} ({r.layout}): {n} rows; {r.counts['bad']} bad, {r.counts['dropped']} dropped for "
                     f"max_length={max_length}, {r.counts['cut']} cut at it, {len(r.keep)} kept; images per row: "
                     f"{_spread(r.images)}; tokens per row: {_spread(r.tokens)}")
        lines += [f"  dropped {where}: {why}" for where, why in r.dropped]
    return "\n".join(lines)


def write_clean(path: str, reports: list[SourceReport]) -> None:
    """The kept rows of every source as the JSON row list ``data.clean_rows`` reads, written atomically:
    ``{"sources": {absolute path: {"rows_fingerprint", "keep": [row indices]}}}``."""
    body = {"sources": {os.path.abspath(r.path): {"rows_fingerprint": r.fingerprint, "keep": r.keep}
                        for r in reports}}
    staging = f"{path}.tmp-{os.getpid()}"
    with open(staging, "w") as f:
        json.dump(body, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(staging, path)


def check_data_main(recipe_path: str, decode: bool, num_proc: int | None, clean: str | None) -> int:
    """``mpipe-hf check-data``: print the report; write the clean row list to ``clean``; the exit status is 1
    when any row is bad, else 0."""
    from .recipe import load_recipe
    recipe = load_recipe(recipe_path)
    reports = check_data(recipe, decode, num_proc)
    print(format_report(reports, recipe.data.row_length), flush=True)
    bad = sum(r.counts["bad"] for r in reports)
    if clean is not None:
        write_clean(clean, reports)
        print(f"wrote the {sum(len(r.keep) for r in reports)} kept rows to {os.path.abspath(clean)}: set "
              f"data.clean_rows: {os.path.abspath(clean)} to train on them", flush=True)
    print(f"{bad} bad row(s)" if bad else "no bad row", flush=True)
    return 1 if bad else 0
