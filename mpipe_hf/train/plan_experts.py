"""Expert parallelism in ``mpipe-hf plan`` and the simulator.

With ``parallel.ep_size = E_p`` the replicas of a stage rank form EP groups (:mod:`mpipe_hf.models.expert_parallel`):

- memory: each EP rank holds ``E / E_p`` experts of every MoE layer of its stages, and so their fp32 weights,
  gradients and AdamW moments; the experts of ``P``'s ``T`` text layers stay whole (every rank runs ``P`` at its own
  times). Which tensors are the experts' is the config's ``base_model_ep_plan``, read by
  :func:`~mpipe_hf.models.expert_parallel.expert_tensors` as the runtime reads it;
- the all-to-all's buffers: a MoE layer sends the rows it routes (``tokens * top_k * hidden``, fp32: the experts'
  input is the norm's output on the fp32 residual stream, under ``train.bf16`` too) and receives as many (balanced
  routing), so a rank whose stages have MoE layers holds ``2 * dispatch_bytes`` while one layer exchanges, and the
  combine as much again after (never both at once). For the backward, transformers' ``AllToAllEP`` keeps what the
  one-process grouped-mm experts keep (the expert inputs and the ``(rows, hidden)`` outputs that the routing
  weights multiply, already in the layer's meta-device count) plus, per routed row, the sort order that puts the
  combined rows back (int64), the row's routing weight in fp32 and the experts' mask of rows routed off the rank
  (bool, masked where ``_is_expert_parallel`` is set): :data:`EP_SAVED_BYTES_PER_ROW` bytes (``tests/test_costs.py``
  measures the difference on a real layer over a one-process gloo all-to-all). Under ``train.bf16`` the combine
  sends the experts' bf16 outputs (:mod:`mpipe_hf.models.expert_precision`), half the dispatch's bytes: the fp32
  figure here bounds it;
- time: each MoE layer's all-to-alls per micro-batch (:func:`~mpipe_hf.schedule.hardware.moe_all_to_all_seconds`:
  the counts, the dispatch and the combine forward, their backwards), charged to the stage's ``F`` and ``B``
  (:class:`~mpipe_hf.schedule.simulate.Costs`' ``all_to_all``).

Assumptions: routing is balanced (dropless routing may send a rank up to ``E_p`` times the mean rows); the
dense weights are counted whole on every replica (FSDP2's ``dp_shard`` would shard them over ``dp``: the plan's
figure is an upper bound there). Under zero-bubble the ``B`` takes the all-to-alls' backward (``W`` runs only the
experts' weight GEMMs); what a ``W`` keeps from its ``B`` (the dispatched rows among it) is not counted, as the
plan counts no ``W``'s inputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..models.costs import is_sparse
from ..models.expert_parallel import check_expert_parallel, expert_tensors, num_experts, stage_prefixes

EP_SAVED_BYTES_PER_ROW = 8 + 4 + 1  # per routed row: its place in the sort (int64), its weight (fp32), its mask (bool)
ROW_BYTES = 4  # the dispatched rows' element size: the fp32 residual stream's


@dataclass(frozen=True)
class ExpertPlan:
    """What ``ep_size`` adds to a plan; every figure is per micro-batch and MoE layer unless it says otherwise.

    Attributes:
        ep_size: ranks of an EP group; experts: ``E``, routed experts per MoE layer; top_k: experts per token.
        moe_layers: MoE layers of each stage (``P``'s ``T`` layers left out: their experts stay whole).
        dispatch_bytes: the rows a rank routes (``tokens * top_k * hidden * 4``).
        saved_bytes: what ``AllToAllEP`` keeps for the backward beyond the one-process layer
            (``tokens * top_k * EP_SAVED_BYTES_PER_ROW``).
        forward_s, backward_s: the all-to-alls' seconds (:func:`~mpipe_hf.schedule.hardware.moe_all_to_all_seconds`).
        within_node: whether the EP group is within a node (NVLink) or across nodes (InfiniBand).
    """

    ep_size: int
    experts: int
    top_k: int
    moe_layers: tuple[int, ...]
    dispatch_bytes: float
    saved_bytes: float
    forward_s: float
    backward_s: float
    within_node: bool

    @property
    def buffer_bytes(self) -> float:
        """The all-to-all's transient buffers on a rank with MoE layers: one exchange's send and receive."""
        return 2 * self.dispatch_bytes

    def stage_seconds(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """``(forward, backward)`` all-to-all seconds of each stage per micro-batch (its MoE layers times one's)."""
        return (tuple(n * self.forward_s for n in self.moe_layers),
                tuple(n * self.backward_s for n in self.moe_layers))

    def describe(self) -> str:
        """The plan's words for it (the layout line)."""
        link = "NVLink" if self.within_node else "InfiniBand"
        return (f"ep_size {self.ep_size}: {self.experts // self.ep_size} of {self.experts} experts of each MoE layer a "
                f"rank; all-to-all {self.dispatch_bytes / 2**20:.1f} MiB a MoE layer and micro-batch over {link}, "
                f"{1e3 * self.forward_s:.3f} ms forward, {1e3 * self.backward_s:.3f} ms backward")


def moe_layers_per_stage(config, layers_per_stage: list[int], text_layers: int = 0) -> tuple[int, ...]:
    """The MoE layers (:func:`~mpipe_hf.models.costs.is_sparse`) of each stage of ``layers_per_stage`` (stage 0's
    count includes the ``text_layers`` that ``P`` takes, which are not counted)."""
    text, out, start = config.get_text_config(), [], 0
    for s, n in enumerate(layers_per_stage):
        first = start + (text_layers if s == 0 else 0)
        out.append(sum(is_sparse(text, i) for i in range(first, start + n)))
        start += n
    return tuple(out)


def expert_plan(config, profile, layers_per_stage: list[int], text_layers: int, ep_size: int,
                within_node: bool = True, cluster=None) -> ExpertPlan | None:
    """The :class:`ExpertPlan` of ``ep_size`` on ``profile``'s micro-batch (its tokens from ``activation_bytes``,
    the fp32 hidden states a stage sends: ``tokens * hidden * 4``); ``None`` for ``ep_size`` 1. Times on
    ``cluster`` (default :class:`~mpipe_hf.schedule.cluster.Cluster`: H100, NVLink 4, NDR).

    Raises:
        ValueError: as :func:`~mpipe_hf.models.expert_parallel.check_expert_parallel` (a model without an EP plan,
            an ``E`` that ``ep_size`` does not divide).
    """
    if ep_size == 1:
        return None
    check_expert_parallel(config, ep_size)
    from ..schedule.cluster import Cluster
    from ..schedule.hardware import moe_all_to_all_seconds
    text = config.get_text_config()
    rows = profile.activation_bytes / (ROW_BYTES * text.hidden_size) * text.num_experts_per_tok
    dispatch = rows * text.hidden_size * ROW_BYTES
    forward, backward = moe_all_to_all_seconds(dispatch, ep_size, cluster or Cluster(), within_node)
    return ExpertPlan(ep_size, num_experts(config), text.num_experts_per_tok,
                      moe_layers_per_stage(config, layers_per_stage, text_layers), dispatch,
                      rows * EP_SAVED_BYTES_PER_ROW, forward, backward, within_node)


def sharded_names(shadow, config, carved, rank: int, pp_size: int, ep_size: int) -> set[str]:
    """The parameter names (of ``shadow``, the whole meta model) that EP shards on pipeline rank ``rank``: the
    fused expert tensors of its stages' MoE layers (none for ``ep_size`` 1)."""
    if ep_size == 1:
        return set()
    under = stage_prefixes(carved, rank, pp_size)
    return {f"{fqn}.{key}" for fqn, keys in expert_tensors(shadow, config, under).items() for key in keys}


def rank_bytes(experts: ExpertPlan | None, rank: int, pp_size: int) -> int:
    """The all-to-all's transient buffers of pipeline rank ``rank`` (:attr:`ExpertPlan.buffer_bytes` when one of its
    stages has a MoE layer, else 0)."""
    if experts is None or not any(experts.moe_layers[s] for s in range(rank, len(experts.moe_layers), pp_size)):
        return 0
    return round(experts.buffer_bytes)


def with_all_to_all(costs, experts: ExpertPlan | None):
    """``costs`` (:class:`~mpipe_hf.schedule.simulate.Costs`) with each stage's all-to-all seconds
    (:meth:`ExpertPlan.stage_seconds`); unchanged without expert parallelism."""
    if experts is None:
        return costs
    forward, backward = experts.stage_seconds()
    return dataclasses.replace(costs, all_to_all=forward, all_to_all_backward=backward)
