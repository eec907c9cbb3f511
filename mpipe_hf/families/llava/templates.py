"""The chat templates of the LLaVA group (Jinja, for transformers' environment: ``trim_blocks`` and
``lstrip_blocks`` on, so all output comes from ``{{ }}`` expressions), in the formats the hub checkpoints use.
``IMAGE_TOKEN`` stands for the image placeholder and ``VIDEO_TOKEN`` for the video one
(:func:`~mpipe_hf.data.templates.default_chat_template` fills both in). A hub marker that the tokenizer's vocabulary
lacks is written as the Qwen2 special token standing in for it (:data:`~mpipe_hf.data.templates.STAND_INS`) or as
plain text. Where the hub writes nothing after an answer, the eos is written, so the encoder labels the turn's end.
Rendering a conversation's first turns with the generation prompt gives a prefix of rendering it all (how the
collator finds the assistant tokens).
"""

from __future__ import annotations

from ...data.templates import BOS, CONTENT, GENERATION, IMAGES, TEXTS, chatml, roles

# ``<image>`` and a newline, unless the next part is a text that starts with one (``"<image>\\n..."`` content).
_LLAVA_IMAGE = ("{{- 'IMAGE_TOKEN' -}}"
                "{%- if not (loop.nextitem is defined and loop.nextitem['type'] == 'text' "
                "and loop.nextitem['text'][:1] == '\\n') -%}"
                "{{- '\\n' -}}"
                "{%- endif -%}")

# LLaVA (llava-1.5): "USER: <image>\n... ASSISTANT: ...", the eos after every assistant turn and a space after
# every system and user turn; the prompt "ASSISTANT:".
LLAVA = ("{%- for message in messages -%}"
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

# LLaVA-NeXT (llava-v1.6-mistral-7b-hf): <<SYS>>\n...\n<</SYS>>\n\n, [INST] <image>\n...text [/INST], " answer</s> ";
# a user turn's images first, then its text. No generation prompt.
LLAVA_NEXT = ("{%- for message in messages -%}"
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
LLAVA_ONEVISION = ("{%- for message in messages -%}"
                   "{%- if message['role'] == 'assistant' -%}{{- '<|im_start|>assistant\\n' -}}" + TEXTS +
                   "{%- else -%}{{- '<|im_start|>' + message['role'] + ' ' -}}" +
                   IMAGES.replace("IMAGE", "'IMAGE_TOKEN'") +
                   IMAGES.replace("'image'", "'video'").replace("IMAGE", "'VIDEO_TOKEN'") +
                   "{%- if message['content'] is string -%}{{- '\\n' + message['content'] -}}{%- else -%}"
                   "{%- for part in message['content'] if part['type'] == 'text' -%}{{- '\\n' + part['text'] -}}"
                   "{%- endfor -%}{%- endif -%}"
                   "{%- endif -%}{{- '<|im_end|>' -}}"
                   "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<|im_start|>assistant\\n'"))

# VipLLaVA (vip-llava-*-hf): "###Human: <image>\n... ###Assistant: answer"; the eos after each answer.
VIPLLAVA = roles("'###Human: '", "'###Assistant: '", "''", "''", "eos_token", "'IMAGE_TOKEN\\n'", "'###Assistant:'")
# Vicuna (LLaVA-NeXT-Video, Video-LLaVA): "USER: <image>\n... ASSISTANT: answer</s>".
VICUNA = roles("'USER: '", "'ASSISTANT: '", "''", "' '", "eos_token", "'IMAGE_TOKEN\\n'", "'ASSISTANT:'")
# Aya Vision (CohereLabs/aya-vision-*), Cohere2-Vision's turns: <BOS_TOKEN>,
# <|START_OF_TURN_TOKEN|><|USER_TOKEN|>...<|END_OF_TURN_TOKEN|>, <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>...
# <|END_OF_TURN_TOKEN|>; the turn markers are ChatML's in the Qwen2 vocabulary (<|im_start|>, <|im_end|>), the role
# tokens plain text. The Command-A-Vision hub template adds a default system preamble and response markers, and a
# checkpoint's own template is used where it has one (chat_template_for).
AYA = roles("'<|im_start|><|USER_TOKEN|>'", "'<|im_start|><|CHATBOT_TOKEN|>'", "'<|im_start|><|SYSTEM_TOKEN|>'",
            "'<|im_end|>'", "'<|im_end|>'", "'IMAGE_TOKEN'", "'<|im_start|><|CHATBOT_TOKEN|>'", BOS)
# Aria (rhymes-ai/Aria): ChatML, each image "<fim_prefix><|img|><fim_suffix>", which the Qwen2 vocabulary's
# <|fim_prefix|> / <|fim_suffix|> stand in for.
ARIA = chatml(None, "'<|fim_prefix|>IMAGE_TOKEN<|fim_suffix|>'")

# Llama 4 Instruct: <|begin_of_text|>, turns <|header_start|>role<|header_end|>\n\n ... <|eot|>, images <|image|>;
# the prompt <|header_start|>assistant<|header_end|>\n\n. <|header_start|> and <|eot|> are written as <|im_start|>
# and <|im_end|> where the vocabulary lacks them (STAND_INS).
LLAMA4 = (BOS + "{%- for message in messages -%}"
          "{{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' -}}"
          + CONTENT.replace("IMAGE", "'IMAGE_TOKEN'") +
          "{{- '<|eot|>' -}}"
          "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<|header_start|>assistant<|header_end|>\\n\\n'"))
# LFM2-VL: <|startoftext|> (the bos) then ChatML, images <image>.
LFM2_VL = BOS + chatml(None, "'IMAGE_TOKEN'")

# Molmo2 (the hub template): the bos (<|im_end|> in the hub tokenizer; the eos where there is no bos, as the stock
# processor prepends), every image of the conversation first (<|image|>, or "Image 1<|image|>Image 2<|image|>..."),
# then ChatML turns with text parts joined by a space (images left out of the turns); here each answer closes with
# <|im_end|>\n (the hub writes it before the next user turn, which renders a multi-turn conversation the same, and
# leaves the last answer open). As the images come first, a row with an image after its first answer renders its
# earlier turns differently once that image counts, so its answers cannot be found and the loader refuses the row.
_MOLMO2_TEXT = ("{%- set m = namespace(text='') -%}"
                "{%- if message['content'] is string -%}{%- set m.text = message['content'] -%}{%- else -%}"
                "{%- for part in message['content'] if part['type'] == 'text' -%}"
                "{%- set m.text = m.text ~ ('' if not m.text else ' ') ~ part['text'] -%}{%- endfor -%}"
                "{%- endif -%}{{- m.text -}}")
MOLMO2 = ("{{- bos_token or eos_token -}}"
          "{%- set count = namespace(images=0) -%}"
          "{%- for message in messages if message['content'] is not string -%}"
          "{%- for part in message['content'] if part['type'] == 'image' -%}"
          "{%- set count.images = count.images + 1 -%}{%- endfor -%}{%- endfor -%}"
          "{%- if count.images == 1 -%}{{- 'IMAGE_TOKEN' -}}"
          "{%- else -%}{%- for i in range(count.images) -%}{{- 'Image ' ~ (i + 1) ~ 'IMAGE_TOKEN' -}}{%- endfor -%}"
          "{%- endif -%}"
          "{%- for message in messages -%}"
          "{{- '<|im_start|>' + message['role'] + '\\n' -}}" + _MOLMO2_TEXT + "{{- '<|im_end|>\\n' -}}"
          "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<|im_start|>assistant\\n'"))
# Step3: "<|BOT|>role\n...<|EOT|>" after the bos, the turn markers ChatML's.
STEP3P7 = roles("'<|im_start|>user\\n'", "'<|im_start|>assistant\\n'", "'<|im_start|>system\\n'", "'<|im_end|>'",
                "'<|im_end|>'", "'IMAGE_TOKEN'", "'<|im_start|>assistant\\n'", BOS)
# MiniMax: "]~b]role\n...[e~[\n", the answer's role "ai", the markers ChatML's.
MINIMAX = roles("'<|im_start|>user\\n'", "'<|im_start|>ai\\n'", "'<|im_start|>system\\n'", "'<|im_end|>\\n'",
                "'<|im_end|>\\n'", "'IMAGE_TOKEN'", "'<|im_start|>ai\\n'", BOS)
