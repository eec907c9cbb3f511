"""Micro-batches for the Qwen-like and new families whose stock image processor exists in transformers only with a
torchvision backend: the split needs no processor, so the tests build each family's vision inputs directly, in the
layout and shapes its stock processor writes (read from the processor's source in the installed transformers),
from the same canonical rows as every other pool (:func:`common.make_ragged_pool`: messages and PIL photos).

Each builder maps one image to ``(tensors, image tokens)``; :func:`direct_collator` joins a micro-batch's images
as the stock processor joins them, puts ``<|vision_start|>``, the image tokens and ``<|vision_end|>`` before each
row's prompt, and labels the answer alone (``-100`` on the prompt, the images and the padding, right-padded).
"""

from __future__ import annotations

import torch
from PIL import Image


def _pixels(image: Image.Image, height: int, width: int) -> torch.Tensor:
    """``image`` resized to ``height x width`` (bicubic), ``(3, H, W)`` scaled to [-1, 1] (mean and std 0.5, the
    stock processors' defaults for these towers)."""
    array = torch.tensor(list(image.convert("RGB").resize((width, height), Image.BICUBIC).getdata()),
                         dtype=torch.float32)
    return (array.view(height, width, 3).permute(2, 0, 1) / 255.0 - 0.5) / 0.5


def _even_grid(image: Image.Image, patch: int, merge: int = 2, cap: int = 8) -> tuple[int, int]:
    """The patch grid ``(h, w)`` of ``image`` at one pixel a pixel, rounded to multiples of ``merge`` (at least
    ``merge``, at most ``cap``), as the stock processors' ``factor = merge * patch`` rounding gives."""
    width, height = image.size
    return tuple(min(cap, max(merge, round(side / (patch * merge)) * merge)) for side in (height, width))


def llama4_image(config, image: Image.Image) -> tuple[dict, int]:
    """Llama 4's image processor as the data path builds it (``mpipe_hf/families/llava/image_processor_llama4.py``, the stock
    ``Llama4ImageProcessor``'s outputs bit for bit without torchvision), at most 2 tiles of ``image_size`` px and a
    global tile where there are 2: ``(tiles, 3, S, S)``, cast from the stock ``bfloat16`` to ``float32`` (exact;
    the unsplit reference takes the pixels as given, the split casts them to the model's dtype). Each tile gives
    ``(S / patch) ** 2 * pixel_shuffle_ratio ** 2`` tokens."""
    from mpipe_hf.families.llava.image_processor_llama4 import Llama4ImageProcessorNoTV
    vision = config.vision_config
    side = vision.image_size
    per_tile = int((side // vision.patch_size) ** 2 * vision.pixel_shuffle_ratio ** 2)
    processor = Llama4ImageProcessorNoTV(size={"height": side, "width": side}, max_patches=2)
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"].float()
    return {"pixel_values": pixels}, per_tile * pixels.shape[0]


def kimi_k25_image(config, image: Image.Image) -> tuple[dict, int]:
    """``Kimi_K25ImageProcessor``: the image resized to a grid of ``merge * patch`` multiples, its patches in
    row-major order ``(h * w, 3, patch, patch)``, ``image_grid_thw`` ``(1, h, w)``; ``h * w / merge ** 2``
    tokens."""
    vision = config.vision_config
    patch, merge = vision.patch_size, vision.merge_kernel_size[0]
    h, w = _even_grid(image, patch, merge)
    pixels = _pixels(image, h * patch, w * patch)
    patches = pixels.view(3, h, patch, w, patch).permute(1, 3, 0, 2, 4).reshape(h * w, 3, patch, patch)
    return {"pixel_values": patches, "image_grid_thw": torch.tensor([[1, h, w]])}, h * w // merge ** 2


def muse_glimmer_image(config, image: Image.Image) -> tuple[dict, int]:
    """``MuseGlimmerImageProcessor``: as Qwen2-VL's, the image resized to a grid of ``merge * patch`` multiples,
    each patch repeated over ``patch_temporal`` frames and flattened ``(h * w, T * 3 * patch * patch)``,
    ``image_grid_thw`` ``(1, h, w)``; ``h * w / merge ** 2`` tokens."""
    vision = config.vision_config
    patch, merge, frames = vision.patch_size, vision.merge_size, vision.patch_temporal
    h, w = _even_grid(image, patch, merge)
    pixels = _pixels(image, h * patch, w * patch)
    patches = pixels.view(3, h, patch, w, patch).permute(1, 3, 0, 2, 4).reshape(h * w, 1, -1)
    return {"pixel_values": patches.expand(-1, frames, -1).reshape(h * w, -1),
            "image_grid_thw": torch.tensor([[1, h, w]])}, h * w // merge ** 2


def minicpm_image(config, image: Image.Image) -> tuple[dict, int]:
    """``MiniCPMOcrImageProcessor`` (one slice, the whole image): NaViT-packed patches ``(1, 3, patch, h * w *
    patch)`` (``reshape_by_patch``), ``target_sizes`` ``(1, 2)`` int32; ``h * w / 4`` tokens in the ``4x``
    downsample mode, ``/ 16`` in ``16x``."""
    patch = config.vision_config.patch_size
    merge = 2 if config.downsample_mode == "4x" else 4
    h, w = _even_grid(image, patch, merge)
    pixels = _pixels(image, h * patch, w * patch)
    unfolded = torch.nn.functional.unfold(pixels.unsqueeze(0), (patch, patch), stride=(patch, patch))
    packed = unfolded.reshape(3, patch, patch, -1).permute(0, 1, 3, 2).reshape(3, patch, -1)
    return {"pixel_values": packed.unsqueeze(0), "target_sizes": torch.tensor([[h, w]], dtype=torch.int32)}, \
        h * w // merge ** 2


def gemma4_unified_image(config, image: Image.Image, max_patches: int = 28) -> tuple[dict, int]:
    """``Gemma4UnifiedImageProcessor``: the image resized to whole model patches (``patch_size *
    pooling_kernel_size`` px, at most 5 a side), each patch's pixels flattened ``(p, q, channel)``, padded to
    ``max_patches`` rows: ``pixel_values`` ``(1, max_patches, (k * patch) ** 2 * 3)``, ``image_position_ids``
    ``(1, max_patches, 2)`` as ``(x, y)``, ``-1`` on padding; one token a real patch."""
    vision = config.vision_config
    side = vision.patch_size * vision.pooling_kernel_size
    width, height = image.size
    h, w = (min(5, max(1, round(s / side))) for s in (height, width))
    pixels = _pixels(image, h * side, w * side)
    patches = pixels.view(3, h, side, w, side).permute(1, 3, 2, 4, 0).reshape(h * w, -1)
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    positions = torch.stack([cols.reshape(-1), rows.reshape(-1)], -1)
    padded = torch.zeros(1, max_patches, patches.shape[-1])
    padded[0, :h * w] = patches
    ids = torch.full((1, max_patches, 2), -1, dtype=torch.long)
    ids[0, :h * w] = positions
    return {"pixel_values": padded, "image_position_ids": ids}, h * w


def inkling_image(config, image: Image.Image) -> tuple[dict, int]:
    """``InklingImageProcessor``: the image cut into ``patch`` px squares in row-major order, each repeated over
    ``temporal_patch_size`` frames, ``(n, T, patch, patch, 3)`` (its ``permute(0, 4, 2, 3, 1)``); one token a patch.
    The grid here is the image's at one pixel a pixel, at most 4 patches a side."""
    vision = config.vision_config
    patch, frames = vision.patch_size, vision.temporal_patch_size
    h, w = _even_grid(image, patch, merge=1, cap=4)
    pixels = _pixels(image, h * patch, w * patch)
    patches = pixels.view(3, h, patch, w, patch).permute(1, 3, 2, 4, 0).reshape(h * w, 1, patch, patch, 3)
    return {"pixel_values": patches.expand(-1, frames, -1, -1, -1).contiguous()}, h * w


def nemotron_h_omni_image(config, image: Image.Image) -> tuple[dict, int]:
    """``NemotronH_Omni_Reasoning_V3ImageProcessor``: the image resized to a patch grid of even sides, normalised
    with the OpenAI CLIP mean and std, its patches in row-major order, each flattened channel-major ``(h * w, 3 *
    patch * patch)`` (``convert_image_to_patches``), ``image_grid_hw`` ``(1, 2)``; ``h * w * downsample_ratio **
    2`` tokens (the pixel shuffle)."""
    from transformers.utils.constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
    patch, shrink = config.vision_config.patch_size, round(1 / config.downsample_ratio)
    h, w = _even_grid(image, patch, shrink)
    unit = _pixels(image, h * patch, w * patch) * 0.5 + 0.5  # back to [0, 1]
    pixels = (unit - torch.tensor(OPENAI_CLIP_MEAN).view(3, 1, 1)) / torch.tensor(OPENAI_CLIP_STD).view(3, 1, 1)
    patches = pixels.view(3, h, patch, w, patch).permute(1, 3, 0, 2, 4).reshape(h * w, -1)
    return {"pixel_values": patches, "image_grid_hw": torch.tensor([[h, w]])}, h * w // shrink ** 2


# model type -> (one image's builder, the dimension a micro-batch's images' pixels are joined along)
BUILDERS = {"llama4": (llama4_image, 0), "kimi_k25": (kimi_k25_image, 0), "minicpm_ocr": (minicpm_image, -1),
            "gemma4_unified": (gemma4_unified_image, 0), "muse_glimmer": (muse_glimmer_image, 0),
            "muse_spark": (muse_glimmer_image, 0), "inkling_mm_model": (inkling_image, 0),
            "nemotron_h_omni": (nemotron_h_omni_image, 0)}
TOKEN_TYPES = ("gemma4_unified",)  # families whose masks read mm_token_type_ids (1 at each image token)


def direct_collator(config, tokenizer):
    """``collate(rows) -> micro-batch`` for ``config``'s model type (:data:`BUILDERS`): ``input_ids``,
    ``attention_mask``, ``labels`` ``(B, L)`` and, when a row has an image, the family's vision keys."""
    build, dim = BUILDERS[config.model_type]
    ids_of = tokenizer.convert_tokens_to_ids
    start, end = ids_of("<|vision_start|>"), ids_of("<|vision_end|>")
    image_token = config.image_token_id

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        seqs, vision = [], []
        for row in rows:
            user, answer = row["messages"]
            prompt = tokenizer(" ".join(p["text"] for p in user["content"] if p["type"] == "text"))["input_ids"]
            reply = tokenizer(answer["content"][0]["text"])["input_ids"] + [tokenizer.eos_token_id]
            head = []
            for image in row["images"]:
                tensors, n = build(config, image)
                vision.append(tensors)
                head += [start] + [image_token] * n + [end]
            seqs.append((head + prompt, reply))
        length = max(len(a) + len(b) for a, b in seqs)
        out = {k: torch.full((len(rows), length), fill, dtype=torch.long)
               for k, fill in (("input_ids", tokenizer.pad_token_id), ("attention_mask", 0), ("labels", -100))}
        for r, (context, reply) in enumerate(seqs):
            n = len(context) + len(reply)
            out["input_ids"][r, :n] = torch.tensor(context + reply)
            out["attention_mask"][r, :n] = 1
            out["labels"][r, len(context):n] = torch.tensor(reply)
        for key in vision[0] if vision else ():
            out[key] = torch.cat([v[key] for v in vision], dim=dim if key == "pixel_values" else 0)
        if config.model_type in TOKEN_TYPES:
            out["mm_token_type_ids"] = (out["input_ids"] == image_token).long()
        return out
    return collate
