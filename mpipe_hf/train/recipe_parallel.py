"""The recipe's ``parallel`` section (:class:`ParallelSection`): the schedule's fields of
:class:`~mpipe_hf.schedule.ScheduleConfig`, the layout, data parallelism and the owner policy.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from ..schedule import ScheduleConfig
from ..schedule.mesh_order import MESH_ORDERS
from ..schedule.owners import OWNER_POLICIES


@dataclass(frozen=True, kw_only=True)
class ParallelSection(ScheduleConfig):
    """``parallel:`` the schedule (the fields of :class:`ScheduleConfig`: ``pp_size``, ``vpp``, ``num_micro``,
    ``preprocess``, ``overflow``, ``owner_backward``, ``less_memory``, ``placement``) and the layout.

    Attributes:
        text_layers: ``T``, decoder layers the transposed preprocess takes from stage 0 with the tower and the
            embedding (0: the tower alone; must be 0 with preprocess ``identity``).
        layers_per_stage: decoder layers per stage, ``pp_size * vpp`` entries; ``None``: balanced by cost.
        profile: a cost profile (``mpipe-hf profile``): placement ``fill`` places the transposed forwards by it,
            and the default layout is balanced by its costs; unit costs and a layout balanced by the config's
            matmul sizes when ``None``.
        timeout_s: the longest any transfer may wait, in seconds.
        dp_size: pipeline replicas (data parallelism): ``dp_size * pp_size`` processes on one ``(dp, pp)`` mesh,
            each replica on its own share of the global batch (:mod:`mpipe_hf.runtime.data_parallel`).
        ep_size: expert parallelism: the replicas of a stage rank form groups of ``ep_size`` that
            each hold ``E / ep_size`` experts of every MoE layer of the stage and exchange tokens by all-to-all
            (:mod:`mpipe_hf.models.expert_parallel`, :func:`~mpipe_hf.runtime.mesh.expert_mesh`); must divide
            ``dp_size * cp_size`` (and, checked against the model before launch, ``E``).
        cp_size: context parallelism: the ranks of a CP group hold the same stages and split every
            micro-batch's sequence among them (:mod:`mpipe_hf.runtime.context_parallel`); ``pp_size * dp_size *
            cp_size`` processes; checked against the model before launch
            (:func:`~mpipe_hf.train.checks.check_context_parallel`). With ``ep_size > 1`` the EP groups are cut
            from the ``dp_size x cp_size`` ranks that hold a stage (:func:`~mpipe_hf.runtime.mesh.expert_mesh`).
        dp_shard: with ``dp_size > 1``: ``true``, FSDP2 shards each stage chunk over the replicas; ``false``,
            each replica keeps its stages whole and the gradients are summed by one all-reduce.
        mesh_order: how the ``(dp, pp)`` mesh numbers the processes (:mod:`mpipe_hf.schedule.mesh_order`):
            ``pp_inner``, global rank ``d * pp_size + p``, a pipeline within a node; ``dp_inner``,
            ``p * dp_size + d``, the replicas of a stage within a node; ``auto`` (default), the faster of the two
            by the at-scale simulator (:func:`resolve_mesh_order`), ``pp_inner`` when every process is on one
            node. The same run either way, but for which traffic crosses the nodes.
        owners: who loads and preprocesses each micro-batch (SPEC.md, "Terms"): ``modulo`` (default), rank
            ``m % NT``; ``balanced`` (overflow ``full`` only), each step's micro-batches spread over the owners by
            their image tokens (LPT, :func:`~mpipe_hf.schedule.owners.balance_owners`; for a decoder-only LM by
            their length), so that no owner draws the heavy ones. Every rank computes the same owners from the
            image sizes the loader read from the file headers, with no collective.

    Raises:
        ValueError: as :class:`ScheduleConfig`, the field named ``parallel.<field>``; a ``text_layers`` that is
            not an integer >= 0, or above 0 with preprocess ``identity``; a ``layers_per_stage`` that is not
            ``pp_size * vpp`` integers >= 1; a ``profile`` that is not a file; a ``timeout_s`` that is not a number
            of seconds in ``(0, 1e9]`` (a numeric string included, as YAML reads ``1e3``).
    """

    text_layers: int = 0
    layers_per_stage: list[int] | None = None
    profile: str | None = None
    timeout_s: float = 300.0
    dp_size: int = 1
    dp_shard: bool = True
    ep_size: int = 1
    cp_size: int = 1
    mesh_order: str = "auto"
    owners: str = "modulo"

    def __post_init__(self):
        if not isinstance(self.dp_size, int) or isinstance(self.dp_size, bool) or self.dp_size < 1:
            raise ValueError(f"parallel.dp_size must be an integer >= 1, got {self.dp_size!r}")
        if not isinstance(self.cp_size, int) or isinstance(self.cp_size, bool) or self.cp_size < 1:
            raise ValueError(f"parallel.cp_size must be an integer >= 1, got {self.cp_size!r}")
        holders = self.dp_size * self.cp_size  # the ranks that hold the same stage: EP groups are cut from them
        if (not isinstance(self.ep_size, int) or isinstance(self.ep_size, bool) or self.ep_size < 1
                or holders % self.ep_size):
            of = (f"parallel.dp_size ({holders}" if self.cp_size == 1 else
                  f"parallel.dp_size x parallel.cp_size ({self.dp_size} x {self.cp_size} = {holders}")
            raise ValueError(f"parallel.ep_size must be an integer >= 1 that divides {of}: the ranks that hold the "
                             f"same stage), got {self.ep_size!r}")
        if not isinstance(self.dp_shard, bool):
            raise ValueError(f"parallel.dp_shard must be true (FSDP2) or false (replicas with one all-reduce), got "
                             f"{self.dp_shard!r}")
        if not isinstance(self.mesh_order, str) or self.mesh_order not in MESH_ORDERS:
            raise ValueError(f"parallel.mesh_order must be one of {MESH_ORDERS} (pp_inner: a pipeline within a "
                             f"node; dp_inner: a stage's replicas within a node; auto: the faster by the "
                             f"simulator), got {self.mesh_order!r}")
        try:
            super().__post_init__()
        except ValueError as err:  # ScheduleConfig's messages start with the bare field name
            raise ValueError(f"parallel.{err}") from None
        text_layers = self.text_layers
        if not isinstance(text_layers, int) or isinstance(text_layers, bool) or text_layers < 0:
            raise ValueError(f"parallel.text_layers must be an integer >= 0, got {text_layers!r}")
        if text_layers and not self.transposed:
            raise ValueError(f"parallel.text_layers = {text_layers} needs preprocess 'frozen' or 'trainable'; "
                             f"preprocess 'identity' is T = 0 (set text_layers: 0)")
        layout = self.layers_per_stage
        if layout is not None and (not isinstance(layout, (list, tuple)) or len(layout) != self.num_stages or any(
                not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in layout)):
            raise ValueError(f"parallel.layers_per_stage must be null or a list of {self.num_stages} integers >= 1 "
                             f"(pp_size * vpp decoder-layer counts), got {layout!r}")
        if self.profile is not None and (not isinstance(self.profile, str) or not os.path.isfile(self.profile)):
            raise ValueError(f"parallel.profile {self.profile!r} is not a file (mpipe-hf profile RECIPE.yaml "
                             f"writes one) or null")
        timeout = math.nan
        if isinstance(self.timeout_s, (int, float, str)) and not isinstance(self.timeout_s, bool):
            try:
                timeout = float(self.timeout_s)  # YAML reads 1e3 (no dot) as a string
            except (ValueError, OverflowError):
                pass
        # at most 1e9 s (31 years): a queue's wait and the doubled timedelta of the executor's groups overflow above
        if not 0 < timeout <= 1e9:  # NaN: False
            raise ValueError(f"parallel.timeout_s must be a number of seconds in (0, 1e9], got {self.timeout_s!r}")
        object.__setattr__(self, "timeout_s", timeout)

    def _check_owners(self) -> None:
        """Here ``owners`` is the policy; each step's owners are chosen by the trainer (:meth:`schedule` has
        none). Raises ``ValueError`` (``ScheduleConfig``'s validation prefixes ``parallel.``)."""
        if not isinstance(self.owners, str) or self.owners not in OWNER_POLICIES:
            raise ValueError(f"owners must be one of {OWNER_POLICIES}, got {self.owners!r}")
        if self.owners == "balanced" and self.overflow != "full":
            raise ValueError(f"owners 'balanced' needs overflow 'full' (mode 'min' fixes its owners), got overflow "
                             f"{self.overflow!r}")

    @property
    def reduction_engine(self) -> str | None:
        """How the gradients of the ranks that hold the same stages are summed
        (:data:`~mpipe_hf.runtime.data_parallel.ENGINES`): ``"shard"`` (FSDP2, ``dp_shard`` with ``dp_size`` above
        1), ``"replicate"`` (whole copies, one all-reduce: also a CP group's ranks at ``dp_size`` 1, the CP sums
        folded into the ``dp x cp`` reduction), ``None`` for one pipeline without context parallelism."""
        if self.dp_size == 1 and self.cp_size == 1:
            return None
        return "shard" if self.dp_shard and self.dp_size > 1 else "replicate"

    @property
    def assignment(self) -> None:
        """No fixed owners: :attr:`owners` names a policy, and the trainer gives each step its owners."""
        return None

    def schedule(self) -> ScheduleConfig:
        """The schedule part alone (``owners``: none; the policy lives on in :attr:`owners`)."""
        return ScheduleConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ScheduleConfig)
                                 if f.name != "owners"})


def resolve_mesh_order(parallel: ParallelSection, config, data, world: int, gpus_per_node: int,
                       bf16: bool = True):
    """``(order, choice)``: ``parallel.mesh_order``, with ``auto`` resolved to ``pp_inner`` or ``dp_inner`` by
    :func:`~mpipe_hf.schedule.mesh_order.choose_mesh_order` (``choice``, its ``OrderChoice``; ``None`` when
    nothing was simulated: an explicit order, one replica, or ``world`` processes on one node of
    ``gpus_per_node``). Every rank computes the same choice from the same inputs, with no collective.

    ``config``: the model's HF config (its sizes); ``data``: the recipe's ``data`` section. The costs are
    :func:`~mpipe_hf.schedule.hardware.figures_estimate`'s on the published H100 figures of
    :class:`~mpipe_hf.schedule.cluster.Cluster` with ``gpus_per_node`` GPUs per node, for micro-batches of
    ``data.micro_batch_size`` samples of ``data.max_length`` tokens, a vision-language model's with one
    448 x 448 image each where its tokens fit (a tower other than Qwen2.5-VL's is left out). Assumptions: the
    choice weighs links, which the real lengths scale alike in both orders. With ``parallel.profile``, that
    measured profile's compute and message bytes instead. The messages between stages are fp32 hidden states
    (the residual stream stays fp32 under bf16).

    Raises:
        ValueError: ``auto`` must simulate (several replicas over several nodes) and ``config`` is ``None``.
    """
    order = parallel.mesh_order
    if order != "auto":
        return order, None
    if parallel.dp_size == 1 or world <= gpus_per_node:
        return "pp_inner", None
    if config is None:
        raise ValueError("parallel.mesh_order 'auto' across nodes needs the model's config (its sizes)")
    from ..schedule.cluster import Cluster
    from ..schedule.hardware import figures_estimate
    from ..schedule.shapes import Workload, shapes_from_config
    from ..schedule.tune import Profile, profile_layers
    cfg = parallel.schedule()
    try:
        text, vision = shapes_from_config(config)
    except AttributeError:  # a tower the closed forms do not know (they count Qwen2.5-VL's): the decoder alone
        text, vision = shapes_from_config(config.get_text_config())[0], None
    cluster = Cluster(gpus_per_node=gpus_per_node)
    images = 1 if vision is not None and 448 * 448 // (vision.patch * vision.merge) ** 2 <= data.max_length else 0
    workload = Workload(tokens=data.max_length, images=images, micro_batch=data.micro_batch_size)
    estimate = figures_estimate(text, vision, workload, cluster, cfg.pp_size)
    hidden_bytes = 4.0 * workload.tokens * workload.micro_batch * text.hidden
    profile = dataclasses.replace(estimate.profile, activation_bytes=hidden_bytes)
    if parallel.profile is not None:
        profile = Profile.load(parallel.profile)
    estimate = dataclasses.replace(estimate, profile=profile)
    layout = parallel.layers_per_stage or profile_layers(profile, cfg, parallel.text_layers)
    from ..schedule.mesh_order import choose_mesh_order
    choice = choose_mesh_order(cfg, parallel.dp_size, estimate, cluster, list(layout), parallel.text_layers,
                               "shard" if parallel.dp_shard else "replicate", bf16)
    return choice.order, choice


def groups_within_node(parallel: ParallelSection, config, data, gpus_per_node: int = 8) -> tuple[bool, bool]:
    """``(EP groups within a node, CP groups within a node)`` of a node of ``gpus_per_node`` GPUs, under the mesh
    order training resolves (:func:`resolve_mesh_order`, resolved once for both). Both kinds of group hold the same
    stage: a CP group is ``cp_size`` of a stage's ranks, an EP group ``ep_size`` of its flattened ``dp x cp`` ranks
    (:func:`~mpipe_hf.runtime.mesh.expert_mesh`), consecutive in both orders' numbering. With ``dp_inner`` a group
    of ``size`` is ``size`` consecutive processes, with ``pp_inner`` it spans ``size * pp_size`` of them; the block
    must divide the node. A group of one lies within a node."""
    sizes = (parallel.ep_size, parallel.cp_size)
    if max(sizes) == 1:
        return True, True
    world = parallel.dp_size * parallel.cp_size * parallel.pp_size
    order, _ = resolve_mesh_order(parallel, config, data, world, gpus_per_node)
    span = 1 if order == "dp_inner" else parallel.pp_size
    return tuple(size == 1 or gpus_per_node % (size * span) == 0 for size in sizes)
