"""Jinja chat templates for each vision-language family, for checkpoints (or the bundled tokenizers) that carry
none, and the choice between a checkpoint's own template and the family default.

The templates follow the formats the hub checkpoints use:

- ``qwen2_vl``, ``qwen2_5_vl``: ChatML (``<|im_start|>role\\n ... <|im_end|>\\n``) with the default system message
  ``You are a helpful assistant.`` when the first message is not a system one, as the Qwen2-VL and Qwen2.5-VL
  checkpoints' templates do;
- ``qwen3_vl``: the same ChatML markup with no default system message, as the Qwen3-VL checkpoints' template does;
- ``llava``: the llava-1.5 conversation format (``USER: <image>\\n... ASSISTANT: ...``), the tokenizer's eos after
  every assistant turn and a space after every system and user turn;
- ``qwen3_5``, ``qwen3_5_moe``, ``qwen3_vl_moe``: ``qwen3_vl``'s ChatML; ``internvl``: the same ChatML with an
  image as ``<IMG_CONTEXT>\\n`` (InternVL3-hf), which the processor expands to ``<img><IMG_CONTEXT>...</img>``;
- ``glm4v``, ``glm4v_moe``: GLM-4.1V's ``[gMASK]<sop><|user|>\\n...<|assistant|>\\n...``, the eos token after each
  answer (the hub format has no end-of-turn token);
- ``gemma3``: ``<bos><start_of_turn>user\\n...<end_of_turn>\\n<start_of_turn>model\\n...``;
- ``paligemma`` (no hub template): its processor's ``<image>...<bos>prompt\\n`` + ``answer<eos>``, turn by turn;
- ``mistral3``: Mistral-Small-3.1's ``<s>[INST]...[/INST]answer</s>``;
- ``llava_next``: llava-v1.6-mistral's ``[INST] <image>\\n... [/INST] answer</s> ``; ``llava_onevision``:
  ``<|im_start|>user <image>\\n...<|im_end|><|im_start|>assistant\\n...<|im_end|>``;
- ``idefics3``, ``smolvlm``: ``User:<image>...<end_of_utterance>\\nAssistant: ...<end_of_utterance>\\n``.

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
          + CONTENT.replace("{{- IMAGE -}}", _LLAVA_IMAGE) +
          "{%- if message['role'] == 'assistant' -%}"
          "{{- eos_token -}}"
          "{%- else -%}"
          "{{- ' ' -}}"
          "{%- endif -%}"
          "{%- endfor -%}"
          "{%- if add_generation_prompt -%}"
          "{{- 'ASSISTANT:' -}}"
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


# Gemma 3 (gemma-3-*-it): <bos>, turns <start_of_turn>user|model\n ... <end_of_turn>\n, the system text and a blank
# line before the first user text, text parts trimmed, images <start_of_image>.
_GEMMA3 = (BOS +
           "{%- if messages[0]['role'] == 'system' -%}"
           "{%- set first = messages[0]['content'] if messages[0]['content'] is string "
           "else messages[0]['content'][0]['text'] -%}"
           "{%- set first_user_prefix = first + '\\n\\n' -%}{%- set loop_messages = messages[1:] -%}"
           "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
           "{%- for message in loop_messages -%}"
           "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' -}}"
           "{{- first_user_prefix if loop.first else '' -}}"
           "{%- if message['content'] is string -%}{{- message['content'] | trim -}}{%- else -%}"
           "{%- for part in message['content'] -%}"
           "{%- if part['type'] == 'image' -%}{{- 'IMAGE_TOKEN' -}}"
           "{%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
           "{%- endfor -%}{%- endif -%}"
           "{{- '<end_of_turn>\\n' -}}"
           "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<start_of_turn>model\\n'"))

# PaliGemma (no hub template; its processor's layout "<image>... <bos>prefix\n" + "suffix<eos>", turn by turn): a
# user or system turn writes its images, the BOS after the first turn's images, its text and a newline; an
# assistant turn its text and the EOS. No generation prompt (the answer follows the newline).
_PALIGEMMA = ("{%- for message in messages -%}"
              "{%- if message['role'] == 'assistant' -%}" + TEXTS + "{{- eos_token -}}"
              "{%- else -%}" + IMAGES.replace("IMAGE", "'IMAGE_TOKEN'") +
              "{%- if loop.first -%}" + BOS + "{%- endif -%}" + TEXTS + "{{- '\\n' -}}"
              "{%- endif -%}"
              "{%- endfor -%}")

# Mistral 3 (Mistral-Small-3.1 v7 format, no default system prompt here): <s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT]
# [INST]...[/INST]answer</s>, images [IMG]. [INST] and the others are control tokens of Mistral's tokenizer and
# plain text in a vocabulary without them (the Qwen2 one).
_MISTRAL3 = (BOS +
             "{%- for message in messages -%}"
             "{%- if message['role'] == 'system' -%}{{- '[SYSTEM_PROMPT]' -}}" + image_part("'IMAGE_TOKEN'") +
             "{{- '[/SYSTEM_PROMPT]' -}}"
             "{%- elif message['role'] == 'user' -%}{{- '[INST]' -}}" + image_part("'IMAGE_TOKEN'") + "{{- '[/INST]' -}}"
             "{%- else -%}" + image_part("'IMAGE_TOKEN'") + "{{- eos_token -}}{%- endif -%}"
             "{%- endfor -%}")

# LLaVA-NeXT (llava-v1.6-mistral-7b-hf): <<SYS>>\n...\n<</SYS>>\n\n, [INST] <image>\n...text [/INST], " answer</s> ";
# a user turn's images first, then its text. No generation prompt.
_LLAVA_NEXT = ("{%- for message in messages -%}"
               "{%- if message['role'] == 'system' -%}{{- '<<SYS>>\\n' -}}" + TEXTS + "{{- '\\n<</SYS>>\\n\\n' -}}"
               "{%- elif message['role'] == 'user' -%}{{- '[INST] ' -}}" +
               IMAGES.replace("IMAGE", "'IMAGE_TOKEN\\n'") + TEXTS + "{{- ' [/INST]' -}}"
               "{%- else -%}{{- ' ' -}}" + TEXTS + "{{- eos_token + ' ' -}}{%- endif -%}"
               "{%- endfor -%}")

# LLaVA-OneVision (llava-onevision-qwen2-*-ov-hf): <|im_start|>user <image>\ntext<|im_end|>, images first, then
# videos (<video>: VIDEO_TOKEN), then each text part after a newline; no newline after <|im_end|>. The hub template
# opens an assistant turn "<|im_start|>assistant " + "\n" + text but prompts with "<|im_start|>assistant\n"; here
# both are the latter, so a conversation's prefix renders as a prefix of it (and as the original LLaVA-OneVision
# ChatML trains it).
_LLAVA_ONEVISION = ("{%- for message in messages -%}"
                    "{%- if message['role'] == 'assistant' -%}{{- '<|im_start|>assistant\\n' -}}" + TEXTS +
                    "{%- else -%}{{- '<|im_start|>' + message['role'] + ' ' -}}" +
                    IMAGES.replace("IMAGE", "'IMAGE_TOKEN'") +
                    IMAGES.replace("'image'", "'video'").replace("IMAGE", "'VIDEO_TOKEN'") +
                    "{%- if message['content'] is string -%}{{- '\\n' + message['content'] -}}{%- else -%}"
                    "{%- for part in message['content'] if part['type'] == 'text' -%}{{- '\\n' + part['text'] -}}"
                    "{%- endfor -%}{%- endif -%}"
                    "{%- endif -%}{{- '<|im_end|>' -}}"
                    "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<|im_start|>assistant\\n'"))


def _idefics(start: str) -> str:
    """Idefics3 / SmolVLM: ``start``, then ``Role:`` (``Role: `` when the content does not open with an image),
    the content, ``<end_of_utterance>\\n`` per turn; the prompt ``Assistant:``."""
    return (start +
            "{%- for message in messages -%}"
            "{{- message['role'] | capitalize -}}"
            "{%- if message['content'] is not string and message['content'][0]['type'] == 'image' -%}{{- ':' -}}"
            "{%- else -%}{{- ': ' -}}{%- endif -%}" + image_part("'IMAGE_TOKEN'") +
            "{{- '<end_of_utterance>\\n' -}}"
            "{%- endfor -%}" + GENERATION.replace("PROMPT", "'Assistant:'"))


# GLM-4.1V / GLM-4.5V: [gMASK]<sop>, turns <|system|>\n / <|user|>\n / <|assistant|>\n, images
# <|begin_of_image|><|image|><|end_of_image|>; no thinking markup is added. The hub format has no end-of-turn token
# (generation stops at the next <|user|> or at <|endoftext|>, the eos), so nothing after an answer would be
# labelled and a model fine-tuned on it would never learn to stop. As GLM fine-tuning recipes do (LLaMA-Factory's
# glm4v template, efficient_eos), each assistant turn ends with the tokenizer's eos token, which the encoder labels
# as the turn's end token (a special token right after the answer, ConversationEncoder.encode).
# A video part <|begin_of_video|><|video|><|end_of_video|> (the hub templates'), which the processor expands to a
# <|begin_of_image|>...<|end_of_image|> and a time per temporal patch (docs/video.md).
_GLM_CONTENT = with_video(image_part("'<|begin_of_image|>IMAGE_TOKEN<|end_of_image|>'"),
                           "'<|begin_of_video|>VIDEO_TOKEN<|end_of_video|>'")
_GLM4V = ("{{- '[gMASK]<sop>' -}}"
          "{%- for message in messages -%}"
          "{{- '<|' + message['role'] + '|>\\n' -}}" + _GLM_CONTENT +
          "{%- if message['role'] == 'assistant' -%}{{- eos_token -}}{%- endif -%}"
          "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<|assistant|>\\n'"))

_QWEN_VIDEO = "'" + QWEN_VIDEO + "'"
_TEMPLATES = {
    "qwen2_vl": chatml("You are a helpful assistant.", video=_QWEN_VIDEO),
    "qwen2_5_vl": chatml("You are a helpful assistant.", video=_QWEN_VIDEO),
    "qwen3_vl": chatml(None, video=_QWEN_VIDEO),
    "qwen3_5": chatml(None, video=_QWEN_VIDEO),
    "qwen3_5_moe": chatml(None, video=_QWEN_VIDEO),
    "qwen3_vl_moe": chatml(None, video=_QWEN_VIDEO),
    "llava": _LLAVA,
    "glm4v": _GLM4V,
    "glm4v_moe": _GLM4V,
    "gemma3": _GEMMA3,
    "paligemma": _PALIGEMMA,
    "internvl": chatml(None, "'IMAGE_TOKEN\\n'"),
    "mistral3": _MISTRAL3,
    "llava_next": _LLAVA_NEXT,
    "llava_onevision": _LLAVA_ONEVISION,
    "idefics3": _idefics(BOS),  # the hub writes '<|begin_of_text|>', Llama 3's BOS
    "smolvlm": _idefics("{{- '<|im_start|>' -}}"),
}
TEMPLATE_TYPES = sorted(_TEMPLATES)
# Each family's image placeholder in the hub checkpoints (a processor names its own, ``processor.image_token``).
HUB_IMAGE_TOKENS = {"llava": "<image>", "glm4v": "<|image|>", "glm4v_moe": "<|image|>", "gemma3": "<start_of_image>",
                    "paligemma": "<image>", "internvl": "<IMG_CONTEXT>", "mistral3": "[IMG]", "llava_next": "<image>",
                    "llava_onevision": "<image>", "idefics3": "<image>", "smolvlm": "<image>"}
# Markers of the hub templates that a vocabulary without them (the Qwen2 one) writes as the Qwen2 special token
# standing in, so that they stay one token each and an end-of-turn marker is still labelled. Other missing markers
# ([gMASK], <|user|>, [INST]...) are written as they are and tokenized as plain text.
HUB_VIDEO_TOKENS = {"llava_onevision": "<video>"}  # a template's VIDEO_TOKEN where not GLM's <|video|>
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
    """The family's Jinja chat template (module docstring), for ``apply_chat_template(..., chat_template=...)``.
    ``image_token``: the image placeholder (``processor.image_token``; ``None``: the hub checkpoints' one,
    :data:`HUB_IMAGE_TOKENS`; the Qwen templates write ``<|vision_start|><|image_pad|><|vision_end|>``);
    ``video_token``: the video placeholder where a template writes ``VIDEO_TOKEN`` (``processor.video_token``;
    ``None``: the hub checkpoints' one, :data:`HUB_VIDEO_TOKENS`, else GLM's ``<|video|>``).
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
