"""Pin each local rank to its own CPU cores (``meshplan.executor.run --cpu-affinity split``).

Where the CPU's kernel dispatch sets the step (small micro-batches, tensor parallelism
with many small kernels), the ranks of one host compete for cores with each other and with
their own helper threads (autograd's device thread, NCCL's proxy). On the lent 4-GPU hosts
of round 9 the same layout's step varied by 5-24 % between runs minutes apart
(docs/benchmarks/accuracy.md). Giving every rank a disjoint block of physical cores, all
hyper-threads of a core to the same rank, removes one source of that variation.

Worked example: 8 CPUs as 4 cores with siblings (0, 4), (1, 5), (2, 6), (3, 7), two local
ranks → rank 0 gets cores (0, 4), (1, 5) = CPUs {0, 1, 4, 5}, rank 1 gets {2, 3, 6, 7}.

The blocks follow CPU numbering, not each GPU's NUMA node: on a multi-socket host where
the GPUs report their NUMA locality, torchrun's own ``--numa-binding=exclusive`` (torch >=
2.11) divides each node's cores among its GPUs instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from meshplan.errors import ConfigError

AFFINITY_MODES = ("none", "split")


def physical_cores(cpus: Iterable[int], siblings_of: Callable[[int], Iterable[int]]
                   ) -> list[tuple[int, ...]]:
    """``cpus`` grouped into physical cores (each the sorted CPUs of one core that are in
    ``cpus``), ordered by their first CPU."""
    allowed = set(cpus)
    cores: dict[tuple[int, ...], None] = {}
    for cpu in sorted(allowed):
        core = tuple(sorted((set(siblings_of(cpu)) | {cpu}) & allowed))
        cores.setdefault(core, None)
    return sorted(cores, key=lambda c: c[0])


def rank_cpus(cpus: Iterable[int], local_rank: int, local_world: int,
              siblings_of: Callable[[int], Iterable[int]]) -> tuple[int, ...]:
    """The CPUs of ``local_rank``'s share: the physical cores split into ``local_world``
    contiguous blocks as even as possible (the first ones one core larger)."""
    cores = physical_cores(cpus, siblings_of)
    if not 0 <= local_rank < local_world:
        raise ConfigError(f"local rank {local_rank} is not in 0..{local_world - 1}")
    if len(cores) < local_world:
        raise ConfigError(f"--cpu-affinity split needs a physical core per local rank: "
                          f"{len(cores)} core(s) for {local_world} ranks; use "
                          f"--cpu-affinity none")
    base, extra = divmod(len(cores), local_world)
    start = local_rank * base + min(local_rank, extra)
    block = cores[start:start + base + (local_rank < extra)]
    return tuple(sorted(cpu for core in block for cpu in core))


def linux_siblings(cpu: int, sys_root: Path = Path("/sys/devices/system/cpu")
                   ) -> frozenset[int]:
    """The CPUs sharing ``cpu``'s physical core (Linux sysfs; just ``cpu`` if unknown)."""
    try:
        text = (sys_root / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()
    except OSError:
        return frozenset({cpu})
    out: set[int] = set()
    for part in text.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.update(range(int(lo), int(hi) + 1))
        elif part:
            out.add(int(part))
    return frozenset(out or {cpu})


def pin_local_rank(mode: str, local_rank: int, local_world: int) -> tuple[int, ...] | None:
    """Apply ``mode`` to this process (call before torch starts its threads, which inherit
    it); returns the CPUs it now runs on, or None where nothing was changed."""
    if mode not in AFFINITY_MODES:
        raise ConfigError(f"--cpu-affinity {mode!r}: expected one of {', '.join(AFFINITY_MODES)}")
    if mode == "none":
        return None
    if not hasattr(os, "sched_setaffinity"):
        raise ConfigError("--cpu-affinity split needs os.sched_setaffinity (Linux); "
                          "use --cpu-affinity none")
    mine = rank_cpus(os.sched_getaffinity(0), local_rank, local_world, linux_siblings)
    os.sched_setaffinity(0, mine)
    return mine


__all__ = ["AFFINITY_MODES", "physical_cores", "rank_cpus", "linux_siblings", "pin_local_rank"]
