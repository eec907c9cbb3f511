"""The blocks the families' Jinja chat templates are written from (:data:`CONTENT`, :func:`chatml`, :func:`roles`,
:func:`image_part`...), the default template of a family (its :class:`~.family_data.FamilyData` ``template``, in
its package's ``data.py``) for checkpoints (or the bundled tokenizers) that carry none, and the choice between a
checkpoint's own template and the family default. The templates follow the formats the hub checkpoints use.

Each template's comment says where it departs from the hub's. A hub marker that the tokenizer's vocabulary lacks
(the Qwen2 vocabulary of the tiny models) is written as the Qwen2 special token that stands in for it
(:data:`STAND_INS`: Gemma's turn markers as ``<|im_start|>``/``<|im_end|>``...) or, where none does, as plain
text (``[gMASK]``, ``<|user|>``, ``[INST]``).

In every template a message's ``content`` is a string or a list of parts ``{"type": "image"}`` /
``{"type": "text", "text": ...}``; an image part renders the family's image placeholder (Qwen:
``<|vision_start|><|image_pad|><|vision_end|>``; LLaVA: ``<image>\\n``, the newline left out when the next text
starts with one; the others ``processor.image_token``), which the processor then expands to the image's tokens.
The Qwen templates write a video part ``{"type": "video"}`` as ``<|vision_start|><|video_pad|><|vision_end|>``, as
the hub templates do, and the GLM ones as ``<|begin_of_video|><|video|><|end_of_video|>`` (``VIDEO_TOKEN``, the
processor's ``video_token``; docs/video.md). ``add_generation_prompt`` appends the assistant header (ChatML
``<|im_start|>assistant\\n``, LLaVA ``ASSISTANT:``; nothing where the hub format has none: PaliGemma, Mistral 3, LLaVA-NeXT). Rendering a
conversation's first turns with the generation prompt gives a prefix of rendering it all (how the collator finds
the assistant tokens).

The templates are written for the Jinja environment of ``transformers`` (``trim_blocks`` and ``lstrip_blocks``
on), so all their output comes from ``{{ }}`` expressions and none from literal text between the tags.
"""

from __future__ import annotations

QWEN_VISION = "<|vision_start|><|image_pad|><|vision_end|>"
QWEN_VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"  # a video part in the Qwen templates (as the hub's)

# The text of one message's content, a string or a list of parts, with each image part as ``IMAGE``.
CONTENT = (
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or (part['type'] is not defined and 'image' in part) -%}"
    "{{- IMAGE -}}"
    "{%- elif part['type'] == 'text' -%}"
    "{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
)


def with_video(content: str, video: str) -> str:
    """``content`` (``CONTENT`` with its images set) writing each video part as the Jinja string ``video``."""
    text = "{%- elif part['type'] == 'text' -%}"
    part = ("{%- elif part['type'] == 'video' or (part['type'] is not defined and 'video' in part) -%}"
            "{{- " + video + " -}}")
    return content.replace(text, part + text, 1)


def chatml(default_system: str | None, image: str = "'" + QWEN_VISION + "'", video: str | None = None) -> str:
    """ChatML over ``CONTENT``, with ``default_system`` as the system turn when the first message is not one,
    each image part written as the Jinja string ``image`` and, where given, each video part as ``video``."""
    content = CONTENT.replace("IMAGE", image)
    if video is not None:
        content = with_video(content, video)
    head = ""
    if default_system is not None:
        head = ("{%- if loop.first and message['role'] != 'system' -%}"
                "{{- '<|im_start|>system\\n" + default_system + "<|im_end|>\\n' -}}"
                "{%- endif -%}")
    return ("{%- for message in messages -%}"
            + head +
            "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
            + content +
            "{{- '<|im_end|>\\n' -}}"
            "{%- endfor -%}"
            "{%- if add_generation_prompt -%}"
            "{{- '<|im_start|>assistant\\n' -}}"
            "{%- endif -%}")


# The text parts of a message (or its string content), and its image parts alone, for templates that write a
# message's images before its text (LLaVA-NeXT, LLaVA-OneVision, PaliGemma).
TEXTS = ("{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}"
          "{%- for part in message['content'] if part['type'] == 'text' -%}{{- part['text'] -}}{%- endfor -%}"
          "{%- endif -%}")
IMAGES = ("{%- if message['content'] is not string -%}"
           "{%- for part in message['content'] if part['type'] == 'image' -%}{{- IMAGE -}}{%- endfor -%}"
           "{%- endif -%}")
BOS = "{%- if bos_token -%}{{- bos_token -}}{%- endif -%}"
GENERATION = "{%- if add_generation_prompt -%}{{- PROMPT -}}{%- endif -%}"


def image_part(expr: str) -> str:
    """``CONTENT`` with each image part written as the Jinja string ``expr``."""
    return CONTENT.replace("IMAGE", expr)


def roles(user: str, assistant: str, system: str, user_end: str, assistant_end: str, image: str, prompt: str,
          start: str = "") -> str:
    """A template of role headers (each argument a Jinja string expression): ``start``, then per message its
    header (``user`` for any role but assistant and system), its content (``image`` for each image part) and its
    end; ``prompt`` as the generation prompt."""
    return (start +
            "{%- for message in messages -%}"
            "{%- if message['role'] == 'assistant' -%}{{- " + assistant + " -}}"
            "{%- elif message['role'] == 'system' -%}{{- " + system + " -}}"
            "{%- else -%}{{- " + user + " -}}{%- endif -%}" + CONTENT.replace("IMAGE", image) +
            "{%- if message['role'] == 'assistant' -%}{{- " + assistant_end + " -}}"
            "{%- else -%}{{- " + user_end + " -}}{%- endif -%}"
            "{%- endfor -%}" + GENERATION.replace("PROMPT", prompt))


# Markers of the hub templates that a vocabulary without them (the Qwen2 one) writes as the Qwen2 special token
# standing in, so that they stay one token each and an end-of-turn marker is still labelled. Other missing markers
# ([gMASK], <|user|>, [INST]...) are written as they are and tokenized as plain text.
STAND_INS = {"<start_of_turn>": "<|im_start|>", "<end_of_turn>": "<|im_end|>",  # Gemma 3
             "<end_of_utterance>": "<|im_end|>",  # Idefics3, SmolVLM
             "<|begin_of_image|>": "<|vision_start|>", "<|end_of_image|>": "<|vision_end|>",  # GLM-4V
             "<|begin_of_video|>": "<|box_start|>", "<|end_of_video|>": "<|box_end|>",  # (families.glm.processor)
             "<|turn>": "<|im_start|>", "<turn|>": "<|im_end|>",  # Gemma 4
             "[|endofturn|]": "<|im_end|>",  # EXAONE 4.5
             "<|vision_bos|>": "<|vision_start|>", "<|vision_eos|>": "<|vision_end|>",  # Qwen2.5-Omni
             "<|header_start|>": "<|im_start|>", "<|eot|>": "<|im_end|>",  # Llama 4
             "<|content_image|>": "<|vision_start|>", "<|end_message|>": "<|im_end|>"}  # Inkling


def default_chat_template(model_type: str, image_token: str | None = None, tokenizer=None,
                          video_token: str | None = None) -> str:
    """The family's Jinja chat template (``FamilyData.template``), for ``apply_chat_template(...,
    chat_template=...)``. ``image_token``: the image placeholder (``processor.image_token``; ``None``: the hub
    checkpoints' one, ``FamilyData.hub_image_token``; the Qwen templates write
    ``<|vision_start|><|image_pad|><|vision_end|>``); ``video_token``: the video placeholder where a template writes
    ``VIDEO_TOKEN`` (``processor.video_token``; ``None``: the hub checkpoints' one, ``FamilyData.hub_video_token``).
    ``tokenizer``: where given, each marker of :data:`STAND_INS` its vocabulary lacks is written as its stand-in.

    Raises:
        ValueError: ``model_type`` has no template here (the message lists the supported ones).
    """
    from ..families.registry import all_data, family_data
    declared = family_data(model_type)
    if declared is None:
        raise ValueError(f"model_type {model_type!r} has no default chat template; supported: {sorted(all_data())}")
    image_token = image_token or declared.hub_image_token
    template = declared.template.replace("IMAGE_TOKEN", image_token.replace("'", "\\'"))
    video_token = video_token or declared.hub_video_token
    template = template.replace("VIDEO_TOKEN", video_token.replace("'", "\\'"))
    if tokenizer is not None:
        vocab = tokenizer.get_vocab()
        for marker, stand_in in STAND_INS.items():
            if marker not in vocab and stand_in in vocab:
                template = template.replace(marker, stand_in)
    return template


def chat_template_for(processor_or_tokenizer, model_type: str) -> str:
    """The chat template to render conversations with: the checkpoint's own (``processor.chat_template``, else its
    tokenizer's ``chat_template``; or a bare tokenizer's ``chat_template``) when it has one, else
    :func:`default_chat_template` of ``model_type``.

    Raises:
        ValueError: the checkpoint has no template and ``model_type`` has no default one.
    """
    own = getattr(processor_or_tokenizer, "chat_template", None)
    if not own:
        tokenizer = getattr(processor_or_tokenizer, "tokenizer", None)
        own = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if isinstance(own, dict):  # several named templates: the one called "default", as transformers picks
        own = own.get("default")
    if own:
        return own
    return default_chat_template(model_type, getattr(processor_or_tokenizer, "image_token", None),
                                 getattr(processor_or_tokenizer, "tokenizer", processor_or_tokenizer),
                                 getattr(processor_or_tokenizer, "video_token", None))
