"""One pipelined run: the object both trainers drive (``mpipe-hf train``, :mod:`.trainer` through :mod:`.job`, and
:class:`~.hf.MPipeTrainer`).

As torchtitan's ``Trainer``, :class:`PipelineRun` owns the state a step needs and the loop calls it: the
``(dp, pp)`` mesh, this rank's share of the model (read from a checkpoint or drawn from a config as a recipe
asks, or carved from the user's model object, meta model or ``PeftModel``), the data parallel wrapping (FSDP2 or
replicas, :mod:`mpipe_hf.runtime.data_parallel`), the precision policy (bf16 autocast, :mod:`.precision`), the
layout and the placement costs, the load-aware owners and the executor. Its methods are the pieces of a step and
of a checkpoint:

- :meth:`PipelineRun.step`: one schedule over the step's micro-batches, the gradients clipped by the global norm
  over the pipeline and the step's loss and norm checked finite (the bad-sample policy, :mod:`.loop`). The
  optimizer and LR scheduler step is the caller's (the HF Trainer steps its own);
- :meth:`PipelineRun.evaluate`: the forward-only schedule over an eval set;
- :meth:`PipelineRun.save` / :meth:`PipelineRun.save_weights` / :meth:`PipelineRun.write_state` and
  :meth:`PipelineRun.load_weights` / :meth:`PipelineRun.load_state`: one checkpoint format for both trainers, the
  weights as ``from_pretrained`` (or PEFT) loads them and each rank's ``rank<r>_state.pt`` (:mod:`.state`), from
  :class:`~.run_checkpoints.RunCheckpoints`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from ..models import get_family
from ..models.freeze import Trainable, apply_trainable
from ..runtime import PipelineExecutor, StepStats, build_mesh, init_distributed
from ..runtime.data_parallel import DataParallel
from ..models.context_parallel_stages import split_sequences
from ..models.tower_division import divide_towers
from ..runtime.mesh import expert_mesh, expert_rank, reduction_mesh
from ..schedule.mesh_order import ORDERS, position
from ..schedule.owners import step_owners
from .collective import together
from .loop import Skips, evaluate_rows, finite_step, run_step
from .optimizer import clip_grad_norm
from .precision import autocast_modules
from .recipe import DataSection, ModelSource, ParallelSection
from .recipe_parallel import resolve_mesh_order
from .report import write_trace
from .run_checkpoints import RunCheckpoints
from .sources import load_share, model_share, profile_layout


@dataclass
class StepResult:
    """What :meth:`PipelineRun.step` did: ``stats`` (``None``: the step's data was bad and it was skipped before
    it ran), the global gradient norm before clipping, and whether the loss and the norm were finite (when not,
    the gradients are dropped and the step counts as skipped)."""

    stats: StepStats | None
    grad_norm: float | None = None
    finite: bool = False

    @property
    def ran(self) -> bool:
        """The step ran and is finite: the caller takes its optimizer step."""
        return self.stats is not None and self.finite


class PipelineRun(RunCheckpoints):
    """The state of one pipelined run on this process, built in three steps so that each trainer keeps its order:

    1. a share of the model: :meth:`connect` then :meth:`carve` (a recipe's checkpoint or config), or
       :meth:`adopt` (a model object, before the process group exists) then :meth:`connect`;
    2. :meth:`load_weights` (resuming: into the whole tensors, before FSDP2 shards them);
    3. :meth:`start`: data parallel, the trained parameters, the precision policy and the executor.

    Args:
        parallel: the recipe's ``parallel`` section (the schedule, the layout, ``dp_size``, ``timeout_s``).
        seed: the seed of a drawn model, of ``P``'s dropout and of anything random.
        data: the bad-sample policy (``on_bad_sample``, ``max_bad_rows``) of :meth:`step`.
    """

    def __init__(self, parallel: ParallelSection, seed: int = 0, data: DataSection | None = None):
        self.parallel, self.cfg, self.seed = parallel, parallel.schedule(), seed
        self.data = data if data is not None else DataSection(path="<the trainer's dataset>")
        # before the process group (adopt): dp_size 1, where every order agrees; connect() reads the mesh
        order = parallel.mesh_order if parallel.mesh_order in ORDERS else "pp_inner"
        pp, cp = self.cfg.pp_size, parallel.cp_size
        world = pp * parallel.dp_size * cp  # a launch of another size fails in connect(), not here
        mine = int(os.environ.get("RANK", 0)) % world  # its rank in the (dp, pp) numbering: the cp index left out
        mine = mine // cp if order == "dp_inner" else mine // (pp * cp) * pp + mine % pp
        self.dp_rank, self.rank = position(order, mine, pp, parallel.dp_size)
        self.cp_rank = 0  # context parallelism: this rank's place in its CP group (connect())
        self.mesh_order = None
        self.device = self.mesh = self.group = self.every = None
        self.carved = self.source = self.counts = None
        self.data_parallel = self.executor = None
        self.experts = None  # expert parallelism (ep_size > 1): this rank's shards and their EP group
        self.params, self.counted, self.skips = {}, [], Skips()
        self._owner_costs = None  # (plan, row costs, headroom) of load-aware owners

    # ---- the share of the model ---------------------------------------------------------------------------

    def connect(self, config=None, bf16: bool = True) -> torch.device:
        """Join the process group, build the ``(dp, pp)`` mesh in ``parallel.mesh_order`` (``auto``: chosen by
        the simulator from the model's HF ``config`` and ``bf16``, :func:`~.recipe_parallel.resolve_mesh_order`;
        global rank 0 prints the choice) and return this process's device.

        Raises:
            ValueError: a world size other than ``pp_size * dp_size``; ``auto`` across nodes without ``config``.
        """
        self.device = init_distributed(timedelta(seconds=self.parallel.timeout_s))
        world = dist.get_world_size()
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # torchrun's and accelerate's processes per node
        self.mesh_order, choice = resolve_mesh_order(self.parallel, config, self.data, world, per_node, bf16)
        self.mesh = build_mesh(self.cfg.pp_size, self.parallel.dp_size, self.mesh_order, self.parallel.cp_size)
        self.cp_rank = self.mesh.get_local_rank("cp") if self.parallel.cp_size > 1 else 0
        # each replica's global ranks, by stage rank (a 2-D mesh: no cp dimension)
        if self.parallel.dp_size > 1 and self.parallel.cp_size == 1 and dist.get_rank() == 0:
            layout = self.mesh.mesh if self.mesh.mesh_dim_names[0] == "dp" else self.mesh.mesh.t()
            print(f"mpipe_hf: mesh_order {self.mesh_order}"
                  + (f" (auto: {choice.describe()})" if choice is not None else "")
                  + f"; the pipelines' global ranks {layout.tolist()}", flush=True)
        self.group = self.mesh.get_group("pp")
        self.rank, self.dp_rank = self.mesh.get_local_rank("pp"), self.mesh.get_local_rank("dp")
        self.every = (dist.get_rank(), dist.get_world_size(), None)  # setup errors reach every rank of every replica
        return self.device

    @property
    def lead(self) -> bool:
        """Global rank 0: the process that prints, logs and reports."""
        return self.every is None or self.every[0] == 0

    def carve(self, source: ModelSource, config, counts: list[int], adapter=None) -> None:
        """This rank's share of ``source`` (read tensor by tensor, or drawn from ``seed`` as the unsplit model
        would be; with ``adapter``, a ``peft.LoraConfig``, with that adapter), on :meth:`connect`'s device in
        train mode. ``counts``: the decoder layers per stage. With ``parallel.ep_size > 1`` a checkpoint's fused
        experts are read for this rank's EP rank alone: ``dp`` rank ``d`` (CP rank ``c``) is EP rank
        ``(d * cp_size + c) % ep_size``, as :func:`~mpipe_hf.runtime.mesh.expert_mesh` numbers it (no collective;
        :meth:`shard_experts` checks it).
        A failure on any rank is raised on every rank."""
        ep = self.parallel.ep_size
        experts = (expert_rank(self.dp_rank, self.cp_rank, self.parallel.cp_size, ep), ep) if ep > 1 else None
        self.carved, _ = together(lambda: load_share(source, config, self.cfg, self.rank, counts,
                                                     self.parallel.text_layers, self.seed, adapter, experts),
                                  "model load", *self.every)
        self.source, self.counts = source.name_or_path, counts
        self.carved.model.to(self.device).train()  # from_pretrained leaves eval mode; the HF Trainer trains

    def adopt(self, model) -> None:
        """This rank's share of a user's ``model`` (a checkpoint path, a meta model, a loaded model or a
        ``PeftModel`` of either: :func:`~.sources.model_share`), laid out by ``layers_per_stage``, else the
        ``profile``, else the config's costs, with the parameters the user froze frozen. Needs no process group;
        :meth:`connect` moves it to the device."""
        user_frozen = tuple(n for n, p in model.named_parameters() if not p.requires_grad) \
            if isinstance(model, torch.nn.Module) and not hasattr(model, "peft_config") else ()
        self.carved, self.source, self.counts = model_share(model, self.cfg, self.rank,
                                                            profile_layout(self.parallel, self.cfg),
                                                            self.parallel.text_layers, self.seed)
        self.freeze(Trainable(freeze=user_frozen))  # a meta model is built anew: keep what its user froze

    def freeze(self, spec) -> None:
        """Freeze this rank's share as ``spec`` (a :class:`~mpipe_hf.models.freeze.Trainable`) says, on top of
        what the split, the adapter and the user's model froze; checked on the whole model before launch
        (:func:`~mpipe_hf.models.freeze.check_trainable`)."""
        if spec.freezes():
            family = get_family(self.carved.model.config.model_type)
            apply_trainable(self.carved.model, family, spec, self.carved.frozen, self.carved.tied, strict=False)

    # ---- the executor -------------------------------------------------------------------------------------

    def start(self, *, bf16: bool = False, trace: bool = False, swap=None, loss_normalization: str = "tokens"
              ) -> PipelineExecutor:
        """Wrap the stages for data parallelism (``dp_size > 1``), collect the parameters this rank trains (and
        those its gradient norm counts: the head copy of a tied pair not), put the stages and ``P`` under bf16
        autocast (``bf16``) and build the executor (``trace``: record every action; ``swap``: a
        :class:`~mpipe_hf.schedule.swap.SwapConfig`; ``loss_normalization``: ``"tokens"`` or ``"micro"``, as
        :class:`~mpipe_hf.runtime.PipelineExecutor`).

        Raises:
            ValueError: as :class:`~mpipe_hf.runtime.PipelineExecutor` (a bad ``loss_normalization``,
                ``zero_bubble`` with FSDP2).
        """
        par, carved = self.parallel, self.carved
        if par.reduction_engine is not None:  # FSDP2 per stage chunk, before the optimizer sees DTensors
            self.data_parallel = DataParallel(reduction_mesh(self.mesh), par.reduction_engine, bf16=bf16,
                                              experts=self.shard_experts(), cp_size=par.cp_size)
            self.data_parallel.wrap(carved.stages, carved.preprocess.trainable_parameters())  # P's: not wrapped
        if par.cp_size > 1:  # each CP rank's stages cut every micro's sequence (Ulysses attention)
            split_sequences(carved.stages.values(), self.mesh.get_group("cp"))
            self.tower = divide_towers(carved.preprocess, self.mesh.get_group("cp"))  # by images and frames
        self.params = carved.trainable_parameters(self.cfg, self.rank)  # none where a frozen P is all it holds
        tied = carved.tied_parameters(self.cfg, self.rank)
        heads = {id(p) for p, peer in tied if peer == 0}  # the head copy of a tied pair
        self.counted = [p for p in self.params.values() if id(p) not in heads]
        stages, preprocess = (autocast_modules(carved.stages, carved.preprocess, self.device) if bf16
                              else (carved.stages, carved.preprocess))
        self.executor = PipelineExecutor(self.cfg, self.rank, stages, preprocess, self.group, self.device,
                                         self.params.values(), timedelta(seconds=par.timeout_s), tied, trace=trace,
                                         costs=self.placement_costs(), seed=self.seed, measure_memory=True,
                                         loss_normalization=loss_normalization, data_parallel=self.data_parallel,
                                         swap=swap)
        return self.executor

    def shard_experts(self):
        """With ``parallel.ep_size > 1``: keep this rank's experts of its stages' MoE layers, dispatched by
        all-to-all over its EP group (:func:`~mpipe_hf.models.expert_parallel.shard_experts` on
        :func:`~mpipe_hf.runtime.mesh.expert_mesh`), and return ``(shards, edp mesh, EP group)`` for
        :class:`~mpipe_hf.runtime.data_parallel.DataParallel`; ``None`` without EP. Every rank calls it."""
        if self.parallel.ep_size == 1:
            return None
        from ..models.expert_parallel import shard_experts
        emesh = expert_mesh(self.mesh, self.parallel.ep_size)
        self.experts = shard_experts(self.carved, self.carved.model.config, self.rank, self.cfg.pp_size,
                                     emesh["ep"], emesh["batch"])
        return self.experts.params, emesh["edp"], self.experts.group

    def placement_costs(self):
        """The simulator costs of ``parallel.profile`` for this layout (placement ``fill`` places by them), or
        ``None``."""
        if self.parallel.profile is None:
            return None
        from ..schedule.tune import Profile, costs_for
        return costs_for(Profile.load(self.parallel.profile), self.cfg, self.counts, self.parallel.text_layers)

    def use_owners(self, plan, row_costs: list[int], micro_batch_size: int) -> None:
        """Load-aware owners (``parallel.owners: balanced``): each step's owners from its rows' costs
        (``row_costs``, one per dataset row, :func:`~.sources.owner_costs`) through ``plan``'s micro-batches, with
        placement ``fill`` and a ``profile`` starting from each owner's idle end of a steady step."""
        self._owner_costs = (plan, row_costs, self._owner_headroom(row_costs, micro_batch_size))

    def _owner_headroom(self, row_costs: list[int], micro_batch_size: int) -> list[float] | None:
        """Placement ``fill`` with a ``profile``: each owner's idle end of a steady step
        (:func:`~mpipe_hf.schedule.owners.fill_headroom` under the profile's costs), in the unit of ``row_costs``
        (the profile's preprocess seconds per micro-batch over the mean cost of a micro-batch of the data);
        ``None`` otherwise (balanced owners then start even)."""
        if self.cfg.placement != "fill" or self.parallel.profile is None or not sum(row_costs):
            return None
        from ..schedule.owners import fill_headroom
        costs = self.placement_costs()
        per_micro = sum(row_costs) / len(row_costs) * micro_batch_size
        if costs.preprocess_forward <= 0:
            return None
        return [h * per_micro / costs.preprocess_forward for h in fill_headroom(self.cfg, costs)]

    def owners_of(self, step: int):
        """Step ``step``'s owner of each micro-batch, the same on every rank (no collective); ``None``: ``m %
        NT``."""
        if self._owner_costs is None:
            return None
        plan, row_costs, room = self._owner_costs
        return step_owners("balanced", plan.micro_costs(step, row_costs), self.cfg, room)

    # ---- a step -------------------------------------------------------------------------------------------

    def step(self, step: int, load: Callable[[int], dict], max_grad_norm: float,
             ahead: Callable[[int], dict] | None = None, num_micro: int | None = None,
             bad_rows: Callable[[], Sequence[str]] | None = None, plan=None) -> StepResult:
        """Step ``step`` (0-based) over its micro-batches (``load(m)``; ``ahead``: the next step's, which
        placement ``fill`` loads early; ``num_micro``: a step shorter than ``M``), then the gradients clipped to
        ``max_grad_norm`` by their global norm over the pipeline (0: not clipped) and the loss and the norm
        checked finite (:func:`~.loop.run_step`, :func:`~.optimizer.clip_grad_norm`,
        :func:`~.loop.finite_step`). ``bad_rows``: the rows the loads dropped since it was last called (the
        plan's :meth:`~mpipe_hf.data.owner.MicroBatchPlan.take_dropped`); they count towards
        ``data.max_bad_rows`` (:attr:`skips`); ``plan``: the plan ``load`` reads, which then leaves out every row
        any rank dropped before, each counted once (:func:`~.loop.run_step`). The optimizer and LR scheduler step
        is the caller's, when the result :attr:`~StepResult.ran`.

        Raises:
            ValueError: a bad sample with ``on_bad_sample: raise``, more than ``max_bad_rows`` rows dropped in
                all, or the ``max_bad_rows``-th skipped step in a row.
            TimeoutError, RuntimeError: any other failure of the step (the same text on every rank).
        """
        owners = self.owners_of(step)
        next_owners = self.owners_of(step + 1) if ahead is not None else None
        stats = run_step(self.executor, load, self.data, self.skips, step, ahead, num_micro, owners, next_owners,
                         bad_rows, plan)
        if stats is None:
            return StepResult(None)
        norm = clip_grad_norm(list(self.params.values()), self.counted, max_grad_norm, self.group, self.device,
                              self.data_parallel)
        return StepResult(stats, norm, finite_step(stats, norm, self.params.values(), self.skips, self.data))

    def evaluate(self, load_rows: Callable[[list[int]], dict], micros: list[list[int]]) -> tuple[float, int]:
        """``(eval loss, label tokens)`` of the forward-only schedule over the micro-batches ``micros`` (row
        indices, every row once: :meth:`~mpipe_hf.data.owner.MicroBatchPlan.eval_micros`) once
        (:func:`~.loop.evaluate_rows`): the token losses summed over the set over its label tokens, the set
        divided among the data-parallel replicas. Every rank calls it."""
        return evaluate_rows(self.executor, load_rows, micros, self.data_parallel, self.dp_rank)

    def gathered_rows(self, mine: Sequence[str]) -> list[str]:
        """Every rank's ``mine`` (e.g. the rows its loads dropped, each owner knowing only its own), gathered over
        every rank of every replica (an evaluation is divided among the replicas, :func:`~.loop.eval_share`), in
        rank order, each row once (the micro-batches every replica runs drop theirs on each). Every rank calls
        it."""
        group = self.executor.control
        every = [None] * dist.get_world_size(group)
        dist.all_gather_object(every, list(mine), group=group)
        return list(dict.fromkeys(row for rows in every for row in rows))

    def write_trace(self, path: str) -> None:
        """Every rank's action events (``trace``) as one Chrome trace at ``path``, by replica 0's rank 0 (every
        rank calls this)."""
        if self.dp_rank == 0 and self.cp_rank == 0:
            write_trace(path, self.executor.events, self.rank, self.cfg.pp_size, self.group)

    def close(self) -> None:
        """End the executor's helper threads and destroy the process groups while Python is still whole (a gloo
        group torn down during interpreter finalisation can abort a finished run: "terminate called without an
        active exception")."""
        from ..runtime.liveness import stop_beating
        from ..runtime.watchdog import release_watched
        stop_beating()  # a clean end: no peer takes this rank for lost
        if self.executor is not None:
            self.executor.watchdog.close()
        release_watched()
        if dist.is_initialized():
            dist.destroy_process_group()
