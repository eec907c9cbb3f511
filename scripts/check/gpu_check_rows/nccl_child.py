"""The child process of the NCCL set-up row (:mod:`.nccl_init`): run with ``NCCL_DEBUG=INFO``,
``NCCL_DEBUG_SUBSYS=INIT`` in a torchrun-like environment of one rank. It joins through the project's
``init_distributed`` (which binds ``device_id``), creates two groups with ``dist.new_group`` as the runtime does
(a NCCL one and a gloo one for headers), and only then runs the first collective on each NCCL group. Between the
phases it prints a marker line to the same stream NCCL logs to, so the parent can tell at which phase each
communicator was initialised."""

from __future__ import annotations

import os
import sys

MARK = "GPU_CHECK_PHASE"


def mark(phase: str) -> None:
    """A marker line, flushed before NCCL's next line (NCCL writes to stdout unless ``NCCL_DEBUG_FILE``)."""
    sys.stdout.write(f"{MARK} {phase}\n")
    sys.stdout.flush()


def main() -> None:
    """The phases: init, groups made, first collectives, end."""
    import torch
    import torch.distributed as dist
    from mpipe_hf.runtime.mesh import init_distributed
    mark("start")
    device = init_distributed()
    mark("after init_distributed")
    nccl = dist.new_group([0], use_local_synchronization=True)
    dist.new_group([0], backend="gloo", use_local_synchronization=True)
    mark("after new_group")
    for group in (None, nccl):
        dist.all_reduce(torch.ones(1, device=device), group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    mark("after first collectives")
    dist.destroy_process_group()
    mark("end")


if __name__ == "__main__":
    sys.path.insert(0, os.environ.get("GPU_CHECK_ROOT", "."))
    main()
