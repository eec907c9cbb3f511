"""Stand-ins for what expert parallelism reads of its process group, for one-process tests of
:func:`~mpipe_hf.models.expert_parallel.shard_experts` (no collective runs): the EP mesh's size and rank, and one EP
rank's part of the experts' dispatch without the all-to-all."""

import torch


class EPMesh:
    """What ``shard_experts`` reads of its EP mesh: the size and this rank's place."""

    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def get_local_rank(self):
        return self._rank


def masked(experts, ep_rank):
    """One EP rank's part of the experts' output without the exchange: its experts run on every row, the routes to
    other ranks' experts sent to the sentinel id ``num_experts`` with weight 0 (the experts forward skips them).
    Summed over the EP ranks, the outputs are the unsharded experts'."""
    forward, per = experts.forward, experts.num_experts

    def dispatch(hidden, index, weights):
        local = (index >= ep_rank * per) & (index < (ep_rank + 1) * per)
        return forward(hidden, torch.where(local, index - ep_rank * per, per), torch.where(local, weights, 0))
    return dispatch
