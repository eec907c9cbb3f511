"""The order of the ``(dp, pp)`` mesh's ranks, and ``auto``'s choice of it by the at-scale simulator.

Two orders number the ``dp_size * pp_size`` processes (``d``: the pipeline replica, ``p``: the stage rank in it):

- ``pp_inner``: global rank ``d * pp_size + p``. A pipeline's ranks are consecutive, so on nodes of ``G`` GPUs a
  pipeline of ``pp_size <= G`` is inside one node: its P2P transfers take NVLink, and each data-parallel group
  (stage rank ``p`` of every replica) spans nodes when ``pp_size * dp_size > G``.
- ``dp_inner``: global rank ``p * dp_size + d``. The replicas of one stage rank are consecutive, so the
  data-parallel groups are inside a node (``dp_size <= G``) and the pipeline's transfers cross nodes.

Which is faster depends on what crosses the nodes' slower links (InfiniBand, against NVLink inside a node): the
pipeline's traffic, every micro-batch's activations and gradients (and MPipe's features and data between the
owners and rank 0), or the step's data-parallel exchange of the rank's weights and gradients.
:func:`choose_mesh_order` simulates both: the schedule's step (:func:`~.simulate.simulate`, on the pipeline's
link in each order) plus each rank's data-parallel exchange after its last action (ring collectives,
:meth:`~.cluster.Cluster.ring_seconds`, on the group's link), as ``scripts/bench/sim_at_scale.py`` adds ZeRO-1's.
Assumptions: the simulator has one link for all the pipeline's transfers, so a pipeline with any pair of ranks on
different nodes takes InfiniBand for every transfer (conservative, as :meth:`~.cluster.Cluster.pipeline_link`);
a data-parallel group with ranks on two nodes runs its rings at InfiniBand's pace (the slowest link of a ring);
the exchange does not overlap compute (an upper bound), and counts one ring per collective (the per-unit
latencies of FSDP2's nested units are left out). Pure Python, no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .cluster import Cluster
from .config import ScheduleConfig
from .layout import balanced_layers
from .mpipe import build_schedule
from .simulate import simulate

MESH_ORDERS = ("pp_inner", "dp_inner", "auto")
ORDERS = ("pp_inner", "dp_inner")  # the concrete ones


def _check(order: str, pp_size: int, dp_size: int, rank: int | None = None) -> None:
    if order not in ORDERS:
        raise ValueError(f"mesh order must be one of {ORDERS} (resolve 'auto' first), got {order!r}")
    if rank is not None and not 0 <= rank < pp_size * dp_size:
        raise ValueError(f"rank {rank} is outside the {pp_size * dp_size} processes of pp_size {pp_size} x dp_size "
                         f"{dp_size}")


def global_rank(order: str, replica: int, stage_rank: int, pp_size: int, dp_size: int) -> int:
    """The global rank of stage rank ``stage_rank`` of pipeline replica ``replica`` (``pp_inner``:
    ``replica * pp_size + stage_rank``; ``dp_inner``: ``stage_rank * dp_size + replica``).

    Raises:
        ValueError: an order other than ``pp_inner`` and ``dp_inner``.
    """
    _check(order, pp_size, dp_size)
    return replica * pp_size + stage_rank if order == "pp_inner" else stage_rank * dp_size + replica


def position(order: str, rank: int, pp_size: int, dp_size: int) -> tuple[int, int]:
    """``(replica, stage rank)`` of global rank ``rank``: the inverse of :func:`global_rank`.

    Raises:
        ValueError: an order other than ``pp_inner`` and ``dp_inner``, or a rank outside the world.
    """
    _check(order, pp_size, dp_size, rank)
    return divmod(rank, pp_size) if order == "pp_inner" else divmod(rank, dp_size)[::-1]


def within_nodes(order: str, pp_size: int, dp_size: int, gpus_per_node: int) -> tuple[bool, bool]:
    """``(every pipeline inside one node, every data-parallel group inside one node)`` when global rank ``g``
    runs on node ``g // gpus_per_node`` (as torchrun numbers the ranks of ``--nnodes`` launchers)."""
    def one_node(ranks) -> bool:
        return len({g // gpus_per_node for g in ranks}) == 1
    pipelines = all(one_node([global_rank(order, d, p, pp_size, dp_size) for p in range(pp_size)])
                    for d in range(dp_size))
    groups = all(one_node([global_rank(order, d, p, pp_size, dp_size) for d in range(dp_size)])
                 for p in range(pp_size))
    return pipelines, groups


@dataclass(frozen=True)
class RankParams:
    """Parameters one stage rank holds in its stage chunks, which data parallelism exchanges: ``gathered``
    bytes its FSDP2 all-gather moves (``shard`` only), ``trained`` parameters whose gradients it reduces, and
    ``replicated_trained`` ones reduced by an fp32 all-reduce whatever the engine (a trainable ``P``, on rank 0)."""

    gathered_bytes: float
    trained: float
    replicated_trained: float = 0.0


def rank_params(cfg: ScheduleConfig, layout: list[int], estimate, bf16: bool = True,
                train_tower: bool | None = None) -> list[RankParams]:
    """Each stage rank's :class:`RankParams` for ``layout`` (decoder layers per stage) and an
    :class:`~.hardware.Estimate`'s parameter counts: its stages' layers, the embedding on rank 0, the LM head on
    the last stage's rank, the tower inside stage 0 with preprocess ``identity`` (trained when ``train_tower``),
    else ``P`` replicated on every rank and trained by rank 0 when the mode is ``trainable``. Under ``bf16``
    (:mod:`mpipe_hf.runtime.data_parallel`) FSDP2 gathers the matmul weights (layers, head, tower) in bf16 and
    the embedding in fp32; every gradient is reduced in fp32."""
    R, last = cfg.pp_size, (cfg.num_stages - 1) % cfg.pp_size
    matmul_bytes = 2 if bf16 else 4
    out = []
    for r in range(R):
        layers = sum(layout[s] for s in range(r, cfg.num_stages, R)) * estimate.layer_params
        head = estimate.head_params if r == last else 0
        embed = estimate.embed_params if r == 0 else 0
        tower = estimate.preprocess_params if r == 0 and not cfg.transposed else 0
        tower_trained = tower if train_tower else 0
        replicated = estimate.preprocess_params if r == 0 and cfg.trains_preprocess else 0
        out.append(RankParams(matmul_bytes * (layers + head + tower) + 4 * embed,
                              layers + head + embed + tower_trained, replicated))
    return out


def exchange_seconds(params: RankParams, dp_size: int, cluster: Cluster, within_node: bool,
                     engine: str = "shard") -> float:
    """One rank's data-parallel exchange in a step: ``shard`` (FSDP2, weights kept gathered through the step),
    one all-gather of its gathered bytes and one fp32 reduce-scatter of its gradients; ``replicate``, one fp32
    all-reduce (a reduce-scatter and an all-gather); plus the fp32 all-reduce of ``P``'s gradients."""
    ring = cluster.ring_seconds
    seconds = 2 * ring(4.0 * params.replicated_trained, dp_size, within_node)
    if engine == "shard":
        return seconds + ring(params.gathered_bytes, dp_size, within_node) + ring(4.0 * params.trained, dp_size,
                                                                                   within_node)
    return seconds + 2 * ring(4.0 * params.trained, dp_size, within_node)


@dataclass(frozen=True)
class OrderChoice:
    """What :func:`choose_mesh_order` found: the faster ``order``, and for each order its predicted step
    seconds (``step_s``), the simulated pipeline's makespan (``pipeline_s``) and the slowest rank's exchange
    (``exchange_s``). Within one node both orders are the same (``order`` is then ``pp_inner``)."""

    order: str
    step_s: dict[str, float]
    pipeline_s: dict[str, float]
    exchange_s: dict[str, float]

    def describe(self) -> str:
        """One line: the choice and both predictions."""
        other = "dp_inner" if self.order == "pp_inner" else "pp_inner"
        return (f"{self.order} (predicted step {self.step_s[self.order]:.4g} s: pipeline "
                f"{self.pipeline_s[self.order]:.4g} s + data-parallel exchange {self.exchange_s[self.order]:.4g} s; "
                f"{other} {self.step_s[other]:.4g} s = {self.pipeline_s[other]:.4g} + {self.exchange_s[other]:.4g})")


def choose_mesh_order(cfg: ScheduleConfig, dp_size: int, estimate, cluster: Cluster,
                      layout: list[int] | None = None, text_layers: int = 0, engine: str = "shard",
                      bf16: bool = True, train_tower: bool | None = None) -> OrderChoice:
    """The faster mesh order for ``dp_size`` replicas of the pipeline ``cfg`` on ``cluster`` (its
    ``gpus_per_node`` and links), with both predictions (the module docstring says how).

    Args:
        estimate: an :class:`~.hardware.Estimate` (``figures_estimate``, or a measured profile with the
            parameter counts): its profile's link figures are replaced by each order's pipeline link.
        layout: decoder layers per stage (default: balanced by count).
        text_layers, engine, bf16, train_tower: as the run has them (``engine``: ``"shard"`` or
            ``"replicate"``; :func:`rank_params`).

    The simulated schedule is ``cfg``'s plain form (placement ``prefix``, no zero bubble): the same transfers,
    built without the costs, so the choice is cheap (under a second at ``pp = 8``, ``M = 128``).
    """
    from .tune import costs_for
    layout = layout or balanced_layers(estimate.profile.num_layers, cfg.num_stages)
    plain = dataclasses.replace(cfg, placement="prefix", zero_bubble=False)
    orders = build_schedule(plain)
    params = rank_params(plain, layout, estimate, bf16, train_tower)
    world = cfg.pp_size * dp_size
    choice = {}
    for order in ORDERS:
        pipelines, groups = within_nodes(order, cfg.pp_size, dp_size, cluster.gpus_per_node)
        latency, bandwidth = cluster.link(pipelines)
        profile = dataclasses.replace(estimate.profile, latency_s=latency, bandwidth_bytes_per_s=bandwidth)
        sim = simulate(orders, costs_for(profile, plain, layout, text_layers))
        ends = [max((ev.end for ev in sim.timeline[r]), default=0.0) for r in range(cfg.pp_size)]
        exchange = [exchange_seconds(p, dp_size, cluster, groups, engine) for p in params]
        choice[order] = (max(e + x for e, x in zip(ends, exchange)), sim.makespan, max(exchange))
        if world <= cluster.gpus_per_node:  # one node: the orders do not differ
            choice["dp_inner"] = choice["pp_inner"]
            break
    best = min(ORDERS, key=lambda o: (choice[o][0], o != "pp_inner"))
    return OrderChoice(best, *({o: choice[o][i] for o in ORDERS} for i in range(3)))
