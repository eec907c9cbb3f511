"""The gradient matrix: every mode crossed with R, V, M and frozen/trainable.

A *case* is a dict the numerics worker runs (see numerics_worker.py). :func:`full_grid` lists every case;
:func:`covering_subset` picks, greedily, cases until every pair of option values that some valid case combines
appears in at least one picked case (pairwise coverage), which is what CI runs.
"""

from __future__ import annotations

import itertools

import specs_families

GRAD_ATOL, LOSS_ATOL = 1e-5, 1e-5
# Each AdamW step's update p_t - p_(t-1), per tensor, against the reference's, as root mean squares over the tensor
# (the worker's compare_updates): a difference above UPDATE_REL * rms(reference update) + 2 ulp * rms(p) fails.
# Relative to the update itself, so the check has the same power at any lr and eps: a skipped step or a tensor that
# got no gradient is 1.0 of its update apart, 100x the bound. Not the elementwise max: AdamW's update
# lr * m / (sqrt(v) + eps) has a slope of up to lr / eps in its gradient where |g| is near eps (1000 at lr 1e-3, eps
# 1e-6), so an element whose gradient differs by 3e-8 between two fp32 summation orders (1e-7 of its tensor's
# largest, well inside the gradient checks) moves by 3e-5, 3% of lr (Gemma 3's and Gemma 4's step-0 updates:
# 1.2% and 2.9% elementwise; 8e-5 at eps 1e-3). Over a tensor those few elements weigh little: at most 2.5e-3 of
# the rms (Gemma 3's embeddings at step 2; most tensors under 1e-4). The 2 ulp: p_t is rounded on each side.
UPDATE_REL, UPDATE_ULPS = 1e-2, 2.0 ** -22
# strict gradients: per tensor, a difference above REL_TOL * max|ref| fails (with 1e-5 + 1e-5 * max|ref| it could hide a
# wrong gradient of a tensor under 1e-5 whole); 27x the worst fp32 difference measured over the families (3.7e-5 of
# max|ref|, Qwen3.5's A_log after an AdamW step), and a wrong scale of 1.001 or more shows
REL_TOL = 1e-3
# without rotary positions (the vision towers), the keys' bias adds the same q . b to every score of a query, which the
# softmax cancels: its gradient is zero in exact arithmetic (fp32 leaves 1e-12 of a largest gradient near 0.2), so
# no relative bound means anything for it; a gradient under ZERO_FLOOR of the case's largest is zero, and fails
# unless it is one of these (and the difference is as small)
ZERO_BY_DESIGN, ZERO_FLOOR = ("k_proj.bias",), 1e-8
# P kind -> (model family, data pool, preprocess values, text_layers)
KINDS = {
    "vision": ("vl", "ragged", ("frozen", "trainable"), 0),
    "vl-text": ("vl", "ragged", ("frozen", "trainable"), 1),
    "llama-text": ("llama", "text", ("frozen", "trainable"), 1),
    "qwen2-text": ("qwen2", "text", ("frozen", "trainable"), 1),
    "vl-identity": ("vl", "ragged", ("identity",), 0),
    "qwen2-identity": ("qwen2", "text", ("identity",), 0),
}
# named modes of the full grid: option overrides on top of a P kind
MODES = {
    "full": {}, "min": {"overflow": "min"}, "owner-backward": {"owner_backward": True},
    "less-memory": {"less_memory": True},
}


def micro_counts(pp_size: int) -> list[int]:
    """``M < R`` (when possible), ``M`` not a multiple of ``R``, and ``M = 2R``."""
    return sorted({max(1, pp_size - 1), pp_size + 1, 2 * pp_size})


def make_case(kind: str, pp_size: int, vpp: int, num_micro: int, preprocess: str, **options) -> dict:
    family, data, _, text_layers = KINDS[kind]
    data = options.pop("data", data)
    case = dict(family=family, data=data, vpp=vpp, num_micro=num_micro, preprocess=preprocess,
                text_layers=text_layers, **options)
    flags = "-".join(f"{k}={v}" for k, v in sorted(options.items()))
    case["name"] = f"{kind}-{preprocess}-R{pp_size}-V{vpp}-M{num_micro}" + (f"-{flags}" if flags else "")
    case["pp_size"] = pp_size
    return case


def valid(case: dict) -> bool:
    if case.get("owner_backward") and case["preprocess"] != "trainable":
        return False
    if case["family"] != "vl" and case["data"] != "text":
        return False
    return True


def full_grid(pp_sizes=(2, 3, 4), vpps=(1, 2, 3)) -> list[dict]:
    """Every named mode x preprocess (``P`` kind and frozen/trainable) x R x V x M (``micro_counts``), where
    valid. The two decoder-only families take turns (llama for odd ``V``, qwen2 for even), and so do the two
    identity kinds, so each cell runs once."""
    cases = []
    for (mode, options), pp_size, vpp in itertools.product(MODES.items(), pp_sizes, vpps):
        lm = "llama-text" if vpp % 2 else "qwen2-text"
        identity = "vl-identity" if vpp % 2 else "qwen2-identity"
        for kind in ("vision", "vl-text", lm, identity):
            for preprocess, num_micro in itertools.product(KINDS[kind][2], micro_counts(pp_size)):
                case = make_case(kind, pp_size, vpp, num_micro, preprocess, **options)
                if valid(case):
                    cases.append(case)
    return cases


def check_case(case: dict, per_rank: list[dict]) -> list[str]:
    """What is wrong with one case's results (``per_rank[r]`` from the worker); empty when it passed.

    Checks: every step's loss, every gradient of the first optimizer step (after its accumulated runs), every
    AdamW step's update per tensor (:func:`update_problems`), that each trainable parameter is checked on exactly
    one rank, that each rank loaded exactly its own micros, once per schedule run, and that the activations a rank
    held at its peak are what the schedule's order predicts (``less_memory`` holds fewer).
    """
    problems = []
    runs = case.get("steps", 1) * case.get("accumulate", 1)
    for rank, res in enumerate(per_rank):
        worst_loss = max(abs(a - b) for a, b in zip(res["losses"], res["ref_losses"]))
        if len(res["losses"]) != runs or worst_loss >= LOSS_ATOL:
            problems.append(f"rank {rank}: losses {res['losses']} vs reference {res['ref_losses']}")
        if case.get("scaled_tolerance"):  # per tensor, 1e-5 + 1e-5 * max|ref| (the generic splitter's families)
            if not res["grad_scaled"] < 1.0:
                problems.append(f"rank {rank}: gradient of {res['grad_scaled_worst']} differs by "
                                f"{res['grad_scaled']:.3g} x (1e-5 + 1e-5 * max|ref|)")
        elif not res["max_diff"] < GRAD_ATOL:
            problems.append(f"rank {rank}: gradient of {res['worst']} differs by {res['max_diff']:.3g}")
        if res.get("update_stats"):
            problems += [f"rank {rank}: {p}"
                         for p in update_problems(res["update_stats"], zero_by_design(res["grad_stats"]))]
        if case.get("strict_grads"):  # the first step's and the last step's, each tensor on its own
            problems += [f"rank {rank}: step 0: {p}" for p in strict_grad_problems(res["grad_stats"])]
            if res.get("last_step_grads"):
                problems += [f"rank {rank}: last step: {p}"
                             for p in strict_grad_problems(res["last_step_grads"]["grad_stats"],
                                                           case.get("last_step_rel", 1e-5))]
        if res["peak_activations"] != [res["expected_peak"]]:
            problems.append(f"rank {rank}: held {res['peak_activations']} activations at peak, the schedule says "
                            f"{res['expected_peak']}")
        owned = res.get("owned_all", res["owned"] * runs)  # per-step owners: each run's own
        if sorted(res["loads"]) != sorted(owned):
            problems.append(f"rank {rank}: loaded micros {sorted(res['loads'])}, owns {owned} over {runs} runs")
    pipeline = per_rank[:case["pp_size"]] if case.get("cp_size", 1) > 1 else per_rank  # each CP rank holds all
    problems += [f"rank {r}: its trainable parameters are not its CP peer's (rank {r % len(pipeline)})"
                 for r, res in enumerate(per_rank) if res["names"] != pipeline[r % len(pipeline)]["names"]]
    checked = sorted(n for res in pipeline for n in res["names"])
    if checked != per_rank[0]["ref_names"]:
        problems.append("the ranks' trainable parameters are not exactly the reference's trainable parameters")
    return problems


def strict_grad_problems(stats: dict[str, list[float]], rel: float = 1e-5) -> list[str]:
    """The strict per-tensor checks over ``{name: [max|ref|, max diff]}``: a reference gradient under ``ZERO_FLOOR``
    of the largest (the check would compare zero with zero: a degenerate test model) fails, unless the tensor is
    zero by design (:data:`ZERO_BY_DESIGN`) and the difference is as small; a difference above ``min(1e-5 + rel *
    max|ref|, REL_TOL * max|ref|)`` fails, a bound every other tensor is above by a factor of 1 / REL_TOL."""
    problems, scale = [], max((top for top, _ in stats.values()), default=0.0)
    for name, (top, diff) in sorted(stats.items()):
        if top <= ZERO_FLOOR * scale:
            if not name.endswith(ZERO_BY_DESIGN) or diff > ZERO_FLOOR * scale:
                problems.append(f"{name}: the reference gradient is zero ({top:.3g}, diff {diff:.3g}, of a largest "
                                f"{scale:.3g}): a degenerate test model")
        elif diff > min(1e-5 + rel * top, REL_TOL * top):
            problems.append(f"{name}: differs by {diff:.3g}, {diff / top:.3g} of max|ref| {top:.3g}")
    return problems


def zero_by_design(stats: dict[str, list[float]]) -> list[str]:
    """The tensors of :data:`ZERO_BY_DESIGN` whose reference gradient in ``stats`` (``{name: [max|ref|, max
    diff]}``) is under ``ZERO_FLOOR`` of the largest: zero in exact arithmetic."""
    scale = max((top for top, _ in stats.values()), default=0.0)
    return [n for n, (top, _) in stats.items() if n.endswith(ZERO_BY_DESIGN) and top <= ZERO_FLOOR * scale]


def update_problems(stats: list[dict[str, list[float]]], zero=()) -> list[str]:
    """Each AdamW step's update against the reference's, over ``stats`` (the worker's ``compare_updates``: per step,
    ``{name: [rms(ref update), rms(update - ref update), rms(p)]}``): a difference above ``UPDATE_REL`` of the
    reference's update plus ``UPDATE_ULPS`` of the parameter fails. A tensor of ``zero`` (gradient zero by design:
    its update is weight decay plus fp32 noise that AdamW divides by its own size) is held to ``UPDATE_REL`` of the
    step's largest update instead."""
    problems = []
    for step, tensors in enumerate(stats):
        largest = max((ref for ref, _, _ in tensors.values()), default=0.0)
        for name, (ref, diff, size) in sorted(tensors.items()):
            if not diff <= UPDATE_REL * (largest if name in zero else ref) + UPDATE_ULPS * size:
                problems.append(f"step {step}: the update of {name} differs by {diff:.3g} rms, "
                                f"{diff / max(ref, 1e-30):.3g} of the reference's ({ref:.3g})")
    return problems


FACTORS = {
    "kind": list(KINDS), "preprocess": ["identity", "frozen", "trainable"], "pp_size": [2, 3, 4],
    "vpp": [1, 2, 3], "micro": ["fewer", "uneven", "double"], "overflow": ["full", "min"],
    "owner_backward": [False, True], "less_memory": [False, True], "data": ["ragged", "noimage", "text"],
    "steps": [1, 3], "accumulate": [1, 2],
}


def _case_of(choice: dict) -> dict | None:
    kind, preprocess, pp_size = choice["kind"], choice["preprocess"], choice["pp_size"]
    if preprocess not in KINDS[kind][2]:
        return None
    num_micro = {"fewer": pp_size - 1, "uneven": pp_size + 1, "double": 2 * pp_size}[choice["micro"]]
    options = {k: choice[k] for k in ("overflow", "owner_backward", "less_memory", "steps", "accumulate")
               if choice[k] != FACTORS[k][0]}
    if (KINDS[kind][0] == "vl") == (choice["data"] == "text"):
        return None
    if choice["data"] != KINDS[kind][1]:
        options["data"] = choice["data"]
    if choice["steps"] > 1 and choice["accumulate"] > 1:
        return None  # keep each case to one kind of repetition
    case = make_case(kind, pp_size, choice["vpp"], num_micro, preprocess, **options)
    return case if valid(case) else None


def covering_subset() -> list[dict]:
    """Cases that together cover every pair of factor values some valid case combines (greedy, deterministic)."""
    names = list(FACTORS)
    candidates = []
    for values in itertools.product(*FACTORS.values()):
        choice = dict(zip(names, values))
        case = _case_of(choice)
        if case is not None:
            pairs = {((a, choice[a]), (b, choice[b])) for a, b in itertools.combinations(names, 2)}
            candidates.append((case, pairs))
    uncovered = set().union(*(pairs for _, pairs in candidates))
    picked = []
    while uncovered:
        case, pairs = max(candidates, key=lambda c: (len(c[1] & uncovered), -c[0]["pp_size"]))
        picked.append(case)
        uncovered -= pairs
    return picked


# The first model families (the Qwen VLs, LLaVA, decoder-only LMs): every family at R = 2, V = 2, frozen and
# trainable (and identity where tying changes the path), 2 AdamW steps, then a save and a from_pretrained reload.
# Qwen3-VL's layouts put DeepStack layers (0 .. 2) on stage 1, so their features are relayed across ranks (and,
# with T = 1, from P through stage 0).
FAMILY_SPECS = [
    ("vl", "frozen", 0, None), ("vl", "trainable", 1, None),
    ("qwen2_vl", "frozen", 0, None), ("qwen2_vl", "trainable", 0, None),
    ("qwen3_vl", "frozen", 0, [1, 3, 4, 4]), ("qwen3_vl", "trainable", 1, [2, 2, 4, 4]),
    ("qwen3_vl", "identity", 0, [1, 3, 4, 4]),
    ("llava", "frozen", 0, None), ("llava", "trainable", 0, None),
    ("llava-full", "frozen", 1, None), ("llava-full", "trainable", 0, None),
    ("llama", "frozen", 1, None), ("llama", "trainable", 1, None),
    ("qwen2", "frozen", 1, None), ("qwen2", "trainable", 2, None),
    ("qwen3-tied", "frozen", 1, None), ("qwen3-tied", "trainable", 1, None), ("qwen3-tied", "identity", 0, None),
]
# The generic splitter's families (tests/dist/specs_families.py): per-tensor tolerance, 1e-5 + 1e-5 * max|ref|
SCALED_FAMILY_SPECS = specs_families.SPECS
MOE_ORDER_SPECS = [("qwen3_vl_moe", "trainable", 0, [1, 3, 4, 4]), ("qwen3_5_moe", "frozen", 1, None)]
TEXT_CONFIGS = ("llama", "qwen2", "qwen3-tied") + specs_families.TEXT_TYPES  # decoder-only: the text pool, T >= 1
ABSOLUTE_TOL_FAMILIES = {config for config, *_ in FAMILY_SPECS}  # their cases keep the absolute GRAD_ATOL
RELOAD_LOGIT_ATOL = 1e-4  # logits of order 10, after 2 AdamW steps (each update checked); measured 2e-6


def family_cases(specs=None, **options) -> list[dict]:
    """The cases of ``specs`` (default :data:`FAMILY_SPECS` and :data:`SCALED_FAMILY_SPECS`; ``R = 2``, ``V = 2``,
    ``M = 3``), each with ``options`` (e.g. ``order="micro"``, named in the case)."""
    cases = []
    for config, preprocess, text_layers, layout in (FAMILY_SPECS + SCALED_FAMILY_SPECS if specs is None else specs):
        data = "text" if config in TEXT_CONFIGS else ("ragged" if config == "vl" else f"ragged-{config}")
        case = dict(family=config, data=data, vpp=2, num_micro=3, preprocess=preprocess, text_layers=text_layers,
                    steps=2, reload=True, pp_size=2, strict_grads=True)
        if layout is not None:
            case["layers_per_stage"] = layout
        case["name"] = f"family-{config}-{preprocess}-T{text_layers}" + (f"-{layout}" if layout else "") + "".join(
            f"-{k}={v}" for k, v in sorted(options.items()))
        case.update(options)
        case.update(specs_families.OPTIONS.get(config, {}))
        if config not in ABSOLUTE_TOL_FAMILIES:  # the generic splitter's families: per-tensor 1e-5 + 1e-5 * max|ref|
            case["scaled_tolerance"] = True
        cases.append(case)
    return cases


def family_grid() -> list[dict]:
    """Every family (:data:`FAMILY_SPECS` and :data:`SCALED_FAMILY_SPECS`, each with its first spec's layout) x
    frozen and trainable x ``T`` in 0, 1, identity at ``T = 0``, a zero-bubble trainable case, and each MoE family
    in the HF Trainer's order too: ``python scripts/check/grad_matrix.py --families``."""
    layouts = {}
    for config, _, _, layout in FAMILY_SPECS + SCALED_FAMILY_SPECS:
        layouts.setdefault(config, layout)
    specs = [(config, pre, t, layout) for config, layout in layouts.items()
             for pre, t in (("frozen", 0), ("frozen", 1), ("trainable", 0), ("trainable", 1))
             if t == 1 or config not in TEXT_CONFIGS]  # a decoder-only LM's P needs T >= 1
    specs += [(config, "identity", 0, layout) for config, layout in layouts.items()]
    zb = [dict(case, zero_bubble=True, reload=False, name=case["name"] + "-zb")
          for case in family_cases([(c, "trainable", 1, layout) for c, layout in layouts.items()])]
    moe = family_cases([(c, "trainable", 1, layout) for c, layout in layouts.items() if "moe" in c], order="micro")
    return family_cases(specs) + zb + moe


def check_reload(per_rank: list[dict]) -> list[str]:
    """What is wrong with a case's save and ``from_pretrained`` reload; empty when it passed."""
    problems = []
    for rank, res in enumerate(per_rank):
        if res["reload_differs"]:
            problems.append(f"rank {rank}: reloaded parameters differ from the trained ones: {res['reload_differs']}")
        if res["reload_keys"]:
            problems.append(f"rank {rank}: from_pretrained missed or did not expect {res['reload_keys']}")
    if not per_rank[0]["reload_logit_diff"] < RELOAD_LOGIT_ATOL:
        problems.append(f"reloaded logits differ from the one-process model's by {per_rank[0]['reload_logit_diff']:.3g}")
    return problems


# packing: packed micro-batches (a text-only row next to rows of one and two images, packed into one sequence)
# against the unsplit model on the same rows unpacked, padded; (config, preprocess, text_layers, layout)
PACKED_SPECS = [("vl", "frozen", 0, None), ("vl", "trainable", 1, None),
                ("qwen3_vl", "trainable", 0, [1, 3, 4, 4]), ("qwen3_5", "frozen", 1, [4, 2, 3, 3]),
                ("llava", "trainable", 0, None), ("gemma3", "frozen", 0, None),
                ("nemotron_h_omni", "trainable", 1, None)]  # Mamba-2 layers run row by row, MoE and MLP blocks


# case options whose cases must fail (numerics_worker.py, controls.py): the packing bugs, the wrong gradients
NEGATIVE_CONTROLS = ("one_range", "no_linear_reset", "detach_features", "scale_small", "scale_later",
                     "keep_zero_init", "stage_sums", "no_video_time", "deepstack_apart", "skip_last_step",
                     "altup_swapped", "positions_after_split", "rows_cut_at_split", "deepstack_offset_lost",
                     "per_layer_offset_lost", "tower_grads_unrouted", "router_sums_local",
                     "micro_tokens_local")


def packed_cases(specs=None, **options) -> list[dict]:
    """The packed cases of ``specs`` (default :data:`PACKED_SPECS`; ``R = 2``, ``V = 2``, ``M = 3``, 2 AdamW
    steps, per-tensor tolerance): the pipeline loads each micro packed, the reference runs it as collated."""
    cases = []
    for config, preprocess, text_layers, layout in PACKED_SPECS if specs is None else specs:
        data = "packed-text" if config in TEXT_CONFIGS else f"packed-{config}"
        case = dict(family=config, data=data, vpp=2, num_micro=3, preprocess=preprocess,
                    text_layers=text_layers, steps=2, pp_size=2, packed=True, scaled_tolerance=True,
                    strict_grads=True, **options)
        if layout is not None:
            case["layers_per_stage"] = layout
        case.update(specs_families.PACKED_OPTIONS.get(config, {}))
        case["name"] = f"packed-{config}-{preprocess}-T{text_layers}" + "".join(
            f"-{k}={v}" for k, v in sorted(options.items()))
        cases.append(case)
    return cases


def packing_controls() -> list[dict]:
    """The packing negative controls (the peers' packing bugs), which the packed check must catch: positions as
    one range over the packed sequence (the mask then spans rows; M-RoPE loses each image's grid), and Qwen3.5's
    linear attention (Nemotron-H's Mamba-2 layers) run over the packed sequence at once (its state flows into the
    next row); controls.py patches each in."""
    return packed_cases([("vl", "frozen", 0, None), ("llava", "trainable", 0, None)], one_range=True) + \
        packed_cases([("qwen3_5", "frozen", 1, [4, 2, 3, 3]), ("nemotron_h_omni", "trainable", 1, None)],
                     no_linear_reset=True)


def gradient_controls() -> list[dict]:
    """The gradient negative controls: a wrong gradient of each kind the family checks once let through, which
    they must now catch: the image features cut from the tower (Gemma 3, whose zero-initialised projection had
    made every tower gradient 0 on both sides), the zero-initialised model itself, a small tensor's gradient 5%
    off (Qwen2.5-VL's vision norm2 weights, 3e-7 to 5e-6: under the old 1e-5 + 1e-5 * max|ref|), every gradient
    after the first step 5% off (LLaVA); the MoE load-balancing term summed over each stage's own routers instead
    of relayed (Qwen3-VL-MoE); and the last AdamW step skipped (Gemma 3 at lr 5e-5, eps 1e-3, where every parameter
    moves by about lr a step: the parameters after the steps stay within the old absolute 1e-4, the update check
    fails)."""
    cases = (family_cases([("gemma3", "trainable", 1, None)], skip_last_step=True, lr=5e-5, adam_eps=1e-3)
             + family_cases([("gemma3", "trainable", 1, None)], detach_features=True)
             + family_cases([("gemma3", "trainable", 1, None)], keep_zero_init=True)
             + family_cases([("vl", "trainable", 1, None)], scale_small=["norm2.weight"])
             + family_cases([("llava", "trainable", 0, None)], scale_later=True)
             + family_cases([("qwen3_vl_moe", "trainable", 1, [2, 2, 4, 4])], stage_sums=True))
    return [dict(c, reload=False) for c in cases]


def skipped_step_controls() -> list[dict]:
    """Every family (each config's first spec in :data:`FAMILY_SPECS` and :data:`SCALED_FAMILY_SPECS`) with its last
    AdamW step skipped on every rank, which the update check must catch: ``python scripts/check/grad_matrix.py
    --controls``. A family whose case takes one step (``specs_families.OPTIONS``) has no update to check, and no control."""
    first = {}
    for spec in FAMILY_SPECS + SCALED_FAMILY_SPECS:
        first.setdefault(spec[0], spec)
    return [dict(c, reload=False) for c in family_cases(list(first.values()), skip_last_step=True)
            if c.get("steps", 1) > 1]


# refused packed by name: MiniCPM-V 4.7's canvas M-RoPE is computed per micro-batch; Gemma 4's (and Gemma 4
# Unified's, Gemma 3n's) shared key/value states would have to be cut per row; Llama 4's chunked attention counts its
# chunks from the start of the sequence (docs/packing.md); Inkling's short convolutions would reach into the row
# before, and its log-length query scaling counts from the packed sequence's start
UNPACKED = ("minicpmv4_7", "gemma4", "gemma4_unified", "llama4", "gemma3n_text", "inkling_mm_model")


def packed_grid() -> list[dict]:
    """Every family packed (:data:`FAMILY_SPECS` and :data:`SCALED_FAMILY_SPECS`' configs, each with its first
    layout, but :data:`UNPACKED`), frozen at ``T = 0`` (trainable at ``T = 1`` for a decoder-only LM) and
    trainable at ``T = 1``: ``python scripts/check/grad_matrix.py --packed``."""
    layouts = {}
    for config, _, _, layout in FAMILY_SPECS + SCALED_FAMILY_SPECS:
        if config not in UNPACKED:
            layouts.setdefault(config, layout)
    specs = [(c, pre, t, layout) for c, layout in layouts.items() for pre, t in (("frozen", 0), ("trainable", 1))
             if t == 1 or c not in TEXT_CONFIGS]
    return packed_cases(specs)


def packed_configs() -> tuple[str, ...]:
    """The vision-language configs of :func:`packed_grid` (each needs its own packed pool)."""
    return tuple(dict.fromkeys(c["family"] for c in packed_grid() if c["family"] not in TEXT_CONFIGS))


VIT = {"freeze_vit": True}
FREEZE_SPECS = [  # (config, preprocess, T, Trainable keywords, schedule options): what trains by pattern
    ("vl", "trainable", 0, VIT, {}), ("vl", "trainable", 1, VIT, {}),
    ("vl", "trainable", 0, VIT, {"owner_backward": True}), ("vl", "trainable", 0, VIT, {"less_memory": True}),
    ("vl", "trainable", 0, VIT, {"zero_bubble": True}),
    ("qwen3_vl", "trainable", 1, VIT, {}), ("llava", "trainable", 0, VIT, {}), ("gemma3", "trainable", 1, VIT, {}),
    ("vl", "trainable", 0, {"freeze_aligner": True}, {}),
    ("vl", "trainable", 1, {"freeze_llm": True}, {}),
    ("vl", "frozen", 0, {"freeze": ["*.mlp.*"], "trainable": ["model.language_model.layers.3.mlp"]}, {}),
    ("vl", "identity", 0, {"freeze": ["model.language_model.layers.0", "model.language_model.layers.1"]}, {}),
    ("qwen3-tied", "trainable", 1, {"freeze": ["model.embed_tokens"]}, {}),
]


def freeze_cases() -> list[dict]:
    """The cases of :data:`FREEZE_SPECS` (``R = 2``, ``V = 2``, ``M = 3``, 2 AdamW steps, per-tensor checks at
    the first and last step): the pipeline and the unsplit reference frozen by the same patterns."""
    cases = []
    for i, (config, preprocess, text_layers, freeze, options) in enumerate(FREEZE_SPECS):
        case = family_cases([(config, preprocess, text_layers, None)], **options)[0]
        case.update(freeze=freeze, reload=False, name=f"freeze{i}-{config}-{preprocess}-T{text_layers}-"
                    + "-".join(sorted(freeze)) + "".join(f"-{k}" for k in sorted(options)))
        cases.append(case)
    return cases
