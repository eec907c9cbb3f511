"""torchrun worker: pipelined steps vs the unsplit Hugging Face model on one process, for many cases in one
process group.

Usage: torchrun --nproc_per_node R numerics_worker.py FIXTURE OUT_DIR CASES_JSON

A case (see matrix.py) names the model (a config of the fixture), the data pool, the schedule and, optionally:
``steps`` (AdamW steps; parameters are compared after the last one), ``accumulate`` (schedule runs per optimizer
step; gradients add up), ``bad_micro`` (a micro with a wrong image-token count, rejected at load), ``corrupt_owner``
(a rank whose load meets an undecodable image), ``mid_step_owner`` (a rank whose micro passes its load but makes
rank 0's stage 0 raise), ``lookahead`` (placement ``fill``: each run loads the next run's micros), ``reload``
(after the steps, save the checkpoint and load it with ``from_pretrained``), ``owners`` (load-aware owners:
``"reversed"``, micro ``m`` to rank ``NT - 1 - m % NT``, or ``"balanced"``, LPT over each run's real image-token
counts; every rank computes them from the same micro-batches), ``bad_rows`` (the micro-batches are
collated from rows on their owners, two rows with an image that does not decode: row_cases.py).
A failing step runs first; the measured steps follow on other micro-batches.

The pipeline runs on every rank; rank 0 then runs the unsplit reference (same micro-batches, same frozen modules,
same optimizer) and saves it; every rank compares its own parameters. Each rank writes OUT_DIR/rank{r}.json.
"""

import copy
import io
import json
import os
import shutil
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from PIL import Image
from transformers import CONFIG_MAPPING

from common import case_freeze, run_cases
from reference import hf_inputs, reference_run
from mpipe_hf.models.tiny import non_degenerate
from controls import negative_controls, tamper_grads
from row_cases import RowCase
from mpipe_hf.data.packing import pack_micro
from mpipe_hf.models import split as split_model
from mpipe_hf.models.base import freeze
from mpipe_hf.models.context_parallel_stages import split_sequences
from mpipe_hf.models.tower_division import divide_towers
from mpipe_hf.runtime import PipelineExecutor, build_mesh, init_distributed
from mpipe_hf.runtime.data_parallel import DataParallel
from mpipe_hf.runtime.mesh import reduction_mesh
from mpipe_hf.runtime.zero_bubble import WeightWork
from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.schedule.interleaved import peak_in_flight
from mpipe_hf.schedule.owners import balance_owners
from mpipe_hf.schedule.swap import SwapConfig
from mpipe_hf.train.checkpoint import save_checkpoint
from mpipe_hf.train.precision import autocast_modules

LR = 1e-3
EPS = 1e-6  # AdamW's eps: with 1e-8, fp32 noise on near-zero gradient elements becomes a visible part of LR
TIMEOUT = timedelta(seconds=60)
SEED = 7  # the executor's: P's dropout masks are drawn from it
# activation swap cases (``case["swap"]``): every tensor of every rank, or rank 0 only
SWAPS = {"all": SwapConfig(enabled=True, min_bytes=0), "rank0": SwapConfig(enabled=True, ranks=[0], min_bytes=0),
         "never": SwapConfig(enabled=True, min_swap_gap=10 ** 6, min_bytes=0), "off": SwapConfig()}


def auto_class(config):
    from mpipe_hf.models.materialize import model_class
    return model_class(config)


def build_model(fixture, family, dropout=0.0, attn=None, keep_zero_init=False):
    """The fixture's config ``family`` as its real HF model class, random weights (seed 0), every weight the model
    initialises to zeros drawn afresh (:func:`mpipe_hf.models.tiny.non_degenerate`; ``keep_zero_init``: kept, a negative
    control); ``dropout``: the vision tower's attention dropout; ``attn``: the attention implementation (``None``:
    transformers' default)."""
    raw = copy.deepcopy(fixture["configs"][family])
    if dropout:
        raw["vision_config"]["attention_dropout"] = dropout
    config = CONFIG_MAPPING[raw["model_type"]].from_dict(raw)
    torch.manual_seed(0)
    model = auto_class(config).from_config(config, **({"attn_implementation": attn} if attn else {}))
    return model if keep_zero_init else non_degenerate(model)


def reload_check(case, split, cfg, rank, group, pp_size, out_dir, ref, micro):
    """Save the trained split as a checkpoint; rank 0 loads it with ``from_pretrained`` and reports, for every
    rank, the parameters that differ from that rank's trained ones (each rank's share gathered to rank 0), the
    keys the load missed or did not expect, and the largest logit difference against the one-process reference
    trained the same way. The other ranks report nothing to check (one load, not one per rank)."""
    ckpt = os.path.join(out_dir, f"ckpt-{case['name']}")
    trained = split.state_dict(cfg, rank)
    save_checkpoint(ckpt, trained, rank, pp_size, group, split.model.config.save_pretrained)
    shares = [None] * pp_size if rank == 0 else None
    dist.gather_object(trained, shares, group=group, group_dst=0)
    out = {"reload_differs": [], "reload_keys": []}
    if rank == 0:
        loaded, info = auto_class(split.model.config).from_pretrained(ckpt, output_loading_info=True)
        state = loaded.state_dict()
        out["reload_differs"] = [f"rank {r}: {n}" for r, share in enumerate(shares) for n, t in share.items()
                                 if not torch.equal(t, state[n])]
        out["reload_keys"] = sorted(info["missing_keys"]) + sorted(info["unexpected_keys"])
        inputs = hf_inputs(ref, {k: v for k, v in micro.items() if k != "labels"})
        with torch.no_grad():
            out["reload_logit_diff"] = float((loaded(**inputs).logits - ref(**inputs).logits).abs().max())
    dist.barrier(group=group)
    if rank == 0:
        shutil.rmtree(ckpt)
    return out


def micro_batches(case, pool, run):
    """The micro-batches of schedule run ``run`` (0, 1, ...): consecutive, wrapping around the pool."""
    start = (case.get("offset", 0) + run * case["num_micro"]) % len(pool)
    return [pool[(start + i) % len(pool)] for i in range(case["num_micro"])]


def run_owners(case, cfg, micros, image_token_id):
    """The owners of one schedule run's ``micros`` under ``case["owners"]`` (``None``: ``m % NT``): ``reversed``
    or ``balanced`` by each micro's image tokens, which every rank counts from the same micro-batches."""
    kind, nt = case.get("owners"), cfg.num_owners
    if kind is None:
        return None
    if kind == "reversed":
        return tuple(nt - 1 - m % nt for m in range(cfg.num_micro))
    return balance_owners([int((mb["input_ids"] == image_token_id).sum()) for mb in micros], nt)


def corrupt_tokens(mb, image_token_id):
    """Drop one image token: the image-token count no longer matches the features."""
    mb = dict(mb)
    ids = mb["input_ids"].clone()
    first = (ids == image_token_id).nonzero()[0]
    ids[tuple(first)] = 0
    mb["input_ids"] = ids
    return mb


def failing_step(case, executor, split, cfg, rank, micros, image_token_id):
    """Run a step that must fail; return (error text, seconds until this rank raised)."""
    if "bad_micro" in case:
        broken = {case["bad_micro"]: corrupt_tokens(micros[case["bad_micro"]], image_token_id)}
    elif "mid_step_owner" in case:
        m = cfg.owned(case["mid_step_owner"])[0]
        broken = {m: corrupt_tokens(micros[m], image_token_id)}
    else:
        broken = {}

    def load(m):
        if cfg.owner(m) == case.get("corrupt_owner"):
            Image.open(io.BytesIO(b"these bytes are not an image")).convert("RGB")  # raises: undecodable image
        mb = broken.get(m, micros[m])
        if "mid_step_owner" not in case:
            split.validate_micro(mb)
        return mb
    start, sent = time.perf_counter(), sum(executor.p2p.bytes_sent.values())
    after = {}
    try:
        executor.step(load)
    except Exception as err:  # noqa: BLE001 - the text is the result
        error = f"{type(err).__name__}: {err}"
    else:
        error = None
    after["error_after_s"] = time.perf_counter() - start
    after["failed_step_sent_bytes"] = sum(executor.p2p.bytes_sent.values()) - sent
    after["failed_step_broke_groups"] = executor.broken
    if executor.ended is not None:  # no in-process recovery (NCCL's policy): later steps are refused
        try:
            executor.step(load)
        except RuntimeError as err:
            after["next_step_refused"] = str(err)
    return error, after


CLOSED_GROUPS: set[str] = set()  # names of the groups of the executors this worker closed
DEFERRED = [0]  # W actions that computed weight gradients their B left (zero-bubble cases), counted here
_weight_run = WeightWork.run


def _counted_run(self):
    DEFERRED[0] += bool(self.groups)
    _weight_run(self)


WeightWork.run = _counted_run


CP_MESHES = {}  # cp_size -> the (dp 1, cp, pp) mesh of the world, made once per launch


def context_parallel(case, group, rank, pp_size):
    """A case's pipeline group, stage rank, pipeline size and context parallelism: with ``case["cp_size"]`` the
    world's ``(cp, pp)`` mesh (its pipeline group, and ``(CP group, DataParallel over the CP ranks)``, whose
    reduction sums the CP ranks' loss figures and gradients); else the launch's, and ``None``."""
    cp = case.get("cp_size", 1)
    if cp == 1:
        return group, rank, pp_size, None
    if cp not in CP_MESHES:
        CP_MESHES[cp] = build_mesh(dist.get_world_size() // cp, 1, "pp_inner", cp)
    mesh = CP_MESHES[cp]
    reducer = DataParallel(reduction_mesh(mesh), "replicate", cp_size=cp)  # one replica of cp ranks
    return mesh.get_group("pp"), mesh.get_local_rank("pp"), mesh["pp"].size(), (mesh.get_group("cp"), reducer)


def run_case(case, fixture, group, rank, device, pp_size, out_dir):
    group, rank, pp_size, cp = context_parallel(case, group, rank, pp_size)
    with negative_controls(case):
        return _run_case(case, fixture, group, rank, device, pp_size, out_dir, cp)


def _run_case(case, fixture, group, rank, device, pp_size, out_dir, cp=None):
    cfg = ScheduleConfig(pp_size, case["vpp"], case["num_micro"], case["preprocess"], case.get("overflow", "full"),
                         case.get("owner_backward", False), case.get("less_memory", False),
                         case.get("placement", "prefix"), zero_bubble=case.get("zero_bubble", False))
    pool = fixture["pools"][case["data"]]
    steps, accumulate = case.get("steps", 1), case.get("accumulate", 1)
    model = build_model(fixture, case["family"], case.get("dropout", 0.0), case.get("attn"),
                        case.get("keep_zero_init", False))
    lead = rank == 0 and (cp is None or dist.get_rank(cp[0]) == 0)  # runs the reference
    ref = copy.deepcopy(model) if lead else None
    split = split_model(model, cfg, rank, case.get("layers_per_stage"), case.get("text_layers", 0))
    if cp is not None:  # each CP rank's stages cut every micro's sequence; its attention is Ulysses'
        split_sequences(split.stages.values(), cp[0])
        divide_towers(split.preprocess, cp[0])  # each CP rank's P runs its share of the tower's images and frames
    case_freeze(split.model, case, split.frozen, split.tied)  # the freeze / trainable patterns, on this rank's share
    params = split.trainable_parameters(cfg, rank)
    stages, preprocess = (autocast_modules(split.stages, split.preprocess, device) if case.get("bf16")
                          else (split.stages, split.preprocess))
    swap = SWAPS[case["swap"]] if case.get("swap") else None  # activation swap
    if case.get("gradient_checkpointing"):
        split.model.activation_checkpointing_enable({"use_reentrant": False})
    executor = PipelineExecutor(cfg, rank, stages, preprocess, group, device, params.values(), TIMEOUT,
                                split.tied_parameters(cfg, rank), seed=SEED, swap=swap,
                                measure_memory=swap is not None,
                                loss_normalization="micro" if case.get("order") == "micro" else "tokens",
                                data_parallel=cp[1] if cp is not None else None)
    if case.get("recover") is False:  # NCCL's policy, on gloo: a step failed mid-transfer ends the executor
        executor.recover = False
    optimizer = torch.optim.AdamW(params.values(), lr=case.get("lr", LR), eps=case.get("adam_eps", EPS)) if params else None
    result, loads = {"reused_groups": executor.group.group_name in CLOSED_GROUPS}, []
    failing = any(k in case for k in ("bad_micro", "corrupt_owner", "mid_step_owner"))
    if failing:
        result["error"], after = failing_step(
            case, executor, split, cfg, rank, micro_batches(case, pool, steps * accumulate),
            getattr(model.config, "image_token_id", None))
        result.update(after)
        if executor.ended is not None:  # the run would restart: the measured steps run on a new executor
            executor = PipelineExecutor(cfg, rank, stages, preprocess, group, device, params.values(), TIMEOUT,
                                        split.tied_parameters(cfg, rank), seed=SEED, swap=swap,
                                        measure_memory=swap is not None)
        result["grads_after_error"] = sorted(n for n, p in params.items() if p.grad is not None)

    rows = RowCase(model.config, out_dir, rank, cfg.num_micro, split.validate_micro) if case.get("bad_rows") else None

    def micros_of(run):  # the reference's micro-batches of schedule run ``run``
        return rows.reference(run) if rows is not None else micro_batches(case, pool, run)
    losses, grads, peaks, owned_all = [], {}, set(), []  # grads: {step: {name: gradient}}
    updates = []  # per optimizer step, {name: p_t - p_(t-1)}
    token_id = getattr(model.config, "image_token_id", None)

    def owners_of(run):
        return run_owners(case, cfg, micro_batches(case, pool, run), token_id)
    deferred = DEFERRED[0]

    def loader(run):
        micros = micro_batches(case, pool, run)

        def load(m):
            loads.append(m)
            if rows is not None:  # read from the rows: a bad one is dropped
                return rows.load(run, m)
            micro = pack_micro(micros[m]) if case.get("packed") else micros[m]  # one sequence
            split.validate_micro(micro)
            return micro
        return load
    for step in range(steps):
        for a in range(accumulate):
            run = step * accumulate + a
            ahead = case.get("lookahead") and run + 1 < steps * accumulate  # load the next run's micros now
            owners = owners_of(run)
            stats = executor.step(loader(run), loader(run + 1) if ahead else None, owners=owners,
                                  next_owners=owners_of(run + 1) if ahead else None,
                                  bad_rows=rows.take if rows is not None else None)
            result.setdefault("bad_rows", []).append([stats.bad_rows, stats.bad_row])
            if rows is not None:  # every rank learns the rows that failed on any rank
                rows.remember(executor, stats.bad_rows)
            owned_all += [m for m in range(cfg.num_micro) if (owners[m] if owners else cfg.owner(m)) == rank]
            losses.append(stats.loss)
            result.setdefault("aux_losses", []).append(stats.aux_loss)
            if swap is not None:  # what this rank's swap manager moved, and the peak on the device
                result.setdefault("swap_offloaded_bytes", []).append(
                    executor.swap.offloaded_bytes if executor.swap is not None else 0)
                result.setdefault("peak_activation_bytes", []).append(stats.rank_activation_bytes[rank])
            peaks.add(stats.peak_activations)
        tamper_grads(case, params, step)
        if step in (0, steps - 1):  # the first step's gradients, and the last's (after AdamW steps)
            grads[step] = {n: p.grad.clone() for n, p in params.items() if p.grad is not None}
        if steps > 1 and optimizer is not None:  # a rank whose layers are all frozen has none
            before = {n: p.detach().clone() for n, p in params.items()}
            if not (case.get("skip_last_step") and step == steps - 1):  # a negative control: the step lost
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            updates.append({n: p.detach() - before[n] for n, p in params.items()})
    result["loads"] = loads
    result["dropped_here"] = rows.dropped if rows is not None else []
    result["failed_rows"] = rows.failed if rows is not None else []
    result["deferred_weights"] = DEFERRED[0] - deferred
    result["order"] = [str(a) for a in executor.order]
    result["bytes_sent"] = dict(executor.p2p.bytes_sent)
    result["stray_first_uses"] = [list(map(str, use)) for use in executor.p2p.stray_first_uses()]
    result["owned_bytes"], result["owned_image_tokens"] = {}, 0
    image_token_id = getattr(model.config, "image_token_id", None)
    for m in (cfg.owned(rank) if rank else []):  # raw bytes of this rank's micros, counted from the data itself
        for key, t in micro_batches(case, pool, 0)[m].items():
            result["owned_bytes"][key] = result["owned_bytes"].get(key, 0) + t.numel() * t.element_size()
        if image_token_id is not None:
            result["owned_image_tokens"] += int((micro_batches(case, pool, 0)[m]["input_ids"] == image_token_id).sum())

    ref_path = os.path.join(out_dir, f"ref-{case['name']}.pt")
    if lead:
        freeze(ref, split.frozen)
        case_freeze(ref, case)
        # a tied weight is one parameter under two names here, and two copies in the pipeline: list both names
        trainable = {n: p for n, p in ref.named_parameters(remove_duplicate=not split.tied) if p.requires_grad}
        ref_opt = torch.optim.AdamW([p for n, p in ref.named_parameters() if p.requires_grad], lr=case.get("lr", LR),
                                    eps=case.get("adam_eps", EPS))
        ref_losses, ref_grads, ref_updates = [], {}, []
        for step in range(steps):
            for a in range(accumulate):
                run = step * accumulate + a
                seeds = (ref.model.vision_tower, SEED, run) if case.get("dropout") else None
                ref_losses.append(reference_run(ref, micros_of(run), seeds, case.get("bf16", False),
                                                case.get("order", "hf")))
            if step in (0, steps - 1):
                ref_grads[step] = {n: p.grad.clone() for n, p in trainable.items() if p.grad is not None}
            if steps > 1:
                before = {n: p.detach().clone() for n, p in trainable.items()}
                ref_opt.step()
                ref_opt.zero_grad(set_to_none=True)
                ref_updates.append({n: p.detach() - before[n] for n, p in trainable.items()})
        torch.save({"losses": ref_losses, "grads": ref_grads, "names": sorted(trainable), "updates": ref_updates,
                    "params": {n: p.detach() for n, p in trainable.items()}}, ref_path)
    dist.barrier(group=group if cp is None else None)  # with CP every pipeline reads the reference
    reference = torch.load(ref_path, weights_only=False)  # this run's own file: the C unpickler, 2.5x faster
    first = compare_grads(params, grads[0], reference["grads"][0])
    result["last_step_grads"] = compare_grads(params, grads[steps - 1], reference["grads"][steps - 1]) \
        if steps > 1 else None
    param_diff = max((float((p.detach() - reference["params"][n]).abs().max()) for n, p in params.items()),
                     default=0.0) if steps > 1 else None
    result["update_stats"] = compare_updates(params, updates, reference["updates"]) if steps > 1 else None
    if case.get("reload"):
        result.update(reload_check(case, split, cfg, rank, group, pp_size, out_dir, ref, micro_batches(case, pool, 0)[0]))
    dist.barrier(group=group if cp is None else None)
    if lead:
        os.remove(ref_path)  # tens of MB per case
    CLOSED_GROUPS.add(executor.group.group_name)
    executor.close()  # the next case's executor runs on these groups
    result.update(peak_activations=sorted(peaks), expected_peak=peak_in_flight(executor.order), losses=losses,
                  ref_losses=reference["losses"], **first,
                  param_diff=param_diff, names=sorted(params), ref_names=reference["names"],
                  owned=cfg.owned(rank), owned_all=owned_all,
                  owners=[owners_of(r) for r in range(steps * accumulate)])
    return result


def compare_grads(params, mine_all, ref_all) -> dict:
    """This rank's gradients against the reference's, per tensor of ``params``: the largest difference
    (``max_diff``, ``worst``), the largest relative norm, the largest difference in units of the scaled per-tensor
    tolerance 1e-5 + 1e-5 * max|ref| (``grad_scaled``), and ``grad_stats``: ``{name: [max|ref|, max diff]}`` for
    the tensors both sides have (what the margin and relative checks of ``matrix.check_case`` read)."""
    worst, max_diff, rel_norm, scaled, stats = None, 0.0, 0.0, (0.0, None), {}
    for name in params:
        mine, theirs = mine_all.get(name), ref_all.get(name)
        if mine is None or theirs is None:
            diff = 0.0 if mine is None and theirs is None else float("inf")
            scaled = max(scaled, (diff, name), key=lambda x: x[0])
        else:
            diff, top = float((mine - theirs).abs().max()), float(theirs.abs().max())
            rel_norm = max(rel_norm, float((mine - theirs).norm() / theirs.norm().clamp_min(1e-30)))
            scaled = max(scaled, (diff / (1e-5 + 1e-5 * top), name), key=lambda x: x[0])
            stats[name] = [top, diff]
        if diff >= max_diff:
            worst, max_diff = name, diff
    return dict(max_diff=max_diff, worst=worst, grad_rel_norm=rel_norm, grad_scaled=scaled[0],
                grad_scaled_worst=scaled[1], grad_stats=stats)


def compare_updates(params, mine, ref) -> list[dict[str, list[float]]]:
    """Each optimizer step's update ``p_t - p_(t-1)`` of this rank's ``params`` against the reference's, per
    tensor, as root mean squares over its elements: ``[{name: [rms(ref update), rms(update - ref update),
    rms(p)]}]`` (``p`` after the last step), one dict per step, three floats per tensor (what
    ``matrix.update_problems`` reads). An update the reference has and this rank lacks (or the other way round)
    differs by ``inf``. A rank without an optimizer (every layer frozen) has no steps."""
    def rms(t):
        return float(t.norm()) / t.numel() ** 0.5
    stats = []
    for step, theirs in enumerate(ref[:len(mine)]):
        out = {}
        for name, param in params.items():
            a, b = mine[step].get(name), theirs.get(name)
            out[name] = ([0.0, float("inf"), 0.0] if a is None or b is None
                         else [rms(b), rms(a - b), rms(param.detach())])
        stats.append(out)
    return stats


def main():
    fixture_path, out_dir, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    device = init_distributed()
    fixture = torch.load(fixture_path, weights_only=False)
    pp_size = int(os.environ["WORLD_SIZE"])
    mesh = build_mesh(pp_size)
    group, rank = mesh.get_group("pp"), mesh.get_local_rank("pp")
    run_cases(cases, lambda case: run_case(case, fixture, group, rank, device, pp_size, out_dir), out_dir, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
