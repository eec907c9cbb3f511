"""torchrun worker: expert parallelism under the pipeline, ``pp = 2`` x ``ep = 2`` on 4 gloo processes
(``dp_size = 2`` replicas, each an EP rank) or 8 (``dp_size = 4``: two EP groups per stage rank, each expert shard
held by ``edp = 2`` replicas whose gradients are summed), case after case in one process group, against the unsplit Hugging
Face model on one process. A case with ``cp_size`` 2 runs on a ``(dp, cp, pp)`` mesh instead (4 processes: one
replica whose 2 CP ranks split each micro's sequence), its EP groups cut from the ``dp x cp`` ranks of a stage.

Usage: torchrun --nproc_per_node 4|8 ep_worker.py FIXTURE OUT_DIR CASES_JSON

A case names a config of the fixture (``family``), its pool (``data``), the schedule (``vpp``, ``num_micro`` per
replica, ``preprocess``, ``text_layers``, ``layers_per_stage``), ``steps`` AdamW steps, ``dp_shard`` (FSDP2 over
the replicas for the dense weights, else one all-reduce), ``bf16`` (autocast), ``packed`` (each micro packed into
one sequence), ``lora`` (peft's LoRA on the attention and, by ``target_parameters``, the fused experts, put into
the model before the split as on one process: the adapter shards of the experts are cut per EP rank too),
``reload`` (the trained adapter saved fused, as ``PipelineRun.save_weights`` does, and read back by
``PeftModel.from_pretrained`` on the unsplit model; the merged weights too) and, as negative controls,
``dp_experts`` (the expert shards' gradients summed over ``dp`` as if they were replicated) and ``wrong_cut`` (each
expert ``lora_B`` shard a contiguous block of columns, as if expert-major like ``lora_A``), which must fail. Every rank carves its share of the same model, keeps its EP rank's half of
every fused expert tensor of its stages (:func:`~mpipe_hf.models.expert_parallel.shard_experts`), and replica
``d`` runs micro-batches ``d * M .. d * M + M - 1`` of each run's global batch of ``dp_size * M``. Global rank 0 then runs
the unsplit model over each global batch in the pipeline's order (summed token losses with the MoE term per micro,
one division by the batch's label tokens: ``numerics_worker.reference_run``) under the same AdamW; every rank
compares its own tensors (an expert shard with its rows of the reference's fused tensor). Each rank writes
``OUT_DIR/rank{r}.json``.
"""

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from common import run_cases
from numerics_worker import TIMEOUT, build_model, compare_grads, reference_run
from mpipe_hf.data.packing import pack_micro
from mpipe_hf.models import split as split_model
from mpipe_hf.models.adapters import apply_adapter, is_adapter_tensor, merged_state
from mpipe_hf.models.base import freeze
from mpipe_hf.models.context_parallel_stages import split_sequences
from mpipe_hf.models.expert_parallel import shard_experts
from mpipe_hf.models.expert_shards import ExpertCut
from mpipe_hf.runtime import PipelineExecutor, build_mesh, init_distributed
from mpipe_hf.runtime.data_parallel import DataParallel
from mpipe_hf.runtime.mesh import expert_mesh, reduction_mesh
from mpipe_hf.runtime.zero_bubble import WeightWork
from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.train.checkpoint import save_adapter, save_checkpoint
from mpipe_hf.train.precision import autocast_modules
from mpipe_hf.train.recipe_lora import LoraSection
from mpipe_hf.train.run_checkpoints import gather_full

PP, EP = 2, 2
DP = int(os.environ.get("WORLD_SIZE", "4")) // PP  # 4 processes: edp 1; 8: edp 2 (experts summed over edp)
LR, EPS = 1e-3, 1e-6
EXCHANGED = [0, 0]  # (split-size exchanges, rows received from the other EP rank), counted over a case


def _counting(original):
    """transformers' AllToAllEP exchanges each layer's per-expert counts with ``all_to_all_single`` first: count
    the exchanges and the rows this rank then receives from its peer (evidence that tokens cross the EP group)."""
    def exchange(output, input, *args, **kwargs):
        work = original(output, input, *args, **kwargs)
        peer = 1 - dist.get_rank(kwargs.get("group")) if EP == 2 else None
        EXCHANGED[0] += 1
        EXCHANGED[1] += int(output[peer].sum()) if peer is not None else 0
        return work
    return exchange


import transformers.distributed.expert_parallel as _ep  # noqa: E402
_ep.all_to_all_single = _counting(_ep.all_to_all_single)
EXPERT_W = [set(), 0]  # (the expert shards' ids, how many of their gradients a zero-bubble W computed)


def _counting_w(original):
    """``WeightWork.run`` counting the expert shards among the weights it computes: evidence that ``W`` (not ``B``)
    computed their gradients from the dispatched tokens it kept."""
    def run(self):
        EXPERT_W[1] += sum(id(w) in EXPERT_W[0] for w in self.weights) if self.groups else 0
        return original(self)
    return run


WeightWork.run = _counting_w(WeightWork.run)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def adapt(model, case):
    """With ``case["lora"]``: peft's LoRA (r 2, both factors drawn: no zero gradient at step 0) on the attention
    and the fused experts, put into ``model`` in place from seed ``case["lora_seed"]`` (default 1); returns the
    ``PeftModel`` (``None`` without)."""
    if not case.get("lora"):
        return None
    torch.manual_seed(case.get("lora_seed", 1))
    section = LoraSection(r=2, lora_alpha=4, init_lora_weights=False, target_modules=["q_proj", "k_proj", "v_proj",
                          "o_proj"], target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    return apply_adapter(model, section.peft_config())


def global_batch(case, pool, run):
    """Run ``run``'s ``D * M`` micro-batches, replica ``d``'s ``M`` from ``d * M`` on (``D``: the case's replicas,
    ``DP / cp_size``: the CP ranks of a replica run the same micro-batches, each its slice of their sequence)."""
    n = DP // case.get("cp_size", 1) * case["num_micro"]
    return [pool[(run * n + i) % len(pool)] for i in range(n)]


def pipelined(case, fixture, mesh, emesh, device):
    """This rank's steps: ``(shards, params, losses, {step: grads}, params after the steps, expert shapes held,
    the modules the split froze, the share)``."""
    rank, replica = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    cfg = ScheduleConfig(PP, case["vpp"], case["num_micro"], case["preprocess"],
                         zero_bubble=case.get("zero_bubble", False))
    model = build_model(fixture, case["family"])
    peft_model = adapt(model, case)
    carved = split_model(model, cfg, rank, case.get("layers_per_stage"), case.get("text_layers", 0))
    carved.peft = peft_model
    whole = {n: t.detach().clone() for n, t in carved.model.state_dict().items()} if case.get("wrong_cut") else {}
    shards = shard_experts(carved, model.config, rank, PP, emesh["ep"], emesh["batch"])
    for (name, cut), param in zip(shards.names.items(), shards.params):  # the control: lora_B read as (out, E, r)
        if ".lora_B." in name and whole:
            with torch.no_grad():
                param.copy_(ExpertCut(1, 1, cut.outer, cut.rows, cut.fused).cut(whole[name]))
    EXPERT_W[:] = [{id(p) for p in shards.params}, 0]
    experts = (shards.params, emesh["edp"]) if not case.get("dp_experts") else None
    dp = DataParallel(reduction_mesh(mesh), "shard" if case.get("dp_shard") else "replicate", case.get("bf16", False),
                      experts)  # with cp: over the dp x cp ranks of the stage
    dp.wrap(carved.stages)
    if case.get("cp_size", 1) > 1:  # each CP rank cuts every micro's sequence (Ulysses attention)
        split_sequences(carved.stages.values(), mesh.get_group("cp"))
    params = carved.trainable_parameters(cfg, rank)
    stages, preprocess = (autocast_modules(carved.stages, carved.preprocess, device) if case.get("bf16")
                          else (carved.stages, carved.preprocess))
    executor = PipelineExecutor(cfg, rank, stages, preprocess, mesh.get_group("pp"), device, params.values(),
                                TIMEOUT, carved.tied_parameters(cfg, rank), data_parallel=dp)
    optimizer = torch.optim.AdamW(params.values(), lr=case.get("lr", LR), eps=case.get("adam_eps", EPS))
    pool = fixture["pools"][case["data"]]
    losses, grads = [], {}
    EXCHANGED[:] = [0, 0]
    for step in range(case["steps"]):
        micros = global_batch(case, pool, step)[replica * cfg.num_micro:(replica + 1) * cfg.num_micro]
        load = (lambda m, micros=micros: pack_micro(micros[m]) if case.get("packed") else micros[m])
        losses.append(executor.step(load).loss)
        if step in (0, case["steps"] - 1):
            grads[step] = {n: full(p.grad).detach().clone() for n, p in params.items() if p.grad is not None}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    after = {n: full(p).detach().clone() for n, p in params.items()}
    executor.close()
    held = {n: tuple(t.shape) for n, t in carved.model.state_dict().items() if n in shards.names}
    return shards, params, losses, grads, after, held, carved.frozen, carved


def reference(case, fixture, model, frozen):
    """The unsplit model's losses, first and last step's gradients and weights after the steps (AdamW)."""
    adapt(model, case)
    freeze(model, frozen)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(trainable.values(), lr=case.get("lr", LR), eps=case.get("adam_eps", EPS))
    losses, grads = [], {}
    for step in range(case["steps"]):
        losses.append(reference_run(model, global_batch(case, fixture["pools"][case["data"]], step),
                                    bf16=case.get("bf16", False), order="pipeline"))
        if step in (0, case["steps"] - 1):
            grads[step] = {n: p.grad.clone() for n, p in trainable.items() if p.grad is not None}
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"losses": losses, "grads": grads, "params": {n: p.detach() for n, p in trainable.items()}}


def as_shards(tensors: dict, shards) -> dict:
    """``tensors`` with each fused expert tensor (and expert adapter) cut to this rank's part."""
    return {n: shards.cut(n, t) for n, t in tensors.items()}


def run_case(case, fixture, mesh, emesh, device, out_dir):
    shards, params, losses, grads, after, held, frozen, carved = pipelined(case, fixture, mesh, emesh, device)
    path = os.path.join(out_dir, f"ref-{case['name']}.pt")
    if dist.get_rank() == 0:  # the split freezes the same modules on every rank
        torch.save(reference(case, fixture, build_model(fixture, case["family"]), frozen), path)
    dist.barrier()
    ref = torch.load(path, weights_only=False)  # this run's own file
    steps = case["steps"]
    first = compare_grads(params, grads[0], as_shards(ref["grads"][0], shards))
    last = compare_grads(params, grads[steps - 1], as_shards(ref["grads"][steps - 1], shards))
    want = as_shards(ref["params"], shards)
    param_diff = max(float((t - want[n]).abs().max()) for n, t in after.items())
    dist.barrier()
    if dist.get_rank() == 0:
        os.remove(path)
    fused = {n: [list(cut.fused), cut.dim] for n, cut in shards.names.items()}
    reloaded = reload_check(case, fixture, carved, shards, mesh, out_dir, ref["params"]) if case.get("reload") else {}
    return {**reloaded, "losses": losses, "ref_losses": ref["losses"], "first": first, "last": last,
            "param_diff": param_diff,
            "names": sorted(params), "experts": sorted(shards.names), "held": {n: list(s) for n, s in held.items()},
            "fused": fused, "ep_rank": shards.ep_rank, "exchanges": EXCHANGED[0], "rows_from_peer": EXCHANGED[1], "expert_w": EXPERT_W[1]}


def reload_check(case, fixture, carved, shards, mesh, out_dir, want):
    """The trained share saved as ``PipelineRun.save_weights`` saves a LoRA run (the EP shards fused over the EP
    group on every rank, then replica 0's pipeline writes): the adapter in PEFT's format, and the merged weights.
    Global rank 0 reads the adapter with ``PeftModel.from_pretrained`` into the unsplit model and reports the
    largest difference of its tensors from the one-process run's after the same steps (``want``), and of the
    merged checkpoint's experts from that adapter merged (``merge_and_unload``)."""
    from peft import PeftModel
    rank, replica, group = mesh.get_local_rank("pp"), mesh.get_local_rank("dp"), mesh.get_group("pp")
    cfg = ScheduleConfig(PP, case["vpp"], case["num_micro"], case["preprocess"])
    state = shards.fused(gather_full(carved.state_dict(cfg, rank)), shards.group.get_group())
    adapter_dir, merged_dir = (os.path.join(out_dir, f"{kind}-{case['name']}") for kind in ("adapter", "merged"))
    if replica == 0:
        save_adapter(adapter_dir, carved.peft, {n: t for n, t in state.items() if is_adapter_tensor(n)}, rank, PP,
                     group)
        save_checkpoint(merged_dir, merged_state(carved.model, state), rank, PP, group,
                        carved.model.config.save_pretrained)
    dist.barrier()
    out = {}
    if dist.get_rank() == 0:
        base = build_model(fixture, case["family"]).state_dict()
        loaded = PeftModel.from_pretrained(build_model(fixture, case["family"]), adapter_dir)
        got = {n.removeprefix("base_model.model."): p.detach() for n, p in loaded.named_parameters()
               if is_adapter_tensor(n)}
        out["adapter_keys"] = sorted(got) == sorted(n for n in want if is_adapter_tensor(n))
        out["adapter_diff"] = max(float((t - want[n]).abs().max()) for n, t in got.items())
        merged = type(loaded.base_model.model).from_pretrained(merged_dir).state_dict()
        expected = loaded.merge_and_unload().state_dict()
        experts = [n for n in expected if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
        out["merged_keys"] = sorted(merged) == sorted(expected)
        out["merged_diff"] = max(float((merged[n] - expected[n]).abs().max()) for n in expected)
        out["merged_experts_moved"] = min(float((expected[n] - base[n]).abs().max()) for n in experts)
    dist.barrier()
    return out


def _replica_executor(case, fixture, mesh, emesh, device):
    """``(rank, replica, cfg, carved, shards, params, executor)``: one EP replica's split, its experts sharded over
    the EP group and a replicated data-parallel engine, and its executor (the failure cases' set-up)."""
    rank, replica = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    cfg = ScheduleConfig(PP, case["vpp"], case["num_micro"], case["preprocess"])
    model = build_model(fixture, case["family"])
    carved = split_model(model, cfg, rank, case.get("layers_per_stage"), case.get("text_layers", 0))
    shards = shard_experts(carved, model.config, rank, PP, emesh["ep"], emesh["batch"])
    dp = DataParallel(mesh["dp"], "replicate", False, (shards.params, emesh["edp"], shards.group))
    dp.wrap(carved.stages)
    params = carved.trainable_parameters(cfg, rank)
    executor = PipelineExecutor(cfg, rank, carved.stages, carved.preprocess, mesh.get_group("pp"), device,
                                params.values(), TIMEOUT, carved.tied_parameters(cfg, rank), data_parallel=dp)
    return rank, replica, cfg, carved, shards, params, executor


def _reference_loss(case, fixture, pool, out_dir) -> float:
    """The unsplit model's loss over step 1's batch, run once by rank 0 and read by every rank."""
    path = os.path.join(out_dir, f"ref-{case['name']}.pt")
    if dist.get_rank() == 0:
        torch.save(reference_run(build_model(fixture, case["family"]), global_batch(case, pool, 1), order="pipeline"),
                   path)
    dist.barrier()
    ref = torch.load(path, weights_only=False)  # this run's own file
    dist.barrier()
    return float(ref)


def failing(case, fixture, mesh, emesh, device, out_dir):
    """Step 0 fails on one rank mid-forward (replica 0's last stage rank raises in its second call of its first
    experts module) while its EP peer waits in that layer's all-to-all: every rank raises the first error within
    seconds (the watchdog breaks the EP group; the pipeline's timeout is 60 s), then an evaluation and step 1 run
    on a renewed EP group, the evaluation's loss and the step's the unsplit model's over step 1's batch."""
    import time
    rank, replica, cfg, carved, shards, params, executor = _replica_executor(case, fixture, mesh, emesh, device)
    if replica == 0 and rank == PP - 1:
        module = carved.model.get_submodule(sorted(shards.names)[0].rpartition(".")[0])
        calls, forward = [0], module.forward

        def broken(*args):
            calls[0] += 1
            if calls[0] == 2:
                raise ValueError("an injected failure in an experts module")
            return forward(*args)
        module.forward = broken
    pool = fixture["pools"][case["data"]]
    loads = [lambda m, s=s: global_batch(case, pool, s)[replica * cfg.num_micro + m] for s in range(2)]
    start, error = time.perf_counter(), None
    try:
        executor.step(loads[0])
    except ValueError as err:
        error = str(err)
    failed_s = time.perf_counter() - start
    for p in params.values():
        p.grad = None
    # an evaluation right after the failed step (the EP group made anew before its loads), then the next step
    evaluated = torch.tensor(executor.evaluate(loads[1]), dtype=torch.float64)
    dist.all_reduce(evaluated, group=mesh.get_group("dp"))
    loss = executor.step(loads[1]).loss
    executor.close()
    ref = _reference_loss(case, fixture, pool, out_dir)
    return {"error": error, "failed_s": failed_s, "loss": loss, "ref_loss": ref,
            "eval_loss": float(evaluated[0] / evaluated[1])}


def drifting(case, fixture, mesh, emesh, device, out_dir):
    """The EP replicas given different row counts for step 0: replica 1 runs ``M - 1`` micro-batches
    (``num_micro``), replica 0 all ``M``, so their all-to-alls would pair different micro-batches. Every rank must
    refuse the step by name before any all-to-all (the step's vote agrees on ``num_micro``), within seconds, not
    after the 60 s timeout; the next step, the same on both, then runs as on one process over its batch."""
    import time
    from mpipe_hf.runtime.preload import ScheduleMismatch
    rank, replica, cfg, carved, shards, params, executor = _replica_executor(case, fixture, mesh, emesh, device)
    pool = fixture["pools"][case["data"]]
    loads = [lambda m, s=s: global_batch(case, pool, s)[replica * cfg.num_micro + m] for s in range(2)]
    start, error, exchanged = time.perf_counter(), None, EXCHANGED[0]
    try:
        executor.step(loads[0], num_micro=cfg.num_micro - 1 if replica == 1 else None)
    except ScheduleMismatch as err:
        error = str(err)
    failed_s, exchanged = time.perf_counter() - start, EXCHANGED[0] - exchanged
    loss = executor.step(loads[1]).loss
    executor.close()
    ref = _reference_loss(case, fixture, pool, out_dir)
    return {"error": error, "failed_s": failed_s, "exchanged": exchanged, "loss": loss, "ref_loss": ref}


def watching_views(run, case, *args) -> dict:
    """``run(case, *args)``'s result with ``view_warnings``: the distinct warnings, each recorded however often it
    came, that a module returned a view tensor (FSDP2 warns when a wrapped stage does: an in-place op on it would
    drop the unit's pre-backward hook). Other warnings are shown, each once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = run(case, *args)
    shown = set()
    for w in caught:
        key = (str(w.message), w.category, w.filename, w.lineno)
        if "returned a view tensor" not in key[0] and key not in shown:
            shown.add(key)
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return {**res, "view_warnings": sorted({str(w.message)[:100] for w in caught
                                            if "returned a view tensor" in str(w.message)})}


def main():
    fixture_path, out_dir, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    device = init_distributed()
    fixture = torch.load(fixture_path, weights_only=False)
    mesh = build_mesh(PP, DP)
    meshes = {1: (mesh, expert_mesh(mesh, EP))}
    for cp in sorted({c.get("cp_size", 1) for c in cases} - {1}):  # (dp, cp, pp): EP over the dp x cp ranks
        cp_mesh = build_mesh(PP, DP // cp, "pp_inner", cp)
        meshes[cp] = (cp_mesh, expert_mesh(cp_mesh, EP))
    kinds = {"fail": failing, "drift": drifting}
    run_cases(cases, lambda case: watching_views(next((kinds[k] for k in kinds if case.get(k)), run_case), case,
                                                 fixture, *meshes[case.get("cp_size", 1)], device, out_dir),
              out_dir, dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
