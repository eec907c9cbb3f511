"""Run one rank's MPipe Transpose schedule for one step (SPEC.md, "Runtime rules").

The executor runs the rank's action list through the handler table, drains its sends, sums loss and label-token
counts over the pipeline group, and divides the step's gradients by the step's label-token count: the loss is
normalised over the whole step (the sum-then-divide of Megatron-LM's per-token loss), not per micro-batch.

Weights tied across ranks (an input embedding on rank 0 tied to the ``lm_head`` of the last rank) are held as
two copies; after the schedule the two ranks swap their gradients and each adds the other's, so both copies get
the unsplit model's gradient, bit for bit the same on both ranks.

With placement ``fill`` and a ``next_load``, the owners also load and preprocess (frozen ``P``) the next step's
micro-batches in this step's idle time; rank 0 keeps their data and features, and the next step starts with them.

Each step starts from a fresh gradient: gradients already in ``.grad`` (accumulated by earlier steps) are set
aside and added back at the end, so a step's normalisation and ``GRAD_REDUCE`` touch only that step's share.

Every owner loads (decodes, validates) its micro-batches before the step's first transfer, and one vote says
whether any rank failed (:mod:`.preload`): a micro-batch that fails to load skips the step on every rank with its
text, no transfer posted (a loader that drops its bad rows instead reports them, and the vote sums them into
:attr:`StepStats.bad_rows`). When a rank raises later, every rank raises the first error's text (see
:mod:`.watchdog`), puts the set-aside gradients back and drops the step's cached micro-batches and activations; on
gloo it moves its transfers to fresh process groups, so no stale message of the failed step can reach the next
one, and on NCCL the run ends, to restart from its last checkpoint (:mod:`.groups`).

The forward-only run of :meth:`PipelineExecutor.evaluate` is :mod:`.evaluate`; a step's figures :mod:`.step_stats`;
the pass over the action list :mod:`.order_run`; the step's totals (loss, tokens, times, peaks)
:mod:`.step_totals`, and the gradients it sets aside and normalises :mod:`.step_gradients`.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial
from datetime import timedelta
from typing import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from ..schedule import ScheduleConfig, build_schedule
from ..schedule.forward import build_forward_schedule
from ..schedule.owners import reassign, relabel, with_owners
from ..schedule.simulate import Costs, Event, split_pairs
from ..schedule.swap import SwapConfig, with_swaps
from .casts import check_no_outer_region, frozen_weight_casts, step_casts, step_region
from .data_parallel import is_sharded, local
from .evaluate import evaluate
from .handlers import preprocess_seed
from .memory import storage_ids
from .placement import host_prepare, to_device
from .groups import abandon, close, fresh_groups, in_process_recovery
from .order_run import OrderRun
from .preload import control_group, load_owned, vote
from .step_context import Preprocess, StepContext, Tensors
from .step_gradients import StepGradients
from .step_stats import StepStats
from .step_totals import SUMS, StepClock, StepTotals, rank_totals
from .swap import SwapManager
from .watchdog import PeerFailed

__all__ = ["PipelineExecutor", "StepStats"]


_REPLICATED = 0  # executors built with data parallelism so far (names their shared error key)


class PipelineExecutor:
    """One rank's side of the pipeline.

    Args:
        cfg: the schedule configuration (same on every rank).
        rank: this process's rank in the pipeline group.
        stages: ``{stage index: module}`` for this rank's stages; a module maps a dict of tensors to a dict of
            tensors, and the last stage returns ``{"loss": summed token loss, "num_tokens": label tokens}``.
        preprocess: the transposed block ``P`` (every rank holds a replica).
        group: the pipeline process group (``mesh.get_group("pp")``); the executor talks on its own copy.
        device: where received tensors go.
        params: the parameters this rank optimises; their step gradients are divided by the step's token count.
        timeout: the longest any wait may take.
        tied: ``[(parameter, peer rank)]``: copies of one weight held on two ranks (``SplitModel.tied_parameters``);
            their gradients are summed over the pair after every step. Each must be in ``params``.
        trace: record the wall-clock start and end (``time.time()``, seconds) of every action of every step in
            :attr:`events` (see :func:`mpipe_hf.schedule.trace.chrome_trace`).
        costs: the costs placement ``fill`` places the transposed forwards by (unit costs when ``None``).
        seed: ``P`` runs micro ``m`` of step :attr:`step_index` under ``preprocess_seed(seed, step_index, m)``
            on every rank, so a ``P`` with dropout is recomputed with the forward's masks. ``step_index`` counts
            the successful steps; a trainer that skips or resumes steps sets it.
        loss_normalization: ``"tokens"`` (default): the step's loss is its summed token loss divided by its label
            tokens (Megatron-LM's per-token loss; the HF Trainer's with ``num_items_in_batch``); ``"micro"``: the
            mean over the micro-batches of each one's token mean (the HF Trainer's for a model that does not take
            ``num_items_in_batch``, such as Qwen2.5-VL's ``accepts_loss_kwargs = False``).
        measure_memory: count the bytes each stage forward saves for its backward (``saved_tensors_hooks``, a
            Python call per saved tensor) and report each rank's peak in :class:`StepStats`.
        data_parallel: this rank's :class:`~.data_parallel.DataParallel` when the pipeline has replicas
            (``dp_size > 1``): the step's loss and label tokens are summed over them, each chunk's gradients are
            reduced once per step, and the division is by the whole global batch's tokens.
        swap: activation swap (:class:`~mpipe_hf.schedule.swap.SwapConfig`): where it is on for this rank, the
            schedule gets its swap actions and a :class:`~.swap.SwapManager` moves the saved tensors; with
            ``measure_memory`` the peak counts the bytes on the device only.
        strict: strict device mode: every tensor handed to a transfer or a collective is checked to be on
            ``device`` (a ``RuntimeError`` names the first that is not; the CPU tests that emulate a device,
            ``tests/device_model.py``, run every step with it).

    Raises:
        ValueError: a tied parameter that is not in ``params``; ``cfg.zero_bubble`` with FSDP2 (an engine
            ``shard`` data parallel over more than one replica).
    """

    def __init__(self, cfg: ScheduleConfig, rank: int, stages: dict[int, nn.Module], preprocess: Preprocess,
                 group: dist.ProcessGroup, device: torch.device, params: Iterable[nn.Parameter],
                 timeout: timedelta = timedelta(seconds=120), tied: Iterable[tuple[nn.Parameter, int]] = (),
                 trace: bool = False, costs: Costs | None = None, seed: int = 0, measure_memory: bool = False,
                 loss_normalization: str = "tokens", data_parallel=None, swap: SwapConfig | None = None,
                 strict: bool = False):
        if loss_normalization not in ("tokens", "micro"):
            raise ValueError(f"loss_normalization must be 'tokens' or 'micro', got {loss_normalization!r}")
        sharded = data_parallel is not None and data_parallel.engine == "shard" and data_parallel.size > 1
        if cfg.zero_bubble and sharded:
            raise ValueError("zero_bubble with FSDP2 (parallel.dp_shard, dp_size > 1) is not supported: FSDP2 "
                             "reduces a chunk's gradients when its inputs' gradient is ready, before W computes "
                             "them; set parallel.dp_shard: false (replicas) or zero_bubble: false")
        self.cfg, self.rank, self.stages, self.preprocess = cfg, rank, stages, preprocess
        self.per_micro, self.dp = loss_normalization == "micro", data_parallel
        global _REPLICATED
        if data_parallel is not None:  # every replica builds its executors in the same order: one error key
            _REPLICATED += 1
        self._shared = f"replicas{_REPLICATED}" if data_parallel is not None else None
        self.measure_memory, self.strict = measure_memory, strict
        self._weights = storage_ids([p for m in stages.values() for p in m.parameters()]
                                    + ([] if preprocess.module is None else list(preprocess.module.parameters())))
        self.seed, self.step_index, self.device, self.timeout = seed, 0, device, timeout
        self.events: list[Event] | None = [] if trace else None
        self.params, self.tied = list(params), list(tied)
        if any(all(p is not q for q in self.params) for p, _ in self.tied):
            raise ValueError("every tied parameter must be one of params (the parameters this rank optimises)")
        # the stages' autocast dtype (a wrapper's ``autocast_dtype``) for the step region; not under FSDP2 (.casts):
        # stages FSDP2 wraps open a region per call, whatever the replicas' count (a one-rank mesh wraps too)
        fsdp = sharded or any(isinstance(m, FSDPModule) for stage in stages.values() for m in stage.modules())
        self.autocast = None if fsdp else next(
            (m.autocast_dtype for m in stages.values() if getattr(m, "autocast_dtype", None)), None)
        self.swap_config, self.swap = swap, None
        if swap is not None:
            swap.check(cfg.pp_size)
        if swap is not None and swap.swaps(rank):  # the modules' buffers stay too (copying them frees nothing)
            held = [t for m in [*stages.values(), preprocess.module] if m is not None for t in m.buffers()]
            self.swap = SwapManager(device, self._weights | storage_ids(held), swap.min_bytes)
        self.costs, self._orders = costs, {}
        self.order = self._order(own=True, ahead=False)
        self._carried: dict | None = None  # the next step's micros, loaded ahead (rank 0: their data, features)
        self.dropped: tuple[int, str | None] = (0, None)  # the last step's rows dropped at load, on every rank
        self.global_ranks = dist.get_process_group_ranks(group)
        self.store = dist.distributed_c10d._get_default_store()
        self._stale: list = []  # a failed step's transfers, alive until its groups are broken (gloo)
        self.recover = in_process_recovery(group)  # a step failed mid-transfer: recovered (gloo) or the end (NCCL)
        self.ended: str | None = None  # why the executor refuses steps (a failed step without recovery)
        everyone = self.global_ranks if data_parallel is None else list(range(dist.get_world_size()))
        self.control = control_group(everyone, timeout)  # the step's vote (:mod:`.preload`), over every replica
        self._fresh_group()

    def _expert_shard(self, weight: torch.Tensor) -> bool:
        """Whether ``weight`` is an expert shard that FSDP2 leaves alone (the one kind cached for a step under it)."""
        return self.dp is not None and id(weight) in self.dp.experts

    def _fresh_group(self) -> None:  # :func:`.groups.fresh_groups`
        fresh_groups(self)

    def close(self) -> None:
        """End this executor's helper threads and hand its process groups to the next executor built over the
        same ranks and timeout (every pipeline rank calls it at the same point; the executor is not used
        afterwards; :func:`.groups.close`)."""
        close(self)

    def _abandon(self, err: BaseException, action) -> BaseException:
        return abandon(self, err, action)

    def _begin(self, order: list, load: Callable[[int], Tensors],
               bad_rows: Callable[[], Sequence[str]] | None = None) -> dict[int, Tensors]:
        """Start a step or an evaluation over this rank's ``order``: fresh groups after a failed step (gloo),
        then every micro it loads, loaded before the first transfer, and the vote (:mod:`.preload`), which also
        sums the rows the loads dropped (``bad_rows()``, read after the loads) over every rank into
        :attr:`dropped` (``(count, one of their texts)``).

        Raises:
            RuntimeError: the executor ended (a failed step on NCCL, :mod:`.groups`).
            ValueError, TimeoutError, RuntimeError: a load failed on some rank (its text, on every rank).
        """
        if self.ended is not None:
            raise RuntimeError(f"this pipeline executor ended after a failed step: {self.ended}")
        if self.broken:
            self._fresh_group()
        if self.dp is not None:  # an EP group a failed step broke, made anew (an evaluation runs no start_step)
            self.dp.renew_ep_group()
        self.watchdog.start_step()
        prepare = partial(host_prepare, self.preprocess, pin=self.device.type == "cuda")
        loaded, error = load_owned(order, load, self.rank, prepare)
        self.dropped = vote(self.control, self.watchdog, error, bad_rows() if bad_rows is not None else (), order,
                            self.rank, self.cfg.pp_size)  # and the replicas agree on their schedules
        return loaded

    def evaluate(self, load: Callable[[int], Tensors], num_micro: int | None = None) -> tuple[float, int]:
        """A forward-only run over ``num_micro`` micro-batches (default ``cfg.num_micro``), without autograd:
        ``(summed token loss, label tokens)``, the same on every rank (:func:`.evaluate.evaluate` has the details
        and the errors)."""
        return evaluate(self, load, num_micro)

    def _sum_tied(self) -> None:
        """Swap the tied copies' gradients with their peers and add them (``g_here + g_peer`` on both sides:
        addition commutes, so both copies hold the same bits)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p, _ in self.tied]
        for (p, peer), grad in zip(self.tied, grads):  # FSDP: both copies are sharded alike over dp
            self.p2p.send({"grad": local(grad)}, peer, f"TIED_GRAD to {peer}", "TIED_GRAD")
        for (p, peer), grad in zip(self.tied, grads):
            peer_grad = self.p2p.recv(peer, f"TIED_GRAD from {peer}")["grad"]
            p.grad = grad + (DTensor.from_local(peer_grad, grad.device_mesh, grad.placements, shape=grad.shape,
                                                stride=grad.stride()) if is_sharded(grad) else peer_grad)
        self.p2p.drain()

    def _order(self, own: bool = True, ahead: bool = False, cfg: ScheduleConfig | None = None,
               forward: bool = False) -> list:
        """This rank's action list of a schedule variant, built once: of ``cfg`` (default the executor's own; a
        short step's otherwise) with ``own``/``ahead`` as ``build_schedule`` takes them, or (``forward``) its
        forward-only schedule. A step's own owners (``cfg.owners``) mostly relabel a schedule built before
        (:func:`~mpipe_hf.schedule.owners.reassign`); the newest 32 variants are kept."""
        cfg = self.cfg if cfg is None else cfg
        key = (cfg, own, ahead, forward)
        if key not in self._orders:
            fast = None if forward else reassign(cfg, own, ahead)
            if fast is not None:
                order = relabel(self._order(own, ahead, fast[0]), fast[1])
            else:
                order = (build_forward_schedule(cfg)[self.rank] if forward else with_swaps(
                    build_schedule(cfg, self.costs, own, ahead)[self.rank], self.swap_config, self.rank))
            while len(self._orders) >= 32:  # per-step owners make many variants: drop the oldest
                self._orders.pop(next(iter(self._orders)))
            self._orders[key] = order
        return self._orders[key]

    def step(self, load: Callable[[int], Tensors], next_load: Callable[[int], Tensors] | None = None,
             num_micro: int | None = None, owners: Sequence[int] | None = None,
             next_owners: Sequence[int] | None = None, bad_rows: Callable[[], Sequence[str]] | None = None
             ) -> StepStats:
        """Run the schedule once over the step's ``M`` micro-batches; gradients add to ``.grad``.

        Args:
            load: ``load(m)`` returns micro ``m``'s raw inputs as a dict of tensors; called only on its owner,
                at its ``DATA_LOAD``.
            next_load: placement ``fill`` only: the next step's ``load``. The owners then load and preprocess the
                next step's micros in this step's idle time, and the next step starts with them (it does not call
                its own ``load`` for them). Pass it on every rank, or on none. Ignored with placement ``prefix``.
            num_micro: fewer micro-batches than ``cfg.num_micro`` for this step (the last step of an epoch that
                does not fill one), run with placement ``prefix`` and no look-ahead.
            owners: this step's owner of each of its micro-batches (load-aware owners,
                :func:`~mpipe_hf.schedule.owners.balance_owners`; overflow ``full`` only), instead of ``m % NT``;
                ``None``: the config's. ``next_owners``: with ``next_load``, the owners of the next step's
                micro-batches that this step loads ahead (``None``: ``m % NT``); pass the same ones to the next
                step as its ``owners``. Every rank must pass the same owners (computed from data every rank
                sees, such as each micro's image tokens); a mismatch hangs until the timeout.
            bad_rows: the rows this rank's loads dropped since it was last called (each ``"WHERE (WHY)"``;
                :meth:`~mpipe_hf.data.owner.MicroBatchPlan.take_dropped`), read after the step's loads (look-ahead
                loads count in this step); their sum over every rank is :attr:`StepStats.bad_rows`.

        Raises:
            ValueError: a sample or the model rejected the inputs on some rank (the same text on every rank),
                or the step has no label token (its ``bad_rows``: the rows its loads dropped).
            TimeoutError: a transfer did not arrive in time (on some rank).
            RuntimeError: any other failure on some rank, with its text.
        """
        check_no_outer_region(self.device.type)
        start = time.perf_counter()
        grads = StepGradients(self.params, self.preprocess.trainable_parameters())
        carried, self._carried = self._carried, None
        cfg, ahead = self._step_schedule(num_micro, next_load, owners, next_owners, grads, carried)
        ctx = self._step_context(cfg, load, next_load, bad_rows, grads, carried)
        clock = StepClock(self.device, start, ctx)
        if self.dp is not None:
            self.dp.start_step()
        run = OrderRun(self, ctx)
        totals, ahead_loaded = self._run(run, clock, grads)
        if totals.num_tokens == 0:
            grads.put_back()
            raise self._no_label_tokens()
        if ahead:
            self._carried = ahead_loaded
        self.step_index += 1
        replicas = self.dp.size if self.dp is not None else 1  # FSDP2's average: over dp x cp
        batches = self.dp.batches if self.dp is not None else 1  # the CP ranks of a replica share its micros
        divisor = cfg.num_micro * batches if self.per_micro else totals.num_tokens
        grads.finish(divisor, replicas, self.dp)
        return totals.stats(self.per_micro, divisor, time.perf_counter() - start, run.peak, self.measure_memory,
                            clock.cuda, self.dropped)

    def _step_schedule(self, num_micro: int | None, next_load, owners: Sequence[int] | None,
                       next_owners: Sequence[int] | None, grads: StepGradients,
                       carried: dict | None) -> tuple[ScheduleConfig, bool]:
        """The step's schedule config and whether it loads the next step's micros ahead; sets :attr:`order`.

        Raises:
            ValueError: a short step (``num_micro``) out of range, or with a look-ahead; bad owners (these with the
                step's gradients and carried micros put back: nothing ran).
        """
        cfg = self.cfg
        if num_micro is not None and num_micro != cfg.num_micro:  # a short step: its own schedule, no look-ahead
            if not 1 <= num_micro <= cfg.num_micro or next_load is not None or carried is not None:
                raise ValueError(f"a step of num_micro = {num_micro} needs 1 <= num_micro <= {cfg.num_micro}, no "
                                 f"next_load and no micro-batches carried from the step before")
            cfg = dataclasses.replace(cfg, num_micro=num_micro, placement="prefix")
        ahead = next_load is not None and cfg.placement == "fill"
        try:  # the step's owners; bad ones fail here, before anything ran, with the step's state put back
            cfg = with_owners(cfg, owners, next_owners if ahead else None)
        except ValueError:
            grads.put_back()
            self._carried = carried
            raise
        self.order = self._order(own=carried is None, ahead=ahead, cfg=cfg)
        return cfg, ahead

    def _step_context(self, cfg: ScheduleConfig, load: Callable[[int], Tensors], next_load, bad_rows,
               grads: StepGradients, carried: dict | None) -> StepContext:
        """Load every micro this rank loads (a look-ahead micro ``m >= M`` through ``next_load``) before the
        step's first transfer, and hold them, and those ``carried`` from the step before, in the step's context.

        Raises:
            as :meth:`_begin`, with the step's gradients and carried micros put back (nothing ran).
        """
        num_micro, index = cfg.num_micro, self.step_index

        def loader(m: int) -> Tensors:
            return load(m) if m < num_micro else next_load(m - num_micro)

        def micro_seed(m: int) -> int:  # a look-ahead micro (m >= M) belongs to the next step
            return preprocess_seed(self.seed, index + m // num_micro, m % num_micro)
        try:  # every micro this rank loads, before the step's first transfer: a bad one skips it on every rank
            loaded = self._begin(self.order, loader, bad_rows)
        except BaseException:
            grads.put_back()
            self._carried = carried  # nothing ran: a retry without look-ahead starts from them too
            raise
        ctx = StepContext(cfg, self.rank, self.stages, self.preprocess, self.p2p, self.group, self.watchdog,
                          loaded.pop, micro_seed, per_micro=self.per_micro, swap=self.swap,
                          split=frozenset(split_pairs(self.order)), strict=self.strict, votes=self.votes)
        if self.swap is not None:
            self.swap.reset()
        for m, (data, feats) in (carried or {}).items():
            ctx.data[m], ctx.feats[m] = data, feats
        return ctx

    def _run(self, run: OrderRun, clock: StepClock, grads: StepGradients) -> tuple[StepTotals, dict]:
        """Run the step's action list, sum its totals over the pipeline (and its loss figures over the replicas)
        and the tied weights' gradients over their pairs: the summed totals, and the next step's micros this one
        loaded ahead. A failure puts the step's gradients back and is abandoned (:mod:`.groups`)."""
        ctx, num_micro, world = run.ctx, run.ctx.cfg.num_micro, len(self.global_ranks)
        try:
            # one bf16 copy of each weight per step, shared by the micros (:mod:`.casts`). No region at all
            # otherwise (fp32, FSDP2): a disabled one still nests the stages' regions, which then keep their casts
            with step_region(self.device.type, self.autocast), frozen_weight_casts(self.stages.values(),
                                                                                 self.autocast), \
                    step_casts(None if self.autocast else self._expert_shard):  # fused experts: .casts
                run()
            self.p2p.drain()
            run.action = None
            busy, wall = clock.read(ctx)
            totals = rank_totals(self.rank, world, busy, wall, run.peak_bytes, clock.device_peak())
            totals = to_device(totals, self.device)  # pinned on CUDA: from pageable memory the copy would wait
            totals[SUMS] = ctx.sums(self.device)  # accumulated on the device: no sync per micro-batch
            ctx.check({"totals": totals}, "the step's loss sum")
            self.watchdog.wait(dist.all_reduce(totals, group=self.group, async_op=True), "the step's loss sum")
            if self.dp is not None:  # the loss, tokens and micro means of the whole global batch
                totals[SUMS] = self.dp.sum(totals[SUMS].clone())
            self._sum_tied()
            ahead_loaded = {m - num_micro: (ctx.data.pop(m), ctx.feats.pop(m)) for m in sorted(ctx.data)
                            if m >= num_micro}
        except BaseException as err:
            grads.put_back()
            if self.swap is not None:  # a failed step's groups go too
                self.swap.reset()
            raise self._abandon(err, run.action) from (None if isinstance(err, PeerFailed) else err)
        finally:
            ctx.clear()
        return StepTotals.read(totals, world), ahead_loaded

    def _no_label_tokens(self) -> ValueError:
        """The error of a step without a label token, naming the rows its loads dropped (``err.bad_rows``)."""
        err = ValueError("the step has no label tokens (every label is -100)" + (
            f"; {self.dropped[0]} bad rows dropped, e.g. {self.dropped[1]}" if self.dropped[0] else
            "; check the collator's labels"))
        err.bad_rows = self.dropped[0]
        return err
