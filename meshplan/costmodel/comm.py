"""Time of NCCL-style collectives on a process group (ring algorithms).

Ring all-reduce moves 2(n-1)/n of the buffer through every rank's link in 2(n-1) steps;
reduce-scatter and all-gather move (n-1)/n in n-1 steps (Patarasuk & Yuan 2009,
"Bandwidth optimal all-reduce algorithms"; NCCL's "bus bandwidth" convention in
nccl-tests/doc/PERFORMANCE.md). The bus bandwidth a group gets comes from the links its ring
crosses (:func:`meshplan.hardware_profiles.topology.group_link`), scaled by the
message-size efficiency curve of that link class.

Overlap (:func:`exposed`): communication hidden behind compute still costs the profile's
``overlap_interference`` share of the hidden time — NCCL kernels take SMs and memory
bandwidth from the GEMMs they overlap (Rashidi et al. 2021, ISCA, §3); measured by
``meshplan calibrate`` (bench_overlap).
"""

from __future__ import annotations

from meshplan.hardware_profiles.topology import GroupLink


def all_reduce_s(link: GroupLink, nbytes: float) -> float:
    n = link.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (2 * (n - 1) / n * nbytes / link.bandwidth_bytes_per_s(nbytes)
            + 2 * (n - 1) * link.hop_latency_s)


def all_gather_s(link: GroupLink, nbytes: float) -> float:
    """All-gather producing ``nbytes`` on every rank (each contributes nbytes/n)."""
    n = link.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    return ((n - 1) / n * nbytes / link.bandwidth_bytes_per_s(nbytes)
            + (n - 1) * link.hop_latency_s)


reduce_scatter_s = all_gather_s  # same volume and steps, reversed direction


def p2p_s(link: GroupLink, nbytes: float) -> float:
    """One send between neighbouring pipeline ranks."""
    if link.size <= 1 or nbytes <= 0:
        return 0.0
    return nbytes / link.bandwidth_bytes_per_s(nbytes) + link.hop_latency_s


def wire_bytes_all_reduce(n: int, nbytes: float) -> float:
    """Bytes each rank sends for a ring all-reduce of ``nbytes``."""
    return 2 * (n - 1) / n * nbytes if n > 1 else 0.0


def wire_bytes_gather(n: int, nbytes: float) -> float:
    """Bytes each rank sends for a ring all-gather / reduce-scatter of ``nbytes``."""
    return (n - 1) / n * nbytes if n > 1 else 0.0


def exposed(comm_s: float, compute_s: float, interference: float) -> float:
    """Time communication overlapped with ``compute_s`` adds to the critical path: what does
    not fit behind the compute, plus ``interference`` of what does."""
    hidden = min(comm_s, compute_s)
    return comm_s - hidden + interference * hidden
