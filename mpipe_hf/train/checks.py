"""What ``mpipe-hf train`` checks before any process group exists: the recipe's schedule, model type, the
tokenizer's chat template (of the model's family, or of none known), layer layout, world size, data files and
output directory (``mpipe-hf check`` runs the same). The rows themselves are checked by :mod:`.data_check`.
"""

from __future__ import annotations

import os

from ..models import get_family
from ..models.decoder import check_packable, layer_types
from ..models.expert_parallel import check_expert_parallel
from ..models.freeze import check_trainable
from ..models.load import check_adapter
from ..models.packed import RECURRENT, row_blind
from ..runtime.context_parallel import kv_repeats
from .metrics import available_trackers
from .recipe import Recipe
from .sources import load_config


def check_output_dir(path: str) -> None:
    """``train.output_dir`` can be created and written (a probe file is made and removed).

    Raises:
        ValueError: naming the field and the operating system's error.
    """
    import tempfile
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".mpipe_hf_probe"):
            pass
    except OSError as err:
        raise ValueError(f"train.output_dir {path!r} is not writable ({err})") from err


def check_sources(recipe: Recipe) -> None:
    """Every data file or folder of the recipe exists (reading and checking its rows is
    :func:`~.data_check.check_data`'s, before the launch).

    Raises:
        ValueError: naming the field and the path.
    """
    for i, source in enumerate(recipe.data.all_sources):
        field = "data.path" if recipe.data.sources is None else f"data.sources[{i}].path"
        if not os.path.exists(source.path):
            raise ValueError(f"{field} {source.path!r} is neither a file nor a folder")
        if source.images is not None and not os.path.isdir(source.images):
            raise ValueError(f"{field.replace('path', 'images')} {source.images!r} is not a folder")
    for field in ("eval_path", "clean_rows"):
        value = getattr(recipe.data, field)
        if value is not None and not os.path.isfile(value):
            raise ValueError(f"data.{field} {value!r} is not a file")


def check_chat_template(recipe: Recipe, config) -> None:
    """The chat template of the recipe's tokenizer (``model.tokenizer``, else the checkpoint's) belongs to the
    family of ``config.model_type`` or to no family known (a user's own): a vision-language model given another
    family's template (the Qwen ChatML on Gemma 3) would fail every image row at load
    (:func:`mpipe_hf.data.template_family.check_template_family`). A decoder-only LM is not checked.

    Raises:
        ValueError: naming the field, both families and the fix.
    """
    if not hasattr(config, "vision_config"):
        return
    from transformers import AutoTokenizer

    from ..data.template_family import check_template_family
    field = "model.tokenizer" if recipe.model.tokenizer or recipe.model.name_or_path is None else "model.name_or_path"
    template = AutoTokenizer.from_pretrained(recipe.model.tokenizer_dir).chat_template
    check_template_family(template, config.model_type, f"{field} {recipe.model.tokenizer_dir!r}")


def check_processor(config, name_or_path: str | None) -> None:
    """A vision-language family whose only processor is the stock one with torchvision
    (:mod:`mpipe_hf.data.stock_processor`) has torchvision and a checkpoint to load it from.

    Raises:
        ValueError: naming the model type, the stock class and the fix (install torchvision, or set
            ``model.name_or_path``).
    """
    if not hasattr(config, "vision_config"):
        return
    from ..data.stock_processor import processor_problem
    problem = processor_problem(config.model_type, name_or_path)
    if problem:
        raise ValueError(problem)


def check(recipe: Recipe) -> list[int]:
    """Every check that needs no process group: schedule, model type, layer layout, world size, data paths.

    Returns the decoder layers per stage: ``layers_per_stage``, else balanced by the costs of the recipe's
    ``profile``, else by the layers' and the LM head's matmul cost estimated from the config. Raises
    ``ValueError`` naming the field.
    """
    cfg = recipe.schedule()
    recipe.model.check_tokenizer()
    check_sources(recipe)
    config = load_config(recipe.model)
    get_family(config.model_type)  # an unknown model_type fails here, naming the supported ones
    check_processor(config, recipe.model.name_or_path)
    check_chat_template(recipe, config)
    available_trackers(recipe.train.report_to)
    counts = check_layout(recipe, config)
    if recipe.data.packing:  # a layer type packing cannot keep exact (chunked attention)
        check_packable(config.get_text_config())
    if recipe.lora is not None:
        check_adapter(config, cfg, recipe.lora.peft_config(), counts, recipe.parallel.text_layers, recipe.lora.merge)
    check_expert_parallel(config, recipe.parallel.ep_size,
                          recipe.lora.peft_config() if recipe.lora is not None else None, recipe.data.packing)
    check_trainable(config, cfg, recipe.train.trainable_spec(),
                    recipe.lora.peft_config() if recipe.lora is not None else None, recipe.parallel.text_layers)
    check_context_parallel(config, recipe.parallel.cp_size)
    check_context_parallel_packing(config, recipe.parallel.cp_size, recipe.data.packing)
    processes = cfg.pp_size * recipe.parallel.dp_size * recipe.parallel.cp_size
    world = int(os.environ.get("WORLD_SIZE", processes))
    if world != processes:
        raise ValueError(f"parallel.pp_size ({cfg.pp_size}) * parallel.dp_size ({recipe.parallel.dp_size}) * "
                         f"parallel.cp_size ({recipe.parallel.cp_size}) = {processes} processes, but {world} were "
                         f"launched; launch {processes}")
    check_output_dir(recipe.train.output_dir)  # last: it creates the directory
    return counts


def check_layout(recipe: Recipe, config, profile=None) -> list[int]:
    """Decoder layers per stage: ``layers_per_stage``, else balanced by the costs of ``profile`` (default: the
    recipe's ``profile``), else by the layers' and the LM head's matmul cost from the config; checked against the
    model. Raises ``ValueError`` naming the field."""
    cfg = recipe.schedule()
    layout = recipe.parallel.layers_per_stage
    if profile is None and recipe.parallel.profile is not None:
        from ..schedule.tune import Profile
        profile = Profile.load(recipe.parallel.profile)
    layers = config.get_text_config().num_hidden_layers
    if profile is not None and profile.num_layers != layers:
        raise ValueError(f"the profile measures a model of {profile.num_layers} decoder layers, but "
                         f"{config.model_type!r} here has {layers}; profile this recipe's model (mpipe-hf profile "
                         f"RECIPE.yaml) or set parallel.layers_per_stage")
    if layout is None and profile is not None:
        from ..schedule.tune import profile_layers
        layout = profile_layers(profile, cfg, recipe.parallel.text_layers)
    return get_family(config.model_type).layer_counts(config, cfg, layout, recipe.parallel.text_layers)


def check_context_parallel_packing(config, cp_size: int, packing: bool) -> None:
    """Check ``data.packing`` with ``parallel.cp_size > 1`` before launch. A packed micro is split as one
    sequence: its rows' block-diagonal mask is built on the whole sequence and Ulysses gives every rank the whole
    sequence for its heads, so it stays exact and a row may cross the split. Raises ``ValueError``, naming the
    model type, for a family whose masks cannot see packed rows (:func:`~mpipe_hf.models.packed.row_blind`: Gemma's
    and PaliGemma's token-type blocks, Molmo2's), which runs the rows one by one, each cut from the whole sequence.
    (Recurrent layer types are refused for any cp by :func:`check_context_parallel`, FlashAttention when the stages
    are set up.)"""
    if cp_size == 1 or not packing:
        return
    masks = get_family(config.model_type).masks
    if row_blind(masks):
        raise ValueError(f"parallel.cp_size {cp_size} does not run with data.packing: true for "
                         f"{config.model_type}, whose masks ({masks.__name__}) cannot see packed rows and run them "
                         f"one by one; set data.packing: false or cp_size: 1")


def check_context_parallel(config, cp_size: int) -> None:
    """Check ``parallel.cp_size`` against the model's HF ``config`` before launch (nothing for ``cp_size`` 1).

    Raises:
        ValueError: ``cp_size`` does not divide the text model's attention heads, or its KV heads do not divide
            the heads (:func:`~mpipe_hf.runtime.context_parallel.kv_repeats`); a decoder layer type whose state runs along the sequence (Gated
            DeltaNet's linear attention, LFM2's short convolutions), which the split cannot yet pass between the
            CP ranks: refused by name.
    """
    if cp_size == 1:
        return
    text = config.get_text_config()
    recurrent = sorted(set(layer_types(text)) & set(RECURRENT))
    if recurrent:
        raise ValueError(f"parallel.cp_size {cp_size}: {config.model_type}'s layers of type {recurrent} carry a "
                         f"state along the sequence, which context parallelism does not pass between its ranks "
                         f"yet; set cp_size: 1")
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    try:
        kv_repeats(heads, kv_heads, cp_size)
    except ValueError as err:
        raise ValueError(f"parallel.cp_size: {err}") from None
