"""End to end: bad rows, conversation rows of every form, and the loader's row-by-row recovery."""

import dataclasses
from functools import partial
import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForImageTextToText

from mpipe_hf.data import MicroBatchPlan
from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.train.recipe import TrainSection

from train_common import EPS, LR, conversation_rows, demo_plan, run, train_unsplit, write_recipe


def test_conversations_train_exactly_and_a_bad_row_is_dropped(demo, tmp_path):
    """Conversation rows with 0 to 3 images, several turns, both content forms, through ``mpipe-hf train`` at
    R = 2 (2 rows per micro-batch, padded), two epochs: the losses, the gradient norms and the trained model equal
    one process's. The second step holds an image that cannot be decoded: with ``on_bad_sample: skip`` its row is
    dropped (a warning naming the JSONL line, ``bad_rows`` in the metrics) and the step trains on the rest, as one
    process does without that row; in the second epoch the row is left out without a second try, warning or count.
    A last row too long for ``max_length`` is left out at launch; the closing line counts each reason apart. With
    ``raise`` the run stops with one line naming the rank, the action and the line, the tracebacks in
    ``output_dir/logs``."""
    import shutil
    data = tmp_path / "data"
    data.mkdir()
    names = sorted(os.listdir(os.path.join(demo, "data", "images")))[:6]
    for name in names:
        shutil.copy(os.path.join(demo, "data", "images", name), data / name)
    good = open(data / names[0], "rb").read()
    (data / "truncated.png").write_bytes(good[:len(good) // 2])  # the header reads, the pixels do not
    with open(data / "conv.jsonl", "w") as f:
        for row in conversation_rows(names):
            f.write(json.dumps(row) + "\n")
        too_long = [{"role": "user", "content": "word " * 2100 + "<image>"}, {"role": "assistant", "content": "No."}]
        f.write(json.dumps({"messages": too_long, "images": [names[0]]}) + "\n")  # over max_length at launch
    keys = dict(path=str(data / "conv.jsonl"), shuffle=False, micro_batch_size=2, num_micro=2, vpp=1,
                max_steps=6)
    out = str(tmp_path / "skip")
    proc = run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train",
                write_recipe(demo, tmp_path / "skip.yaml", out, **keys)])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6] and not any(r.get("skipped") for r in rows), rows
    assert [r["bad_rows"] for r in rows] == [0, 1, 0, 0, 0, 0] and rows[-1]["bad_rows_total"] == 1, rows
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("mpipe_hf: warning: dropped")]
    assert len(warnings) == 1 and "conv.jsonl:6 (cannot decode image" in warnings[0], proc.stdout[-3000:]
    assert "mpipe_hf: qwen2_5_vl pp_size=2 vpp=1 dp_size=1 ep_size=1 engine=none M=2 " in proc.stdout, \
        proc.stdout[:3000]  # the start-up line names the whole layout
    closing = [line for line in proc.stdout.splitlines() if line.startswith("mpipe_hf: 6 steps in ")]
    assert len(closing) == 1 and "(0 steps skipped; rows left out: 1 over max_length, 1 failed to load)" in \
        closing[0], proc.stdout[-3000:]
    plan = demo_plan(demo, str(data / "conv.jsonl"), num_micro=2, micro_batch_size=2, shuffle=False)
    counts = [len(plan.dataset[i]["images"]) for i in range(12)]
    assert sorted(set(counts)) == [0, 1, 2, 3]
    assert plan.load(1, 0)["input_ids"].shape[0] == 1, "step 2's first micro-batch trains on its good row"
    plan.take_dropped()
    model = AutoModelForImageTextToText.from_pretrained(os.path.join(demo, "model"), dtype=torch.float32)
    model.model.visual.requires_grad_(False)
    train = TrainSection(max_steps=6, learning_rate=LR, adam_epsilon=EPS)
    losses, norms, micros = train_unsplit(model, plan, 2, 6, train)  # the plan drops the bad row here too
    for row, loss, norm in zip(rows, losses, norms):
        assert abs(row["loss"] - loss) < 1e-4 and abs(row["grad_norm"] - norm) < 1e-4 * norm, (row, loss, norm)
    loaded = AutoModelForImageTextToText.from_pretrained(os.path.join(out, "checkpoint"))
    with torch.no_grad():
        inputs = {k: v for k, v in micros[0].items() if k != "labels"}
        assert (loaded(**inputs).logits - model(**inputs).logits).abs().max().item() < 1e-4

    out = str(tmp_path / "raise")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train",
                           write_recipe(demo, tmp_path / "raise.yaml", out, on_bad_sample="raise", **keys)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("mpipe-hf: error: pipeline rank ") and "DATA_LOAD" in errors[0] \
        and "conv.jsonl:6" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr, proc.stderr[-3000:]
    logs = sorted(os.listdir(os.path.join(out, "logs")))
    assert logs == ["rank0.log", "rank1.log"]
    assert all("Traceback" in open(os.path.join(out, "logs", name)).read() for name in logs)


class _Rows:
    """Rows ``{"id", "where"}`` for :class:`MicroBatchPlan`, a collator that fails on the ``bad`` ones (PIL's
    error for a truncated image) and, with ``null``, has a ``null_batch``."""

    def __init__(self, bad, null=True):
        self.bad, self.rows = set(bad), [{"id": i, "where": f"x.jsonl:{i + 1}"} for i in range(40)]
        if null:
            self.null_batch = lambda: {"ids": torch.tensor([-1])}

    def __call__(self, rows):
        if any(r["id"] in self.bad for r in rows):
            raise OSError("image file is truncated")
        return {"ids": torch.tensor([r["id"] for r in rows])}


class _Executor:
    """Loads micro 0 as the pipeline's owner would (a load's ValueError fails the step, as the vote raises it) and
    counts the rows the loads dropped, as the vote sums them."""

    cfg = ScheduleConfig(2, 1, 2)
    step_index = 0

    def step(self, load, next_load=None, num_micro=None, owners=None, next_owners=None, bad_rows=None):
        from mpipe_hf.runtime import StepStats
        self.batch = load(0)
        dropped = bad_rows() if bad_rows is not None else []
        return StepStats(1.0, 1, 0.0, 0.0, 0, bad_rows=len(dropped), bad_row=dropped[-1] if dropped else None)


def test_load_rows_drops_the_bad_row_and_says_where(capsys):
    """A micro-batch whose collation (or the model's check) fails is collated row by row: the bad row is dropped
    with one warning naming its line and the rest is the micro-batch; a micro-batch of bad rows only becomes the
    collator's null micro-batch, or fails without one; with ``drop_bad_rows`` off it fails as a whole."""
    collate = _Rows(bad={1, 9})
    plan = MicroBatchPlan(collate.rows, collate, num_micro=2, micro_batch_size=3)
    assert plan.load_rows([0, 1, 2])["ids"].tolist() == [0, 2]
    assert capsys.readouterr().out == ("mpipe_hf: warning: dropped x.jsonl:2 (OSError: image file is truncated); "
                                       "the step trains on the rest\n")
    assert plan.take_dropped() == ["x.jsonl:2 (OSError: image file is truncated)"] and plan.take_dropped() == []
    assert plan.load_rows([9])["ids"].tolist() == [-1] and plan.take_dropped() == ["x.jsonl:10 (OSError: image "
                                                                                   "file is truncated)"]

    def validate(batch):  # the model's check of the collated micro-batch counts as the row's failure too
        if 4 in batch["ids"].tolist():
            raise ValueError("x.jsonl:5: image-token count 3 differs from 4")
    checked = MicroBatchPlan(collate.rows, collate, 2, 3, validate)
    assert checked.load_rows([3, 4, 5])["ids"].tolist() == [3, 5]
    assert checked.take_dropped() == ["x.jsonl:5 (image-token count 3 differs from 4)"]
    user = _Rows(bad={1, 9}, null=False)  # a user's collator: no null micro-batch, the micro-batch fails
    with pytest.raises(ValueError, match=r"dataset rows \[9\]: OSError: image file is truncated"):
        MicroBatchPlan(user.rows, user, 2, 1).load_rows([9])
    with pytest.raises(ValueError, match=r"dataset rows \[0, 1, 2\]: OSError"):
        MicroBatchPlan(collate.rows, collate, 2, 3, drop_bad_rows=False).load_rows([0, 1, 2])
    capsys.readouterr()
    from mpipe_hf.data import TextCollator, qwen2_tokenizer
    null = TextCollator(qwen2_tokenizer(5120)).null_batch()
    assert null["input_ids"].shape == null["labels"].shape == (1, null["input_ids"].shape[1]) and bool(
        (null["labels"] == -100).all()) and null["input_ids"].shape[1] > 0


def test_max_bad_rows_stops_the_run_with_the_last_error(tmp_path):
    """``on_bad_sample: skip``: each bad row is dropped and counted; the run stops with the last row's text once
    more than ``max_bad_rows`` failed in all, or after ``max_bad_rows`` skipped steps in a row (a micro-batch a
    user's collator cannot load); a step that runs resets the steps in a row; ``raise`` stops at the first. The
    count is saved and resumed with the rank's state; ``max_bad_steps`` is an alias, with a FutureWarning."""
    from mpipe_hf.train.loop import Skips, run_step
    from mpipe_hf.train.recipe import DataSection
    from mpipe_hf.train.state import load_rank_state, rank_state, rank_state_name

    data = DataSection(path="x.jsonl", max_bad_rows=2)
    collate = _Rows(bad={1, 7, 13})  # one row of micro 0 (3 rows) in steps 0, 1 and 2
    plan, skips = MicroBatchPlan(collate.rows, collate, 2, 3), Skips()
    for step in range(2):
        stats = run_step(_Executor(), partial(plan.load, step), data, skips, step, bad_rows=plan.take_dropped)
        assert stats.bad_rows == 1 and skips.bad_rows == step + 1 and skips.total == 0
    with pytest.raises(ValueError, match=r"x.jsonl:14 \(OSError: image file is truncated\) \(3 rows failed in all, "
                                         r"more than data.max_bad_rows = 2\)"):
        run_step(_Executor(), partial(plan.load, 2), data, skips, 2, bad_rows=plan.take_dropped)
    torch.save(rank_state(3, None, None, skips, {}), tmp_path / rank_state_name(0))
    resumed = Skips()
    load_rank_state(str(tmp_path), 0, None, None, resumed, {})
    assert resumed.bad_rows == 3

    user = _Rows(bad={2, 6, 8}, null=False)  # micro 0 (1 row) of steps 1, 3 and 4: no row left, no null micro
    plan, skips, results = MicroBatchPlan(user.rows, user, 2, 1), Skips(), []
    with pytest.raises(ValueError, match=r"OSError: image file is truncated \(2 steps in a row skipped.*"
                                         r"max_bad_rows = 2\)"):
        for step in range(6):
            stats = run_step(_Executor(), partial(plan.load, step), data, skips, step, bad_rows=plan.take_dropped)
            results.append(stats and stats.bad_rows)
    assert results == [0, None, 0, None] and skips.total == 3 and skips.bad_rows == 0
    strict = MicroBatchPlan(collate.rows, collate, 2, 3, drop_bad_rows=False)
    with pytest.raises(ValueError, match="dataset rows \\[0, 1, 2\\]: OSError"):
        run_step(_Executor(), partial(strict.load, 0), dataclasses.replace(data, on_bad_sample="raise"), Skips(), 0)

    from mpipe_hf.train.hf_parts import MPipeConfig
    with pytest.warns(FutureWarning, match="max_bad_rows"):
        assert DataSection(path="x.jsonl", max_bad_steps=4).max_bad_rows == 4
    with pytest.warns(FutureWarning, match="max_bad_rows"):
        config = MPipeConfig(pp_size=1, max_bad_steps=5)
    assert config.max_bad_rows == 5 and config.data().max_bad_rows == 5 and MPipeConfig(pp_size=1).max_bad_rows == 10


def test_a_failed_row_is_remembered_and_counted_once(capsys, tmp_path):
    """A row whose image does not decode comes up every epoch (one step is one epoch here): it is tried, warned
    about and counted once, then left out of every later load; ``max_bad_rows`` counts distinct rows, so a
    limit of 1 lets six epochs run. The rows are saved with the rank's state by index and place: a resumed plan
    leaves them out without trying them, unless the row at that index is another one now (the data changed)."""
    from mpipe_hf.train.loop import Skips, run_step
    from mpipe_hf.train.recipe import DataSection
    from mpipe_hf.train.state import load_rank_state, rank_state, rank_state_name

    data = DataSection(path="x.jsonl", max_bad_rows=1)
    collate = _Rows(bad={1})
    rows = collate.rows[:6]
    plan, skips, tried = MicroBatchPlan(rows, collate, 2, 3), Skips(), []
    real = plan._checked
    plan._checked = lambda ids: tried.append(list(ids)) or real(ids)
    counts = [run_step(_Executor(), partial(plan.load, step), data, skips, step, plan=plan).bad_rows
              for step in range(6)]
    assert counts == [1, 0, 0, 0, 0, 0] and skips.bad_rows == 1 and skips.rows == {1: plan.identity(1)}, counts
    assert skips.rows[1][0] == "x.jsonl:2"
    assert sum(1 in ids for ids in tried) == 2  # the micro-batch, then the row alone, in the first epoch only
    assert capsys.readouterr().out.count("warning: dropped x.jsonl:2") == 1
    assert plan.failed == {1} and plan.take_failed() == []

    torch.save(rank_state(6, None, None, skips, {}), tmp_path / rank_state_name(0))
    resumed = Skips()
    load_rank_state(str(tmp_path), 0, None, None, resumed, {})
    assert resumed.rows == {1: plan.identity(1)} and resumed.bad_rows == 1
    again, tried = MicroBatchPlan(rows, collate, 2, 3), []
    again._checked = lambda ids: tried.append(list(ids)) or real(ids)
    assert run_step(_Executor(), partial(again.load, 6), data, resumed, 6, plan=again).bad_rows == 0
    assert again.failed == {1} and not any(1 in ids for ids in tried), tried
    moved = MicroBatchPlan(collate.rows[2:8], collate, 2, 3)  # two rows left out: index 1 is x.jsonl:4 now
    moved.remember(resumed.rows)
    assert moved.failed == set()
    evaluation = MicroBatchPlan(rows, collate, 2, 3, evaluation=True)
    evaluation.load_rows([0, 1, 2])
    evaluation.remember([1])
    assert evaluation.failed == set()  # each evaluation counts the rows it lost


def _resume_onto(rows, collate, saved, capsys):
    """One step of a plan over ``rows`` resumed from ``saved`` (a rank state's ``Skips``): ``(the ids the step
    tried, the resumed Skips, what the step printed)``."""
    from mpipe_hf.train.loop import Skips, run_step
    from mpipe_hf.train.recipe import DataSection
    resumed, tried = Skips(bad_rows=saved.bad_rows, rows=dict(saved.rows)), []
    plan = MicroBatchPlan(rows, collate, 2, 3)
    real = plan._checked
    plan._checked = lambda ids: tried.append(list(ids)) or real(ids)
    capsys.readouterr()
    run_step(_Executor(), partial(plan.load, 6), DataSection(path="x.jsonl", max_bad_rows=1), resumed, 6, plan=plan)
    return sorted({i for ids in tried for i in ids}), resumed, capsys.readouterr().out


def test_a_resume_onto_changed_data_skips_no_good_row(capsys, tmp_path):
    """A checkpoint remembers each failed row by its place and a digest of its content and of the files it
    names: resumed onto the same data, the bad row is left out untried and not counted again; resumed onto data
    where that index holds another row (an edited file, a mended image, another dataset with the same places),
    the row is tried, one line says the checkpoint's row was forgotten, and the count of rows that failed stays."""
    from mpipe_hf.train.loop import Skips, run_step
    from mpipe_hf.train.recipe import DataSection

    image = tmp_path / "a.png"
    image.write_bytes(b"broken")
    collate = _Rows(bad={1})
    rows = [dict(r, image=str(image)) for r in collate.rows[:6]]
    plan, skips = MicroBatchPlan(rows, collate, 2, 3), Skips()
    run_step(_Executor(), partial(plan.load, 0), DataSection(path="x.jsonl", max_bad_rows=1), skips, 0, plan=plan)
    assert list(skips.rows) == [1] and skips.bad_rows == 1

    tried, same, out = _resume_onto(rows, collate, skips, capsys)
    assert 1 not in tried and same.rows == skips.rows and same.bad_rows == 1 and "other data" not in out
    edited = [dict(r) for r in rows]
    edited[1]["id"] = 11  # the line x.jsonl:2 now holds another (good) row
    for changed in (edited, collate.rows[20:26]):  # an edited file; another dataset at the same places
        tried, resumed, out = _resume_onto(changed, collate, skips, capsys)
        assert 1 in tried and resumed.rows == {} and resumed.bad_rows == 1, (tried, resumed)
        assert out.count("resumed onto other data: 1 row(s)") == 1 and "(x.jsonl:2)" in out, out
    image.write_bytes(b"a mended image, longer")  # the row names a file that changed since
    tried, resumed, _ = _resume_onto(rows, _Rows(bad=()), skips, capsys)
    assert 1 in tried and resumed.rows == {} and resumed.bad_rows == 1
    old_style = Skips(bad_rows=1, rows={1: "x.jsonl:2"})  # a checkpoint from before rows had a digest
    tried, resumed, _ = _resume_onto(rows, collate, old_style, capsys)  # tried again, failed, not counted again
    assert 1 in tried and resumed.bad_rows == 1 and resumed.rows == {1: "x.jsonl:2"}


def test_a_micro_batch_of_known_failed_rows_is_the_null_micro_batch():
    """Every row of a micro-batch failed before: the collator's null micro-batch stands in without a load; a
    user's collator without one fails the micro-batch (the step is skipped), naming the rows."""
    collate = _Rows(bad={1})
    plan = MicroBatchPlan(collate.rows, collate, 2, 1)
    assert plan.load_rows([1])["ids"].tolist() == [-1] and plan.failed == {1}
    plan.take_dropped()
    assert plan.load_rows([1])["ids"].tolist() == [-1] and plan.take_dropped() == []
    user = _Rows(bad={1}, null=False)
    bare = MicroBatchPlan(user.rows, user, 2, 1)
    bare.remember([1])
    with pytest.raises(ValueError, match=r"dataset rows \[1\]: every row failed to load before"):
        bare.load_rows([1])


def test_the_run_saves_a_checkpoint_before_it_stops_for_bad_data(capsys):
    """The stop for too many bad rows saves an ordinary ``checkpoint-<step>`` first (the steps done), then raises;
    so does the stop for too many skipped steps in a row without data parallelism (with it, a failed step may
    leave a replica's collective pending, which a save would wait on: no save); any other error saves nothing, nor
    a stop before the first step; a ``checkpoint-<step>`` that save_steps wrote, or the run resumed from, is kept."""
    from types import SimpleNamespace
    from mpipe_hf.train.job import RecipeJob
    from mpipe_hf.train.loop import Skips
    from mpipe_hf.train.recipe import DataSection

    data = DataSection(path="x.jsonl", max_bad_rows=1)

    def stop_for_rows():
        Skips(bad_rows=1).drop_rows(1, "x.jsonl:3 (OSError: truncated)", data)

    def stop_for_steps():
        Skips(in_row=0).record("no row left", DataSection(path="x.jsonl", max_bad_rows=1))

    def other():
        raise ValueError("pipeline rank 1, FORWARD3: shapes differ")
    for raiser, data_parallel, saves in [(stop_for_rows, None, True), (stop_for_rows, object(), True),
                                         (stop_for_steps, None, True), (stop_for_steps, object(), False),
                                         (other, None, False)]:
        saved = []

        def step(*args, **kwargs):
            raiser()
        job = SimpleNamespace(plan=SimpleNamespace(load=lambda step, m: None), steps=30,
                              recipe=SimpleNamespace(train=SimpleNamespace(max_grad_norm=1.0)),
                              run=SimpleNamespace(step=step, data_parallel=data_parallel, lead=True),
                              save_before_stop=saved.append)
        with pytest.raises(ValueError):
            RecipeJob.train_step(job, 22)
        assert saved == ([22] if saves else []), (raiser.__name__, data_parallel, saved)
    saved = []  # step 0: nothing trained, nothing to keep
    job.save_before_stop, job.run = saved.append, SimpleNamespace(step=lambda *a, **k: stop_for_rows(),
                                                                   data_parallel=None, lead=True)
    with pytest.raises(ValueError):
        RecipeJob.train_step(job, 0)
    assert saved == []
    for due, resumed_here in [(False, False), (True, False), (False, True)]:
        written = []
        job = SimpleNamespace(save=lambda done: written.append(done) or f"/out/checkpoint-{done}",
                              run=SimpleNamespace(lead=True), recipe=SimpleNamespace(train=SimpleNamespace(
                                  output_dir="/out")), save_due=lambda done: due,
                              resume="/out/checkpoint-22" if resumed_here else None, start_step=22)
        RecipeJob.save_before_stop(job, 22)
        line = capsys.readouterr().out
        assert line.startswith("mpipe_hf: stopping for bad data after step 22: saved /out/checkpoint-22; ") and \
            "train.resume: auto" in line, line
        # the checkpoint save_steps wrote after step 22, or the one the run resumed from, is kept, not overwritten
        assert written == ([] if due or resumed_here else [22]), (due, resumed_here, written)
