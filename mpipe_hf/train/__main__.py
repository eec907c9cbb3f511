"""``python -m mpipe_hf.train RECIPE.yaml``: the per-process entry point for torchrun and accelerate launch."""

import sys

from .trainer import main

try:
    main()
except ValueError as err:  # a recipe that cannot be read or is invalid, before training: one line, as mpipe-hf's
    sys.exit(f"mpipe-hf: error: {err}")
