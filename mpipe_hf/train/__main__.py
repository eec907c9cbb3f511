"""``python -m mpipe_hf.train RECIPE.yaml``: the per-process entry point for torchrun and accelerate launch."""

from .trainer import main

main()
