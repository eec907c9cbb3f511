"""The rows that compare the pipeline with one process: the split Qwen2.5-VL (trainable ``P``) against the
unsplit HF model in fp32 under deterministic algorithms (loss and every gradient, atol 1e-5), and FSDP2 on a
one-rank mesh in bf16 with LoRA, through the executor, against the unsplit model on one process under
autocast."""

from __future__ import annotations

import contextlib
import copy
import warnings

import torch

from .common import Row, Setup, closing, drop_grads, executor_for, pinned

SPLIT = "split vs unsplit (deterministic)"
FSDP = "fsdp2 one-rank bf16 lora"
FSDP_OWN = "fsdp2 one-rank bf16 lora own autocast"
ATOL = 1e-5
# bf16 keeps 8 significant bits: two results that round one bf16 cast apart differ by 2**-8 of its magnitude.
# The FSDP2 path and one process make the same casts of the same values (the bf16 all-gather is the cast autocast
# makes), so they should agree to fp32 summation order; two bf16 ulps of the largest gradient is the bound.
BF16_REL = 2.0 ** -7


@contextlib.contextmanager
def deterministic(device: torch.device):
    """``torch.use_deterministic_algorithms(True)`` (ops without a deterministic kernel warn; the row lists
    them) and no TF32 in matmuls or cuDNN convolutions, restored on the way out. ``CUBLAS_WORKSPACE_CONFIG`` is
    set by ``gpu_check.py`` before CUDA starts. Yields the list the warnings land in."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[2], saved[3]


def reference(model, micros: list[dict], bf16: bool, device: torch.device) -> float:
    """Loss of ``model`` (unsplit, one process) over the step's ``micros``, normalised by the step's label tokens;
    gradients land in ``.grad``. Each micro's summed token loss is backpropagated and the gradients divided once
    at the end, the pipeline's order of operations; ``bf16``: each forward under bf16 autocast."""
    total = sum(int((mb["labels"][..., 1:] != -100).sum()) for mb in micros)
    vocab, loss_sum = model.config.get_text_config().vocab_size, 0.0
    for mb in micros:
        mb = {k: v.to(device) for k, v in mb.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(**{k: v for k, v in mb.items() if k != "labels"}).logits
            loss = model.loss_function(logits=logits, labels=mb["labels"], vocab_size=vocab, num_items_in_batch=1)
        loss.backward()
        loss_sum += float(loss.detach())
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(total)
    return loss_sum / total


def compare(grads: dict, ref: dict) -> tuple[float, float, str | None, list]:
    """``(max abs diff, max diff over its tensor's max |ref|, worst name, names on one side only)``."""
    worst, diff, rel = None, 0.0, 0.0
    one_side = sorted(set(grads) ^ set(ref))
    for name in set(grads) & set(ref):
        d = float((grads[name].float() - ref[name].float()).abs().max())
        rel = max(rel, d / max(float(ref[name].abs().max()), 1e-30))
        if d >= diff:
            worst, diff = name, d
    return diff, rel, worst, one_side


def full(grad: torch.Tensor) -> torch.Tensor:
    """A gradient as a plain tensor (an FSDP2 DTensor gathered)."""
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def split_row(setup: Setup) -> Row:
    """The split model (``R = 1, V = 2``, ``P`` trainable: the vision tower's gradients too) against the unsplit
    Qwen2.5-VL on one process, fp32, deterministic algorithms: the loss and every gradient within atol 1e-5."""
    from mpipe_hf.models import split
    from mpipe_hf.schedule import ScheduleConfig
    from .families import build_model, micro_batches
    model = build_model("tiny_qwen2_5_vl_config").to(setup.device).train()
    ref = copy.deepcopy(model)
    micros = [pinned(mb, setup.device) for mb in micro_batches(model.config, "padded")]
    cfg = ScheduleConfig(1, 2, len(micros), "trainable")
    carved = split(model, cfg, 0)
    with deterministic(setup.device) as caught:
        ex, params = executor_for(carved, cfg, setup.device)
        with closing(ex):
            stats = ex.step(micros.__getitem__)
        ref_loss = reference(ref, micros, False, setup.device)
    grads = {n: p.grad for n, p in params.items() if p.grad is not None}
    if setup.broken(SPLIT):
        name = sorted(grads)[0]
        grads[name] = grads[name] + 1e-3
    names = {n for n, p in ref.named_parameters() if p.grad is not None}
    diff, rel, worst, one_side = compare(grads, {n: p.grad for n, p in ref.named_parameters() if n in names})
    loss_diff = abs(stats.loss - ref_loss)
    ok = diff <= ATOL and loss_diff <= ATOL and not one_side
    nondet = sorted({str(w.message).split(" does not have")[0][:60] for w in caught
                     if "deterministic" in str(w.message)})
    figures = (f"{len(grads)} gradients, max diff {diff:.2e} ({worst}), loss diff {loss_diff:.2e}, atol {ATOL:g}, "
               f"fp32 on {setup.device.type}" + (f"; only one side: {one_side[:3]}" if one_side else "")
               + (f"; no deterministic kernel: {nondet[:3]}" if nondet else ""))
    return Row(SPLIT, "PASS" if ok else "FAIL", figures,
               {"max_grad_diff": diff, "max_grad_rel": rel, "worst": worst, "loss_diff": loss_diff,
                "one_side": one_side, "nondeterministic": nondet})


def lora_model(setup: Setup):
    """A Qwen2 decoder (``--hidden``, ``--layers``, ``--vocab``) with LoRA on every projection, its ``lora_B``
    drawn at random (PEFT starts them at zero, which would leave every ``lora_A`` gradient zero)."""
    from peft import LoraConfig
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from mpipe_hf.models.adapters import apply_adapter
    args = setup.args
    heads = max(1, args.hidden // 64)
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=heads,
                         num_key_value_heads=1 if heads == 1 else 2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    apply_adapter(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    return model.to(setup.device).train()


def one_rank_fsdp(stages: dict, device: torch.device):
    """:class:`~mpipe_hf.runtime.data_parallel.DataParallel` ``shard`` with ``bf16`` over a one-rank ``dp`` mesh,
    its stage chunks wrapped by FSDP2 as with replicas. The library wraps only when ``dp`` has more than one
    replica (:meth:`~mpipe_hf.runtime.data_parallel.DataParallel.wrap`): the row lets it wrap here."""
    from torch.distributed.device_mesh import init_device_mesh
    from mpipe_hf.runtime.data_parallel import DataParallel
    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp",))
    dp = DataParallel(mesh, "shard", bf16=True)
    dp.size = 2  # wrap's own guard: "more than one replica"
    try:
        dp.wrap(stages)
    finally:
        dp.size = 1
    return dp


def fsdp_row(setup: Setup) -> Row:
    """FSDP2 on a one-rank mesh, bf16 units with fp32 reduction, LoRA, through the executor, its autocast set by
    the row to a region per stage call (as the executor runs under FSDP2 with replicas), against the unsplit model
    on one process under per-micro autocast: every LoRA gradient, max difference relative to the tensor's largest,
    PASS within two bf16 ulps (:data:`BF16_REL`)."""
    return fsdp_case(setup, FSDP, own=False)


def fsdp_own_row(setup: Setup) -> Row:
    """:func:`fsdp_row` with the executor's own choice of autocast region (nothing set by the row, the replicas'
    count the mesh's own): PASS also needs that choice to be a region per stage call (``autocast`` ``None``)."""
    return fsdp_case(setup, FSDP_OWN, own=True)


def fsdp_case(setup: Setup, check: str, own: bool) -> Row:
    """The FSDP2 rows (:func:`fsdp_row`, :func:`fsdp_own_row`); ``own``: the executor chooses its autocast."""
    from mpipe_hf.models import split
    from mpipe_hf.schedule import ScheduleConfig
    from .perf import bench
    model = lora_model(setup)
    ref = copy.deepcopy(model)
    micros = bench(setup).micros
    cfg = ScheduleConfig(1, 2, len(micros), "identity")
    carved = split(model, cfg, 0)
    dp = one_rank_fsdp(carved.stages, setup.device)
    ex, params = executor_for(carved, cfg, setup.device, bf16=True, data_parallel=dp)
    if not own:
        ex.autocast = None  # under FSDP2 the executor keeps a region per stage call (runtime/casts.py says why)
    chosen = str(ex.autocast)
    with closing(ex):
        stats = ex.step(micros.__getitem__)
    ref_loss = reference(ref, micros, True, setup.device)
    grads = {n: full(p.grad) for n, p in params.items() if p.grad is not None}
    if setup.broken(check):
        name = sorted(grads)[0]
        grads[name] = grads[name] * 1.05
    ref_grads = {n: p.grad for n, p in ref.named_parameters() if p.requires_grad and p.grad is not None}
    diff, rel, worst, one_side = compare(grads, ref_grads)
    sharded = sum(hasattr(p, "full_tensor") for p in params.values())
    loss_rel = abs(stats.loss - ref_loss) / max(abs(ref_loss), 1e-30)
    ok = rel <= BF16_REL and loss_rel <= BF16_REL and not one_side and sharded == len(params) > 0 and (
        chosen == "None" or not own)
    drop_grads(params)
    figures = (f"{len(grads)} LoRA gradients ({sharded} DTensor), max diff {diff:.2e} ({rel:.2e} of the tensor's "
               f"max; PASS <= {BF16_REL:.2e}, two bf16 ulps), loss rel diff {loss_rel:.2e}"
               + (f"; the executor's step region: {chosen} (PASS: None)" if own else "")
               + (f"; only one side: {one_side[:3]}" if one_side else ""))
    return Row(check, "PASS" if ok else "FAIL", figures, {"max_grad_diff": diff, "max_grad_rel": rel, "worst": worst,
                                                           "loss_rel_diff": loss_rel, "sharded": sharded,
                                                           "step_autocast": chosen})


def rows() -> tuple:
    """``(check, measure)`` of this module's rows, in the table's order."""
    return ((SPLIT, split_row), (FSDP, fsdp_row), (FSDP_OWN, fsdp_own_row))
