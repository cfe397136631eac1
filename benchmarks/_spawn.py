"""Spawned worker processes for the diagnostics in benchmarks/ that collect one result per
process through a queue (host_sustain.py, emulate_selective_memory.py)."""
from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable, Sequence


def spawn_and_collect(target: Callable, args: Sequence[tuple]) -> dict[Any, Any]:
    """Run ``target(*a, queue)`` in a spawned process for each ``a`` in ``args``; each puts
    one ``(key, value)`` pair on ``queue``. Returns those pairs as a dict once every
    process has exited."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, queue)) for a in args]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)   # before join: a full queue blocks its writer
    for p in procs:
        p.join()
    return results
