"""What a run says about its evaluation and its packing, and ``MPipeTrainer.predict``.

- An evaluation that lost rows at load says so: the dropped row's warning names the evaluation, not "the step",
  and the run summary gives the rows it ran on (``mpipe-hf train``'s side end to end: tests/test_train.py's
  eval test; here the pieces).
- A packed run prints its packing at start-up: rows per micro-batch, the fill and the padding saved (end to end:
  tests/test_packing_train.py).
- ``MPipeTrainer.predict`` runs the forward-only schedule (one process, ``pp_size = 1``): a ``PredictionOutput``
  whose ``test_loss`` is the unsplit model's over the rows that loaded, with no predictions, the rows counted.

Run as a script, this file is the ``predict`` worker (one process, its own gloo world).
"""

import json
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import torch


def test_an_evaluation_that_drops_a_row_says_so(capsys):
    from mpipe_hf.data import MicroBatchPlan
    from mpipe_hf.train.report import summary_line

    def collate(rows):
        if any(r == "bad" for r in rows):
            raise ValueError("no such image")
        return {"input_ids": torch.tensor([[len(rows)]])}
    rows = ["a", "bad", "c"]
    train = MicroBatchPlan(rows, collate, 1, 3)
    evaluation = MicroBatchPlan(rows, collate, 1, 3, evaluation=True)
    train.load_rows([0, 1, 2])
    evaluation.load_rows([0, 1, 2])
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("(no such image); the step trains on the rest"), out
    assert out[1].endswith("(no such image); the evaluation runs on the rest"), out
    assert evaluation.take_dropped() == ["dataset row 1 (no such image)"]

    run = SimpleNamespace(cfg=SimpleNamespace(pp_size=1), skips=SimpleNamespace(total=0, bad_rows=0))
    job = SimpleNamespace(steps=2, start_step=0, run=run, bubbles=[[0.1]] * 2, peaks=[[2 ** 20]] * 2,
                          losses=[2.0, 1.0], eval_rows=(2, 12))
    line = summary_line(job, 1.0, "out")
    assert "the last evaluation ran on 2 of 12 eval rows (10 failed to load and were left out)" in line, line
    assert "were left out" not in summary_line(SimpleNamespace(**{**vars(job), "eval_rows": (12, 12)}), 1.0, "out")
    assert "evaluation" not in summary_line(SimpleNamespace(**{**vars(job), "eval_rows": None}), 1.0, "out")


def test_the_recipe_runs_evaluation_counts_the_rows_its_owners_dropped(capsys):
    """``RecipeJob.evaluate``: the rows every owner dropped (gathered over the pipeline) are counted in the metrics
    row, the warning and the summary's ``eval_rows``."""
    from mpipe_hf.train.job import RecipeJob
    logged = []
    run = SimpleNamespace(evaluate=lambda load, micros: (1.5, 40), gathered_rows=lambda mine: mine + ["b.jsonl:2 (x)"],
                          lead=True)
    job = SimpleNamespace(run=run, eval_set=list(range(12)), metrics=SimpleNamespace(log=logged.append),
                          eval_plan=SimpleNamespace(load_rows=None, take_dropped=lambda: ["a.jsonl:3 (y)"],
                                                    eval_micros=lambda: [[0, 1]]),
                          recipe=SimpleNamespace(data=SimpleNamespace(micro_batch_size=2)))
    RecipeJob.evaluate(job, 4)
    assert job.eval_rows == (10, 12)
    assert logged[0]["eval_rows"] == 10 and logged[0]["eval_rows_dropped"] == 2, logged
    out = capsys.readouterr().out
    assert "step 4: eval_loss 1.50000 over 40 label tokens of 10 of 12 eval rows" in out, out
    assert ("warning: step 4: the evaluation ran on 10 of 12 rows: 2 failed to load and were left out (the first: "
            "a.jsonl:3 (y))") in out, out


def test_an_evaluation_is_divided_among_the_replicas():
    """Each of ``dp`` replicas evaluates its share of the set: the same forwards on each (FSDP2 gathers its
    weights in every one), every micro-batch counted by one replica, and the sums over the replicas give one
    process's loss. The executor here returns a micro-batch's loss and tokens from its rows; the replicas'
    ``DataParallel.sum`` is what each replica would add (replayed one replica at a time)."""
    from mpipe_hf.schedule import ScheduleConfig
    from mpipe_hf.train.loop import eval_share, evaluate_rows

    micros = [[i] for i in range(11)]
    for size in (1, 2, 3, 4, 12):
        shares = [eval_share(micros, size, r) for r in range(size)]
        assert len({tuple(len(part) for part, _ in share) for share in shares}) == 1, shares  # the same forwards
        counted = sorted(m[0] for share in shares for part, yes in share if yes for m in part)
        assert counted == list(range(11)), (size, counted)  # each once
        assert sum(len(p) for p, _ in shares[0]) == 11 // size + 11 % size  # the share, not the whole set

    class Executor:
        cfg, device, runs = ScheduleConfig(2, 1, 4), "cpu", 0

        def evaluate(self, load, n):
            self.runs += 1
            batch = [load(m) for m in range(n)]
            return float(sum(10 * r + 1 for rows in batch for r in rows)), sum(len(rows) for rows in batch)

    partial = []
    dp = SimpleNamespace(size=3, batches=3, sum=lambda values: partial.append(values.tolist()) or values)
    executors = [Executor() for _ in range(3)]
    for replica, executor in enumerate(executors):
        evaluate_rows(executor, lambda rows: rows, micros, dp, replica)
    loss, tokens = evaluate_rows(Executor(), lambda rows: rows, micros)
    assert tokens == 11 and loss == sum(10 * r + 1 for r in range(11)) / 11
    assert [sum(p[k] for p in partial) for k in (0, 1)] == [loss * tokens, tokens], partial
    assert [e.runs for e in executors] == [2, 2, 2]  # 3 micro-batches, then the 2 every replica runs

    class Slice(Executor):  # a CP rank: its slice's half of each micro-batch's loss and label tokens
        def evaluate(self, load, n):
            loss, tokens = super().evaluate(load, n)
            return loss / 2, tokens / 2

    partial.clear()  # dp 2 x cp 2: each replica's CP ranks run its share, their slices' sums added over dp x cp
    dp_cp = SimpleNamespace(size=4, batches=2, sum=lambda values: partial.append(values.tolist()) or values)
    for rank in range(4):
        evaluate_rows(Slice(), lambda rows: rows, micros, dp_cp, rank // 2)
    assert [sum(p[k] for p in partial) for k in (0, 1)] == [loss * tokens, tokens], partial


def test_the_packing_line_gives_rows_fill_and_padding_saved():
    from mpipe_hf.data.packing import PackedPlan
    from mpipe_hf.train.plan_packing import packing_line
    lengths = [60, 40, 30, 30, 20, 20]  # 200 tokens in 2 micro-batches of up to 100
    plan = PackedPlan(list(range(6)), list, 2, 100, lengths)
    bins = plan.bins(0)
    assert sorted(r for b in bins for r in b) == list(range(6))
    padded = sum(len(b) * max(lengths[r] for r in b) for b in bins)
    rows = sorted(len(b) for b in bins)
    line = packing_line(plan)
    assert line.startswith("mpipe_hf: packing on (data.packing): micro-batches of whole rows up to 100 tokens"), line
    per_micro = f"{rows[0]} rows" if rows[0] == rows[-1] else f"{rows[0]} to {rows[-1]} rows (mean 3.0)"
    assert f"step 1: {per_micro} a micro-batch, fill 100% of the budget (lowest 100%)" in line, line
    assert f"padding saved: {padded - 200} of the {padded} tokens" in line, line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_predict_returns_the_loss_of_the_rows_that_loaded(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    got = json.loads((tmp_path / "predict.json").read_text())
    assert got["predictions"] is None and got["label_ids"] is None
    metrics = got["metrics"]
    assert metrics["test_rows"] == 4 and metrics["test_rows_dropped"] == 1, metrics
    assert metrics["test_label_tokens"] == 4 * 11
    assert abs(metrics["test_loss"] - got["expected"]) < 1e-5 * got["expected"], got
    assert "the evaluation runs on the rest" in proc.stdout and "predict returns the loss only" in proc.stderr
    assert "the test set ran on 4 of 5 rows: 1 failed to load" in proc.stderr


def predict_worker(out: str) -> None:
    """A tiny Qwen2 LM on one pipeline rank: ``predict`` over 5 rows, one of which its collator refuses; the
    output and the unsplit model's token-mean loss over the other 4 go to ``out/predict.json``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, TrainingArguments
    from mpipe_hf import MPipeConfig, MPipeTrainer
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    rows = [{"input_ids": torch.randint(0, 96, (12,)).tolist()} for _ in range(5)]
    rows[3]["bad"] = True

    def collate(batch):
        if any(row.get("bad") for row in batch):
            raise ValueError("a row the collator refuses")
        ids = torch.tensor([row["input_ids"] for row in batch])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    model = Qwen2ForCausalLM(config)
    reference = Qwen2ForCausalLM(config)
    reference.load_state_dict(model.state_dict())
    args = TrainingArguments(output_dir=out, per_device_eval_batch_size=2, gradient_accumulation_steps=2,
                             report_to="none", remove_unused_columns=False, use_cpu=True)
    trainer = MPipeTrainer(model=model, args=args, data_collator=collate,
                           mpipe_config=MPipeConfig(pp_size=1, preprocess="identity", timeout_s=60))
    result = trainer.predict(rows)
    total = 0.0
    with torch.no_grad():
        for row in rows[:3] + rows[4:]:
            batch = collate([row])
            logits = reference(input_ids=batch["input_ids"]).logits
            total += float(torch.nn.functional.cross_entropy(logits[0, :-1], batch["labels"][0, 1:], reduction="sum"))
    with open(os.path.join(out, "predict.json"), "w") as f:
        json.dump({"predictions": result.predictions, "label_ids": result.label_ids, "metrics": result.metrics,
                   "expected": total / (4 * 11)}, f)


if __name__ == "__main__":
    predict_worker(sys.argv[1])
