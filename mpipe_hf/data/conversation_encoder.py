"""Encoding a conversation as the model sees it (:class:`ConversationEncoder`): the text the chat template
renders, its token ids with each image placeholder expanded to the image's tokens, and labels on the assistant
turns only; shared by the loader (token counts at load) and the collator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import PIL.Image
import torch

from .collate import IGNORE
from ..families.registry import all_data, family_data
from .templates import chat_template_for



def repeated(model_type: str | None) -> bool:
    """Whether the family's processor expands an image's placeholder to the placeholder token repeated, a count that
    depends on that image's size only (``_get_num_multimodal_tokens``; ``FamilyData.repeated``); the others'
    expansions are the processor's own text."""
    declared = family_data(model_type) if model_type else None
    return declared is not None and declared.repeated


def _model_type_of(processor) -> str | None:
    """The family of a processor built by :mod:`.processor` (``None`` for a bare tokenizer)."""
    if getattr(processor, "mpipe_model_type", None):
        return processor.mpipe_model_type
    owners = {name: model_type for model_type, declared in all_data().items() for name in declared.stock_classes}
    for cls in type(processor).__mro__:
        if cls.__module__.startswith("transformers.models.") and cls.__name__ in owners:
            return owners[cls.__name__]
    return None


@dataclass
class Encoded:
    """One conversation as the model sees it, before truncation: ``ids`` and ``labels`` (each ``L`` ints, the
    image and video placeholders expanded to their tokens), ``image_spans`` (``[start, end)`` of each image's and
    each video's tokens, in the text's order: the spans a cut must not go through), the rendered ``text`` and
    ``video_spans`` (the videos' spans alone)."""
    ids: list[int]
    labels: list[int]
    image_spans: list[tuple[int, int]]
    text: str
    video_spans: list[tuple[int, int]] = field(default_factory=list)


class ConversationEncoder:
    """Renders a conversation with the chat template and finds its assistant tokens, shared by the loader (token
    counts at load) and the collator.

    Args:
        processor: an HF processor (a family with a data path here, :func:`~mpipe_hf.families.registry.family_data`), or a tokenizer for a decoder-only LM
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
        self.model_type = model_type or _model_type_of(processor)
        if chat_template is None:
            if model_type is None:
                model_type = self.model_type or ("qwen2_vl" if not self.vision else None)
            try:
                chat_template = chat_template_for(processor, model_type or "")
            except ValueError as err:
                raise ValueError(f"{type(processor).__name__} has no chat template and its model family cannot be "
                                 f"told; pass chat_template or model_type ({err})") from err
        self.chat_template = chat_template
        self.image_token_id = processor.image_token_id if self.vision else None
        self.image_token = getattr(processor, "image_token", None) if self.vision else None
        if self.image_token is None and self.image_token_id is not None:
            self.image_token = self.tokenizer.convert_ids_to_tokens(self.image_token_id)
        # videos where the processor has a video processor (the Qwen2-VL / Qwen2.5-VL ones of build_processor)
        has_video = self.vision and getattr(processor, "video_processor", None) is not None
        self.video_token = getattr(processor, "video_token", None) if has_video else None
        # Qwen3-VL's processor expands a video's whole <|vision_start|><|video_pad|><|vision_end|> (per-frame
        # timestamps, each frame's tokens between its own markers): the placeholder it replaces, where written
        self.video_wrapper = None
        if self.video_token and hasattr(processor, "_calculate_timestamps"):
            self.video_wrapper = processor.vision_start_token + self.video_token + processor.vision_end_token
        # Qwen3-VL's and GLM-4.xV's expand a video to text (per temporal patch, its tokens and its time), not to
        # its placeholder repeated: the stock replace_video_token's text (GLM's replaces the bare <|video|>)
        self.video_text = bool(self.video_token) and (self.video_wrapper is not None
                                                      or hasattr(processor, "replace_frame_token_id"))
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

    def _placeholders(self, text: str, images: list, videos: list, where: str) -> list[tuple[int, str, int]]:
        """``(start, kind, length)`` of every image and video placeholder of ``text`` in order (found as the
        processor finds them: Qwen3-VL's video wrapper, :attr:`video_wrapper`, before a bare video token), checked
        against the numbers of ``images`` and ``videos``.

        Raises:
            ValueError: the counts differ; a video for a processor without a video processor.
        """
        if videos and self.video_token is None:
            raise ValueError(f"{where}: the row has {len(videos)} video(s) but {type(self.processor).__name__} "
                             f"takes no videos (docs/video.md lists the families that do)")
        marks = {"image": re.escape(self.image_token or ""), "video": re.escape(self.video_token or "")}
        if self.video_wrapper:
            marks["video"] = re.escape(self.video_wrapper) + "|" + marks["video"]
        pattern = "|".join(f"(?P<{kind}>{mark})" for kind, mark in marks.items() if mark)
        found = [(m.start(), m.lastgroup, m.end() - m.start()) for m in re.finditer(pattern, text)] if pattern else []
        for kind, given in (("image", images), ("video", videos)):
            written = sum(k == kind for _, k, _ in found)
            if written != len(given):
                raise ValueError(f"{where}: the chat template wrote {written} {kind} token(s) for {len(given)} "
                                 f"{kind}(s); it must render each {kind} part as the family's {kind} placeholder")
        return found

    def expand(self, text: str, images: list, where: str, videos: list = ()
               ) -> tuple[str, list[tuple[int, int]], list[int], list[str], list[int]]:
        """``text`` with its ``j``-th image placeholder (``processor.image_token``, found as the processor finds it)
        replaced by ``images[j]`` and its ``k``-th video placeholder (``processor.video_token``) by ``videos[k]``:
        the text the processor expands it to, or an int ``n`` (any video; an image of a :func:`repeated` family):
        the placeholder ``n`` times. Returns the expanded text, each placeholder's ``[start, end)`` in it and its
        start in ``text`` (in the text's order), its kind (``image`` / ``video``) and its length in ``text``.

        Raises:
            ValueError: the numbers of placeholders differ from ``len(images)`` / ``len(videos)``; an int for an
                image of a family whose expansion is not the placeholder repeated; videos for a processor without a
                video processor.
        """
        found = self._placeholders(text, images, videos, where)
        queues = {"image": iter(images), "video": iter(videos)}
        marks = {"image": self.image_token, "video": self.video_token}
        pieces, chars, last = [], [], 0
        for start, kind, length in found:
            item = next(queues[kind])
            if not isinstance(item, str):  # a count: any video's, or an image's of a repeated family
                if kind == "image" and not repeated(self.model_type):
                    raise ValueError(f"{where}: {self.model_type} expands an image to more than its placeholder "
                                     f"repeated; pass each image's expansion (image_replacements_for_sizes)")
                item = marks[kind] * int(item)
            pieces.append(text[last:start])
            at = sum(map(len, pieces))
            pieces.append(item)
            chars.append((at, at + len(item)))
            last = start + length
        pieces.append(text[last:])
        return "".join(pieces), chars, [f[0] for f in found], [f[1] for f in found], [f[2] for f in found]

    def encode(self, messages: list[dict], images: list, where: str, videos: list = ()) -> Encoded:
        """Render ``messages`` (parts lists), expand each image placeholder to ``images[j]`` as the processor
        expands image ``j`` and each video placeholder to ``videos[k]`` (:meth:`expand`), tokenize with offsets,
        and mark the assistant tokens.

        ``labels`` is ``ids`` on every token that overlaps an assistant content span or the end-of-turn token
        after it (the first token after the content that is not whitespace, when it is a special token:
        ``<|im_end|>`` for ChatML, the eos for LLaVA), with whatever whitespace lies between; ``-100`` elsewhere.
        Character spans become token spans through the fast tokenizer's offsets of the whole text, so a BPE token
        that joins the template's text and the content (LLaVA's ``": "`` and the answer's first word) is labelled.
        ``image_spans`` are the tokens that overlap each image's or video's expansion (``video_spans`` the videos'
        alone), none of them labelled.

        Raises:
            ValueError: the template's prefixes are not prefixes (:meth:`assistant_spans`); :meth:`expand`'s.
        """
        text = self.render(messages)
        spans = self.assistant_spans(messages, text, where)
        expanded, chars, starts, kinds, lengths = self.expand(text, images, where, videos)
        grown = [end - start - length for (start, end), length in zip(chars, lengths)]

        def moved(at: int) -> int:  # a character of ``text`` (not inside a placeholder) -> of ``expanded``
            return at + sum(g for start, g in zip(starts, grown) if start < at)

        spans = [(moved(a), moved(b), moved(c)) for a, b, c in spans]
        enc = self.tokenizer(expanded, add_special_tokens=self.add_special_tokens(text), return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        labelled = [False] * len(ids)
        for start, end, turn_end in spans:
            after = next((i for i, (s, e) in enumerate(offsets) if s >= end and e > s and expanded[s:e].strip()), None)
            if after is not None and offsets[after][0] < turn_end and ids[after] in self.special_ids:
                end = offsets[after][1]  # the end-of-turn token, and any whitespace before it
            for i, (s, e) in enumerate(offsets):
                if e > s and s < end and e > start:
                    labelled[i] = True
        image_spans = []
        for a, b in chars:
            inside = [i for i, (s, e) in enumerate(offsets) if e > s and s < b and e > a]
            image_spans.append((inside[0], inside[-1] + 1) if inside else (0, 0))
        for a, b in image_spans:
            labelled[a:b] = [False] * (b - a)
        labels = [token if lab else IGNORE for token, lab in zip(ids, labelled)]
        video_spans = [span for span, kind in zip(image_spans, kinds) if kind == "video"]
        return Encoded(list(ids), labels, image_spans, text, video_spans)

    def image_tokens_for_sizes(self, sizes: list[tuple[int, int]]) -> list[int]:
        """Tokens each image of size ``(height, width)`` takes, without decoding it: the processor's
        ``_get_num_multimodal_tokens`` (Qwen: the image processor's ``smart_resize`` patch grid over
        ``merge_size**2``; LLaVA: the crop's patches, fixed)."""
        if not sizes:
            return []
        return [int(n) for n in self.processor._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens]

    def image_replacements_for_sizes(self, sizes: list[tuple[int, int]]) -> list:
        """What :meth:`encode` takes for one row's images of sizes ``(height, width)``, without decoding them: the
        counts of :meth:`image_tokens_for_sizes` for a :func:`repeated` family, else the text the processor expands
        each placeholder to for blank images of those sizes in one row (the expansion of these families depends on
        the size and, for LLaVA-OneVision, on the row's number of images, not on the pixels)."""
        if not sizes or repeated(self.model_type):
            return self.image_tokens_for_sizes(sizes)
        blanks = [PIL.Image.new("RGB", (int(w), int(h))) for h, w in sizes]
        out = self.processor(text=[self.image_token * len(sizes)], images=[blanks],
                             return_text_replacement_offsets=True)
        return [item["replacement"] for item in out["text_replacement_offsets"][0]]

    def video_tokens_for(self, refs: list[dict]) -> list:
        """What :meth:`encode` takes for a row's videos (:func:`~.video.video_ref` references), without decoding
        them: each video's tokens (:func:`~.video.video_tokens`), or for Qwen3-VL's and GLM-4.xV's processors the
        text they expand the video to (per temporal patch its tokens and time, from the sampled frames' indices and
        the video's fps: the stock ``replace_video_token`` on the counted grid).

        Raises:
            ValueError: a video whose header cannot be read or that cannot be sampled.
        """
        from .video import video_layout, video_tokens
        video_processor = self.processor.video_processor
        if not self.video_text:
            return [video_tokens(ref, video_processor) for ref in refs]
        out = []
        for ref in refs:
            grid, metadata = video_layout(ref, video_processor)
            inputs = {"video_grid_thw": [torch.tensor(grid)], "video_metadata": [metadata]}
            out.append(self.processor.replace_video_token(inputs, 0))
        return out
