"""Check that the families whose vision tower is a timm model (FastVLM, Perception-LM, Gemma 3n) split exactly, where
timm and torchvision import (they do not beside the CPU torch the project's CI runs on).

Usage (an environment with timm, torchvision and mpipe_hf installed, e.g. the stock PyPI torch build):
    /work/venv-stock/bin/python scripts/check/check_timm_families.py [--out DIR]

For each type, as ``tests/test_numerics.py``'s family cases: its tiny config
(:func:`mpipe_hf.families.registry.tiny_config`) at 12 layers, a ragged pool of real photos and captions whose vision
inputs are built directly in the shape the real processor gives (:data:`IMAGES`; the project has no processor of
these types), then one 2-process torchrun of ``tests/dist/numerics_worker.py``: a trainable tower at ``T = 1`` and a
frozen one at ``T = 0`` (2 AdamW steps, ``R = 2``, ``V = 2``, ``M = 3``, then a save and ``from_pretrained``
reload; Gemma 3n also trainable at ``T = 0``), each checked by ``matrix.check_case`` and ``check_reload`` against the
unsplit one-process model. Two negative controls per type must fail the same check:
the image features cut from the tower's graph (``detach_features``) and the last AdamW step skipped
(``skip_last_step``); Gemma 3n's third, its AltUp streams 1 and 2 swapped where a stage hands them on
(``altup_swapped``). The load-time check must pass every micro-batch of the pool and refuse one with an image token
lost. Prints a PASS or FAIL line per type and writes :data:`RECORD` (the date, versions and verdicts), which
``scripts/report/model_table.py`` reads: a type that passed is "exact (script, <date>)" in docs/models.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "dist"))
WORKER = os.path.join(ROOT, "tests", "dist", "numerics_worker.py")
RECORD = os.path.join(HERE, "check_timm_families.json")
TYPES = ("fast_vlm", "perception_lm", "gemma3n")
CONTROLS = {"detach_features": TYPES, "skip_last_step": TYPES, "altup_swapped": ("gemma3n",)}  # option: types


def fast_vlm_image(config, photo):
    """FastVLM's processor (a CLIP-style resize and centre crop to one square size, 1024 px on the hub):
    ``pixel_values`` ``(1, 3, S, S)`` in [-1, 1], S 128 here; one token per cell of the tower's 64 x downsampled
    grid, ``(S / 64) ** 2``."""
    from direct_llava_like import pixels
    side = 128
    return {"pixel_values": pixels(photo, side, side).unsqueeze(0)}, (side // 64) ** 2


def perception_lm_image(config, photo):
    """``PerceptionLMImageProcessor`` (``thumb+tile``): ``pixel_values`` ``(1, 1 + tiles, 3, T, T)``: the whole
    photo resized to one tile (the thumbnail), then the photo resized to a canvas of 1 x 2 tiles and cut into them
    (T 32 here, 448 on the hub); ``(T / patch / pooling_ratio) ** 2`` tokens a tile."""
    import torch
    from direct_llava_like import pixels
    tile = config.vision_config.model_args["img_size"][0]
    canvas = pixels(photo, tile, 2 * tile)
    views = torch.stack([pixels(photo, tile, tile), canvas[..., :tile], canvas[..., tile:]])
    per_tile = (tile // config.vision_config.model_args["patch_size"] // config.projector_pooling_ratio) ** 2
    return {"pixel_values": views.unsqueeze(0)}, 3 * per_tile


def gemma3n_image(config, photo):
    """Gemma 3n's ``SiglipImageProcessor``: one square resize (768 px on the hub, 64 here), ``pixel_values`` ``(1,
    3, S, S)`` in [-1, 1]; the tower's multi-scale fusion adapter gives its fixed grid whatever ``S``
    (``vision_soft_tokens_per_image`` tokens: 256 on the hub, 4 here)."""
    from direct_llava_like import pixels
    side = 64
    return {"pixel_values": pixels(photo, side, side).unsqueeze(0)}, config.vision_soft_tokens_per_image


IMAGES = {"fast_vlm": fast_vlm_image, "perception_lm": perception_lm_image, "gemma3n": gemma3n_image}


def build_fixture(path: str) -> dict:
    """The tiny configs and ragged pools of :data:`TYPES` (``common.build_fixture``'s layout), saved at ``path``;
    returns the pools."""
    import direct_llava_like
    import torch
    from common import NUM_LAYERS, VOCAB_RANKS, make_ragged_pool
    from mpipe_hf.data import qwen2_tokenizer
    from mpipe_hf.families.registry import tiny_config
    direct_llava_like.IMAGES.update(IMAGES)  # the direct collator's image builders, by model type
    tokenizer = qwen2_tokenizer(VOCAB_RANKS)
    configs = {t: tiny_config(t)(tokenizer, num_layers=NUM_LAYERS) for t in TYPES}
    pools = {f"ragged-{t}": make_ragged_pool(direct_llava_like.direct_collator(c, tokenizer))
             for t, c in configs.items()}
    torch.save({"configs": {k: c.to_dict() for k, c in configs.items()}, "pools": pools}, path)
    return {"configs": configs, "pools": pools}


def load_check_problems(model_type: str, config, pool: list[dict]) -> list[str]:
    """What is wrong with the family's load-time check (``Family.validate``) on ``pool``: a micro-batch it refuses,
    or one with its first image token made a text token that it takes."""
    from mpipe_hf.models import get_family
    from mpipe_hf.models.materialize import meta_model
    check = get_family(model_type).validate(meta_model(config))
    problems = []
    for m, micro in enumerate(pool):
        try:
            check(micro)
        except ValueError as err:
            problems.append(f"micro {m} refused: {err}")
        image = micro["input_ids"] == config.image_token_id
        if image.any():
            ids = micro["input_ids"].clone()
            ids[tuple(image.nonzero()[0])] = 0
            try:
                check({**micro, "input_ids": ids})
                problems.append(f"micro {m} with an image token lost was taken")
            except ValueError:
                pass
    return problems


def batchnorm_mode_problems(config, micro: dict) -> tuple[list[str], bool]:
    """``(problems, has_batchnorm)``: whether the model's logits on ``micro`` depend on train or eval mode through
    anything but BatchNorm (FastViT's ConvMlp keeps one, reparameterised or not). ``from_pretrained`` returns a
    model in eval mode, whose BatchNorm reads its running statistics; the reference trains in train mode, whose
    BatchNorm reads the micro-batch's own, and each owner's tower updates its running statistics from its own
    micro-batches (as data parallelism without synchronised BatchNorm does): so the reload check's logits differ
    exactly when the model has BatchNorm, and the parameters are what it checks bit for bit then."""
    import torch
    from mpipe_hf.models.materialize import model_class
    from mpipe_hf.models.tiny import non_degenerate
    torch.manual_seed(0)
    model = non_degenerate(model_class(config).from_config(config))
    inputs = {k: v for k, v in micro.items() if k != "labels"}
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        train = model.train()(**inputs).logits
        model.eval()
        for norm in norms:
            norm.train()
        other = model(**inputs).logits
    diff = float((train - other).abs().max())
    return ([] if diff == 0 else [f"logits depend on the mode beyond BatchNorm: {diff:.3g}"]), bool(norms)


def cases() -> list[dict]:
    """The exact cases and the negative controls (``control`` set: they must fail) of every type."""
    from matrix import family_cases
    exact = family_cases([(t, pre, layers, None) for t in TYPES for pre, layers in (("trainable", 1), ("frozen", 0))])
    # Gemma 3n's stage 0 reads the vision embedder's hard-token table, which a trainable P at T = 0 holds: both
    # give it gradients (P's soft tokens, stage 0's end-of-image token), summed on rank 0
    exact += [dict(c, reload=False) for c in family_cases([("gemma3n", "trainable", 0, None)]) if c["family"] in TYPES]
    controls = [dict(c, reload=False, control=True) for option, types in CONTROLS.items()
                for c in family_cases([(t, "trainable", 1, None) for t in types], **{option: True})]
    return exact + controls


def verdicts(results: list[dict], fixture: dict) -> dict[str, list[str]]:
    """``{model_type: problems}`` (empty: exact, every control caught, the load check right)."""
    from matrix import check_case, check_reload
    out = {t: load_check_problems(t, fixture["configs"][t], fixture["pools"][f"ragged-{t}"]) for t in TYPES}
    batchnorm = {}
    for t in TYPES:
        problems, batchnorm[t] = batchnorm_mode_problems(fixture["configs"][t], fixture["pools"][f"ragged-{t}"][0])
        out[t] += problems
    for case in cases():
        per_rank = [r[case["name"]] for r in results]
        problems = check_case(case, per_rank) + (check_reload(per_rank) if case["reload"] else [])
        if batchnorm[case["family"]]:  # the reloaded model's eval-mode BatchNorm (batchnorm_mode_problems)
            kept = [p for p in problems if not p.startswith("reloaded logits differ")]
            if len(kept) < len(problems):
                print(f"{case['name']}: reloaded (eval-mode) logits differ by {per_rank[0]['reload_logit_diff']:.3g}"
                      ": BatchNorm's running statistics, the only part that reads the mode")
            problems = kept
        if case.get("control") and not problems:
            out[case["family"]].append(f"{case['name']}: the negative control passed the check")
        elif case.get("control"):
            print(f"{case['name']}: caught ({len(problems)} problems; {problems[0][:100]})")
        elif not case.get("control") and problems:
            out[case["family"]] += [f"{case['name']}: {p}" for p in problems]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for the fixture and the workers' results (default: a temporary one)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds for the torchrun launch")
    args = parser.parse_args(argv)
    try:
        import timm
    except Exception as err:  # noqa: BLE001 - timm raises whatever torchvision's import raised
        print(f"this check needs timm and torchvision for this torch ({err}): run it with an environment that has "
              "them, e.g. pip install timm torchvision beside the PyPI torch", file=sys.stderr)
        return 2
    import torch
    import transformers
    from common import read_results, run_torchrun
    out = args.out or tempfile.mkdtemp(prefix="timm-families-")
    os.makedirs(out, exist_ok=True)
    fixture = build_fixture(os.path.join(out, "fixture.pt"))
    run_torchrun(WORKER, 2, [os.path.join(out, "fixture.pt"), out, json.dumps(cases())], timeout=args.timeout)
    found = verdicts(read_results(out, 2), fixture)
    for model_type, problems in found.items():
        print(f"{model_type}: {'FAIL' if problems else 'PASS'}" + "".join(f"\n  {p}" for p in problems))
    record = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "timm": timm.__version__,
              "transformers": transformers.__version__,
              "types": {t: "exact" if not p else "failed" for t, p in found.items()}}
    with open(RECORD, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"wrote {RECORD}")
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
