"""The conversation collator: rows of a conversation dataset -> one micro-batch of the model's forward inputs,
the images decoded here (only a micro-batch's owner decodes them) and labels on the assistant turns only.
"""

from __future__ import annotations

import os

import PIL.Image
import torch

from .collate import IGNORE, NULL_TEXT, nothing_to_learn
from .conversation_encoder import ConversationEncoder
from .conversation_rows import canonical_row


class ConversationCollator:
    """Rows -> a micro-batch. Rows from :func:`~.conversation.load_conversation_dataset` are used as they are;
    other rows (a user's ``datasets.Dataset`` of either accepted form, images as paths relative to the working
    directory or as PIL images) are checked and normalised here, as the loader does. The micro-batch has the keys
    of the model's forward: ``input_ids``, ``attention_mask``, ``labels`` ``(B, L)`` and the processor's
    other outputs (Qwen: ``mm_token_type_ids`` ``(B, L)``, and when some row has images ``pixel_values``
    ``(patches, C*T*p*p)`` and ``image_grid_thw`` ``(images, 3)``; LLaVA: ``pixel_values`` ``(images, C, h, w)``).

    Each row is rendered with ``apply_chat_template`` and the template of :func:`~.templates.chat_template_for`,
    its images are opened here (the owner of the micro-batch is the only one that decodes them), and the processor
    tokenizes and expands the images, padding on the right to the longest row. ``labels`` is ``-100`` except on
    every assistant turn's content and its end-of-turn token (:meth:`ConversationEncoder.encode`); rows are cut at
    ``max_length`` tokens (``L <= max_length``).

    Args:
        processor: the HF processor, or a tokenizer for a decoder-only LM (rows without images).
        max_length: the most tokens a row keeps; ``None``: no cut.
        chat_template, model_type: as :class:`ConversationEncoder`.

    Raises (on call):
        ValueError: naming the JSONL line: an image that cannot be decoded, a cut through an image's tokens (a row
            the loader did not check), or token ids that differ from the processor's (a template or processor this
            module does not handle).
    """

    def __init__(self, processor, max_length: int | None, chat_template: str | None = None,
                 model_type: str | None = None):
        self.encoder = ConversationEncoder(processor, chat_template, model_type)
        self.processor, self.max_length = processor, max_length

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

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        wheres = [r.get("where") or f"row {i} of the micro-batch" for i, r in enumerate(rows)]
        rows = [r if "where" in r else canonical_row(r, os.getcwd(), where) for r, where in zip(rows, wheres)]
        texts = [self.encoder.render(r["messages"]) for r in rows]
        images = [im for r, where in zip(rows, wheres) for im in self._open(r, where)]
        special = self.encoder.add_special_tokens(texts[0])
        kwargs = dict(padding=True, padding_side="right", add_special_tokens=special, return_tensors="pt")
        if self.encoder.vision:
            batch = self.processor(text=texts, images=images or None, **kwargs)
        else:
            batch = self.processor(texts, **kwargs)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        per_row = self._image_tokens(batch, rows, ids)
        length = ids.shape[1] if self.max_length is None else min(ids.shape[1], self.max_length)
        labels = torch.full((ids.shape[0], length), IGNORE, dtype=ids.dtype)
        for i, (row, where) in enumerate(zip(rows, wheres)):
            enc = self.encoder.encode(row["messages"], per_row[i], where)
            n = int(mask[i].sum())
            if enc.ids != ids[i, :n].tolist() or not bool(mask[i, :n].all()):
                raise ValueError(f"{where}: the processor's token ids differ from the rendered conversation's; "
                                 f"cannot place the labels")
            if any(start < length < end for start, end in enc.image_spans):
                raise ValueError(f"{where}: max_length={length} cuts through an image's tokens (load the rows with "
                                 f"load_conversation_dataset, which drops such rows)")
            keep = min(n, length)
            labels[i, :keep] = torch.tensor(enc.labels[:keep], dtype=ids.dtype)
        out = {k: (v[:, :length] if v.shape == ids.shape else v) for k, v in batch.items()
               if isinstance(v, torch.Tensor)}
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
