"""Encoding a conversation as the model sees it (:class:`ConversationEncoder`): the text the chat template
renders, its token ids with each image placeholder expanded to the image's tokens, and labels on the assistant
turns only; shared by the loader (token counts at load) and the collator.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import LlavaProcessor

from .collate import IGNORE
from .processor import QWEN_PROCESSORS
from .templates import chat_template_for


def _model_type_of(processor) -> str | None:
    """The family of a processor built by :mod:`.processor` (``None`` for a bare tokenizer)."""
    for cls in type(processor).__mro__:
        for model_type, qwen in QWEN_PROCESSORS.items():
            if cls is qwen:
                return model_type
        if cls is LlavaProcessor:
            return "llava"
    return None


@dataclass
class Encoded:
    """One conversation as the model sees it, before truncation: ``ids`` and ``labels`` (each ``L`` ints, the
    image placeholders expanded to the image's tokens), ``image_spans`` (``[start, end)`` of each image's tokens)
    and the rendered ``text``."""
    ids: list[int]
    labels: list[int]
    image_spans: list[tuple[int, int]]
    text: str


class ConversationEncoder:
    """Renders a conversation with the chat template and finds its assistant tokens, shared by the loader (token
    counts at load) and the collator.

    Args:
        processor: an HF processor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA), or a tokenizer for a decoder-only LM
            (rows without images).
        chat_template: a Jinja template; ``None``: :func:`~.templates.chat_template_for` (the checkpoint's own
            template, else the family default).
        model_type: the family for the default template; ``None``: from the processor's class (a bare tokenizer
            gets ChatML with the default system message, ``qwen2_vl``'s).

    Raises:
        ValueError: no template given, none in the checkpoint, and the family cannot be told.
    """

    def __init__(self, processor, chat_template: str | None = None, model_type: str | None = None):
        self.processor = processor
        self.vision = hasattr(processor, "image_processor")
        self.tokenizer = processor.tokenizer if self.vision else processor
        if chat_template is None:
            if model_type is None:
                model_type = _model_type_of(processor) or ("qwen2_vl" if not self.vision else None)
            try:
                chat_template = chat_template_for(processor, model_type or "")
            except ValueError as err:
                raise ValueError(f"{type(processor).__name__} has no chat template and its model family cannot be "
                                 f"told; pass chat_template or model_type ({err})") from err
        self.chat_template = chat_template
        self.image_token_id = processor.image_token_id if self.vision else None
        tok = self.tokenizer
        self.special_ids = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}

    # -- rendering --

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """``apply_chat_template(messages, tokenize=False)`` of the processor (or tokenizer) with the template."""
        return self.processor.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def add_special_tokens(self, text: str) -> bool:
        """Whether tokenizing ``text`` adds the tokenizer's special tokens (as the processor does by default): not
        when the template already wrote the BOS."""
        bos = self.tokenizer.bos_token
        return not (bos and text.startswith(bos))

    def assistant_spans(self, messages: list[dict], text: str, where: str) -> list[tuple[int, int, int]]:
        """Character spans ``(content_start, content_end, turn_end)`` in ``text`` of every assistant turn.

        The turn of assistant message ``k`` is what rendering ``messages[:k + 1]`` adds to rendering
        ``messages[:k]`` with the generation prompt (so the template's assistant header is not in it); within it
        the content is where the message's text is written (as it is, else stripped of outer whitespace), else,
        for a template that rewrites the content, the turn less its outer whitespace.

        Raises:
            ValueError: the template does not render a conversation's prefixes as prefixes of its text.
        """
        spans = []
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            head = self.render(messages[:k], add_generation_prompt=True)
            turn = self.render(messages[:k + 1])
            if not (turn.startswith(head) and text.startswith(turn)):
                raise ValueError(f"{where}: the chat template does not render the conversation up to assistant turn "
                                 f"{k} as a prefix of the whole (it rewrites earlier turns), so the assistant tokens "
                                 f"cannot be found")
            segment = turn[len(head):]
            content = "".join(p["text"] for p in message["content"] if p["type"] == "text")
            for written in (content, content.strip()):
                at = segment.find(written)
                if at >= 0:
                    start, end = at, at + len(written)
                    break
            else:
                start = len(segment) - len(segment.lstrip())
                end = len(segment.rstrip())
            spans.append((len(head) + start, len(head) + end, len(turn)))
        return spans

    def encode(self, messages: list[dict], image_tokens: list[int], where: str) -> Encoded:
        """Render ``messages`` (parts lists), tokenize with offsets, mark the assistant tokens and expand each
        image token to ``image_tokens[j]`` copies, as the processor expands image ``j``.

        ``labels`` is ``ids`` on every token that overlaps an assistant content span or the end-of-turn token
        after it (the first token after the content that is not whitespace, when it is a special token:
        ``<|im_end|>`` for ChatML, the eos for LLaVA), with whatever whitespace lies between; ``-100`` elsewhere.
        Character spans become token spans through the fast tokenizer's offsets of the whole text, so a BPE token
        that joins the template's text and the content (LLaVA's ``": "`` and the answer's first word) is labelled.

        Raises:
            ValueError: the template's prefixes are not prefixes (:meth:`assistant_spans`), or the rendered text has
                a different number of image tokens than ``image_tokens`` has images.
        """
        text = self.render(messages)
        spans = self.assistant_spans(messages, text, where)
        enc = self.tokenizer(text, add_special_tokens=self.add_special_tokens(text), return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        labelled = [False] * len(ids)
        for start, end, turn_end in spans:
            after = next((i for i, (s, e) in enumerate(offsets) if s >= end and e > s and text[s:e].strip()), None)
            if after is not None and offsets[after][0] < turn_end and ids[after] in self.special_ids:
                end = offsets[after][1]  # the end-of-turn token, and any whitespace before it
            for i, (s, e) in enumerate(offsets):
                if e > s and s < end and e > start:
                    labelled[i] = True
        found = sum(t == self.image_token_id for t in ids) if self.image_token_id is not None else 0
        if found != len(image_tokens):
            raise ValueError(f"{where}: the chat template wrote {found} image token(s) for {len(image_tokens)} "
                             f"image(s); it must render each image part as the family's image placeholder")
        out_ids, out_labels, image_spans = [], [], []
        for token, lab in zip(ids, labelled):
            if self.image_token_id is not None and token == self.image_token_id:
                n = image_tokens[len(image_spans)]
                image_spans.append((len(out_ids), len(out_ids) + n))
                out_ids += [token] * n
                out_labels += [IGNORE] * n
            else:
                out_ids.append(token)
                out_labels.append(token if lab else IGNORE)
        return Encoded(out_ids, out_labels, image_spans, text)

    def image_tokens_for_sizes(self, sizes: list[tuple[int, int]]) -> list[int]:
        """Tokens each image of size ``(height, width)`` takes, without decoding it: the processor's
        ``_get_num_multimodal_tokens`` (Qwen: the image processor's ``smart_resize`` patch grid over
        ``merge_size**2``; LLaVA: the crop's patches, fixed)."""
        if not sizes:
            return []
        return [int(n) for n in self.processor._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens]
