"""Process groups for the pipeline, from a ``DeviceMesh`` (SPEC.md, "Runtime rules")."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..schedule.mesh_order import ORDERS
from .liveness import nccl_error_handling, start_beating


def init_distributed(timeout: timedelta = timedelta(minutes=5)) -> torch.device:
    """Join the process group that ``torchrun`` or ``accelerate launch`` set up in the environment.

    Uses NCCL when CUDA is available, else gloo. Returns this process's device.

    A worker group that torchrun's elastic agent restarted (``TORCHELASTIC_RESTART_COUNT > 0``) joins through
    the agent's store under a prefix of its own attempt: on the agent's store the backends' connection keys of the
    failed attempt are still there (torch 2.13, gloo: the restarted ranks dial the dead processes' addresses and
    fail with "Connection refused").

    Starts the process's liveness thread (on NCCL; :mod:`.liveness`): a rank that dies or stops ends every rank
    within seconds, each printing one line that names it. On NCCL, torch's own error handling is left to it
    (``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` unless set).
    """
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if dist.is_initialized():
        start_beating(timeout.total_seconds())
        return device
    backend, restart = "nccl" if cuda else "gloo", int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    if cuda:
        nccl_error_handling()
    if restart > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        world = int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                              timeout=timeout)
        dist.init_process_group(backend, store=dist.PrefixStore(f"mpipe_hf/attempt{restart}", store),
                                rank=int(os.environ["RANK"]), world_size=world, timeout=timeout,
                                device_id=device if cuda else None)
    else:
        dist.init_process_group(backend, timeout=timeout, device_id=device if cuda else None)
    start_beating(timeout.total_seconds())  # a lost or stopped rank ends every rank, on NCCL too (.liveness)
    return device


def build_mesh(pp_size: int, dp_size: int = 1, order: str = "pp_inner", cp_size: int = 1) -> DeviceMesh:
    """The ``(dp, pp)`` mesh over the whole world, numbered by ``order``
    (:mod:`mpipe_hf.schedule.mesh_order`): ``pp_inner``, global rank ``d * pp_size + p`` is stage rank ``p`` of
    pipeline replica ``d``, so a pipeline's ranks are consecutive (one node's, where it fits); ``dp_inner``,
    global rank ``p * dp_size + d``, so the replicas of a stage rank are (its data-parallel group within a node).
    Ask it, by name, for ``get_group("pp")``, ``get_local_rank("pp")`` and ``mesh["dp"]``; in either order a
    pipeline's group lists its ranks in stage order and global rank 0 is replica 0's stage rank 0.

    ``cp_size > 1`` (context parallelism) adds a ``cp`` dimension just outside ``pp`` (``pp_inner``: global rank
    ``(d * cp_size + c) * pp_size + p``; ``dp_inner``: ``(p * dp_size + d) * cp_size + c``, a CP group's ranks
    consecutive): the ``cp_size`` pipelines of a CP group hold the same stages and split each micro-batch's
    sequence; ``get_group("cp")`` is that group (:func:`reduction_mesh` the one their gradients are summed over).

    Raises:
        ValueError: if ``dp_size * pp_size`` differs from the world size, or ``order`` is not ``pp_inner`` or
            ``dp_inner`` (resolve ``auto`` first: ``mpipe_hf.train.recipe_parallel.resolve_mesh_order``).
    """
    if order not in ORDERS:
        raise ValueError(f"parallel.mesh_order: the mesh order must be one of {ORDERS}, got {order!r}")
    world = dist.get_world_size()
    if dp_size * pp_size * cp_size != world:
        raise ValueError(f"pp_size ({pp_size}) * dp_size ({dp_size}) * cp_size ({cp_size}) must equal the number of "
                         f"processes ({world}); launch {pp_size * dp_size * cp_size} processes or set pp_size to "
                         f"{world // (dp_size * cp_size)}")
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if cp_size > 1:
        if order == "dp_inner":
            return init_device_mesh(device_type, (pp_size, dp_size, cp_size), mesh_dim_names=("pp", "dp", "cp"))
        return init_device_mesh(device_type, (dp_size, cp_size, pp_size), mesh_dim_names=("dp", "cp", "pp"))
    if order == "dp_inner":  # the mesh's last dimension varies fastest over the global ranks
        return init_device_mesh(device_type, (pp_size, dp_size), mesh_dim_names=("pp", "dp"))
    return init_device_mesh(device_type, (dp_size, pp_size), mesh_dim_names=("dp", "pp"))


def expert_mesh(mesh: DeviceMesh, ep_size: int) -> DeviceMesh:
    """The expert-parallel view of a ``(dp, pp)`` mesh: its ``dp`` dimension (the pipeline replicas,
    each on its own micro-batches) split into ``(edp, ep, batch)``. ``mesh_view["ep"]`` is an EP group: ``ep_size``
    replicas of one stage rank that each hold ``E / ep_size`` experts of the stage's MoE layers and exchange
    tokens by all-to-all (``dp`` rank ``d`` is EP rank ``d % ep_size``); ``mesh_view["edp"]`` groups the
    ``dp_size / ep_size`` replicas that hold the same experts, over which their gradients are summed
    (Megatron-LM's expert data parallelism); ``mesh_view["batch"]``, of one rank, is the group that shares a
    batch (transformers' ``AllToAllEP`` takes it as its TP mesh: here no two ranks hold the same tokens). The
    global numbering is ``mesh``'s, in either order; its ``dp``
    and ``pp`` groups are unchanged.

    With a ``cp`` dimension (context parallelism) the EP groups are cut from the ``dp x cp`` ranks that hold a
    stage, flattened (:func:`reduction_mesh`), as Megatron-Core folds its expert-parallel group over DP x CP: the
    CP ranks of a micro-batch hold different tokens of it, as replicas hold different micro-batches, so the
    all-to-all treats them alike. Flattened rank ``d * cp_size + c`` is EP rank ``(d * cp_size + c) % ep_size``
    (:func:`expert_rank`); the returned mesh is then 3-D, ``(edp, ep, batch)``.

    Raises:
        ValueError: ``ep_size`` is not an integer >= 1 that divides the replicas (``dp_size``, times
            ``cp_size`` with a ``cp`` dimension).
    """
    split = "cp" in (mesh.mesh_dim_names or ())
    holders = reduction_mesh(mesh)
    replicas = holders.size()
    if not isinstance(ep_size, int) or isinstance(ep_size, bool) or ep_size < 1 or replicas % ep_size:
        of = "parallel.dp_size" + (" x parallel.cp_size" if split else "")
        raise ValueError(f"parallel.ep_size must be an integer >= 1 that divides {of} ({replicas}: the "
                         f"ranks that hold the same stage), got {ep_size!r}")
    if not split:
        return mesh._unflatten("dp", (replicas // ep_size, ep_size, 1), ("edp", "ep", "batch"))
    return holders._unflatten("dp_cp", (replicas // ep_size, ep_size, 1), ("edp", "ep", "batch"))


def expert_rank(dp_rank: int, cp_rank: int, cp_size: int, ep_size: int) -> int:
    """The EP rank :func:`expert_mesh` gives the stage rank of replica ``dp_rank`` and CP rank ``cp_rank``: its
    flattened ``dp x cp`` index modulo ``ep_size`` (``dp_rank % ep_size`` without context parallelism)."""
    return (dp_rank * cp_size + cp_rank) % ep_size


def reduction_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D mesh a stage rank's gradients and loss sums are summed over: ``mesh["dp"]``, or with a ``cp``
    dimension the ``dp x cp`` ranks that hold the same stages, flattened (``"dp_cp"``): each CP rank's backward
    gives its slice of the sequence's share of a gradient, so the CP ranks' sums fold into the dp reduction
    (:class:`~.data_parallel.DataParallel` over this mesh)."""
    if "cp" not in (mesh.mesh_dim_names or ()):
        return mesh["dp"]
    return mesh["dp", "cp"]._flatten("dp_cp")
