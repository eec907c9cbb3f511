"""``MPipeTrainer`` against the plain one-process ``transformers.Trainer`` on the same script and data.

The example scripts ``examples/sft_qwen2_5_vl.py`` (plain) and ``examples/sft_qwen2_5_vl_pipelined.py`` (the same
with three lines changed) run on the demo: the plain one on one process, the pipelined one under torchrun at
``R = 2``, ``V = 2`` (and once under accelerate launch). Their ``trainer_state.json`` logs (loss, grad_norm,
learning_rate of every step) and their final checkpoints must agree.
"""

import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile

import pytest
import torch
from transformers import AutoModelForImageTextToText

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAIN = os.path.join(ROOT, "examples", "sft_qwen2_5_vl.py")
PIPELINED = os.path.join(ROOT, "examples", "sft_qwen2_5_vl_pipelined.py")


def launch(cmd, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, f"{cmd[:6]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def torchrun(script, args, nproc=2, timeout=600):
    return launch([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                   script, *args], timeout=timeout)


def accelerate_launch(script, args, nproc=2, timeout=600):
    return launch([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(nproc),
                   "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", script, *args],
                  timeout=timeout)


def train_plain(demo, out, **options):
    """The plain script's ``main`` in this process, on one process as a user runs it (a process start less per
    case)."""
    runpy.run_path(PLAIN)["main"](common(demo, out, **options))


def history(out):
    """The per-step training logs of a run's last checkpoint or final state: ``{step: log}``."""
    state = json.load(open(os.path.join(out, "trainer_state.json")))
    return {h["step"]: h for h in state["log_history"] if "loss" in h}


def common(demo, out, **options):
    args = ["--model", os.path.join(demo, "model"), "--data", os.path.join(demo, "data", "train.jsonl"),
            "--output-dir", out, "--max-steps", str(options.pop("max_steps", 3))]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


def final_state(out):
    return AutoModelForImageTextToText.from_pretrained(out).state_dict()


@pytest.mark.parametrize("options", [
    # frozen tower, clipping that clips, 3 rows per micro-batch, which the pipeline packs into one sequence
    # and the plain Trainer pads; over the epoch's end: 89 rows in 30 micro-batches, M = 8, so step 4 has 6
    # micro-batches (the last of 2 rows) and step 5 starts epoch 2
    dict(max_grad_norm=0.5, learning_rate=1e-3, max_steps=5, batch_size=3, packing=True),
    # a trainable tower under bf16 autocast with fp32 master weights (in fp32, a trainable tower's steps equal one
    # process at 1e-5 in tests/test_numerics.py and tests/test_train.py; here, the Trainer's bf16 path)
    dict(train_tower=True, bf16=True, max_grad_norm=0.5, learning_rate=2e-5),
    # the ViT frozen by the user (requires_grad_) and by MPipeConfig(freeze_vit=True), the merger trained; launched
    # with accelerate launch (the others with torchrun), under context parallelism: cp 2 x pp 2 (V = 2) on 4
    # processes, each CP rank's pipeline on its half of every sequence, against the plain Trainer on one process,
    # both with Qwen2.5-VL's default loss (the mean of the micro-batches' means: each CP rank's slice over the whole
    # micro's label tokens)
    dict(train_merger=True, max_grad_norm=0.5, learning_rate=1e-3, launcher=accelerate_launch, cp=2),
], ids=["frozen-packed", "trainable-bf16", "merger-accelerate-cp2"])
def test_mpipe_trainer_equals_plain_trainer(demo, tmp_path, options):
    """3 steps (5 across an epoch's end, packed) of the pipelined script under torchrun or accelerate launch (at cp 2
    x pp 2 on 4 processes) equal the plain Trainer's on one process: every step's loss, global grad norm, learning
    rate and epoch, and every parameter after the last step (atol 1e-4). At cp 2 the measured agreement is about
    1e-7 (loss, grad norm, weights); the CP rank 1 given other text tokens than its peer (a negative control run by
    hand) is off by 3e-3 in the loss, 4e-2 in the grad norm and 3e-3 in the weights."""
    plain, piped, options = str(tmp_path / "plain"), str(tmp_path / "piped"), dict(options)
    # the pipelined script's own flags
    piped_only = {key: options.pop(key) for key in ("packing", "cp") if key in options}
    launcher = options.pop("launcher", torchrun)
    train_plain(demo, plain, **options)
    proc = launcher(PIPELINED, common(demo, piped, **options, **piped_only), nproc=2 * piped_only.get("cp", 1))
    ref, got = history(plain), history(piped)
    assert sorted(ref) == sorted(got) == list(range(1, options.get("max_steps", 3) + 1))
    tol = 1e-3 if options.get("bf16") else 1e-5
    for step in ref:
        assert abs(got[step]["loss"] - ref[step]["loss"]) <= tol * ref[step]["loss"], (step, got[step], ref[step])
        assert abs(got[step]["grad_norm"] - ref[step]["grad_norm"]) <= 10 * tol * ref[step]["grad_norm"], step
        assert got[step]["learning_rate"] == pytest.approx(ref[step]["learning_rate"], rel=1e-12)
        assert got[step]["epoch"] == pytest.approx(ref[step]["epoch"], rel=1e-12)
        assert 0.0 <= got[step]["bubble"] < 1.0 and got[step]["skipped_steps"] == 0
        assert {f"step_s_rank{r}" for r in range(2)} <= set(got[step])
        assert all(got[step][f"peak_activation_mib_rank{r}"] > 0 for r in range(2))
    assert ref[1]["grad_norm"] > options["max_grad_norm"], "the clip clips"
    a, b = final_state(plain), final_state(piped)
    assert sorted(a) == sorted(b)
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-4, worst
    assert "Traceback" not in proc.stderr
    if piped_only.get("cp"):  # the end's checkpoint-3, one writer per CP group: whole, each process's RNG state
        from mpipe_hf.train.hf import STAGING_PREFIX
        assert "mpipe_hf: MPipeTrainer pp_size=2 vpp=2 dp_size=1 ep_size=1 cp_size=2" in proc.stdout, proc.stdout
        files = set(os.listdir(os.path.join(piped, "checkpoint-3")))
        assert {"rank0_state.pt", "rank1_state.pt", *(f"rng_state_{r}.pth" for r in range(4))} <= files, files
        assert not [name for name in os.listdir(piped) if name.startswith(STAGING_PREFIX)]


def test_mpipe_trainer_takes_a_peft_model(demo, tmp_path):
    """The example scripts with ``--lora 8`` (``get_peft_model`` on the loaded model, LoRA on the decoder's
    attention): 3 pipelined steps equal the plain Trainer's with the same PeftModel (loss, grad norm, learning
    rate), and ``save_model`` writes PEFT's adapter files whose tensors equal the plain Trainer's (atol 1e-5),
    with no config.json."""
    from safetensors.torch import load_file
    plain, piped = str(tmp_path / "plain"), str(tmp_path / "piped")
    options = dict(lora=8, learning_rate=1e-3, max_grad_norm=0.5)
    train_plain(demo, plain, **options)
    proc = torchrun(PIPELINED, common(demo, piped, **options))
    ref, got = history(plain), history(piped)
    assert sorted(ref) == sorted(got) == [1, 2, 3]
    for step in ref:
        assert abs(got[step]["loss"] - ref[step]["loss"]) <= 1e-5 * ref[step]["loss"], (step, got[step], ref[step])
        assert abs(got[step]["grad_norm"] - ref[step]["grad_norm"]) <= 1e-4 * ref[step]["grad_norm"], step
        assert got[step]["learning_rate"] == pytest.approx(ref[step]["learning_rate"], rel=1e-12)
    assert "config.json" not in os.listdir(piped) and "adapter_config.json" in os.listdir(piped)
    a, b = (load_file(os.path.join(d, "adapter_model.safetensors")) for d in (plain, piped))
    assert sorted(a) == sorted(b) and len(a) == 4 * 2 * 16  # q, k, v, o x (A, B) x 16 decoder layers
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-5, worst
    assert "Traceback" not in proc.stderr


def test_save_steps_resume_and_evaluate(demo, tmp_path):
    """``save_steps`` writes a checkpoint that ``from_pretrained`` loads with each rank's optimizer state; a run
    resumed from it continues with the uninterrupted run's losses and ends with its weights; ``evaluate()``
    gives the one-process token-normalised eval loss."""
    data = os.path.join(demo, "data", "train.jsonl")
    full, resumed = str(tmp_path / "full"), str(tmp_path / "resumed")
    torchrun(PIPELINED, common(demo, full, save_steps=2, eval_data=data, max_steps=4))
    ckpt = os.path.join(full, "checkpoint-2")
    assert {"rank0_state.pt", "rank1_state.pt", "rng_state_0.pth", "rng_state_1.pth",
            "trainer_state.json", "config.json", "model.safetensors.index.json",
            "chat_template.jinja"} <= set(os.listdir(ckpt))
    AutoModelForImageTextToText.from_pretrained(ckpt)
    torchrun(PIPELINED, common(demo, resumed, save_steps=2, max_steps=4, resume=ckpt))
    a, b = history(full), history(resumed)
    assert [a[s]["loss"] for s in (3, 4)] == [b[s]["loss"] for s in (3, 4)], (a, b)
    sa, sb = final_state(full), final_state(resumed)
    assert all(torch.equal(sa[k], sb[k]) for k in sa), "resumed weights equal the uninterrupted run's"

    # eval_loss of the trained model, one process, over every row once: summed token loss / label tokens
    state = json.load(open(os.path.join(full, "trainer_state.json")))
    eval_loss = [h["eval_loss"] for h in state["log_history"] if "eval_loss" in h][-1]
    from mpipe_hf.data import ConversationCollator, load_conversation_dataset
    from mpipe_hf.data import load_checkpoint_processor
    model = AutoModelForImageTextToText.from_pretrained(full).eval()
    processor = load_checkpoint_processor(os.path.join(demo, "model"))
    dataset = load_conversation_dataset(data, processor, 2048)
    collate = ConversationCollator(processor, 2048)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for i in range(len(dataset)):
            batch = collate([dataset[i]])
            logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
            total += float(model.loss_function(logits=logits, labels=batch["labels"],
                                               vocab_size=model.config.get_text_config().vocab_size,
                                               num_items_in_batch=1))
            tokens += int((batch["labels"][..., 1:] != -100).sum())
    assert abs(eval_loss - total / tokens) < 1e-5 * eval_loss, (eval_loss, total / tokens)


def test_arguments_a_pipeline_cannot_honour_are_named(tmp_path):
    from transformers import TrainingArguments
    from mpipe_hf import MPipeConfig
    from mpipe_hf.train.hf import check_training_args
    for options, name in ((dict(torch_compile=True), "torch_compile"), (dict(optim="adafactor"), "optim"),
                          (dict(train_sampling_strategy="group_by_length"), "train_sampling_strategy")):
        args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **options)
        with pytest.raises(ValueError, match=name):
            check_training_args(args, MPipeConfig(pp_size=1))
    with pytest.raises(ValueError, match="preprocess"):
        MPipeConfig(pp_size=2, preprocess="warm")
    with pytest.raises(ValueError, match="processes for pp_size=2"):
        check_training_args(TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none"),
                            MPipeConfig(pp_size=2))


def test_context_parallel_refusals_name_the_trainer_fields(tmp_path, monkeypatch):
    """``MPipeConfig(cp_size=2)`` refuses, by name and before any collective, what a recipe's ``parallel.cp_size``
    refuses (heads the split cannot share out; packing for a family whose masks run packed rows one by one,
    Gemma 3's) and accelerate's own ``ParallelismConfig``; a launch of another size names ``pp_size * cp_size``.
    The controls: the same config at ``cp_size`` 1 (or without packing) passes each check, and Qwen2.5-VL, whose
    packed micro is split as one sequence, passes with packing at ``cp_size`` 2."""
    from accelerate import ParallelismConfig
    from transformers import AutoConfig, Qwen2Config, TrainingArguments
    from mpipe_hf import MPipeConfig
    from mpipe_hf.train.hf_parts import check_context_parallel_trainer, check_training_args
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    cp2, cp1 = MPipeConfig(pp_size=2, cp_size=2), MPipeConfig(pp_size=2)
    packed2, packed1 = MPipeConfig(pp_size=2, cp_size=2, packing=True), MPipeConfig(pp_size=2, packing=True)
    gemma3 = AutoConfig.for_model("gemma3")
    with pytest.raises(ValueError, match=r"MPipeConfig cp_size 2 does not run with packing=True for gemma3, whose "
                                         r"masks .* one by one; set packing=False or cp_size=1"):
        check_context_parallel_trainer(packed2, gemma3)
    for passes in (packed1, cp2):
        check_context_parallel_trainer(passes, gemma3)
    check_context_parallel_trainer(packed2, AutoConfig.for_model("qwen2_5_vl"))
    with pytest.raises(ValueError, match="MPipeConfig ep_size must be 1"):  # a recipe's cp_size 2 takes ep_size 2
        MPipeConfig(pp_size=2, cp_size=2, ep_size=2)
    with pytest.raises(ValueError, match=r"1 processes for pp_size=2 cp_size=2 \(launch 4 processes\)"):
        check_training_args(args, cp2)
    monkeypatch.setenv("WORLD_SIZE", "4")
    check_training_args(args, cp2)
    args.parallelism_config = ParallelismConfig(cp_size=2)
    with pytest.raises(ValueError, match=r"parallelism_config cp_size=2 \(.*MPipeConfig\(cp_size=...\)"):
        check_training_args(args, cp2)
    args.parallelism_config = None
    odd = Qwen2Config(num_attention_heads=3, num_key_value_heads=3, hidden_size=24)
    with pytest.raises(ValueError, match="MPipeConfig cp_size: .*heads"):
        check_context_parallel_trainer(cp2, odd)
    check_context_parallel_trainer(cp1, odd)
    check_context_parallel_trainer(cp2, Qwen2Config(num_attention_heads=4, num_key_value_heads=2, hidden_size=32))


# ---- checkpoint-<step> written whole or not at all ----------------------------------------------------------

CHECKPOINT_FILES = {"rank0_state.pt", "rank1_state.pt", "rng_state_0.pth", "rng_state_1.pth",
                    "trainer_state.json", "config.json", "generation_config.json", "model.safetensors.index.json",
                    "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}


SCENARIOS = (0, -2, 3)  # uninterrupted; SIGUSR1 in step 2; rank 1's save of step 3 fails (last: it raises)


def checkpoint_worker(work: str) -> None:
    """Run by torchrun (this file as a script, 2 processes): for each of :data:`SCENARIOS` in turn (one launch,
    one process group, a new trainer each), 4 steps of a tiny Qwen2 LM with ``save_steps=1``,
    ``save_total_limit=2``, an evaluation at every step and ``load_best_model_at_end``, into
    ``work/<scenario>/out``. With ``fail_step`` > 0 the training state file of rank 1 fails half-written at that
    step's save (``OSError``, a full disk). With ``fail_step`` < 0, rank 1 receives SIGUSR1 (preemption) in step
    ``-fail_step``: every rank then stops after that step. Each rank writes what ``train()`` raised (empty:
    nothing) to ``work/<scenario>/rank<r>.txt``."""
    import errno
    from transformers import Qwen2Config, Qwen2ForCausalLM, TrainingArguments
    from mpipe_hf import MPipeConfig, MPipeTrainer

    config = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)

    def collate(batch):
        ids = torch.tensor([row["input_ids"] for row in batch])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    step, write = MPipeTrainer.training_step, MPipeTrainer._save_optimizer_and_scheduler
    for fail_step in SCENARIOS:
        def signalled(self, *a, **k):
            if self.run.rank == 1 and self.state.global_step + 1 == -fail_step:
                os.kill(os.getpid(), signal.SIGUSR1)
            return step(self, *a, **k)

        def failing(self, output_dir):
            if self.run.rank == 1 and self.state.global_step == fail_step:
                with open(os.path.join(output_dir, "rank1_state.pt"), "wb") as f:
                    f.write(b"half of it")
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            write(self, output_dir)
        MPipeTrainer.training_step = signalled if fail_step < 0 else step
        MPipeTrainer._save_optimizer_and_scheduler = failing if fail_step > 0 else write
        torch.manual_seed(0)  # each scenario: the same rows and model
        rows = [{"input_ids": torch.randint(0, 96, (12,)).tolist()} for _ in range(8)]
        folder = os.path.join(work, str(fail_step))
        args = TrainingArguments(output_dir=os.path.join(folder, "out"), max_steps=4, per_device_train_batch_size=1,
                                 gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1, save_steps=1,
                                 save_total_limit=2, eval_strategy="steps", eval_steps=1, load_best_model_at_end=True,
                                 metric_for_best_model="eval_loss", report_to="none", remove_unused_columns=False,
                                 train_sampling_strategy="sequential", use_cpu=True, seed=0)
        trainer = MPipeTrainer(model=Qwen2ForCausalLM(config), args=args,
                               mpipe_config=MPipeConfig(pp_size=2, preprocess="identity", timeout_s=60),
                               train_dataset=rows, eval_dataset=rows[:2], data_collator=collate)
        try:
            trainer.train()
            error = ""
        except Exception as err:  # noqa: BLE001 - reported to the test
            error = f"{type(err).__name__}: {err}"
        with open(os.path.join(folder, f"rank{os.environ['RANK']}.txt"), "w") as f:
            f.write(error)
    MPipeTrainer.training_step, MPipeTrainer._save_optimizer_and_scheduler = step, write
    for bad in BAD_ROWS:
        bad_rows_scenario(os.path.join(work, "bad-" + "-".join(map(str, bad))), bad, config)


BAD_ROWS = ((2,), (2, 5))  # rows whose "image" does not decode: one (two epochs), then two with max_bad_rows 1


def bad_rows_scenario(folder: str, bad: tuple[int, ...], config) -> None:
    """Run by :func:`checkpoint_worker` in its launch: 8 steps (two epochs of 8 rows, 2 one-row micro-batches a
    step) of a tiny Qwen2 LM whose collator fails on the rows ``bad`` as on an image that does not decode (a null
    micro-batch stands in for a bad row's), ``max_bad_rows=1``, no ``save_steps``. Each rank writes
    ``rank<r>.json``: what ``train()`` raised (empty: nothing) and the logged ``bad_rows`` and ``bad_rows_total``
    of each step."""
    from transformers import Qwen2ForCausalLM, TrainingArguments
    from mpipe_hf import MPipeConfig, MPipeTrainer

    class Collate:
        def __call__(self, batch):
            if any(row["id"] in bad for row in batch):
                raise OSError("image file is truncated")
            ids = torch.tensor([row["input_ids"] for row in batch])
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

        def null_batch(self):
            ids = torch.zeros(1, 12, dtype=torch.long)
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.full_like(ids, -100)}
    torch.manual_seed(0)
    rows = [{"id": i, "input_ids": torch.randint(0, 96, (12,)).tolist()} for i in range(8)]
    args = TrainingArguments(output_dir=os.path.join(folder, "out"), max_steps=8, per_device_train_batch_size=1,
                             gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1, save_strategy="no",
                             report_to="none", remove_unused_columns=False, train_sampling_strategy="sequential",
                             use_cpu=True, seed=0)
    trainer = MPipeTrainer(model=Qwen2ForCausalLM(config), args=args,
                           mpipe_config=MPipeConfig(pp_size=2, preprocess="identity", timeout_s=60, max_bad_rows=1),
                           train_dataset=rows, data_collator=Collate())
    try:
        trainer.train()
        error = ""
    except Exception as err:  # noqa: BLE001 - reported to the test
        error = f"{type(err).__name__}: {err}"
    logged = [[h["bad_rows"], h["bad_rows_total"]] for h in trainer.state.log_history if "bad_rows" in h]
    with open(os.path.join(folder, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump({"error": error, "logged": logged}, f)


@pytest.fixture(scope="module")
def checkpoint_runs(tmp_path_factory):
    """``{fail_step: (output_dir, [each rank's error text])}`` of :func:`checkpoint_worker`'s one launch; before
    it, a crashed save's leftover in the uninterrupted scenario's output directory."""
    from mpipe_hf.train.hf import STAGING_PREFIX
    work = tmp_path_factory.mktemp("checkpoints")
    for fail_step in SCENARIOS:
        (work / str(fail_step)).mkdir()
    for bad in BAD_ROWS:
        (work / ("bad-" + "-".join(map(str, bad)))).mkdir()
    stale = work / "0" / "out" / f"{STAGING_PREFIX}checkpoint-99"
    stale.mkdir(parents=True)
    (stale / "model-00001-of-00002.safetensors").write_bytes(b"partial")
    torchrun(os.path.abspath(__file__), [str(work)], timeout=400)
    runs = {f: (str(work / str(f) / "out"), [(work / str(f) / f"rank{r}.txt").read_text() for r in range(2)])
            for f in SCENARIOS}
    for bad in BAD_ROWS:
        folder = work / ("bad-" + "-".join(map(str, bad)))
        runs[bad] = (str(folder / "out"), [json.load(open(folder / f"rank{r}.json")) for r in range(2)])
    return runs


def assert_complete(checkpoint: str, step: int):
    files = set(os.listdir(checkpoint))
    assert CHECKPOINT_FILES <= files, (checkpoint, sorted(CHECKPOINT_FILES - files))
    index = json.load(open(os.path.join(checkpoint, "model.safetensors.index.json")))
    assert set(index["weight_map"].values()) <= files
    assert json.load(open(os.path.join(checkpoint, "trainer_state.json")))["global_step"] == step
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_pretrained(checkpoint)


def leftovers(out: str) -> list[str]:
    return [name for name in os.listdir(out) if name.startswith("tmp-") or name.endswith((".tmp", ".old"))]


def test_trainer_checkpoints_are_renamed_in_whole(checkpoint_runs):
    """Every ``checkpoint-<step>`` is written as ``tmp-checkpoint-<step>`` (a name the Trainer's resume and
    rotation do not match) and renamed in complete: after training every kept checkpoint has every rank's files,
    ``save_total_limit`` and ``best_model_checkpoint`` name final directories, and what a crashed save left is gone
    at the next save."""
    from pathlib import Path
    from transformers.trainer_utils import _re_checkpoint, get_last_checkpoint
    from mpipe_hf.train.hf import STAGING_PREFIX
    staged = f"{STAGING_PREFIX}checkpoint-12"
    assert _re_checkpoint.search(staged) is None and _re_checkpoint.search(staged + ".tmp") is None
    with tempfile.TemporaryDirectory() as folder:  # a crashed save's leftover, as the launch had it at its start
        (Path(folder) / f"{STAGING_PREFIX}checkpoint-99").mkdir()
        assert get_last_checkpoint(folder) is None and not list(Path(folder).glob("checkpoint-*"))  # rotation's glob
    out, errors = checkpoint_runs[0]
    assert errors == ["", ""], errors
    assert leftovers(out) == []
    kept = sorted(name for name in os.listdir(out) if name.startswith("checkpoint-"))
    assert len(kept) == 2 and "checkpoint-4" in kept, kept
    for name in kept:
        assert_complete(os.path.join(out, name), int(name.split("-")[1]))
    assert get_last_checkpoint(out) == os.path.join(out, "checkpoint-4")
    best = json.load(open(os.path.join(out, "checkpoint-4", "trainer_state.json")))["best_model_checkpoint"]
    assert best is not None and os.path.basename(best) in kept, (best, kept)


def test_a_preempted_trainer_saves_and_stops_on_every_rank(checkpoint_runs):
    """SIGUSR1 to rank 1 in step 2 (as SLURM's ``--signal``): both ranks finish step 2, ``checkpoint-2`` is saved
    whole and ``train()`` returns on both, without an error and without steps 3 and 4."""
    out, errors = checkpoint_runs[-2]
    assert errors == ["", ""], errors
    kept = sorted(name for name in os.listdir(out) if name.startswith("checkpoint-"))
    assert kept == ["checkpoint-1", "checkpoint-2"], kept
    assert_complete(os.path.join(out, "checkpoint-2"), 2)
    assert leftovers(out) == []


def test_a_failed_trainer_save_leaves_the_last_checkpoint(checkpoint_runs):
    """The training state file of rank 1 fails half-written in step 3's save: every rank raises that rank's error (none
    waits for the other), no ``checkpoint-3`` nor temporary directory is left, and ``checkpoint-2``, complete, is
    what ``resume_from_checkpoint=True`` would take."""
    from transformers.trainer_utils import get_last_checkpoint
    out, errors = checkpoint_runs[3]
    for error in errors:
        assert error.startswith("RuntimeError: pipeline rank 1, saving ") and "checkpoint-3" in error, errors
        assert "OSError: [Errno 28] No space left on device (injected)" in error, errors
    assert sorted(name for name in os.listdir(out) if name.startswith("checkpoint-")) == ["checkpoint-1",
                                                                                           "checkpoint-2"]
    assert leftovers(out) == []
    assert_complete(os.path.join(out, "checkpoint-2"), 2)
    assert get_last_checkpoint(out) == os.path.join(out, "checkpoint-2")



def test_the_trainer_remembers_a_failed_row_and_saves_before_it_stops(checkpoint_runs):
    """``MPipeTrainer`` with ``max_bad_rows=1``: a row that fails in both epochs is dropped and counted once (the
    run ends, ``bad_rows_total`` 1); a second failed row stops the run in step 3 with the count, after saving an
    ordinary ``checkpoint-2`` (no ``save_steps``), complete and resumable."""
    out, results = checkpoint_runs[(2,)]
    for res in results:
        assert res["error"] == "", res
        assert [count for count, _ in res["logged"]] == [0, 1, 0, 0, 0, 0, 0, 0], res["logged"]
        assert res["logged"][-1][1] == 1, res["logged"]
    out, results = checkpoint_runs[(2, 5)]
    for res in results:
        assert res["error"].startswith("ValueError: a row failed to load: dataset row 5 (OSError: image file is "
                                       "truncated) (2 rows failed in all, more than data.max_bad_rows = 1)"), res
    assert sorted(name for name in os.listdir(out) if name.startswith("checkpoint-")) == ["checkpoint-2"]
    assert_complete(os.path.join(out, "checkpoint-2"), 2)
    assert leftovers(out) == []

if __name__ == "__main__":
    checkpoint_worker(sys.argv[1])
