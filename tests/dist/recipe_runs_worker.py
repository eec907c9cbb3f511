"""Under torchrun: ``mpipe_hf.train.train`` on each recipe given, one after another in the same processes, as
``python -m mpipe_hf.train`` runs one. A run that resumes from an earlier run's checkpoint reads it from disk as a
new launch would (the weights, every rank's optimizer, scheduler and data state), so a resume is checked without
starting the processes again (each start costs several seconds of imports).

Usage: ``torchrun --nproc_per_node N recipe_runs_worker.py RECIPE.yaml [RECIPE.yaml ...]``
"""

import sys

import torch.distributed as dist

from mpipe_hf.train import load_recipe
from mpipe_hf.train.trainer import train

if __name__ == "__main__":
    for path in sys.argv[1:]:
        train(load_recipe(path))
        dist.barrier()  # the next run may read what this one saved
    dist.destroy_process_group()
