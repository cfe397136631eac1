"""Time of NCCL-style collectives on a process group (ring algorithms).

Every call costs latency plus bytes over bandwidth (the alpha-beta model, Thakur,
Rabenseifner & Gropp 2005, IJHPCA 19(1) §2), with NCCL's split of the latency into a
per-call base and a per-ring-step part (NCCL ``src/graph/tuning.cc``, ``ncclTopoTuneModel``:
``baseLatencies + (nsteps − nInterSteps)·intraLat + nInterSteps·interLat``)::

    t = α_base + steps_intra·α_nvlink + steps_inter·α_network + bus_bytes / (busbw · eff(S))

* all-reduce: bus bytes 2(n-1)/n · S in 2(n-1) steps, 2(k-1) of them between the k nodes
  the group spans; reduce-scatter and all-gather: (n-1)/n · S in n-1 steps (k-1 between
  nodes) (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms"; NCCL's "bus
  bandwidth" convention in nccl-tests/doc/PERFORMANCE.md);
* broadcast: S in n-1 steps (pipelined along the ring; busbw = algbw), at the profile's
  measured broadcast curve (``nvlink_broadcast_efficiency``) inside a node where calibrate
  timed broadcasts, else at the collectives' curve — which over-prices: on round 38's
  2 × H200 the ZeRO-1 broadcasts ran at ~370 GB/s where that curve gives ~310;
* p2p: S in one step; all-to-all: the bytes leaving a rank at the group's bus bandwidth, one
  step per peer, at the profile's measured all-to-all curve (``nvlink_all_to_all_efficiency``,
  ``meshplan calibrate`` times ``all_to_all_single`` on the node's group sizes) inside a
  node, else at the collectives' curve.

α_base, α_nvlink and α_network are :class:`~meshplan.hardware_profiles.topology.GroupLink`'s
``base_latency_s``, ``intra_hop_latency_s`` / ``hop_latency_s`` (datasheet: NCCL's
Ring/Simple constants 8.4, 3.4 and 14.0 µs in ``data/clusters.toml``; ``meshplan calibrate``
measures α_base and α_nvlink: :mod:`meshplan.hardware_profiles.collective_latency`). The bus
bandwidth a group gets comes from the links its ring crosses
(:func:`meshplan.hardware_profiles.topology.group_link`), scaled by the message-size
efficiency curve of that link class.

Measured error (``benchmarks/collective_latency.py``): the 819 all-reduces, reduce-scatters
and all-gathers of 64 KiB-4 MiB on 2 and 4 ranks in the 21 stored calibrations
(docs/benchmarks/data/profiles, 2026-11, H100 and H200, torch 2.11), each on its own profile:
mean |error| 86 % (max 440 %) with the old per-hop latency (2(n-1) × half the 2-rank probe),
22 % (max 123 %) with this model on the same profiles read as older profiles are
(docs/calibrate.md; in-sample for the bandwidth curve). A 1 MiB all-reduce on 4 ranks of
round 26's 4 × H200 profile: 383 µs before, 126 µs now, 86 µs timed.

Overlap (:func:`exposed`): communication hidden behind compute still costs the profile's
``overlap_interference`` share of the hidden time — NCCL kernels take SMs and memory
bandwidth from the GEMMs they overlap (Rashidi et al. 2021, ISCA, §3); measured by
``meshplan calibrate`` (bench_overlap).
"""

from __future__ import annotations

from meshplan.hardware_profiles.collective_latency import ring_steps
from meshplan.hardware_profiles.topology import GroupLink


def call_latency_s(link: GroupLink, op: str) -> float:
    """Latency of one ``op`` call on ``link`` (no bytes): α_base plus its ring steps."""
    if link.size <= 1:
        return 0.0
    return link.latency_s(*ring_steps(op, link.size, link.nodes_spanned))


def all_reduce_s(link: GroupLink, nbytes: float) -> float:
    n = link.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (2 * (n - 1) / n * nbytes / link.bandwidth_bytes_per_s(nbytes)
            + call_latency_s(link, "all_reduce"))


def all_gather_s(link: GroupLink, nbytes: float) -> float:
    """All-gather producing ``nbytes`` on every rank (each contributes nbytes/n)."""
    n = link.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    return ((n - 1) / n * nbytes / link.bandwidth_bytes_per_s(nbytes)
            + call_latency_s(link, "all_gather"))


reduce_scatter_s = all_gather_s  # same volume and steps, reversed direction


def broadcast_s(link: GroupLink, nbytes: float) -> float:
    """One broadcast of ``nbytes`` from one rank to the rest of the group: every rank
    receives the whole buffer, pipelined along the ring (nccl-tests PERFORMANCE.md:
    broadcast busbw = algbw, so ``nbytes`` at the bus bandwidth), latency n − 1 ring steps.
    The efficiency is the profile's measured broadcast curve where ``meshplan calibrate``
    timed broadcasts on the link's class, else the all-reduce/all-gather curve."""
    if link.size <= 1 or nbytes <= 0:
        return 0.0
    return nbytes / link.broadcast_bytes_per_s(nbytes) + call_latency_s(link, "broadcast")


def p2p_s(link: GroupLink, nbytes: float) -> float:
    """One send between neighbouring pipeline ranks."""
    if link.size <= 1 or nbytes <= 0:
        return 0.0
    return nbytes / link.bandwidth_bytes_per_s(nbytes) + call_latency_s(link, "p2p")


def all_to_all_s(link: GroupLink, bytes_leaving: float) -> float:
    """One all-to-all in which every rank sends ``bytes_leaving`` to the others: the ranks'
    links run concurrently at the bus bandwidth of the group (nccl-tests PERFORMANCE.md:
    alltoall busbw = algbw·(n-1)/n, and ``bytes_leaving`` is already the (n-1)/n share),
    one step of latency per peer."""
    n = link.size
    if n <= 1 or bytes_leaving <= 0:
        return 0.0
    total = bytes_leaving * n / (n - 1)          # the algorithm's buffer size per rank
    return (bytes_leaving / link.all_to_all_bytes_per_s(total)
            + call_latency_s(link, "all_to_all"))


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
