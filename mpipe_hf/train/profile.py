"""Measure a cost :class:`~mpipe_hf.schedule.tune.Profile` of a recipe's model and data on one process
(``mpipe-hf profile RECIPE.yaml``).

The model is split for one rank with a trainable preprocess (``P`` = the tower; for a decoder-only LM, the
embedding and one decoder layer, whose layer time is then taken out), and a few of the recipe's micro-batches run
through ``P`` and the single stage, forward and backward. Hooks time each decoder layer's forward and backward, the
LM head's (final norm, ``lm_head``, loss), and the front's forward (embedding, image-feature injection, position
ids); what the stage's forward took beyond these is the cost every stage pays (causal masks, rotary tables).
Backward times are read from gradient hooks: the head's ends when its input's gradient is ready, the front's
starts when its output's is. A layer's, the head's and the tower's saved activations are counted with
``saved_tensors_hooks``. The first micro-batch warms up and is not counted; the medians of the others are kept.
Link latency and bandwidth cannot be measured on one process: they keep the profile's defaults (edit them for
your interconnect).
"""

from __future__ import annotations

import statistics
import time

import torch

from ..data import MicroBatchPlan
from ..models import split
from ..schedule import ScheduleConfig
from ..schedule.tune import Profile
from ..runtime.memory import SavedStorages, saved_bytes, storage_ids
from .recipe import Recipe
from .trainer import is_vision_language, load_config, load_data, load_model, load_processor


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values() if torch.is_tensor(t))


class _LayerClock:
    """Forward and backward seconds of each hooked module, appended per call."""

    def __init__(self, layers):
        self.forward, self.backward, self._t = [], [], {}
        for layer in layers:
            layer.register_forward_pre_hook(lambda m, a: self._t.__setitem__(("f", id(m)), time.perf_counter()))
            layer.register_forward_hook(lambda m, a, o: self.forward.append(
                time.perf_counter() - self._t[("f", id(m))]))
            layer.register_full_backward_pre_hook(lambda m, g: self._t.__setitem__(("b", id(m)), time.perf_counter()))
            layer.register_full_backward_hook(lambda m, gi, go: self.backward.append(
                time.perf_counter() - self._t[("b", id(m))]))


class _SavedBytes(SavedStorages):
    """:class:`~.plan.SavedStorages` with a region per hooked layer and one for the head (the parameters'
    storages, views such as ``weight.t()`` included, left out); ``layer`` (the median over the layers) and
    ``head`` keep the last micro-batch's figures."""

    def __init__(self, layers, head, params: set[int]):
        super().__init__(params)
        self.layer = self.head = 0
        for layer in layers:
            layer.register_forward_pre_hook(lambda m, a: self._enter(("layer", id(m))))
            layer.register_forward_hook(lambda m, a, o: self._enter(None))
        head.register_forward_pre_hook(lambda m, a: self._enter("head"))
        head.register_forward_hook(lambda m, a, o: self._enter(None))

    def _enter(self, region):
        self.region = region
        self.by_region.setdefault(region, {})  # a layer that saves nothing counts as 0

    def __exit__(self, *exc):
        super().__exit__(*exc)
        layers = [self.bytes(r) for r in self.by_region if isinstance(r, tuple)]
        self.layer = statistics.median(layers) if layers else 0
        self.head = self.bytes("head")


def profile_recipe(recipe: Recipe, num_micro: int = 4) -> Profile:
    """Time ``num_micro`` micro-batches (after one warm-up) of ``recipe`` on this process (CPU, or the first
    GPU when there is one).

    Raises:
        ValueError: as the recipe checks (model type, data rows).
    """
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = load_config(recipe.model)
    model = load_model(recipe.model, config, recipe.train.seed).to(device)
    vision = is_vision_language(config)
    text_layers = 0 if vision else 1
    cfg = ScheduleConfig(1, 1, num_micro + 1, "trainable")
    carved = split(model, cfg, 0, None, text_layers)
    pre, stage = carved.preprocess, carved.stages[0]
    dataset, collate = load_data(recipe, config, load_processor(recipe, config))
    plan = MicroBatchPlan(dataset, collate, num_micro + 1, recipe.data.micro_batch_size, None,
                          recipe.data.shuffle, recipe.train.seed)
    clock = _LayerClock(list(stage.layers) + list(getattr(pre.module, "layers", [])))
    head_clock, front_clock = _LayerClock([stage.head]), _LayerClock([stage.front] if stage.front is not None else [])
    stamps = {}  # when the backward reaches the head's input, and the front's output
    saved = _SavedBytes(list(stage.layers), stage.head, storage_ids(model.parameters()))

    def stamp(key):
        return lambda grad: stamps.__setitem__(key, time.perf_counter())
    stage.head.register_forward_pre_hook(lambda m, args: [args[0].register_hook(stamp("head")), None][1])
    if stage.front is not None:
        stage.front.register_forward_hook(
            lambda m, a, out: [out["hidden_states"].register_hook(stamp("front")), None][1])
    rows: dict[str, list[float]] = {k: [] for k in ("pf", "pb", "sf", "lf", "lb", "hf", "hb", "ef", "eb")}
    sizes = {}

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
    for m in range(num_micro + 1):
        raw = {k: v.to(device) for k, v in plan.load(0, m).items()}
        for c in (clock, head_clock, front_clock):
            c.forward.clear()
            c.backward.clear()
        sync()
        t0 = time.perf_counter()
        feats = pre.module(pre.inputs(raw))
        sync()
        t1 = time.perf_counter()
        inputs = {**pre.stage0_inputs(raw), **{k: v.detach().requires_grad_(v.is_floating_point())
                                              for k, v in feats.items()}}
        with saved:
            out = stage(inputs)
        sync()
        t2 = time.perf_counter()
        out["loss"].backward()
        sync()
        t3 = time.perf_counter()
        floats = [k for k, v in feats.items() if v.is_floating_point()]
        torch.autograd.backward([feats[k] for k in floats], [inputs[k].grad for k in floats])
        sync()
        t4 = time.perf_counter()
        if m == 0:
            tower_saved = saved_bytes(lambda: pre.module(pre.inputs(raw)),
                                      storage_ids(pre.module.parameters())) if vision else 0
            sizes = dict(feature=_nbytes(feats), data=_nbytes(pre.stage0_inputs(raw)), graph=_nbytes(pre.inputs(raw)))
            continue
        n_stage = len(stage.layers)
        lf = clock.forward[-n_stage:] if n_stage else []
        rows["pf"].append(t1 - t0 - sum(clock.forward[:-n_stage] if n_stage else clock.forward))
        rows["pb"].append(t4 - t3 - sum(clock.backward[n_stage:]))
        head_f, front_f = sum(head_clock.forward), sum(front_clock.forward)
        head_b = stamps["head"] - t2
        front_b = t3 - stamps["front"] if "front" in stamps else 0.0
        rows["hf"].append(head_f)
        rows["hb"].append(head_b)
        rows["ef"].append(front_f)
        rows["sf"].append(t2 - t1 - sum(lf) - head_f - front_f)
        rows["eb"].append(front_b)
        rows["lf"] += clock.forward
        rows["lb"] += clock.backward
        sizes["activation"] = raw["input_ids"].numel() * config.get_text_config().hidden_size * 4  # fp32 hidden
    med = {k: statistics.median(v) if v else 0.0 for k, v in rows.items()}
    layer = next(iter(stage.layers))
    p_params = sum(p.numel() * p.element_size() for p in pre.module.parameters()) if vision else 0
    return Profile(
        num_layers=config.get_text_config().num_hidden_layers, layer_forward_s=med["lf"], layer_backward_s=med["lb"],
        preprocess_forward_s=med["pf"] if vision else 0.0, preprocess_backward_s=med["pb"] if vision else 0.0,
        embed_s=med["ef"] if vision else med["pf"], embed_backward_s=med["eb"], stage_forward_s=med["sf"],
        head_forward_s=med["hf"], head_backward_s=med["hb"],
        activation_bytes=float(sizes["activation"]), feature_bytes=float(sizes["feature"] if vision else 0),
        data_bytes=float(sizes["data"]), graph_bytes=float(sizes["graph"]), preprocess_param_bytes=float(p_params),
        layer_activation_bytes=float(saved.layer), head_activation_bytes=float(saved.head),
        preprocess_activation_bytes=float(tower_saved),
        layer_param_bytes=float(sum(p.numel() * p.element_size() for p in layer.parameters())))
