"""The run's record: ``output_dir/metrics.jsonl`` and the experiment trackers, written by rank 0.

Trackers go through Accelerate's tracker API (``accelerate.tracking``: TensorBoard, Weights & Biases, MLflow,
...), as ``Accelerator(log_with=...).init_trackers`` builds them, without an ``Accelerator``: the pipeline owns
the processes and the devices. Per-rank figures (lists in a row) are logged as one scalar per rank,
``bubble_per_rank/rank2``.
"""

from __future__ import annotations

import json
import os

TRACKER_DIR = "runs"


def available_trackers(report_to: list[str]) -> None:
    """Check that every tracker of ``report_to`` is installed.

    Raises:
        ValueError: naming ``train.report_to``, the missing trackers and the package to install.
    """
    from accelerate.tracking import filter_trackers
    if not report_to:
        return
    import logging
    quiet = logging.getLogger("accelerate.tracking")
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        found = {str(t) for t in filter_trackers(list(report_to), logging_dir=".")}
    finally:
        quiet.level = level
    missing = [t for t in report_to if t not in found]
    if missing:
        raise ValueError(f"train.report_to names {missing}, which are not installed here (pip install "
                         f"{' '.join(missing)})")


def scalars(row: dict) -> dict:
    """A metrics row as tracker values: numbers stay, a per-rank list becomes ``{key}/rank{r}`` scalars, other
    values (an error's text) are left out."""
    out = {}
    for key, value in row.items():
        if key == "step":
            continue
        if isinstance(value, bool):
            out[key] = int(value)
        elif isinstance(value, (int, float)):
            out[key] = value
        elif isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
            out.update({f"{key}/rank{r}": v for r, v in enumerate(value)})
    return out


class MetricsLog:
    """``metrics.jsonl`` (one JSON row per logged step) and the trackers of ``report_to``, on rank 0 only.

    Args:
        output_dir: the run's directory; trackers write under ``output_dir/runs``.
        report_to: tracker names (``accelerate.tracking.LOGGER_TYPE_TO_CLASS`` keys).
        resumed_at: the step a resumed run continues from: the rows the interrupted run wrote after that step
            are dropped (the resumed run writes them again), the others kept and appended to; ``None``: a fresh
            file.
        config: hyperparameters the trackers store at the start (flat ``{name: bool | int | float | str}``).
        enabled: ``False`` on every rank but 0: every method does nothing.
    """

    def __init__(self, output_dir: str, report_to: list[str], resumed_at: int | None, config: dict,
                 enabled: bool = True):
        self.enabled, self.history, self.trackers = enabled, [], []
        if not enabled:
            return
        self.path = os.path.join(output_dir, "metrics.jsonl")
        if resumed_at is not None and os.path.isfile(self.path):
            with open(self.path) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            self.history = [r for r in rows if r.get("step", 0) <= resumed_at]
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.history)
            os.replace(tmp, self.path)
        self.file = open(self.path, "a" if resumed_at is not None else "w")
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS
        if report_to:
            from accelerate import PartialState
            PartialState()  # the trackers' logging asks for it; it joins the process group already there
        name, logging_dir = os.path.basename(os.path.abspath(output_dir)), os.path.join(output_dir, TRACKER_DIR)
        for kind in report_to:
            cls = LOGGER_TYPE_TO_CLASS[kind]
            tracker = cls(name, logging_dir) if cls.requires_logging_directory else cls(name)
            tracker.start()
            tracker.store_init_configuration(config)
            self.trackers.append(tracker)

    def log(self, row: dict) -> None:
        """Append ``row`` (with its ``step``, 1-based) to the file and the history, and send it to the
        trackers."""
        if not self.enabled:
            return
        self.history.append(row)
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        values = scalars(row)
        for tracker in self.trackers:
            tracker.log(values, step=row["step"])

    def close(self) -> None:
        """Close the file and finish every tracker."""
        if not self.enabled:
            return
        self.file.close()
        for tracker in self.trackers:
            tracker.finish()
