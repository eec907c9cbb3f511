"""The Qwen-like group's chat templates that are not ChatML (:func:`mpipe_hf.data.templates.chatml` writes the
others), in the hub's turn markers; ``IMAGE_TOKEN`` stands for the image placeholder
(:mod:`mpipe_hf.data.templates`)."""

from __future__ import annotations

from ...data.templates import CONTENT, GENERATION, IMAGES, TEXTS, roles

# PaddleOCR-VL: <|begin_of_sentence|> (the tokenizer's BOS, where it has one), a user turn "User: " + its images
# <|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|> + its text + "\n", a system turn its text + "\n", an answer
# "Assistant: " + text + the eos token (the hub writes its </s> separator there), the prompt "Assistant: ".
# <|IMAGE_START|>/<|IMAGE_END|> are plain text in a vocabulary without them (the Qwen2 one). ERNIE 4.5 VL's turns
# are these too, less its "Picture n:" labels and thinking block.
PADDLEOCR_VL = ("{%- if bos_token -%}{{- bos_token -}}{%- endif -%}"
                "{%- for message in messages -%}"
                "{%- if message['role'] == 'assistant' -%}{{- 'Assistant: ' -}}" + TEXTS + "{{- eos_token -}}"
                "{%- else -%}{%- if message['role'] == 'user' -%}{{- 'User: ' -}}{%- endif -%}" +
                IMAGES.replace("IMAGE", "'<|IMAGE_START|>IMAGE_TOKEN<|IMAGE_END|>'") + TEXTS + "{{- '\\n' -}}"
                "{%- endif -%}"
                "{%- endfor -%}" + GENERATION.replace("PROMPT", "'Assistant: '"))

# EXAONE 4.0 / 4.5 (non-reasoning): turns [|system|] / [|user|] / [|assistant|] + content + [|endofturn|] + "\n",
# the prompt [|assistant|]; an image as <|vision_start|><|image_pad|><|vision_end|> (the placeholder its processor
# names by default, with the Qwen2 vision markers). [|endofturn|] is written as <|im_end|> in a vocabulary without
# it (templates.STAND_INS), so that the end of each answer is one special token and labelled.
EXAONE = ("{%- for message in messages -%}"
          "{{- '[|' + message['role'] + '|]' -}}" +
          CONTENT.replace("IMAGE", "'<|vision_start|>IMAGE_TOKEN<|vision_end|>'") +
          "{{- '[|endofturn|]\\n' -}}"
          "{%- endfor -%}" + GENERATION.replace("PROMPT", "'[|assistant|]'"))

# HunYuan-VL: <｜hy_begin▁of▁sentence｜>, a user turn <｜hy_User｜> + content, an answer <｜hy_Assistant｜> + text + the
# eos token, a system turn its text + <｜hy_place▁holder▁no▁3｜>; an image as the tokenizer's image start, image and
# image end tokens, which HunYuanVLProcessor requires around each placeholder (here the Qwen2 vision markers stand in
# for the hub's, so the template names them directly). The <｜hy_...｜> markers are plain text in the Qwen2 vocabulary.
HUNYUAN = ("{{- '<｜hy_begin▁of▁sentence｜>' -}}"
           "{%- for message in messages -%}"
           "{%- if message['role'] == 'user' -%}{{- '<｜hy_User｜>' -}}"
           "{%- elif message['role'] == 'assistant' -%}{{- '<｜hy_Assistant｜>' -}}{%- endif -%}" +
           CONTENT.replace("IMAGE", "'<|vision_start|>IMAGE_TOKEN<|vision_end|>'") +
           "{%- if message['role'] == 'assistant' -%}{{- eos_token -}}"
           "{%- elif message['role'] == 'system' -%}{{- '<｜hy_place▁holder▁no▁3｜>' -}}{%- endif -%}"
           "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<｜hy_Assistant｜>'"))

# Kimi K2.5 (non-thinking): <|im_user|>user<|im_middle|>...<|im_end|>, answers
# <|im_assistant|>assistant<|im_middle|><think></think>...<|im_end|> (the empty reasoning block of the non-thinking
# mode, part of the prompt), <|im_system|>system<|im_middle|> for a system turn, no default one; an image is
# <|media_begin|>image<|media_content|> + the placeholder + <|media_end|>. The markers other than <|im_end|> are plain
# text in the Qwen2 vocabulary.
_KIMI_ANSWER = "'<|im_assistant|>assistant<|im_middle|><think></think>'"
KIMI = roles("'<|im_user|>user<|im_middle|>'", _KIMI_ANSWER, "'<|im_system|>system<|im_middle|>'", "'<|im_end|>'",
             "'<|im_end|>'", "'<|media_begin|>image<|media_content|>IMAGE_TOKEN<|media_end|>'", _KIMI_ANSWER)
