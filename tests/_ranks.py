"""Start the CPU ranks of an in-test process group from a forkserver.

A rank started with "spawn" is a fresh interpreter that imports torch, torch.distributed's
FSDP / pipelining / optim and meshplan.executor again: about 2 s of CPU a rank, which on
the 2-core test machine was most of a tiny world's time (world 8: 18 s, of which ~1 s
training). The forkserver imports them once a session and forks every rank from that
state. Like "spawn" (and unlike "fork") a rank shares nothing with the test process: it
unpickles its function and arguments, and sees the environment the test process had when
the first group started — so pass settings as arguments, not through os.environ.
"""

from __future__ import annotations

import multiprocessing
from typing import Callable

# Imported by the forkserver before the first rank forks; a name that does not import
# (torch missing, or _harness not on sys.path in a unit-only run) is skipped by the
# forkserver.
PRELOAD = [
    "torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.pipelining",
    "torch.distributed.optim", "torch.distributed.checkpoint",
    "torch.distributed.tensor.parallel", "meshplan.executor.parallelize",
    "meshplan.executor.checkpoint", "meshplan.executor.fp8", "meshplan.calibrate.bench_layers",
    "_harness",
]


def start_ranks(fn: Callable, args: tuple, nprocs: int) -> None:
    """``fn(rank, *args)`` on ``nprocs`` processes; returns when all have exited, raises
    torch's ProcessRaisedException / ProcessExitedException if one failed."""
    import torch.multiprocessing as mp
    multiprocessing.set_forkserver_preload(PRELOAD)   # read when the server starts
    mp.start_processes(_frozen_start, args=(fn, *args), nprocs=nprocs, join=True,
                       start_method="forkserver")


def _frozen_start(rank: int, fn: Callable, *args) -> None:
    """``fn(rank, *args)`` with what the rank holds so far in the collector's permanent
    generation: torch and the executor, some 300 000 objects, are module state a full
    collection scans to no effect, and a ``gc.collect()`` took 0.2-0.4 s in a rank (the
    calibration runs one after each module it times). ``gc.freeze`` itself is constant time."""
    import gc
    gc.freeze()
    fn(rank, *args)


def run_and_save(jobs, out: str, rank: int) -> None:
    """On a rank of an initialised gloo world: run ``jobs`` ([(name, callable)]) in order,
    recording each result or, at the first exception, its traceback and stop (the group may
    be out of step; later jobs are reported as not run); save the results to
    ``{out}.rank{rank}``, meet the other ranks and close the process group."""
    import traceback

    import torch
    import torch.distributed as dist
    results = {}
    for name, run in jobs:
        try:
            results[name] = run()
        except Exception:
            results[name] = {"error": f"rank {rank}: {traceback.format_exc()}"}
            break
    torch.save(results, f"{out}.rank{rank}")
    dist.barrier()
    dist.destroy_process_group()
