"""The CPU cost of one c10d call as the executor's cp cores make it: ``host_comm_op_s``
(the ring's sends and receives) and ``host_all_to_all_s`` (one ``all_to_all_single``).

Each rank of a group sends two tiny tensors to the next rank and receives two from the
previous one — one ``dist.batch_isend_irecv`` of four ``P2POp`` and a ``wait`` on each
work, the exchange of :class:`meshplan.executor.context_parallel._Ring` — ``iters`` times
back to back, timed on the host without synchronising the device (the messages are 128
bytes, so the GPU never holds the host back). The CPU seconds per exchange over its four
calls is the key :mod:`meshplan.costmodel.cp_host` prices every c10d operation of a cp
core's send and receive with; likewise one ``all_to_all_single`` of 128 bytes a rank,
``iters`` times, for the all-to-all calls (NCCL runs one as grouped sends and receives to
every peer, so its host cost is its own). Receive buffers are allocated once, outside the
timing: the cores' own ``empty_like`` calls are counted as operators there.

Every rank of the world calls :func:`bench_host_comm` (it makes a group and barriers);
rank 0's median of ``repeats`` timings is returned, None elsewhere or without a group.
"""

from __future__ import annotations

import statistics
import time

CALLS_PER_EXCHANGE = 4


def _exchange(tensors, recv, nxt: int, prev: int, group) -> None:
    import torch.distributed as dist
    ops = ([dist.P2POp(dist.isend, t, peer=nxt, group=group) for t in tensors]
           + [dist.P2POp(dist.irecv, r, peer=prev, group=group) for r in recv])
    for w in dist.batch_isend_irecv(ops):
        w.wait()


def bench_host_comm(device, group_size: int, *, iters: int = 50,
                    repeats: int = 5) -> list[dict] | None:
    """Rows ``{"kind", "group_size", "calls", "seconds"}`` on the first ``group_size`` ranks
    of ``device`` (a ``torch.device``): kind "p2p", the CPU seconds of one ring exchange
    (``calls`` = 4 c10d calls), and kind "all_to_all", of one ``all_to_all_single`` of a
    128-byte buffer (1 call; the all-to-all cp core's and MoE's exchange); each the median
    of ``repeats`` runs of ``iters`` back to back. None on ranks other than 0 and where
    ``group_size`` < 2. (torch is imported here: the profile writer imports this module
    without it.)"""
    import torch
    import torch.distributed as dist
    world, rank = dist.get_world_size(), dist.get_rank()
    if group_size < 2 or group_size > world:
        return None
    members = list(range(group_size))
    group = dist.new_group(members)                 # every rank must call new_group
    rows = []
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tensors = [torch.zeros(64, device=device, dtype=dtype) for _ in range(2)]
    recv = [torch.empty_like(t) for t in tensors]
    nxt, prev = members[(rank + 1) % group_size], members[(rank - 1) % group_size]
    flat = torch.zeros(64 * group_size, device=device, dtype=dtype)
    flat_out = torch.empty_like(flat)
    patterns = (("p2p", CALLS_PER_EXCHANGE,
                 lambda: _exchange(tensors, recv, nxt, prev, group)),
                ("all_to_all", 1,
                 lambda: dist.all_to_all_single(flat_out, flat, group=group)))
    for kind, calls, fn in patterns:
        samples = []
        if rank in members:
            for _ in range(5):
                fn()
            for _ in range(repeats):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                dist.barrier(group=group)
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                samples.append((time.perf_counter() - t0) / iters)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        dist.barrier()
        if rank == 0:
            rows.append({"kind": kind, "group_size": group_size, "calls": calls,
                         "seconds": statistics.median(samples), "iters": iters,
                         "repeats": repeats})
    return rows if rank == 0 else None


def _per_call(rows, kind: str) -> float | None:
    vals = [r["seconds"] / r["calls"] for r in rows
            if r.get("calls") and r.get("kind", "p2p") == kind]
    return statistics.median(vals) if vals else None


def host_comm_op_s(rows) -> float | None:
    """The profile key from :func:`bench_host_comm` rows: the median CPU seconds per call of
    the ring's exchange (kind "p2p")."""
    return _per_call(rows, "p2p")


def host_all_to_all_s(rows) -> float | None:
    """The profile key from :func:`bench_host_comm` rows: the median CPU seconds of one
    ``all_to_all_single`` call (kind "all_to_all")."""
    return _per_call(rows, "all_to_all")


__all__ = ["CALLS_PER_EXCHANGE", "bench_host_comm", "host_all_to_all_s", "host_comm_op_s"]
