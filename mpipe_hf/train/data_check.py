"""``mpipe-hf check-data RECIPE``: every row of a recipe's data (``data.path`` or ``data.sources``, and
``data.eval_path``) read on this machine, in parallel, before anything is launched, with every bad row listed in
one pass, the counts, and optionally the clean row list a run can train on (``data.clean_rows``). Each kept row
then goes through what loading runs on a micro-batch (the collator and the model's own check, its image-token
count: :func:`load_check`), so a row that training would drop is listed here too. ``mpipe-hf train`` runs the
first check (images read to their headers only) before it launches the processes, which then read its cache.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from ..data.budgets import CAPS, RowCaps
from ..data.conversation import LEFT_OUT, ConversationDataset, Source, column, left_out_counts, read_source
from ..data.owner import MicroBatchPlan
from .recipe import Recipe
from .sources import load_config, load_data, load_processor, micro_validator, row_collator

STATUSES = ("ok", "cut", "dropped", "bad")


@dataclass
class SourceReport:
    """One source's check: ``counts`` per status (:data:`STATUSES`), the ``bad`` rows ``[(where, reason)]``, the
    rows ``dropped`` for ``max_length`` or ``max_visual_tokens`` ``[(where, reason)]``, per kept row ``images``,
    ``tokens``, ``image_tokens`` and ``video_tokens``, the rows ``over`` each visual cap (cap name -> their
    ``where``, kept or dropped: :data:`~mpipe_hf.data.budgets.CAPS`), and the kept row indices with the raw rows'
    fingerprint (for the clean row list); ``load_bad``: the rows of ``bad`` that passed the row check but failed as
    loaded (:func:`load_check`; ``None``: not run)."""

    path: str
    layout: str
    counts: dict[str, int]
    bad: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    images: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    keep: list[int] = field(default_factory=list)
    image_tokens: list[int] = field(default_factory=list)
    video_tokens: list[int] = field(default_factory=list)
    over: dict[str, list[str]] = field(default_factory=dict)
    fingerprint: str = ""
    load_bad: int | None = None


def _spread(values: list[int]) -> str:
    if not values:
        return "-"
    return f"min {min(values)}, median {statistics.median(values):g}, max {max(values)}"


def check_source(source: Source, processor, recipe: Recipe, config, decode: bool, num_proc: int | None,
                 validate=False) -> SourceReport:
    """Every row of ``source`` checked (:func:`~mpipe_hf.data.conversation.read_source`; ``decode``: every image
    decoded in full) and summed up; unless ``validate`` is ``False``, each kept row then as loaded
    (:func:`load_check`, ``validate``: the model's micro-batch check or ``None``)."""
    done = read_source(source, processor, recipe.data.row_length, config.model_type, decode=decode,
                       num_proc=num_proc, caps=recipe.data.caps)
    names = ("where", "status", "error", "num_images", "num_tokens", "image_tokens", "video_tokens", "visual")
    table = {name: column(done.rows, name) for name in names}
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
            for key, name in (("images", "num_images"), ("tokens", "num_tokens"), ("image_tokens", "image_tokens"),
                              ("video_tokens", "video_tokens")):
                getattr(report, key).append(table[name][i])
        for cap in json.loads(table["visual"][i]).get("over", []) if table["visual"][i] else []:
            report.over.setdefault(cap, []).append(table["where"][i])
    if validate is not False:
        load_check(report, done.rows, status, row_collator(done.layout, processor, recipe.data, config), validate)
    return report


def load_check(report: SourceReport, rows, status: list[str], collate, validate) -> None:
    """Each kept row of ``report`` through what loading runs on a micro-batch, that row alone: its images
    decoded and processed by ``collate``, then ``validate`` (the model's check, ``SplitModel.validate_micro``, e.g.
    the family's image-token count; ``None``: none), by the loader's own function
    (:meth:`~mpipe_hf.data.owner.MicroBatchPlan.load_rows`). A row that fails moves from ``keep`` to ``bad`` with
    the reason, and is counted in ``load_bad``. ``rows``: the source's checked rows; ``status``: their statuses."""
    report.load_bad = 0
    if not report.keep:
        return
    kept = ConversationDataset(report.path, rows.select(report.keep), [], layout="text" if report.layout == "text"
                               else "messages")
    plan = MicroBatchPlan(kept, collate, 1, 1, validate, drop_bad_rows=False)
    failed = []
    for j in tqdm(range(len(kept)), desc=f"loading {os.path.basename(str(report.path))}", leave=False):
        try:
            plan.load_rows([j])
        except ValueError as err:
            cause = err.__cause__ or err
            why = str(cause) if isinstance(cause, ValueError) else f"{type(cause).__name__}: {cause}"
            where = kept.where(j)
            failed.append(j)
            report.bad.append((where, f"as loaded: {why.removeprefix(f'{where}: ')}"))
    for j in failed:
        report.counts[status[report.keep[j]]] -= 1
    report.counts["bad"] += len(failed)
    report.load_bad = len(failed)
    gone = set(failed)
    for key in ("keep", "images", "tokens", "image_tokens", "video_tokens"):
        setattr(report, key, [v for j, v in enumerate(getattr(report, key)) if j not in gone])


def check_data(recipe: Recipe, decode: bool = True, num_proc: int | None = None) -> list[SourceReport]:
    """Every source of ``recipe.data`` and its ``eval_path`` checked on this process (``num_proc``: the
    processes ``datasets.map`` uses; ``None``: ``data.num_proc``, else up to 8). With ``decode``, each kept row is
    also loaded as training loads it (:func:`load_check`), the model's micro-batch check built from the config on
    the meta device (:func:`~.sources.micro_validator`); without, that step is skipped (it decodes the images).

    Raises:
        ValueError: a source that cannot be read; a model type with no family.
    """
    config = load_config(recipe.model)
    processor = load_processor(recipe, config)
    validate = micro_validator(config) if decode else False
    sources = list(recipe.data.all_sources)  # DataSource has Source's fields
    if recipe.data.eval_path is not None:
        sources.append(Source(recipe.data.eval_path))
    return [check_source(s, processor, recipe, config, decode, num_proc or recipe.data.num_proc, validate)
            for s in sources]


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


def format_report(reports: list[SourceReport], max_length: int, caps: RowCaps | None = None) -> str:
    """The check as text: every bad row (``where: reason``), then per source the counts, and for rows with images
    or videos their visual tokens (:func:`visual_lines`) and the rows over each cap set in ``caps``."""
    lines = []
    for r in reports:
        lines += [f"{where}: {why}" for where, why in r.bad]
    for r in reports:
        n = sum(r.counts.values())
        loaded = ("not loaded as training loads them (--headers-only)" if r.load_bad is None
                  else f"{r.load_bad} of the bad rows passed the row check and failed only when collated as training collates "
                     "them (the processor, the model's token-count check)")
        over = left_out_counts(dict(r.dropped))
        lines.append(f"{r.path} ({r.layout}): {n} rows; {r.counts['bad']} bad, {over.get(LEFT_OUT[0], 0)} dropped "
                     f"over max_length={max_length}, {over.get(LEFT_OUT[1], 0)} dropped over max_visual_tokens, "
                     f"{r.counts['cut']} cut at max_length, "
                     f"{len(r.keep)} kept; images per row: {_spread(r.images)}; tokens per row: {_spread(r.tokens)}; "
                     f"{loaded}")
        lines += [f"  dropped {where}: {why}" for where, why in r.dropped]
        lines += visual_lines(r, caps)
    return "\n".join(lines)


CAP_EFFECT = {"max_pixels": "resized down by the image processor", "video_max_pixels": "frames resized down",
              "max_frames": "sampled down", "max_visual_tokens": "resized or sampled down, or dropped"}


def histogram(columns: dict[str, list[int]], bins: int = 8, width: int = 30) -> list[str]:
    """A text histogram of per-row counts: one line per range of values (``0``, then ``bins`` equal ranges up to
    the largest), a count per column of ``columns`` (name -> values per row) in each, and a bar for the last."""
    top = max((max(v) for v in columns.values() if v), default=0)
    step = max(1, -(-top // bins))
    edges = [(0, 0)] + [(lo, min(lo + step - 1, top)) for lo in range(1, top + 1, step)]
    counts = {name: [sum(lo <= x <= hi for x in values) for lo, hi in edges] for name, values in columns.items()}
    last = list(counts.values())[-1]
    scale = width / max(1, max(last))
    lines = [f"    {'tokens':>11} " + " ".join(f"{name:>7}" for name in columns) + f"  (rows; bars: {list(columns)[-1]})"]
    for k, (lo, hi) in enumerate(edges):
        label = f"{lo}" if lo == hi else f"{lo}-{hi}"
        lines.append((f"    {label:>11} " + " ".join(f"{counts[n][k]:>7}" for n in columns) + " "
                      + "#" * round(last[k] * scale)).rstrip())
    return lines


def visual_lines(report: SourceReport, caps: RowCaps | None, shown: int = 5) -> list[str]:
    """The visual-token figures of a source with images or videos: image, video and total tokens per kept row
    (min, median, max, and :func:`histogram`), then per cap set in ``caps`` the rows over it (count, what capping
    did, the first ``shown``)."""
    total = [i + v for i, v in zip(report.image_tokens, report.video_tokens)]
    if not any(total) and not report.over:
        return []
    lines = [f"  visual tokens per row: images {_spread(report.image_tokens)}; videos {_spread(report.video_tokens)}; "
             f"total {_spread(total)}"]
    lines += histogram({"images": report.image_tokens, "videos": report.video_tokens, "total": total})
    for cap in CAPS:
        value = getattr(caps, cap, None) if caps is not None else None
        if value is None:
            continue
        rows = report.over.get(cap, [])
        more = f", ... ({len(rows) - shown} more)" if len(rows) > shown else ""
        lines.append(f"  over data.{cap}={value}: {len(rows)} row(s)" + (
            f" ({CAP_EFFECT[cap]}): {', '.join(rows[:shown])}{more}" if rows else ""))
    return lines


def balance_line(reports: list[SourceReport], recipe: Recipe, config) -> str:
    """The costliest of the ``parallel.cp_size`` ranks over the mean, per source, its kept rows in file order
    grouped as the recipe's micro-batches (:func:`~.context_parallel_balance.data_balance`, weights from
    ``config``: :func:`~.context_parallel_balance.recipe_weights`): over all micros, and the worst micro."""
    from .context_parallel_balance import data_balance, recipe_weights
    cp, weights = recipe.parallel.cp_size, recipe_weights(recipe, config)
    parts = []
    for r in reports:
        whole, worst = data_balance(r.tokens, r.image_tokens, r.video_tokens, recipe.data, weights, cp)
        parts.append(f"{os.path.basename(str(r.path))} {whole:.3f} (worst micro-batch {worst:.3f})")
    return (f"context parallelism (cp_size {cp}): the costliest rank's work over the mean (tokens, attention by "
            f"heads, the tower's items; rows in file order): " + "; ".join(parts))


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
    print(format_report(reports, recipe.data.row_length, recipe.data.caps), flush=True)
    if recipe.parallel.cp_size > 1:
        print(balance_line(reports, recipe, load_config(recipe.model)), flush=True)
    bad = sum(r.counts["bad"] for r in reports)
    if clean is not None:
        write_clean(clean, reports)
        print(f"wrote the {sum(len(r.keep) for r in reports)} kept rows to {os.path.abspath(clean)}: set "
              f"data.clean_rows: {os.path.abspath(clean)} to train on them", flush=True)
    print(f"{bad} bad row(s)" if bad else "no bad row", flush=True)
    return 1 if bad else 0
