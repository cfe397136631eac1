"""Collective microbenchmarks: all-reduce, reduce-scatter, all-gather, broadcast (from
group rank 0, as torch's ZeroRedundancyOptimizer syncs parameters) and p2p by message
size and group size, on groups of consecutive ranks inside one node, and the latency probe:
a 256-byte all-reduce on the smallest (2 ranks) and the largest group of the node, whose
two times split a call's latency into a per-call base and a per-ring-step part
(:func:`meshplan.hardware_profiles.collective_latency.split_latency`); and on the largest
group the CPU cost of a c10d call (:mod:`meshplan.calibrate.bench_host_comm`).

Every rank runs this (collectives and ``new_group`` are collective calls); only rank 0's
timings are returned. Iteration counts are fixed, never adaptive, so that all ranks issue
the same sequence of collectives.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from meshplan.calibrate.bench_host_comm import bench_host_comm
from meshplan.calibrate.timing import time_fn
from meshplan.executor.functional_comm import silence_collective_rename_notice

COLLECTIVE_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")
LATENCY_PROBE_BYTES = 256
# the probe's timings are differences of tens of µs between two group sizes: more samples
# than the bandwidth rows (still well under a second)
LATENCY_PROBE_ITERS = 50

silence_collective_rename_notice()


def node_group_sizes(world: int, local_world: int) -> list[int]:
    """Powers of two from 2 up to the ranks of one node."""
    sizes, n = [], 2
    while n <= min(world, local_world):
        sizes.append(n)
        n *= 2
    return sizes


def latency_sizes(groups: list[int]) -> list[int]:
    """Group sizes the latency probe runs on: the smallest and the largest of the node."""
    return sorted({groups[0], groups[-1]}) if groups else []


def bench_collectives(sizes_bytes: list[int], device: torch.device, *, iters: int,
                      progress=None) -> dict[str, list[dict[str, Any]]]:
    world, rank = dist.get_world_size(), dist.get_rank()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    rows: dict[str, list[dict[str, Any]]] = {"collectives": [], "latency": [], "host_comm": []}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    esize = torch.finfo(dtype).bits // 8
    groups = node_group_sizes(world, local_world)
    for n in groups:
        members = list(range(n))
        group = dist.new_group(members)            # every rank must call new_group
        inside = rank in members

        def record(op, nbytes, t):
            if rank == 0:
                rows["collectives" if op != "latency" else "latency"].append(
                    {"op": "all_reduce" if op == "latency" else op, "group_size": n,
                     "nbytes": nbytes, "seconds": t.median_s, "iters": t.iters})

        probe = [("latency", LATENCY_PROBE_BYTES)] if n in latency_sizes(groups) else []
        for op, nbytes in probe + [(o, s) for s in sizes_bytes
                                   for o in COLLECTIVE_OPS]:
            if inside:
                numel = max(n, nbytes // esize // n * n)
                full = torch.ones(numel, device=device, dtype=dtype)
                part = torch.ones(numel // n, device=device, dtype=dtype)
                if op in ("all_reduce", "latency"):
                    fn = lambda: dist.all_reduce(full, group=group)
                elif op == "reduce_scatter":
                    fn = lambda: dist.reduce_scatter_tensor(part, full, group=group)
                elif op == "broadcast":
                    fn = lambda: dist.broadcast(full, src=0, group=group)
                elif op == "all_to_all":     # MoE's dispatch: each rank's buffer split n ways
                    recv = torch.empty_like(full)
                    fn = lambda: dist.all_to_all_single(recv, full, group=group)
                else:
                    fn = lambda: dist.all_gather_into_tensor(full, part, group=group)
                t = time_fn(fn, device=device, warmup=3,
                            iters=max(iters, LATENCY_PROBE_ITERS) if op == "latency" else iters,
                            before=lambda: dist.barrier(group=group))
                record(op, numel * esize, t)
            dist.barrier()
            if progress is not None:
                progress.step(f"{op} n={n} {nbytes / 2**20:.2f} MiB")
        if n == 2:
            _bench_p2p(sizes_bytes, device, dtype, esize, iters, rows, progress, group)
    if groups:
        host = bench_host_comm(device, groups[-1])
        if host is not None:
            rows["host_comm"].extend(host)
        if progress is not None:
            progress.step(f"host cost of a c10d call n={groups[-1]}")
    return rows


def _bench_p2p(sizes_bytes, device, dtype, esize, iters, rows, progress, group) -> None:
    """One-way send from rank 0 to rank 1 (a pipeline stage boundary)."""
    rank = dist.get_rank()
    for nbytes in sizes_bytes:
        buf = torch.ones(max(1, nbytes // esize), device=device, dtype=dtype)
        if rank in (0, 1):
            fn = (lambda: dist.send(buf, 1)) if rank == 0 else (lambda: dist.recv(buf, 0))
            t = time_fn(fn, device=device, warmup=3, iters=iters,
                        before=lambda: dist.barrier(group=group))
            if rank == 0:
                rows["collectives"].append({"op": "p2p", "group_size": 2,
                                            "nbytes": buf.numel() * esize,
                                            "seconds": t.median_s, "iters": t.iters})
        dist.barrier()
        if progress is not None:
            progress.step(f"p2p {nbytes / 2**20:.2f} MiB")


def count_steps(world: int, local_world: int, n_sizes: int) -> int:
    groups = node_group_sizes(world, local_world)
    probes = latency_sizes(groups)
    return sum(len(COLLECTIVE_OPS) * n_sizes + (1 if n in probes else 0)
               + (n_sizes if n == 2 else 0)
               for n in groups) + (1 if groups else 0)
