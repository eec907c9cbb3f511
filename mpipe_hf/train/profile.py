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
from ..models import get_family, split
from ..models.freeze import apply_trainable
from ..schedule import ScheduleConfig
from ..schedule.tune import Profile
from ..runtime.memory import SavedStorages, saved_bytes, storage_ids
from .recipe import Recipe
from .sources import is_vision_language, load_config, load_data, load_model, load_processor


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


class _Probe:
    """The clocks and hooks on one stage and ``P`` that split a micro-batch's time into the profile's parts:
    each decoder layer's forward and backward, the head's and the front's (embedding), and the stamps of when the
    backward reaches the head's input and the front's output; ``saved`` counts the bytes saved for backward."""

    def __init__(self, stage, pre, model, device: torch.device):
        self.stage, self.pre, self.device = stage, pre, device
        self.clock = _LayerClock(list(stage.layers) + list(getattr(pre.module, "layers", [])))
        self.head_clock = _LayerClock([stage.head])
        self.front_clock = _LayerClock([stage.front] if stage.front is not None else [])
        self.stamps = {}  # when the backward reaches the head's input, and the front's output
        self.saved = _SavedBytes(list(stage.layers), stage.head, storage_ids(model.parameters()))
        stage.head.register_forward_pre_hook(lambda m, args: [args[0].register_hook(self._stamp("head")), None][1])
        if stage.front is not None:
            stage.front.register_forward_hook(
                lambda m, a, out: [out["hidden_states"].register_hook(self._stamp("front")), None][1])

    def _stamp(self, key):
        return lambda grad: self.stamps.__setitem__(key, time.perf_counter())

    def _sync(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def time(self, raw: dict):
        """One micro-batch's forward and backward through ``P`` and the stage: ``(t0 .. t4, P's features)``, the
        clocks reading the same micro-batch."""
        pre, stage = self.pre, self.stage
        for c in (self.clock, self.head_clock, self.front_clock):
            c.forward.clear()
            c.backward.clear()
        t0 = self._sync()
        feats = pre.module(pre.inputs(raw))
        t1 = self._sync()
        inputs = {**pre.stage0_inputs(raw), **{k: v.detach().requires_grad_(v.is_floating_point())
                                              for k, v in feats.items()}}
        with self.saved:
            out = stage(inputs)
        t2 = self._sync()
        out["loss"].backward()
        t3 = self._sync()
        floats = [k for k, v in feats.items() if v.requires_grad]  # a micro without an image: P gives (0, H) zeros
        if floats:
            torch.autograd.backward([feats[k] for k in floats], [inputs[k].grad for k in floats])
        t4 = self._sync()
        return (t0, t1, t2, t3, t4), feats

    def record(self, rows: dict[str, list[float]], times) -> None:
        """Add one micro-batch's parts to ``rows``, from its ``times`` and the clocks."""
        t0, t1, t2, t3, t4 = times
        clock, n_stage = self.clock, len(self.stage.layers)
        lf = clock.forward[-n_stage:] if n_stage else []
        rows["pf"].append(t1 - t0 - sum(clock.forward[:-n_stage] if n_stage else clock.forward))
        rows["pb"].append(t4 - t3 - sum(clock.backward[n_stage:]))
        head_f, front_f = sum(self.head_clock.forward), sum(self.front_clock.forward)
        rows["hf"].append(head_f)
        rows["hb"].append(self.stamps["head"] - t2)
        rows["ef"].append(front_f)
        rows["sf"].append(t2 - t1 - sum(lf) - head_f - front_f)
        rows["eb"].append(t3 - self.stamps["front"] if "front" in self.stamps else 0.0)
        rows["lf"] += clock.forward
        rows["lb"] += clock.backward


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
    carved = split(model, ScheduleConfig(1, 1, num_micro + 1, "trainable"), 0, None, 0 if vision else 1)
    spec = recipe.train.trainable_spec()  # a frozen ViT: P's backward, graph and parameters are the merger's
    if spec.freezes():
        apply_trainable(carved.model, get_family(config.model_type), spec, carved.frozen, carved.tied)
    pre, stage = carved.preprocess, carved.stages[0]
    dataset, collate = load_data(recipe, config, load_processor(recipe, config))
    plan = MicroBatchPlan(dataset, collate, num_micro + 1, recipe.data.micro_batch_size, None,
                          recipe.data.shuffle, recipe.train.seed)
    probe = _Probe(stage, pre, model, device)
    rows: dict[str, list[float]] = {k: [] for k in ("pf", "pb", "sf", "lf", "lb", "hf", "hb", "ef", "eb")}
    sizes, tower_saved = {}, 0
    for m in range(num_micro + 1):
        host = pre.with_host(plan.load(0, m))  # with what the owner computes at load (Qwen-VL's positions)
        raw = {k: v if k in pre.host_keys else v.to(device) for k, v in host.items()}
        times, feats = probe.time(raw)
        if m == 0:
            tower_saved = saved_bytes(lambda: pre.module(pre.inputs(raw)),
                                      storage_ids(pre.module.parameters())) if vision else 0
            sizes = dict(feature=_nbytes(feats), data=_nbytes(pre.stage0_inputs(raw)), graph=_nbytes(pre.inputs(raw)))
            continue
        probe.record(rows, times)
        sizes["activation"] = raw["input_ids"].numel() * config.get_text_config().hidden_size * 4  # fp32 hidden
    return _profile(config, rows, sizes, tower_saved, stage, pre, probe.saved, vision)


def _profile(config, rows, sizes, tower_saved, stage, pre, saved, vision: bool) -> Profile:
    """The :class:`Profile` of the medians of ``rows`` and the byte counts."""
    med = {k: statistics.median(v) if v else 0.0 for k, v in rows.items()}
    layer = next(iter(stage.layers))
    p_params = sum(p.numel() * p.element_size() for p in pre.module.parameters() if p.requires_grad) if vision else 0
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
