"""Shared by the distributed test workers and the tests that launch them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import torch
from PIL import Image
from skimage import data as skdata

from mpipe_hf.data import CaptionCollator, qwen2_5_vl_processor, qwen2_tokenizer
from mpipe_hf.models.tiny import tiny_qwen2_5_vl_config

PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "camera", "coins", "horse", "clock"]
CAPTIONS = ["An astronaut in an orange suit.", "A cup of coffee on a saucer.", "A tabby cat looks at the camera.",
            "A rocket on its launch pad.", "A man with a camera on a tripod.", "Old coins on a dark cloth.",
            "A white horse shape.", "A small clock on a table."]


def photo(name: str, side: int) -> Image.Image:
    array = getattr(skdata, name)()
    if array.ndim == 2:
        array = np.stack([array] * 3, -1)
    image = Image.fromarray(array[..., :3].astype(np.uint8))
    image.thumbnail((side, side))
    return image


def make_micro_batches(tokenizer, num: int) -> list[dict[str, torch.Tensor]]:
    """``num`` micro-batches of 1-2 real photos each, differing in image size and text length."""
    collate = CaptionCollator(qwen2_5_vl_processor(tokenizer))
    out = []
    for m in range(num):
        rows = []
        for j in range(1 + m % 2):
            i = (m * 2 + j) % len(PHOTOS)
            rows.append({"image": photo(PHOTOS[i], 56 + 28 * ((m + j) % 3)), "prompt": "Describe the image." + " Briefly." * (m % 3),
                         "caption": CAPTIONS[i]})
        out.append(collate(rows))
    return out


def run_torchrun(worker: str, nproc: int, args: list[str], timeout: int) -> None:
    """Run ``worker`` under torchrun on ``nproc`` CPU processes; raise with its output when it fails."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", worker, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")


def read_results(out_dir: str, nproc: int) -> list[dict]:
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(nproc)]


def build_fixture(path: str, num_micro: int) -> None:
    """Tokenizer, tiny config and micro-batches, built once and shared with the workers through ``path``."""
    tokenizer = qwen2_tokenizer()
    torch.save({"config": tiny_qwen2_5_vl_config(tokenizer).to_dict(),
                "micro_batches": make_micro_batches(tokenizer, num_micro)}, path)
