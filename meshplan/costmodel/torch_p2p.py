"""What torch.distributed.pipelining's point-to-point order costs an interleaved step.

torch (2.11, 2.13) runs interleaved 1F1B through ``_PipelineScheduleRuntime``, which turns
each rank's compute order into one list of compute and SEND/RECV actions before the step
(``_add_send_recv``). The ranks take turns, in rank order, one slot each: a rank places
its next compute action only once that action's input is already in its own list (the
RECV that the sender put there, or the producing chunk on the same rank); placing an
action whose output crosses to another rank appends its SEND to the rank's list and the
matching RECV to the receiver's list at once. Empty slots in torch's order (``None``:
``rank`` of them first, ``post_warmup_ops`` after the warm-up, one before every cool-down
backward; ``_get_1f1b_rank_ops``) are dropped before this, while the UNSHARD / RESHARD
and REDUCE_GRAD actions torch adds (``_add_unshard_reshard``, ``_add_reduce_grad``) take
turns of their own. A RECV therefore lands in the receiver's list as soon as the sender has
placed the producing action, often far ahead of the compute that needs it.

At run time every SEND and RECV is its own ``batch_isend_irecv`` group on the pipeline
process group, so a rank's p2p kernels run one at a time on that group's single NCCL
stream, in list order, and ProcessGroupNCCL makes each wait for the compute enqueued
before it. A RECV posted early then holds back the rank's later SENDs until its own peer
sends. With pp = 2 this costs nothing (a rank's two peers are one rank); from pp = 3 on,
rank 0 posts the receive for its second chunk's first micro-batch (which the last rank
sends once that micro-batch has crossed all pp ranks) right after its first forward, and
its sends to rank 1 queue behind it.

:func:`fifo_step_s` replays the lowered lists with those rules and returns the step's
pipeline time; the estimate takes the longer of it and the closed form with the
per-operation slowdown (``torch_p2p_slowdown`` in costmodel.corrections), whichever binds. Evidence: in the
profiler traces of p14, p08 and n06 (pp 4, interleaved; docs/benchmarks/accuracy.md rounds
6-7) the compute per rank matched the calibrated layer times while the last rank idled
2-3 × the schedule's bubble; the replay, with no fitted constant, brings the six pp 4
interleaved layouts where it binds (k12, p08, p14, q10, r15, u13; rounds 3-11) from
−3.2..−12.0 % to −1.6..−2.9 % (re-predicted after round 11, not held out). An earlier
diagnostic (benchmarks/diag_pipeline_fifo.py) had one FIFO per peer pair and so found
nothing: batched p2p runs on the group's own communicator, one stream per rank.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

from meshplan.costmodel.pipeline_sim import rank_order

# action kinds in a lowered list
F, B, SEND_F, SEND_B, RECV_F, RECV_B = "F", "B", "SEND_F", "SEND_B", "RECV_F", "RECV_B"


# torch keeps at most this many of a rank's stages gathered (``_add_unshard_reshard``'s
# ``max_active_stages``); its UNSHARD / RESHARD actions take turns in the lowering
_ACTIVE_STAGES = 3


def _slots(pp: int, vpp: int, m: int, rank: int) -> list[tuple[str, int, int] | None]:
    """torch's interleaved compute order for ``rank`` as the lowering takes turns over it:
    (kind, stage, mb), with ``None`` for a turn that places nothing — an UNSHARD before a
    stage's work (at most three stages active; one leaving takes a RESHARD turn) and the
    REDUCE_GRAD after a stage's last backward (``_add_unshard_reshard``,
    ``_add_reduce_grad``)."""
    compute = [(F if kind == 0 else B, chunk * pp + rank, mb)
               for kind, chunk, mb in rank_order("interleaved-1f1b", pp, vpp, m, rank)]
    out: list[tuple[str, int, int] | None] = []
    active: set[int] = set()
    backwards = dict.fromkeys((c * pp + rank for c in range(vpp)), 0)
    for i, action in enumerate(compute):
        upcoming: list[int] = []
        for _, stage, _ in compute[i:]:
            if stage not in upcoming:
                upcoming.append(stage)
                if len(upcoming) == _ACTIVE_STAGES:
                    break
        leaving = [st for st in active if st not in upcoming]
        joining = [st for st in upcoming if st not in active]
        out.extend([None] * (len(leaving) + len(joining)))
        active.difference_update(leaving)
        active.update(joining)
        out.append(action)
        if action[0] == B:
            backwards[action[1]] += 1
            if backwards[action[1]] == m:
                out.append(None)
    return out


@lru_cache(maxsize=256)
def lowered_interleaved(pp: int, vpp: int, m: int) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """Per rank, the interleaved step's actions with its sends and receives, in the order
    torch's runtime issues them (module docstring). Needs ``m % pp == 0``.

    Example, pp = 4, vpp = 2, m = 8, rank 0 starts: F(0,0) SEND_F(0,0) RECV_F(4,0)
    F(0,1) SEND_F(0,1) RECV_F(4,1) ... — the receive for stage 4 (from rank 3) is posted
    after the first forward, three forwards before rank 3 can send it.
    """
    stages = pp * vpp
    queues = [deque(_slots(pp, vpp, m, r)) for r in range(pp)]
    lists: list[list[tuple[str, int, int]]] = [[] for _ in range(pp)]
    have: list[set] = [set() for _ in range(pp)]

    def ready(r: int, kind: str, s: int, mb: int) -> bool:
        if kind == F and s > 0:
            return (RECV_F, s, mb) in have[r] or (F, s - 1, mb) in have[r]
        if kind == B and s < stages - 1:
            return (RECV_B, s, mb) in have[r] or (B, s + 1, mb) in have[r]
        return True

    while any(queues):
        progress = False
        for r in range(pp):
            if not queues[r]:
                continue
            slot = queues[r][0]
            if slot is not None:
                kind, s, mb = slot
                if not ready(r, kind, s, mb):
                    continue
                lists[r].append(slot)
                have[r].add(slot)
                if kind == F and s < stages - 1:
                    dst = (s + 1) % pp
                    lists[r].append((SEND_F, s, mb))
                    lists[dst].append((RECV_F, s + 1, mb))
                    have[dst].add((RECV_F, s + 1, mb))
                elif kind == B and s > 0:
                    dst = (s - 1) % pp
                    lists[r].append((SEND_B, s, mb))
                    lists[dst].append((RECV_B, s - 1, mb))
                    have[dst].add((RECV_B, s - 1, mb))
            queues[r].popleft()
            progress = True
        if not progress:
            raise RuntimeError(f"interleaved order pp={pp} vpp={vpp} m={m} cannot be lowered")
    return tuple(tuple(x) for x in lists)


def _transfer_key(action: tuple[str, int, int]) -> tuple[str, int, int]:
    """(direction, receiving stage, mb): what a SEND and its RECV have in common."""
    kind, s, mb = action
    if kind == SEND_F:
        return (F, s + 1, mb)
    if kind == SEND_B:
        return (B, s - 1, mb)
    return (F if kind == RECV_F else B, s, mb)


@lru_cache(maxsize=256)
def _replay_index(pp: int, vpp: int, m: int) -> tuple[list, dict, list]:
    """What :func:`fifo_step_s` looks up in the lowered lists, which depend on the shape
    only: per rank the list indices of its SEND/RECV actions; (S|R, transfer key) -> (rank,
    index); per rank and index the compute action listed last before it (None: none)."""
    lists = lowered_interleaved(pp, vpp, m)
    comm_idx = [[i for i, a in enumerate(lst) if a[0] not in (F, B)] for lst in lists]
    where = {(_side(lst[i]), _transfer_key(lst[i])): (r, i)
             for r, lst in enumerate(lists) for i in comm_idx[r]}
    prev_compute = []
    for lst in lists:
        last, table = None, []
        for a in lst:
            table.append(last)
            if a[0] in (F, B):
                last = a
        prev_compute.append(table)
    return comm_idx, where, prev_compute


@lru_cache(maxsize=4096)
def fifo_step_s(forward_s: tuple[float, ...], backward_s: tuple[float, ...], m: int,
                pp: int, vpp: int, p2p_s: float) -> float:
    """Pipeline time of one interleaved step as torch's runtime issues it (module
    docstring): each rank computes in list order, a compute action waits for its input's
    RECV; each rank's SEND/RECV kernels run one at a time in list order, each after the
    compute listed before it, and a transfer ends ``p2p_s`` after both its SEND and RECV
    kernels have started. ``forward_s`` / ``backward_s``: per virtual stage, per
    micro-batch (without the per-operation slowdown, which this replaces where it binds).
    """
    stages = pp * vpp
    lists = lowered_interleaved(pp, vpp, m)
    comm_idx, where, prev_compute = _replay_index(pp, vpp, m)
    dur = {F: forward_s, B: backward_s}
    done: dict[tuple[str, int, int], float] = {}      # compute action -> end
    arrived: dict[tuple[str, int, int], float] = {}   # transfer key -> end
    ci = [0] * pp
    cj = [0] * pp
    ctail = [0.0] * pp
    ntail = [0.0] * pp
    posted: dict[tuple[str, tuple], float] = {}       # (S|R, key) -> kernel start
    ended: set = set()                                # (rank, list index) of finished comms

    def input_ready(r: int, kind: str, s: int, mb: int) -> float | None:
        if kind == F:
            if s == 0:
                return 0.0
            return arrived.get((F, s, mb)) if (s - 1) % pp != r else done.get((F, s - 1, mb))
        t = done.get((F, s, mb))
        if t is None or s == stages - 1:
            return t
        up = arrived.get((B, s, mb)) if (s + 1) % pp != r else done.get((B, s + 1, mb))
        return None if up is None else max(t, up)

    progress = True
    while progress:
        progress = False
        for r in range(pp):
            lst = lists[r]
            while ci[r] < len(lst):
                a = lst[ci[r]]
                if a[0] not in (F, B):
                    ci[r] += 1
                    continue
                ready_t = input_ready(r, *a)
                if ready_t is None:
                    break
                ctail[r] = done[a] = max(ctail[r], ready_t) + dur[a[0]][a[1]]
                ci[r] += 1
                progress = True
            while cj[r] < len(comm_idx[r]):
                i = comm_idx[r][cj[r]]
                if (r, i) in ended:
                    cj[r] += 1
                    continue
                a = lst[i]
                side, key = _side(a), _transfer_key(a)
                if (side, key) not in posted:
                    before = prev_compute[r][i]
                    if before is not None and before not in done:
                        break
                    start = max(ntail[r], done[before] if before is not None else 0.0)
                    posted[(side, key)] = start
                    progress = True
                other = ("R" if side == "S" else "S", key)
                if other not in posted:
                    break
                end = max(posted[(side, key)], posted[other]) + p2p_s
                arrived[key] = end
                ntail[r] = max(ntail[r], end)
                ended.add((r, i))
                peer_rank, peer_i = where[other]
                ended.add((peer_rank, peer_i))
                ntail[peer_rank] = max(ntail[peer_rank], end)
                cj[r] += 1
                progress = True
    if any(ci[r] < len(lists[r]) for r in range(pp)):
        raise RuntimeError(f"interleaved replay pp={pp} vpp={vpp} m={m} did not finish")
    return max(ctail)


def _side(action: tuple[str, int, int]) -> str:
    return "S" if action[0] in (SEND_F, SEND_B) else "R"


# The replay, Python over every action of the step, is only run up to this many chunk
# passes per step (a few ms), so that the planner's search stays fast (a speed limit, not a
# fit). How many micro-batches per rank the order can bind at is a measured number: the
# profile's ``torch_p2p_order_max_microbatches_per_rank`` (costmodel.corrections).
MAX_CHUNK_ACTIONS = 4096


def applies(runtime: str, schedule: str, pp: int, vpp: int, m: int, *,
            max_microbatches_per_rank: int) -> bool:
    """Where :func:`fifo_step_s` can bound the step: torch's runtime, interleaved, pp ≥ 3
    (pp = 2 loses nothing to the order: tested), the micro-batch count torch needs, and
    at most ``max_microbatches_per_rank``·pp micro-batches (the order's waits come once a
    step, the slowdown's with every micro-batch: :func:`meshplan.costmodel.corrections.
    p2p_order_applies`) and ``MAX_CHUNK_ACTIONS`` chunk passes (pp·vpp·m)."""
    return (runtime == "torch" and schedule == "interleaved-1f1b" and vpp >= 2 and pp >= 3
            and m % pp == 0 and m <= max_microbatches_per_rank * pp
            and pp * vpp * m <= MAX_CHUNK_ACTIONS)


__all__ = ["lowered_interleaved", "fifo_step_s", "applies"]
