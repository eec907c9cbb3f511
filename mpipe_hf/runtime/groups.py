"""The process groups an executor talks on, and what a failed step does to them (SPEC.md, "Runtime rules";
docs/gpus.md).

An executor owns a group over its pipeline ranks for collectives and one for each directed pair of pipeline ranks a
step can use that has the rank in it (:func:`pair_groups`, made by the pair's two ranks alone; :class:`~.p2p.P2P`;
every group here is named by :func:`~.group_names.member_group`); on NCCL three more, gloo's: one per direction for the
transfers' headers (so the host reads no device memory to learn a transfer's shapes), and one for the step's votes
on host values. A group per directed pair gives each pair's messages in one direction a stream of their own, so no
transfer waits behind another pair's under either of NCCL's set-ups (:mod:`mpipe_hf.schedule.eager`; docs/gpus.md).
A step whose data a rank cannot load never reaches them (:mod:`.preload` skips it before its first transfer). A step
that fails later, mid-transfer:

- on gloo, is recovered in-process: every rank breaks the step's groups (:meth:`.Watchdog.break_groups`, which
  fails whatever is pending on them), and the next step runs on fresh groups;
- on NCCL, ends the run. Aborting communicators one by one can hang while another communicator (the data-parallel
  group's, a pending FSDP2 all-gather) has work in flight, and nothing else can free an NCCL operation its peer
  never matches. So every communicator of the process is aborted at once (:func:`end_communicators`), and the
  process holds no stuck NCCL work while it ends: it does not wait for NCCL's watchdog to time that work out. The
  executor refuses further steps; the trainer exits with one line, and torchrun's ``--max-restarts`` restarts the
  workers, which resume from the last checkpoint (``train.resume: auto``).

Closed executors hand their clean groups to the next executor over the same ranks (idle gloo groups slow a
process down, and destroyed ones cannot be safely remade: their hashed names come back).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from ..schedule.eager import pipeline_pairs
from .group_names import member_group
from .liveness import announce_end
from .p2p import P2P
from .preload import alive, shared_error
from .watchdog import PeerFailed, Watchdog, lost_peer

# process groups of closed executors, by (pipeline ranks, timeout): [(collectives, {directed pair: group},
# (header up, header down) on NCCL or None, the votes' group, watchdog step)]
IDLE_GROUPS: dict[tuple[tuple[int, ...], timedelta], list[tuple]] = {}

RESTART = ("a step that fails mid-transfer on NCCL cannot be recovered in-process; the run ends here, and "
           "torchrun --max-restarts restarts it from the last checkpoint (train.resume: auto)")


def in_process_recovery(group: dist.ProcessGroup) -> bool:
    """Whether a step that failed mid-transfer can be recovered without ending the process: gloo only."""
    return dist.get_backend(group) == "gloo"


def fresh_groups(ex) -> None:
    """Give executor ``ex`` groups of its own (all pipeline ranks call this at the same point): a closed
    executor's clean ones when there are any, else new ones; after a failed step (gloo: its groups are broken)
    always new ones, and the failed step's buffers go. When the groups are NCCL's, two gloo groups over the same
    ranks carry the transfers' headers (:mod:`.p2p`) and a third the step's votes on host values (``ex.votes``:
    which of ``P``'s parameters any rank gave a gradient, ``GRAD_REDUCE``); on gloo the collectives' group takes
    the votes. Their waits block in the caller, so the watchdog is threaded and breaks them (with every other gloo
    group) when the step fails."""
    old = getattr(ex, "p2p", None)
    if old is not None:
        ex.watchdog.close()
        ex._stale.clear()  # its groups are broken: nothing uses the buffers
    idle = [g for g in IDLE_GROUPS.get((tuple(ex.global_ranks), ex.timeout), []) if alive(g[0])]
    IDLE_GROUPS[(tuple(ex.global_ranks), ex.timeout)] = idle  # a destroyed world's groups go
    if old is None and idle:
        ex.group, pairs, headers, ex.votes, step = idle.pop()
    else:
        pipe = "pipeline/" + "-".join(map(str, ex.global_ranks))
        ex.group = member_group(ex.global_ranks, pipe, 2 * ex.timeout)
        headers, ex.votes = None, ex.group
        if dist.get_backend(ex.group) != "gloo":  # the header groups (up, down) and the votes' group
            *headers, ex.votes = (member_group(ex.global_ranks, f"{pipe}/{kind}", 2 * ex.timeout, backend="gloo")
                                  for kind in ("up", "down", "votes"))
            headers = tuple(headers)
        pairs = pair_groups(ex.global_ranks, 2 * ex.timeout, ex.rank)
        step = ex.watchdog.step if old is not None else 0  # on from the old watchdog's step: its keys are used
    groups = [ex.group, *pairs.values(), *(headers or ()), *([ex.votes] if ex.votes is not ex.group else [])]
    # threaded: every P2P wait that blocks is on a gloo group (the data groups on gloo, the header groups on NCCL)
    ex.watchdog = Watchdog(ex.store, ex.group.group_name, ex.timeout, True, step, ex._shared, groups)
    ex.p2p = P2P(ex.rank, pairs, ex.device, ex.watchdog, headers)
    if old is not None:
        ex.p2p.bytes_sent.update(old.bytes_sent)
    ex.broken = False


def pair_groups(global_ranks: list[int], timeout, rank: int) -> dict[tuple[int, int], dist.ProcessGroup]:
    """``{(src, dst): group}`` for each directed pair of :func:`~mpipe_hf.schedule.eager.pipeline_pairs` that has
    pipeline rank ``rank`` in it: a group of two, made by the pair's two ranks alone, in one global order (the sorted
    pairs; each rank makes its own in that order), its lower pipeline rank group rank 0. No rank calls the creation
    of a group it is not in (:func:`~.group_names.member_group`: the pair's own name; on NCCL no split of the
    world's communicator), so a rank makes and holds as many as it uses: at most 6, rank 0 ``2R - 2``. Under eager
    set-up each creation is a rendezvous of the two members; taken in the one sorted order, no cycle of waits can
    form, as with the lazy set-up's connect prologue (docs/gpus.md, "Communicators"). Each pair's stream carries
    that pair's messages only (:mod:`mpipe_hf.schedule.eager`)."""
    out = {}
    for src, dst in pipeline_pairs(len(global_ranks)):
        if rank in (src, dst):
            low, high = sorted((src, dst))
            out[(src, dst)] = member_group([global_ranks[low], global_ranks[high]],
                                           f"pair/{global_ranks[src]}-{global_ranks[dst]}", timeout, split=False)
    return out


def close(ex) -> None:
    """End ``ex``'s helper threads and hand its groups on (never a failed step's)."""
    ex.watchdog.close()
    if not ex.broken:
        IDLE_GROUPS.setdefault((tuple(ex.global_ranks), ex.timeout), []).append(
            (ex.group, ex.p2p.pairs, ex.p2p.headers, ex.votes, ex.watchdog.step))
    ex.broken = True


def abandon(ex, err: BaseException, action) -> BaseException:
    """After ``err`` on this rank (at ``action``) or a peer's: publish it unless a peer did first, drop the step's
    transfers, and return the first error, to raise on every rank. On NCCL (no in-process recovery) the error is
    a ``RuntimeError`` that says the run ends, and ``ex`` refuses every later step."""
    ex._stale += ex.p2p.discard()
    ex.broken = True
    if not isinstance(err, PeerFailed):
        where = f"pipeline rank {ex.rank}" + (f", {action}" if action is not None else "")
        if lost_peer(err):  # a peer's process is gone (a peer that broke its groups published first)
            peer = f"pipeline rank {action.peer}" if action is not None and action.peer is not None else (
                "a pipeline rank")
            shared = RuntimeError(f"{where}: lost {peer}, whose process ended (killed or crashed; see its log): "
                                  f"{str(err).splitlines()[0]}")
        else:
            shared = shared_error(err, where)
        ex.watchdog.report(shared)
    ex.watchdog.break_groups()  # gloo: nothing of the step stays pending, on any rank (see .watchdog)
    first = ex.watchdog.first_error()
    if not ex.recover:
        ex.ended = f"{first}; {RESTART}"
        announce_end(f"mpipe-hf: error: {first}")  # ranks blocked where no wait of ours runs end too (.liveness)
        end_communicators(ex.group)
        return RuntimeError(ex.ended)
    return first


def end_communicators(group: dist.ProcessGroup) -> None:
    """After a failed step on NCCL, abort every NCCL communicator of this process at once (torch's
    ``_abort_process_group`` of the world: the aborts in one NCCL group call, so none waits for another's work),
    so that the process ends now, with its error, instead of when NCCL's watchdog times the stuck transfers out
    (``parallel.timeout_s`` later, holding the GPU meanwhile); torchrun's restart then finds the node free. Nothing
    on gloo, whose broken groups hold nothing (and whose in-process recovery needs the world)."""
    if dist.get_backend(group) != "nccl":
        return
    try:
        dist.distributed_c10d._abort_process_group()
    except (RuntimeError, ValueError) as err:  # already destroyed or aborted: nothing is left to wait for
        print(f"mpipe_hf: aborting the NCCL communicators after the failed step: {err}", flush=True)
