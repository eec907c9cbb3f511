"""Jinja chat templates for each vision-language family, for checkpoints (or the bundled tokenizers) that carry
none, and the choice between a checkpoint's own template and the family default.

The templates follow the formats the hub checkpoints use:

- ``qwen2_vl``, ``qwen2_5_vl``: ChatML (``<|im_start|>role\\n ... <|im_end|>\\n``) with the default system message
  ``You are a helpful assistant.`` when the first message is not a system one, as the Qwen2-VL and Qwen2.5-VL
  checkpoints' templates do;
- ``qwen3_vl``: the same ChatML markup with no default system message, as the Qwen3-VL checkpoints' template does;
- ``llava``: the llava-1.5 conversation format (``USER: <image>\\n... ASSISTANT: ...``), the tokenizer's eos after
  every assistant turn and a space after every system and user turn.

In every template a message's ``content`` is a string or a list of parts ``{"type": "image"}`` /
``{"type": "text", "text": ...}``; an image part renders the family's image placeholder (Qwen:
``<|vision_start|><|image_pad|><|vision_end|>``; LLaVA: ``<image>\\n``, the newline left out when the next text
starts with one), which the processor then expands to the image's tokens. ``add_generation_prompt`` appends the
assistant header (ChatML ``<|im_start|>assistant\\n``, LLaVA ``ASSISTANT:``).

The templates are written for the Jinja environment of ``transformers`` (``trim_blocks`` and ``lstrip_blocks``
on), so all their output comes from ``{{ }}`` expressions and none from literal text between the tags.
"""

from __future__ import annotations

QWEN_VISION = "<|vision_start|><|image_pad|><|vision_end|>"

# The text of one message's content, a string or a list of parts, with each image part as ``IMAGE``.
_CONTENT = (
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


def _chatml(default_system: str | None) -> str:
    """ChatML over ``_CONTENT``, with ``default_system`` as the system turn when the first message is not one."""
    head = ""
    if default_system is not None:
        head = ("{%- if loop.first and message['role'] != 'system' -%}"
                "{{- '<|im_start|>system\\n" + default_system + "<|im_end|>\\n' -}}"
                "{%- endif -%}")
    return ("{%- for message in messages -%}"
            + head +
            "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
            + _CONTENT.replace("IMAGE", "'" + QWEN_VISION + "'") +
            "{{- '<|im_end|>\\n' -}}"
            "{%- endfor -%}"
            "{%- if add_generation_prompt -%}"
            "{{- '<|im_start|>assistant\\n' -}}"
            "{%- endif -%}")


# ``<image>`` and a newline, unless the next part is a text that starts with one (``"<image>\\n..."`` content).
_LLAVA_IMAGE = ("{{- 'IMAGE_TOKEN' -}}"
                "{%- if not (loop.nextitem is defined and loop.nextitem['type'] == 'text' "
                "and loop.nextitem['text'][:1] == '\\n') -%}"
                "{{- '\\n' -}}"
                "{%- endif -%}")

_LLAVA = ("{%- for message in messages -%}"
          "{%- if message['role'] == 'user' -%}"
          "{{- 'USER: ' -}}"
          "{%- elif message['role'] == 'assistant' -%}"
          "{{- 'ASSISTANT: ' -}}"
          "{%- endif -%}"
          + _CONTENT.replace("{{- IMAGE -}}", _LLAVA_IMAGE) +
          "{%- if message['role'] == 'assistant' -%}"
          "{{- eos_token -}}"
          "{%- else -%}"
          "{{- ' ' -}}"
          "{%- endif -%}"
          "{%- endfor -%}"
          "{%- if add_generation_prompt -%}"
          "{{- 'ASSISTANT:' -}}"
          "{%- endif -%}")

_TEMPLATES = {
    "qwen2_vl": _chatml("You are a helpful assistant."),
    "qwen2_5_vl": _chatml("You are a helpful assistant."),
    "qwen3_vl": _chatml(None),
    "llava": _LLAVA,
}
TEMPLATE_TYPES = sorted(_TEMPLATES)


def default_chat_template(model_type: str, image_token: str = "<image>") -> str:
    """The family's Jinja chat template (module docstring), for ``apply_chat_template(..., chat_template=...)``.
    ``image_token``: LLaVA's image placeholder (``<image>`` in the llava-hf checkpoints; a checkpoint built on
    another vocabulary names its own, ``processor.image_token``).

    Raises:
        ValueError: ``model_type`` has no template here (the message lists the supported ones).
    """
    if model_type not in _TEMPLATES:
        raise ValueError(f"model_type {model_type!r} has no default chat template; supported: {TEMPLATE_TYPES}")
    return _TEMPLATES[model_type].replace("IMAGE_TOKEN", image_token.replace("'", "\\'"))


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
    return own if own else default_chat_template(model_type, getattr(processor_or_tokenizer, "image_token", None)
                                                 or "<image>")
