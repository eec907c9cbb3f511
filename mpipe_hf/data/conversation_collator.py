"""The conversation collator: rows of a conversation dataset -> one micro-batch of the model's forward inputs,
the images decoded here (only a micro-batch's owner decodes them) and labels on the assistant turns only.
"""

from __future__ import annotations

import os

import PIL.Image
import torch
from transformers import BatchFeature

from .budgets import resize_images
from .collate import IGNORE, NULL_TEXT, nothing_to_learn
from .conversation_encoder import ConversationEncoder
from .conversation_rows import canonical_row


# the processor outputs with one entry per token, cut with input_ids at max_length
PER_TOKEN = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids",
             "moe_mm_token_type_ids")  # ERNIE 4.5 VL's MoE modality ids


def prefix_token_types(labels: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """PaliGemma's ``token_type_ids`` ``(B, L)`` for conversations: 0 on each row's prefix, up to (not including)
    its first label token, 1 from there on and on padding.

    PaliGemma attends bidirectionally among the tokens of type 0 (its image-and-prompt prefix) and causally from
    the others (``PaliGemmaModel.forward``: ``block_sequence_ids`` 0 where ``token_type_ids == 0``); its processor
    marks the suffix it is given as 1. A conversation has several prompts and answers, and only the span before
    the first answer may be one bidirectional block: were a later user turn type 0 too, the tokens of the first
    prompt would attend to it, so the first answer's loss would see text written after it. A row with no label
    (:meth:`ConversationCollator.null_batch`) is all prefix."""
    has = labels != IGNORE
    first = torch.where(has.any(1), has.int().argmax(1), torch.full_like(has[:, 0], labels.shape[1], dtype=torch.long))
    positions = torch.arange(labels.shape[1]).unsqueeze(0)
    types = (positions >= first.unsqueeze(1)).long()
    types[attention_mask[:, :labels.shape[1]] == 0] = 1
    return types


class ConversationCollator:
    """Rows -> a micro-batch. Rows from :func:`~.conversation.load_conversation_dataset` are used as they are;
    other rows (a user's ``datasets.Dataset`` of either accepted form, images as paths relative to the working
    directory or as PIL images) are checked and normalised here, as the loader does. The micro-batch has the keys
    of the model's forward: ``input_ids``, ``attention_mask``, ``labels`` ``(B, L)`` and the processor's
    other outputs for the whole micro-batch (its images batched per row, as the HF processor batches them), named
    as the forward names them. When some row has images:

    - Qwen2/2.5/3-VL, Qwen3.5(-MoE), Qwen3-VL-MoE, GLM-4V(-MoE): ``mm_token_type_ids`` ``(B, L)`` (always),
      ``pixel_values`` ``(patches, C*T*p*p)``, ``image_grid_thw`` ``(images, 3)``;
    - LLaVA, PaliGemma: ``pixel_values`` ``(images, C, h, w)``; Gemma 3 the same and ``token_type_ids`` ``(B, L)``
      (always; 1 on image tokens); PaliGemma ``token_type_ids`` ``(B, L)`` (always, :func:`prefix_token_types`);
    - InternVL: ``pixel_values`` ``(tiles, C, h, w)``, every image's tiles and thumbnail in order;
    - LLaVA-NeXT: ``pixel_values`` ``(images, crops, C, h, w)`` (zero-padded crops), ``image_sizes``
      ``(images, 2)``; LLaVA-OneVision the same and ``batch_num_images`` ``(rows with images,)``;
    - Idefics3, SmolVLM: ``pixel_values`` ``(B, tiles, C, h, w)`` and ``pixel_attention_mask`` ``(B, tiles, h, w)``
      (a row's missing tiles all-zero, which the model skips);
    - Mistral 3: ``pixel_values`` ``(images, C, h, w)`` (zero-padded to the largest) and ``image_sizes``
      ``(images, 2)``.

    When some row has videos (Qwen2-VL, Qwen2.5-VL: docs/video.md): ``pixel_values_videos``
    ``(patches, C*T*p*p)`` and ``video_grid_thw`` ``(videos, 3)``, Qwen2.5-VL also ``second_per_grid_ts``
    ``(videos,)`` (s per temporal patch); each video is decoded and sampled here (:func:`~.video.load_video`).

    Each row is rendered with ``apply_chat_template`` and the template of :func:`~.templates.chat_template_for`,
    its images are opened here (the owner of the micro-batch is the only one that decodes them), and the processor
    tokenizes and expands the images, padding on the right to the longest row. ``labels`` is ``-100`` except on
    every assistant turn's content and its end-of-turn token (:meth:`ConversationEncoder.encode`); rows are cut at
    ``max_length`` tokens (``L <= max_length``).

    Args:
        processor: the HF processor, or a tokenizer for a decoder-only LM (rows without images).
        max_length: the most tokens a row keeps; ``None``: no cut.
        chat_template, model_type: as :class:`ConversationEncoder`.
        video_decoder: what decodes video files (``pyav`` or ``torchcodec``: :data:`~.video.DECODERS`,
            ``data.video_decoder``).

    Raises (on call):
        ValueError: naming the JSONL line: an image or video that cannot be decoded, a video for a processor
            without a video processor, a cut through an image's or video's tokens (a row the loader did not
            check), or token ids that differ from the processor's (a template or processor this module does not
            handle).
    """

    def __init__(self, processor, max_length: int | None, chat_template: str | None = None,
                 model_type: str | None = None, video_decoder: str = "pyav"):
        self.encoder = ConversationEncoder(processor, chat_template, model_type)
        self.processor, self.max_length, self.video_decoder = processor, max_length, video_decoder

    def _open(self, row: dict, where: str) -> list:
        """The row's images as RGB PIL images: each path opened and decoded here, as is an image already opened (a
        ``PIL.Image.Image``, lazily read). Raises ``ValueError`` naming ``where`` and the file when one does not
        decode."""
        images = []
        for image in row.get("images") or []:
            try:
                if isinstance(image, PIL.Image.Image):  # opened lazily by the dataset: decoded here
                    images.append(image.convert("RGB"))
                    continue
                with PIL.Image.open(image) as opened:
                    images.append(opened.convert("RGB"))
            except Exception as err:  # a corrupt file fails only here, when it is decoded
                name = getattr(image, "filename", "") or ("an image in memory" if isinstance(
                    image, PIL.Image.Image) else image)
                raise ValueError(f"{where}: cannot decode image {name}: {err}") from err
        return images

    def _load_videos(self, rows: list[dict], wheres: list[str]) -> tuple[list, list]:
        """Every row's videos in order, decoded and sampled here (:func:`~.video.load_video`): the frames of all
        rows as one list, and their metadata. Raises ``ValueError`` naming the row when one cannot be read."""
        from .video import load_video
        frames, metadata = [], []
        for row, where in zip(rows, wheres):
            for ref in row.get("videos") or []:
                if self.encoder.video_token is None:
                    raise ValueError(f"{where}: the row has a video but {type(self.processor).__name__} takes no "
                                     f"videos (docs/video.md lists the families that do)")
                try:
                    video, meta = load_video(ref, self.processor.video_processor, self.video_decoder)
                except ValueError as err:
                    raise ValueError(f"{where}: {err}") from err
                frames.append(video)
                metadata.append(meta)
        return frames, metadata

    def _image_tokens(self, batch, rows: list[dict], ids: torch.Tensor) -> list[list[int]]:
        """Tokens each row's images took in ``batch``: from ``image_grid_thw`` (``t*h*w / merge_size**2``) for the
        Qwen families, else the row's image tokens shared equally among its images (LLaVA's fixed count)."""
        counts = [len(r.get("images") or []) for r in rows]
        if "image_grid_thw" in batch:
            merge = self.processor.image_processor.merge_size
            flat = (batch["image_grid_thw"].prod(-1) // merge ** 2).tolist()
            out, at = [], 0
            for n in counts:
                out.append(flat[at:at + n])
                at += n
            return out
        out = []
        for i, n in enumerate(counts):
            total = int((ids[i] == self.encoder.image_token_id).sum()) if n else 0
            out.append([total // n] * n if n else [])
        return out

    def _per_row_images(self, batch, rows: list[dict], ids: torch.Tensor) -> tuple[list[list], list[list]]:
        """What each row's images, and videos, expand to in ``batch`` (what :meth:`ConversationEncoder.encode`
        takes): the processor's own replacement texts (``text_replacement_offsets``), else the token counts of
        :meth:`_image_tokens` (rows without videos: only the Qwen processors take videos, and they return the
        offsets)."""
        offsets = batch.pop("text_replacement_offsets", None)
        if offsets is None:
            return self._image_tokens(batch, rows, ids), [[] for _ in rows]
        return tuple([[item["replacement"] for item in row if item["type"] == kind] for row in offsets]
                     for kind in ("image", "video"))

    def _process(self, texts: list[str], images: list[list], special: bool, videos: tuple = ((), ())):
        kwargs = dict(padding=True, padding_side="right", add_special_tokens=special, return_tensors="pt")
        if not self.encoder.vision:
            return self.processor(texts, **kwargs)
        frames, metadata = videos
        if frames:  # sampled and sized already (_load_videos): the processor resizes and patchifies them
            kwargs.update(videos=list(frames), video_metadata=list(metadata), do_sample_frames=False)
        # one list of images per row, as the processors batch them (LLaVA-OneVision counts each row's images,
        # Gemma 3 / SmolVLM check them per row)
        def call(**kw):
            return self.processor(text=texts, images=images if any(images) else None,
                                  return_text_replacement_offsets=True, **kw)
        try:
            return call(**kwargs)
        except ValueError as err:
            if "text_replacement_offsets" not in str(err):
                raise
        # a processor that converts its replacement offsets to tensors too (InternVL's, when the first row has no
        # image): its outputs as lists, converted here with the offsets left out, as ProcessorMixin converts them
        out = call(**{**kwargs, "return_tensors": None})
        return BatchFeature(dict(out), tensor_type="pt", skip_tensor_conversion=["text_replacement_offsets"])

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        wheres = [r.get("where") or f"row {i} of the micro-batch" for i, r in enumerate(rows)]
        rows = [r if "where" in r else canonical_row(r, os.getcwd(), where) for r, where in zip(rows, wheres)]
        texts = [self.encoder.render(r["messages"]) for r in rows]
        image_processor = getattr(self.processor, "image_processor", None)  # a capped image to its counted size:
        images = [resize_images(self._open(r, where), r.get("resize"), image_processor)  # .budgets
                  for r, where in zip(rows, wheres)]
        videos = self._load_videos(rows, wheres)
        batch = self._process(texts, images, self.encoder.add_special_tokens(texts[0]), videos)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        per_row, per_row_videos = self._per_row_images(batch, rows, ids)
        length = ids.shape[1] if self.max_length is None else min(ids.shape[1], self.max_length)
        labels = torch.full((ids.shape[0], length), IGNORE, dtype=ids.dtype)
        for i, (row, where) in enumerate(zip(rows, wheres)):
            enc = self.encoder.encode(row["messages"], per_row[i], where, per_row_videos[i])
            n = int(mask[i].sum())
            if enc.ids != ids[i, :n].tolist() or not bool(mask[i, :n].all()):
                raise ValueError(f"{where}: the processor's token ids differ from the rendered conversation's; "
                                 f"cannot place the labels")
            if any(start < length < end for start, end in enc.image_spans):
                raise ValueError(f"{where}: max_length={length} cuts through an image's or video's tokens (load "
                                 f"the rows with load_conversation_dataset, which drops such rows)")
            keep = min(n, length)
            labels[i, :keep] = torch.tensor(enc.labels[:keep], dtype=ids.dtype)
        out = {k: (v[:, :length] if k in PER_TOKEN else v) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        out.pop("labels", None)  # a processor's own (PaliGemma's stock one writes them from its prefix/suffix)
        if self.encoder.model_type == "paligemma":
            out["token_type_ids"] = prefix_token_types(labels, out["attention_mask"])
        out["labels"] = labels
        return out

    def null_batch(self) -> dict[str, torch.Tensor]:
        """A micro-batch that trains nothing: one text-only conversation row, collated as any other (the model's
        keys, ``(1, L)``, no image), with every label ``-100``. It adds 0 to the step's loss sum and label tokens
        and exactly zero gradients; what stands in for a micro-batch none of whose rows could be loaded
        (:meth:`~.owner.MicroBatchPlan.load_rows`)."""
        text = [{"type": "text", "text": NULL_TEXT}]
        row = {"where": "<null micro-batch>", "images": [],
               "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": text}]}
        return nothing_to_learn(self([row]))
