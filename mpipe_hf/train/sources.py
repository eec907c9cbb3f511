"""Where a run's model, processor and rows come from: the HF config of a recipe's source, the rank's share of the
model (from a checkpoint, drawn from a config, or carved from a user's model object), the processor and the
datasets. Used by ``mpipe-hf train`` (:mod:`.job`), :class:`~.hf.MPipeTrainer`, ``mpipe-hf profile`` and the
benchmarks.
"""

from __future__ import annotations

import json
import os

import torch
from accelerate.utils import set_seed
from transformers import AutoConfig, AutoTokenizer

from ..data import ConversationCollator, ConversationDataset, TextCollator, build_processor, image_processor_for
from ..data.conversation import Source, dropped_warning, load_sources
from ..data.processor import PIXEL_BOUNDED_TYPES
from ..models import get_family, split
from ..models.adapters import ADAPTER, check_adapted
from ..models.load import split_checked, split_from_checkpoint, split_from_config
from ..models.materialize import model_class
from .recipe import DataSection, ModelSource, ParallelSection, Recipe


def is_vision_language(config) -> bool:
    """Whether ``config`` is a vision-language model's (it has a ``vision_config``)."""
    return hasattr(config, "vision_config")


def load_config(source: ModelSource):
    """The HF config of ``source`` (a checkpoint directory, a config directory or a ``config.json`` file; floats
    JSON cannot hold, as ``save_pretrained`` tags them (Nemotron-H's ``time_step_limit`` of ``inf``), read back)."""
    from transformers import PretrainedConfig
    path = source.name_or_path or source.config
    if os.path.isfile(path):
        with open(path) as f:
            raw = PretrainedConfig._decode_special_floats(json.load(f))
        if not isinstance(raw, dict) or "model_type" not in raw:
            raise ValueError(f"model.config {path!r} has no model_type; write a config with save_pretrained or "
                             f"copy a checkpoint's config.json")
        return AutoConfig.for_model(raw.pop("model_type"), **raw)
    return AutoConfig.from_pretrained(path)


def load_model(source: ModelSource, config, seed: int):
    """The HF model: ``from_pretrained`` on a checkpoint, or ``from_config`` with weights drawn from ``seed`` (the
    same on every rank)."""
    cls = model_class(config)  # mistral4: a decoder-only LM in the image-text-to-text map alone
    if source.name_or_path is not None:
        return cls.from_pretrained(source.name_or_path, dtype=torch.float32)
    set_seed(seed)
    return cls.from_config(config, dtype=torch.float32)  # as from_pretrained above, whatever the config's dtype


def load_share(source: ModelSource, config, cfg, rank: int, layers_per_stage: list[int], text_layers: int,
               seed: int, adapter=None, experts: tuple[int, int] | None = None):
    """``(SplitModel, LoadReport)``: this rank's share of the model, built on the meta device and materialised
    alone, from the checkpoint's safetensors (read tensor by tensor) or drawn from ``seed`` exactly as the unsplit
    ``load_model`` would (see :mod:`mpipe_hf.models.load`). With ``adapter`` (a ``peft.LoraConfig``), the share of
    that model after ``set_seed(seed); peft.get_peft_model(model, adapter)``. ``experts``: ``(ep_rank, ep_size)``
    under expert parallelism; a checkpoint's fused experts are then read for that EP rank alone
    (:func:`~mpipe_hf.models.load.split_from_checkpoint`), drawn ones are drawn whole."""
    if source.name_or_path is not None:
        return split_from_checkpoint(source.name_or_path, config, cfg, rank, layers_per_stage, text_layers,
                                     adapter, seed, experts)
    return split_from_config(config, cfg, rank, layers_per_stage, text_layers, seed, adapter)


def pixel_settings(recipe: Recipe, config) -> dict:
    """The recipe's pixel bounds as settings of a checkpoint's image processor, to win over its own (``size``, and
    ``min_pixels`` / ``max_pixels`` where it has them), for a family whose images are resized between them
    (:data:`~mpipe_hf.data.processor.PIXEL_BOUNDED_TYPES`); ``{}`` for any other."""
    if config.model_type not in PIXEL_BOUNDED_TYPES:
        return {}
    low, high = recipe.data.min_pixels, recipe.data.max_pixels
    return {"size": {"shortest_edge": low, "longest_edge": high}, "min_pixels": low, "max_pixels": high}


def load_processor(recipe: Recipe, config):
    """The tokenizer (decoder-only LM) or the family's processor (vision-language). A checkpoint's own image
    processor is used when it has one; a config-initialised model gets one built from its config. Qwen families
    resize images to ``min_pixels .. max_pixels``. A family whose data path is its checkpoint's stock processor
    (:mod:`~mpipe_hf.data.stock_processor`) gets the recipe's ``model.tokenizer`` and pixel bounds over it too."""
    from ..data.stock_processor import checkpoint_image_processor, needs_stock_processor, stock_processor
    if is_vision_language(config) and needs_stock_processor(config.model_type):  # the checkpoint's own
        return stock_processor(config.model_type, recipe.model.name_or_path, recipe.model.tokenizer,
                               **pixel_settings(recipe, config))
    tokenizer = AutoTokenizer.from_pretrained(recipe.model.tokenizer_dir)
    if not is_vision_language(config):
        return tokenizer
    saved = recipe.model.name_or_path is not None and os.path.isfile(
        os.path.join(recipe.model.name_or_path, "preprocessor_config.json"))
    if saved:  # the recipe's pixel bounds win over the checkpoint's
        image_processor = checkpoint_image_processor(config.model_type, recipe.model.name_or_path,
                                                     **pixel_settings(recipe, config))
    else:
        image_processor = image_processor_for(config, recipe.data.min_pixels, recipe.data.max_pixels)
    return build_processor(config, tokenizer, image_processor)


def load_data(recipe: Recipe, config, processor, quiet: bool = False, path: str | None = None,
              num_proc: int | None = None):
    """``(dataset, collate)``: the rows of ``data.path`` or ``data.sources`` (``path``: that one file instead, as
    the eval set), in any layout (:func:`~mpipe_hf.data.conversation.load_sources`), checked and tokenised once
    and cached, rendered with the checkpoint's chat template, else the family's; ``text`` rows for a decoder-only
    LM. Rows that do not fit ``data.max_length`` without cutting an image are dropped with one warning; rows that
    fail the check cost themselves (:func:`bad_rows_policy`). Nothing is printed when ``quiet``.

    Raises:
        ValueError: a source that cannot be read; bad rows past the policy; no row left.
    """
    data = recipe.data
    sources = [Source(path)] if path is not None else list(data.all_sources)  # DataSource has Source's fields
    dataset = load_sources(sources, processor, data.row_length, config.model_type, seed=recipe.train.seed,
                           stopping=data.mix_stopping, clean_rows=None if path is not None else data.clean_rows,
                           num_proc=num_proc or data.num_proc, caps=data.caps)
    bad_rows_policy(dataset, data, quiet)
    if dataset.dropped and not quiet:
        print(f"mpipe_hf: warning: {dropped_warning(dataset, data.row_length)}", flush=True)
    return dataset, row_collator(dataset.layout, processor, data, config)


def row_collator(layout: str, processor, data: DataSection, config):
    """The collator a run's micro-batches go through: :class:`TextCollator` for ``text`` rows (``layout``),
    else :class:`ConversationCollator` for ``config``'s family, both cutting at ``data.row_length`` tokens."""
    if layout == "text":
        return TextCollator(processor, data.row_length)
    return ConversationCollator(processor, data.row_length, model_type=config.model_type,
                                video_decoder=data.video_decoder)


def micro_validator(config):
    """The check loading runs on every micro-batch for ``config``'s model (``SplitModel.validate_micro``:
    :func:`~mpipe_hf.models.generic.micro_check`, e.g. the family's image-token count), the same function, built on
    the model on the meta device (no weights are read or drawn); ``None`` when the family declares none (a
    registered splitter that is not a :class:`~mpipe_hf.models.family.Family` too).

    Raises:
        ValueError: ``config.model_type`` has no family (:func:`~mpipe_hf.models.get_family`).
    """
    family = get_family(config.model_type)
    if getattr(family, "validate", None) is None:
        return None
    from ..models.generic import micro_check
    from ..models.load import meta_model
    return micro_check(family, meta_model(config))


def node_first(fn, what: str, every):
    """``fn()`` on every rank, on each node's first process (``LOCAL_RANK`` 0) before the node's others, so that
    they read the ``datasets`` cache it wrote; a failure on any rank is raised on every rank (``every``: the
    ``(rank, world, group)`` of :func:`~.collective.together`)."""
    import torch.distributed as dist

    from .collective import raise_or, together
    first = int(os.environ.get("LOCAL_RANK", 0)) == 0
    if not first:
        dist.barrier()
    try:
        value = fn()
    except Exception as err:  # noqa: BLE001 - raised on every rank by together()
        value = err
    if first:
        dist.barrier()
    return together(lambda: raise_or(value), what, *every)


def trainer_rows(dataset, processor, data: DataSection, model_type: str, seed: int = 0):
    """``MPipeTrainer``'s rows: a user's dataset (a ``datasets.Dataset`` of any layout, a list of rows, a file or
    folder path, or :class:`~mpipe_hf.data.conversation.Source` items mixed by weight, seeded by ``seed``)
    through the loader ``mpipe-hf train`` uses (:func:`load_sources`), under the bad-row policy of ``data``, with
    the same warning for the rows dropped for their size (rank 0); a :class:`ConversationDataset` as it is."""
    if isinstance(dataset, ConversationDataset):
        return dataset
    if isinstance(dataset, Source):
        dataset = [dataset]
    sources = dataset if isinstance(dataset, list) and dataset and all(isinstance(s, Source) for s in dataset) \
        else [Source(dataset)]
    rows = load_sources(sources, processor, data.row_length, model_type, seed=seed, stopping=data.mix_stopping,
                        caps=data.caps)
    quiet = int(os.environ.get("RANK", 0)) != 0
    bad_rows_policy(rows, data, quiet=quiet)
    if rows.dropped and not quiet:  # as mpipe-hf train's load: the rows left out for their size, by reason
        print(f"mpipe_hf: warning: {dropped_warning(rows, data.row_length)}", flush=True)
    return rows


SHOWN_BAD_ROWS = 20  # the bad rows one message names; mpipe-hf check-data lists them all


def bad_rows_policy(dataset, data: DataSection, quiet: bool = False) -> None:
    """What the rows that failed the check at the start cost: with ``on_bad_sample: skip`` and at most
    ``max_bad_rows`` of them, each is left out with one warning naming at most :data:`SHOWN_BAD_ROWS`; else the
    run stops before its first step.

    Raises:
        ValueError: any bad row with ``on_bad_sample: raise``, or more than ``data.max_bad_rows``: the count,
            the first :data:`SHOWN_BAD_ROWS` (file and line, and the reason) and how to list and leave out all.
    """
    if not dataset.bad:
        return
    shown = "\n  ".join(f"{where}: {why}" for where, why in dataset.bad[:SHOWN_BAD_ROWS])
    more = f"\n  ... and {len(dataset.bad) - SHOWN_BAD_ROWS} more" if len(dataset.bad) > SHOWN_BAD_ROWS else ""
    head = f"{len(dataset.bad)} bad row(s) in {dataset.path}"
    if data.on_bad_sample == "raise" or len(dataset.bad) > data.max_bad_rows:
        why = ("data.on_bad_sample is raise" if data.on_bad_sample == "raise"
               else f"more than data.max_bad_rows = {data.max_bad_rows}")
        raise ValueError(f"{head} ({why}):\n  {shown}{more}\nList them all with `mpipe-hf check-data RECIPE`, and "
                         f"train on the rest with its --write-clean FILE and data.clean_rows: FILE")
    if not quiet:
        print(f"mpipe_hf: warning: {head}, left out (data.max_bad_rows = {data.max_bad_rows}):\n  {shown}{more}",
              flush=True)


def owner_costs(dataset, config) -> list[int]:
    """Each dataset row's preprocess cost for load-aware owners (``parallel.owners: balanced``), known on every
    rank without decoding anything: a vision-language model's rows, their image and video tokens (the loader counted
    them from the image and video file headers; ``visual_tokens``); a decoder-only LM's, their tokens, which its
    text layers' work grows with."""
    return list(_visual_tokens(dataset) if is_vision_language(config) else dataset.num_tokens)


def _visual_tokens(dataset) -> list[int]:
    """Each row's image and video tokens (a :class:`~mpipe_hf.data.ConversationDataset`'s ``visual_tokens``; its
    ``image_tokens`` for a dataset without videos)."""
    return list(getattr(dataset, "visual_tokens", None) or dataset.image_tokens)


def packing_rows(dataset, config, data: DataSection, profile=None) -> tuple[list[int], list[float]]:
    """``(lengths, costs)`` of every dataset row for the packer (``data.packing``), known on every rank
    without decoding anything: a row's tokens after the cut (``min(num_tokens, data.row_length)``), and its cost
    in decoder-token units, ``tokens + w * image_tokens`` (its images' and videos' tokens) with ``w`` the vision
    part's work per image token over the decoder's per token (:func:`image_token_weight`; ``profile``: the
    recipe's measured one, or ``None``)."""
    lengths = [min(int(n), data.row_length) for n in dataset.num_tokens]
    weight = image_token_weight(config, profile) if is_vision_language(config) else 0.0
    return lengths, [n + weight * int(i) for n, i in zip(lengths, _visual_tokens(dataset))]


def image_token_weight(config, profile=None) -> float:
    """The vision part's forward seconds per image token over the decoder's (every layer and the head) per token:
    what an image token costs beyond its place in the decoder. From ``profile`` (a measured
    :class:`~mpipe_hf.schedule.tune.Profile`, whose micro-batch's tokens over its image tokens are its
    ``activation_bytes`` over its ``feature_bytes``, both ``tokens x hidden`` tensors) when it has a tower time and
    image features, else from the config's matmul costs (:func:`~.plan_estimate.estimate_profile`)."""
    measured = profile is not None and min(profile.preprocess_forward_s, profile.feature_bytes,
                                           profile.activation_bytes) > 0
    if not measured:
        from .plan_estimate import estimate_profile
        profile = estimate_profile(config, tokens=1024, image_tokens=1024)
    decoder = profile.num_layers * profile.layer_forward_s + profile.head_forward_s
    return profile.preprocess_forward_s / decoder * profile.activation_bytes / profile.feature_bytes


def profile_layout(parallel: ParallelSection, cfg) -> list[int] | None:
    """``layers_per_stage``, else the layout balanced by the costs of ``profile``, else ``None`` (balanced by the
    config's matmul costs)."""
    if parallel.layers_per_stage is not None or parallel.profile is None:
        return parallel.layers_per_stage
    from ..schedule.tune import Profile, profile_layers
    return profile_layers(Profile.load(parallel.profile), cfg, parallel.text_layers)


def model_share(model, cfg, rank: int, layers_per_stage, text_layers: int, seed: int):
    """``(SplitModel, checkpoint path or None, decoder layers per stage)``: this rank's share of ``model``: a
    checkpoint path (read tensor by tensor), a model on the meta device (initialised from its config and
    ``seed``, bit for bit ``from_config``'s values), or a loaded model, carved in place (the modules this rank
    does not hold are dropped from it). A ``peft.PeftModel`` of either of the last two is carved with its
    adapter; a meta one is built anew by :func:`~mpipe_hf.models.load.split_from_config`, drawn as
    ``set_seed(seed); get_peft_model(from_config(config), its LoraConfig)`` (the trainer's ``carved.peft`` is
    then not the object the user passed)."""
    peft_model, adapter = None, None
    if is_peft(model):
        peft_model, adapter = model, model.peft_config[ADAPTER]
        model = model.base_model.model
    path = str(model) if isinstance(model, (str, os.PathLike)) else None
    config = AutoConfig.from_pretrained(path) if path is not None else model.config
    counts = get_family(config.model_type).layer_counts(config, cfg, layers_per_stage, text_layers)
    if path is not None:
        return split_from_checkpoint(path, config, cfg, rank, counts, text_layers)[0], path, counts
    source = getattr(config, "_name_or_path", None) or None
    if any(p.is_meta for p in model.parameters()):
        return split_from_config(config, cfg, rank, counts, text_layers, seed, adapter)[0], None, counts
    if peft_model is None:
        return split(model, cfg, rank, counts, text_layers), source, counts
    check_adapted(model, adapter)
    carved = split_checked(model, cfg, rank, counts, text_layers,
                           {n for n, p in model.named_parameters() if p.requires_grad})
    carved.peft = peft_model
    return carved, peft_model.peft_config[ADAPTER].base_model_name_or_path or source, counts


def is_peft(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # peft is needed only for a PeftModel, which cannot exist without it
        return False
    return isinstance(model, PeftModel)


