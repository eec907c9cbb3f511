"""Micro-batches of the llava_like families whose stock image processor exists in transformers only with a
torchvision backend (Cohere2-Vision, LFM2-VL, Molmo2, Step3p7, Unlimited-OCR, MiniMax-M3-VL), built without it: the
split does not need the processor.

:func:`direct_collator` reads the same caption rows as a processor's collator (:func:`common.caption_row`): the
text of each turn tokenized, each image written as the processor writes it (a start marker, its image tokens, an
end marker; the Qwen2 special tokens stand in, as in the tiny configs) and its vision keys made with the keys,
shapes and dtypes the family's real processor gives (read from its source in transformers): the photo resized to
each view and normalised to [-1, 1], the processor's grids and counts. The loss covers the assistant's turn.
:data:`IMAGES` maps a model type to ``image(config, photo) -> (vision keys of one image, tokens)``; a micro-batch's
keys are its images' concatenated along dim 0, as the processors batch them.
"""

from __future__ import annotations

import numpy as np
import torch

Tensors = dict[str, torch.Tensor]


def pixels(photo, height: int, width: int) -> torch.Tensor:
    """``photo`` (PIL) resized to ``(height, width)``, as ``(3, height, width)`` in [-1, 1]."""
    array = np.asarray(photo.convert("RGB").resize((width, height)), dtype=np.float32) / 127.5 - 1.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def size_class(photo) -> int:
    """0, 1 or 2: the photo's longer side over 56, 84, 112 px (the caption pools' three sizes)."""
    return min(2, max(0, (max(photo.size) - 56) // 28))


def _cohere2_vision(config, photo) -> tuple[Tensors, int]:
    """``Cohere2VisionImageProcessor``: ``pixel_values`` ``(tiles, 3, S, S)`` (1-3 tiles, S the tower's
    ``image_size``); per tile ``(S / patch / downsample_factor) ** 2`` tokens."""
    side, tiles = config.vision_config.image_size, 1 + size_class(photo)
    per_tile = (side // config.vision_config.patch_size // config.downsample_factor) ** 2
    views = torch.stack([pixels(photo.rotate(90 * t), side, side) for t in range(tiles)])
    return {"pixel_values": views}, tiles * per_tile


def _lfm2_vl(config, photo, max_patches: int = 36) -> tuple[Tensors, int]:
    """``Lfm2VlImageProcessor``: ``pixel_values`` ``(1, max_num_patches, p * p * 3)`` (the image's patches, row by
    row, each ``(p, p, 3)`` flattened; zero-padded), ``pixel_attention_mask`` int32 ``(1, max_num_patches)``,
    ``spatial_shapes`` ``(1, 2)`` (patch rows and columns, multiples of ``downsample_factor``); ``(rows / f) *
    (cols / f)`` tokens."""
    patch, factor = config.vision_config.patch_size, config.downsample_factor
    rows, cols = [(4, 4), (4, 6), (6, 4)][size_class(photo)]
    image = pixels(photo, rows * patch, cols * patch)
    patches = image.reshape(3, rows, patch, cols, patch).permute(1, 3, 2, 4, 0).reshape(rows * cols, -1)
    values = torch.zeros(1, max_patches, patches.shape[1])
    values[0, :rows * cols] = patches
    mask = torch.zeros(1, max_patches, dtype=torch.int32)
    mask[0, :rows * cols] = 1
    return ({"pixel_values": values, "pixel_attention_mask": mask, "spatial_shapes": torch.tensor([[rows, cols]])},
            (rows // factor) * (cols // factor))


def _downsampled(side: int, patch: int) -> int:
    """Grid side after the patch embedding and two stride-2, padding-1 convolutions (Step3p7's downsamplers)."""
    return -(-(-(-(side // patch) // 2)) // 2)


def _step3p7(config, photo, local_size: int = 64) -> tuple[Tensors, int]:
    """``Step3p7ImageProcessor``: ``pixel_values`` ``(1, 3, S, S)`` (the global view, S the tower's
    ``image_size``), ``pixel_values_local`` ``(n, 3, s, s)`` (0, 2 or 3 crops of ``local_size`` px) and
    ``num_local_patches`` ``(1,)``; each view's grid downsampled 4 x (ceil) tokens, the crops' first."""
    side, patch = config.vision_config.image_size, config.vision_config.patch_size
    crops = [0, 2, 3][size_class(photo)]
    keys = {"pixel_values": pixels(photo, side, side)[None], "num_local_patches": torch.tensor([crops]),
            "pixel_values_local": torch.stack([pixels(photo.rotate(90 * (c + 1)), local_size, local_size)
                                               for c in range(crops)]) if crops else torch.zeros(0, 3, local_size,
                                                                                                 local_size)}
    return keys, _downsampled(side, patch) ** 2 + crops * _downsampled(local_size, patch) ** 2


def _unlimited_ocr(config, photo, size: int = 64, tile: int = 48) -> tuple[Tensors, int]:
    """``UnlimitedOcrImageProcessor``: ``pixel_values`` ``(1, 3, size, size)`` (the global view), the tiles of a
    ``(columns, rows)`` canvas (``patches_grid``: 1 x 1 without tiles, 2 x 1, 2 x 2) as ``pixel_values_local``
    ``(tiles, 3, tile, tile)`` and ``num_local_patches`` ``(1,)``; tokens as ``UnlimitedOcrProcessor`` counts
    them: per view side ``q = ceil(side / patch / 4)`` queries, a newline after each row of them, a view separator."""
    patch = config.vision_config.sam_config.patch_size
    columns, rows = [(1, 1), (2, 1), (2, 2)][size_class(photo)]
    tiles = columns * rows if size_class(photo) else 0
    local = [pixels(photo.rotate(90 * t), tile, tile) for t in range(tiles)]
    keys = {"pixel_values": pixels(photo, size, size)[None], "num_local_patches": torch.tensor([tiles]),
            "patches_grid": torch.tensor([[columns, rows]]),
            "pixel_values_local": torch.stack(local) if local else torch.zeros(0, 3, tile, tile)}
    glob, per_tile = -(-(size // patch) // 4), -(-(tile // patch) // 4)
    return keys, glob * (glob + 1) + 1 + ((rows * per_tile) * (columns * per_tile + 1) if tiles else 0)


def _minimax_m3_vl(config, photo) -> tuple[Tensors, int]:
    """``MiniMaxM3VLImageProcessor`` (Qwen2-VL's layout): ``pixel_values`` ``(h * w, 3 * T * p * p)`` (the image
    resized to ``(h p, w p)``, repeated over ``temporal_patch_size`` T frames, its patches in 2 x 2 merge windows) and
    ``image_grid_thw`` ``(1, 3)`` = ``[1, h, w]``; ``h * w / merge ** 2`` tokens."""
    vision = config.vision_config
    patch, frames, merge = vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size
    rows, cols = [(4, 4), (4, 6), (6, 4)][size_class(photo)]
    image = pixels(photo, rows * patch, cols * patch)[None].expand(frames, -1, -1, -1)
    patches = image.reshape(1, frames, 3, rows // merge, merge, patch, cols // merge, merge, patch)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(rows * cols, -1)
    return {"pixel_values": patches, "image_grid_thw": torch.tensor([[1, rows, cols]])}, rows * cols // merge ** 2


def _molmo2(config, photo) -> tuple[Tensors, int]:
    """``Molmo2ImageProcessor``: ``pixel_values`` ``(crops, patches, p * p * 3)`` (the low-resolution view, then 1-2
    high-resolution crops side by side; each crop's patches row by row), ``image_token_pooling`` ``(tokens, 4)``
    (each token's 2 x 2 patches, indices into the image's own flattened patches; -1 pads a window cut by the last
    crop's edge), ``image_grids`` ``(1, 4)`` (the low-resolution and high-resolution token grids) and
    ``image_num_crops`` ``(1,)``; one token per pooling row."""
    vision = config.vision_config
    side, patch = vision.image_size[0], vision.patch_size
    grid, crops, cut = side // patch, [1, 2, 2][size_class(photo)], size_class(photo) == 2
    views = [pixels(photo, side, side)] + list(pixels(photo, side, side * crops).split(side, dim=2))
    values = torch.stack([v.reshape(3, grid, patch, grid, patch).permute(1, 3, 2, 4, 0).reshape(grid * grid, -1)
                          for v in views])
    pooling = []
    for crop, rows, cols in [(0, grid // 2, grid // 2), (None, grid // 2, crops * grid // 2)]:
        for r in range(rows):
            for c in range(cols):
                at = crop if crop is not None else 1 + c // (grid // 2)
                col = (2 * c) % grid
                window = [at * grid * grid + (2 * r + dr) * grid + col + dc for dr in (0, 1) for dc in (0, 1)]
                if cut and crop is None and c == cols - 1:
                    window = [window[0], -1, window[2], -1]
                pooling.append(window)
    grids = torch.tensor([[grid // 2, grid // 2, grid // 2, crops * grid // 2]])
    return ({"pixel_values": values, "image_token_pooling": torch.tensor(pooling), "image_grids": grids,
             "image_num_crops": torch.tensor([1 + crops])}, len(pooling))


IMAGES = {"cohere2_vision": _cohere2_vision, "lfm2_vl": _lfm2_vl, "step3p7": _step3p7,
          "unlimited_ocr": _unlimited_ocr, "minimax_m3_vl": _minimax_m3_vl, "molmo2": _molmo2}
TYPES = tuple(IMAGES)
# families whose model reads each token's modality (mm_token_type_ids: 1 at the image's tokens and markers)
TOKEN_TYPES = ("molmo2",)


def _text(message) -> str:
    return " ".join(part["text"] for part in message["content"] if part["type"] == "text")


def _row(config, tokenizer, row: dict):
    """``(input_ids, labels, token types, [vision keys of each image])`` of one caption row."""
    special = tokenizer.convert_tokens_to_ids
    user, answer = row["messages"][0], tokenizer.encode(_text(row["messages"][1])) + [tokenizer.eos_token_id]
    ids, types, vision = tokenizer.encode("user:"), [], []
    types = [0] * len(ids)
    for photo in row["images"]:
        keys, count = IMAGES[config.model_type](config, photo)
        marked = [special("<|vision_start|>")] + [config.image_token_id] * count + [special("<|vision_end|>")]
        ids, types, vision = ids + marked, types + [1] * len(marked), vision + [keys]
    prompt = tokenizer.encode(_text(user) + "\nassistant:")
    ids, types = ids + prompt, types + [0] * len(prompt)
    return ids + answer, [-100] * len(ids) + answer, types + [0] * len(answer), vision


def direct_collator(config, tokenizer):
    """``collate(rows) -> micro-batch``: right-padded ``input_ids``, ``attention_mask``, ``labels`` (and
    ``mm_token_type_ids`` for :data:`TOKEN_TYPES`), the images' vision keys concatenated along dim 0 (a floating
    key with no rows, e.g. no local views anywhere, is left out, as the processors leave it)."""
    def collate(rows: list[dict]) -> Tensors:
        made = [_row(config, tokenizer, row) for row in rows]
        width = max(len(r[0]) for r in made)
        pad = [width - len(r[0]) for r in made]
        out = {"input_ids": torch.tensor([r[0] + [tokenizer.pad_token_id] * p for r, p in zip(made, pad)]),
               "attention_mask": torch.tensor([[1] * len(r[0]) + [0] * p for r, p in zip(made, pad)]),
               "labels": torch.tensor([r[1] + [-100] * p for r, p in zip(made, pad)])}
        if config.model_type in TOKEN_TYPES:
            out["mm_token_type_ids"] = torch.tensor([r[2] + [0] * p for r, p in zip(made, pad)])
        images = [keys for r in made for keys in r[3]]
        for key in dict.fromkeys(k for keys in images for k in keys):
            joined = torch.cat([keys[key] for keys in images if key in keys])
            if joined.shape[0] or not joined.is_floating_point():
                out[key] = joined
        return out
    return collate
