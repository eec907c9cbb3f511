"""The bad-row case of the numerics worker (a row that fails mid-run costs that row, not the step).

The case's micro-batches are read from conversation rows by a :class:`~mpipe_hf.data.MicroBatchPlan` with the
model's own collator, on each micro-batch's owner. Two rows name a PNG truncated after its header (it opens, its
pixels do not decode): in the first schedule run the bad row is one of a three-row micro-batch (the owner drops it
and collates the other two), in the second it is a micro-batch's only row (a null micro-batch stands in). The
reference trains one process on the same micro-batches without those rows.
"""

from __future__ import annotations

import io
import os

from common import VOCAB_RANKS, caption_row, collator, photo
from mpipe_hf.data import MicroBatchPlan, qwen2_tokenizer
from mpipe_hf.train.loop import Skips

SOURCE = "rows.jsonl"
GOOD = 13  # rows 0 .. 12 are good; 13 and 14 name the truncated PNG
BAD = (13, 14)
# each schedule run's micro-batches (M = 4) as row indices: run 0 drops one row of three in micro 2 (owner rank 2
# at R = 4), run 1's micro 3 (owner rank 3) is one bad row alone
RUNS = [[[0, 1], [2, 3], [4, 13, 5], [6, 7]], [[8, 9], [10, 11], [12, 0], [14]]]


def truncated_png(path: str) -> None:
    """A real photo's PNG cut after half its bytes: ``PIL.Image.open`` reads the header, decoding fails."""
    buffer = io.BytesIO()
    photo("astronaut", 84).save(buffer, format="PNG")
    data = buffer.getvalue()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])


class RowCase:
    """The rows, the plan that loads them on their owners and the reference's micro-batches.

    Args:
        config: the model's HF config (its processor collates the rows).
        directory: where this rank writes the truncated PNG.
        rank: this process's pipeline rank (each writes its own copy).
        num_micro: the schedule's ``M`` (4).
        validate: the split model's ``validate_micro``.
    """

    def __init__(self, config, directory: str, rank: int, num_micro: int, validate):
        if num_micro != len(RUNS[0]):
            raise ValueError(f"the bad-row case has {len(RUNS[0])} micro-batches per run, got num_micro {num_micro}")
        bad_png = os.path.join(directory, f"truncated-rank{rank}.png")
        truncated_png(bad_png)
        rows = [caption_row(i % 8, 56 + 28 * (i % 3), i % 3 != 2, i % 3) for i in range(GOOD)]
        rows += [dict(caption_row(i, 56, True, 0), images=[bad_png]) for i in range(len(BAD))]
        for line, row in enumerate(rows, 1):
            row["where"] = f"{SOURCE}:{line}"  # a row ready for the collator, as a dataset's rows are
        self.plan = MicroBatchPlan(rows, collator(config, qwen2_tokenizer(VOCAB_RANKS)), num_micro, 2, validate)
        self.dropped: list[list[str]] = []  # what this rank dropped in each schedule run
        self.skips = Skips()  # the run's distinct failed rows, which every rank learns after each run
        self.failed: list[list[int]] = []  # the rows this rank's plan knows to fail after each run

    def remember(self, executor, count: int) -> None:
        """After a schedule run whose vote counted ``count`` dropped rows: every rank learns which rows failed on
        any rank (:meth:`~mpipe_hf.train.loop.Skips.distinct`, a gather over the vote's group) and its plan
        leaves them out from now on; records what the plan knows."""
        self.skips.distinct(count, executor, self.plan)
        self.failed.append(sorted(self.plan.failed))

    def load(self, run: int, micro: int):
        """Micro ``micro`` of schedule run ``run``, as its owner loads it."""
        return self.plan.load_rows(RUNS[run][micro])

    def take(self) -> list[str]:
        """The executor's ``bad_rows``: the rows this rank dropped since the last call (recorded per run)."""
        taken = self.plan.take_dropped()
        self.dropped.append(taken)
        return taken

    def reference(self, run: int) -> list[dict]:
        """Run ``run``'s micro-batches without the bad rows (a micro-batch left empty is left out)."""
        micros = [[i for i in rows if i not in BAD] for rows in RUNS[run]]
        return [self.plan.collate([self.plan.dataset[i] for i in rows]) for rows in micros if rows]
