"""What a hub snapshot of a vision-language model holds beside the weights, and loading it back.

save_processor_files writes what a hub snapshot of the family holds beside the weights, so that a user loads
the checkpoint as the original model (transformers 5 reads each file as noted):

- ``preprocessor_config.json``: the image processor, with ``image_processor_type`` (``AutoImageProcessor``'s
  class; with torchvision also ``AutoVideoProcessor``'s, ``...ImageProcessor`` -> ``...VideoProcessor``, where the
  directory has no video processor file) and ``processor_class`` (``AutoProcessor``'s class);
- ``video_preprocessor_config.json``: the video processor (``video_processor_type``), for Qwen3-VL as its
  snapshots hold one (the class inferred from the image processor's type would be Qwen2-VL's); Qwen2-VL and
  Qwen2.5-VL snapshots have none, unless the video processor's settings differ from those the image processor
  implies (:func:`~.video_processor.implied_by_image`);
- ``processor_config.json``: the processor's own arguments, where it has any (LLaVA: patch size, feature
  strategy, image token, extra positions, as llava-hf's snapshots hold them);
- ``tokenizer.json``, ``tokenizer_config.json`` (with ``processor_class``) and ``chat_template.jinja``, which the
  tokenizer and the processor both read;
- ``generation_config.json``: what ``generate`` stops at (every end-of-turn token of the chat template).

With torchvision, ``AutoProcessor.from_pretrained(dir)`` then gives the stock processor (``Qwen2_5_VLProcessor``)
with the chat template. Without it, a Qwen family's stock processor fails on its video processor (an
``ImportError`` naming e.g. ``Qwen2VLVideoProcessor``); :func:`load_checkpoint_processor` then builds the
image-only processor of :func:`mpipe_hf.data.build_processor` from ``AutoTokenizer`` and ``AutoImageProcessor``.
"""

from __future__ import annotations

import copy
import json
import os


_VIDEO_KEYS = ("do_convert_rgb", "do_normalize", "do_rescale", "do_resize", "image_mean", "image_std", "merge_size",
               "patch_size", "resample", "rescale_factor", "size", "temporal_patch_size")
CHATML_END_TOKENS = ("<|im_end|>", "<|endoftext|>")  # the Qwen checkpoints stop at both, <|im_end|> first


def stock_processor_class(processor) -> str:
    """The name of the ``transformers`` processor class that ``processor`` is or derives from (``Qwen2_5_VLProcessor``
    for :func:`mpipe_hf.data.build_processor`'s image-only subclass), or that it stands in for (its class's
    ``stock_class_name``: Mistral 3's without torchvision), the name ``AutoProcessor`` resolves.

    Raises:
        TypeError: no class in ``type(processor).__mro__`` comes from ``transformers`` and none is named.
    """
    for cls in type(processor).__mro__:
        if cls.__module__.startswith("transformers.models."):
            return cls.__name__
    if getattr(type(processor), "stock_class_name", None):
        return type(processor).stock_class_name
    raise TypeError(f"{type(processor).__name__} derives from no transformers processor class")


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def chat_eos_token_ids(tokenizer, chat_template: str, eos_token_id=None) -> list[int]:
    """The token ids ``generate`` should stop at for conversations rendered by ``chat_template``: for a ChatML
    template (one that writes ``<|im_end|>``) ``<|im_end|>`` then ``<|endoftext|>``, as the Qwen checkpoints'
    ``generation_config.json`` lists them; then the tokenizer's eos token (a LLaVA template writes it after each
    answer) and ``eos_token_id`` (an int, a list or ``None``: the ids already configured), each id once."""
    ids = []
    if "<|im_end|>" in chat_template:
        vocab = tokenizer.get_vocab()
        ids += [vocab[token] for token in CHATML_END_TOKENS if token in vocab]
    ids += _ids(tokenizer.eos_token_id) + _ids(eos_token_id)
    return list(dict.fromkeys(ids))


def chat_generation_config(config, tokenizer, chat_template: str, generation_config=None):
    """The ``GenerationConfig`` a checkpoint saves: ``generation_config`` (a copy; e.g. the source checkpoint's,
    with its sampling settings) or else ``GenerationConfig.from_model_config(config)``, with its eos ids extended by
    :func:`chat_eos_token_ids` (a list when there are several, as the hub configs write them) and its pad id set to
    the tokenizer's where it has none."""
    from transformers import GenerationConfig

    gen = (copy.deepcopy(generation_config) if generation_config is not None
           else GenerationConfig.from_model_config(config))
    eos = chat_eos_token_ids(tokenizer, chat_template, gen.eos_token_id)
    gen.eos_token_id = eos if len(eos) > 1 else (eos[0] if eos else None)
    if gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id
    return gen


def video_processor_config(directory: str) -> dict | None:
    """The video processor settings a checkpoint directory (e.g. the hub snapshot a run fine-tunes) holds, read as
    ``AutoVideoProcessor`` reads them: ``processor_config.json``'s ``video_processor`` entry, else
    ``video_preprocessor_config.json``; ``None`` when it has neither (a Qwen2-VL or Qwen2.5-VL snapshot, whose video
    processor is built from the image processor's ``preprocessor_config.json``), or when ``directory`` is not a
    local directory.

    Raises:
        json.JSONDecodeError: one of those files is not valid JSON.
    """
    nested = os.path.join(directory, "processor_config.json")
    if os.path.isfile(nested):
        with open(nested) as f:
            video = json.load(f).get("video_processor")
        if isinstance(video, dict):
            return video
    flat = os.path.join(directory, "video_preprocessor_config.json")
    if os.path.isfile(flat):
        with open(flat) as f:
            return json.load(f)
    return None


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_processor_files(directory: str, config, processor, chat_template: str, generation_config=None,
                         video_processor: dict | None = None) -> list[str]:
    """Write into ``directory`` the processor files of a hub snapshot (the module docstring lists them), so that
    ``AutoProcessor.from_pretrained(directory)`` gives the stock processor of ``config.model_type`` with
    ``chat_template`` where torchvision is installed, and ``AutoTokenizer`` and ``AutoImageProcessor`` (with
    :func:`mpipe_hf.data.build_processor`, or :func:`load_checkpoint_processor`) give the image-only processor
    where it is not. ``config.json`` and the weights are the caller's. Files of those names are replaced;
    ``processor`` is left as it was.

    Args:
        directory: the checkpoint directory (created if missing).
        config: the model's config (``model_type`` and, without ``generation_config``, the eos and pad ids).
        processor: the processor the run used: a stock ``transformers`` processor or the image-only one of
            :func:`mpipe_hf.data.build_processor` (its ``tokenizer`` and ``image_processor`` are saved).
        chat_template: the Jinja chat template (e.g. ``mpipe_hf.data.chat_template_for(processor, model_type)``),
            written as ``chat_template.jinja``.
        generation_config: a ``GenerationConfig`` to start from (see :func:`chat_generation_config`).
        video_processor: the video processor's settings (e.g. :func:`video_processor_config` of the source
            checkpoint), written as ``video_preprocessor_config.json``. Without them: the processor's own video
            processor's where it has one, else for a family whose hub snapshots hold one (``FamilyData.snapshot_video_class``) the image processor's
            resizing and normalisation under the family's video processor class, else no file (Qwen2-VL,
            Qwen2.5-VL, as on the hub).

    Returns:
        The names of the files written, sorted.

    Raises:
        ValueError: ``chat_template`` is empty.
        TypeError: ``processor`` derives from no ``transformers`` processor class.
    """
    written = save_processor(directory, processor, config.model_type, chat_template, video_processor)
    chat_generation_config(config, processor.tokenizer, chat_template, generation_config).save_pretrained(directory)
    return sorted(written + ["generation_config.json"])


def save_processor(directory: str, processor, model_type: str, chat_template: str,
                   video_processor: dict | None = None) -> list[str]:
    """The processor part of :func:`save_processor_files` (everything but ``generation_config.json``): what
    ``processor.save_pretrained`` of the image-only processors writes. Returns the names written, sorted.

    Raises:
        ValueError: ``chat_template`` is empty.
        TypeError: ``processor`` derives from no ``transformers`` processor class.
    """
    if not isinstance(chat_template, str) or not chat_template.strip():
        raise ValueError("chat_template must be a non-empty Jinja template string")
    os.makedirs(directory, exist_ok=True)
    name = stock_processor_class(processor)
    tokenizer = processor.tokenizer
    written = set()
    saved = (tokenizer.chat_template, getattr(tokenizer, "_processor_class", None))
    tokenizer.chat_template, tokenizer._processor_class = chat_template, name
    try:
        for path in tokenizer.save_pretrained(directory):
            written.add(os.path.relpath(path, directory))
    finally:
        tokenizer.chat_template, tokenizer._processor_class = saved

    image = json.loads(processor.image_processor.to_json_string())
    image["processor_class"] = name
    _write_json(os.path.join(directory, "preprocessor_config.json"), image)
    written.add("preprocessor_config.json")

    from .video_processor import implied_by_image
    own_video = getattr(processor, "video_processor", None)
    if video_processor is None and own_video is not None and not implied_by_image(own_video,
                                                                                  processor.image_processor):
        video_processor = json.loads(own_video.to_json_string())
    from ..families.registry import family_data
    declared = family_data(model_type)
    if video_processor is None and declared is not None and declared.snapshot_video_class:
        video_processor = {key: image[key] for key in _VIDEO_KEYS if key in image}
        video_processor["video_processor_type"] = declared.snapshot_video_class
    if video_processor is not None:
        _write_json(os.path.join(directory, "video_preprocessor_config.json"),
                    {**video_processor, "processor_class": name})
        written.add("video_preprocessor_config.json")

    skip = set(processor.get_attributes()) | {"processor_class", "chat_template", "auto_map"}
    own = {key: value for key, value in processor.to_dict().items() if key not in skip}
    if own:  # flat, as llava-hf's snapshots hold it (the sub-processors have their own files)
        _write_json(os.path.join(directory, "processor_config.json"), {**own, "processor_class": name})
        written.add("processor_config.json")
    return sorted(written)


def load_checkpoint_processor(directory: str):
    """The processor of a checkpoint directory written with :func:`save_processor_files`, with its chat template:
    ``AutoProcessor.from_pretrained(directory)`` where torchvision is installed (the families with
    ``FamilyData.always_ours`` excepted) or the model type has no processor here; else (no torchvision: the stock processors
    of most families need it for their video processor, Gemma 4's and GLM-4.6V's included) the processor training
    uses, :func:`mpipe_hf.data.build_processor`, over ``AutoTokenizer`` and ``AutoImageProcessor`` (images and text
    processed as by the stock class; Qwen2-VL / Qwen2.5-VL, Qwen3-VL and GLM-4.1V / GLM-4.5V videos by the
    torchvision-free video processors, with the snapshot's video settings where it has any). A LoRA adapter
    directory (PEFT's ``adapter_config.json`` and the processor files, no ``config.json``) takes the model type
    from the config of its ``base_model_name_or_path``.

    Raises:
        OSError: ``directory`` lacks the config, tokenizer or image processor files (from ``transformers``).
        ValueError: the model type has no processor (from ``transformers`` or ``build_processor``); its only
            processor is the stock one, which needs torchvision, and torchvision does not import
            (:func:`~.stock_processor.processor_problem`'s reason, naming the fix).
    """
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer
    from transformers.utils import is_torchvision_available

    from ..families.registry import family_data
    from .processor import build_processor
    from .stock_processor import processor_problem

    adapter = os.path.join(directory, "adapter_config.json")
    source = directory
    if not os.path.isfile(os.path.join(directory, "config.json")) and os.path.isfile(adapter):
        with open(adapter) as f:
            source = json.load(f).get("base_model_name_or_path")
        if not source:
            raise ValueError(f"{directory!r} is an adapter directory that names no base model "
                             f"(base_model_name_or_path is null: trained from a config); pass the base model's "
                             f"directory, or one with its config.json")
    config = AutoConfig.from_pretrained(source)
    problem = processor_problem(config.model_type, directory)
    if problem:  # its only processor is the stock torchvision one: say so, not AutoProcessor's generic error
        raise ValueError(problem)
    # FamilyData.always_ours: build_processor's even with torchvision (the stock PaliGemma/Idefics3 processors add
    # tokens and rewrite the text; InternVL, LLaVA-OneVision, SmolVLM need torchvision for video, GLM-4.1V's ours)
    declared = family_data(config.model_type)
    if declared is None or (is_torchvision_available() and not declared.always_ours):
        return AutoProcessor.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    from .stock_processor import checkpoint_image_processor  # ours where the stock class needs torchvision
    image_processor = checkpoint_image_processor(config.model_type, directory)
    video = None
    if declared.video_from_snapshot is not None:  # the snapshot's video settings, as AutoVideoProcessor reads them
        video = declared.video_from_snapshot(image_processor, config, video_processor_config(directory))
    processor = build_processor(config, tokenizer, image_processor, video_processor=video)
    processor.chat_template = tokenizer.chat_template
    return processor
