"""What one collective call costs beyond its bytes: a per-call base plus a per-ring-step term.

The alpha-beta model (Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1), §2: a message costs α + n·β; a ring of p
ranks takes p − 1 steps per pass) with NCCL's split of α (NCCL ``src/graph/tuning.cc``,
``ncclTunerConstantsDefaults`` and ``ncclTopoTuneModel``, NCCL 2.30.7): a collective's
latency is ``baseLatencies[algo][proto]`` once per call plus ``hwLatencies[hw][algo][proto]``
per ring step, the steps of a ring crossing nodes at the network's latency, the others at
NVLink's::

    t = α_base + Σ_steps α_step(hop) + bus_bytes / (busbw · eff(S))
    steps: all-reduce 2(n − 1) (of which 2(k − 1) cross nodes, k nodes), reduce-scatter and
           all-gather n − 1 (k − 1), p2p 1, all-to-all n − 1 (one per peer)

Datasheet values (``data/clusters.toml``: ``collective_base_latency_us``,
``intra_node.latency_us``, ``network.latency_us``) are NCCL's Ring/Simple constants, the
protocol NCCL runs for the MiB-sized messages of training: α_base 8.4 µs, α_step 3.4 µs over
NVLink and 14.0 µs over the network.

``meshplan calibrate`` measures both on the machine (:func:`split_latency`): a 256-byte
all-reduce on 2 ranks and on the whole node, ``t(n) = α_base + 2(n − 1)·α_step``. Through
torch on H100 / H200 the per-call part dominates (the probe includes torch's launch of the
call and the ranks' skew after the barrier): the 2-rank probe read 33-129 µs over 21
calibrations of 2026-11 (docs/benchmarks/data/profiles), and the 64 KiB-1 MiB all-reduces
of those calibrations took about as long on 4 ranks as on 2.

Profiles written before the split carry one key, ``[cluster] intra_latency_us`` = half the
2-rank probe, which the cost model used to charge per ring step (2(n − 1) of them: 383 µs
for a 1 MiB all-reduce on 4 ranks of round 26's 4 × H200 profile, 86 µs measured in that
calibration). :func:`legacy_split` reads it as the whole probe less two datasheet steps
(the probe's time is kept; the per-step part is the datasheet's), and
:func:`nvlink_curve` re-derives such a profile's NVLink curve from its stored collective
rows, which had been read with the old latency (docs/calibrate.md, "Older profiles").
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping

from meshplan.errors import ProfileError
from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.curve_fit import extend_with_base, merge_points

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "p2p", "all_to_all")
# the ops the NVLink curve is read from; broadcast and all-to-all have their own curves
# (broadcast_curve, all_to_all_curve)
CURVE_OPS = ("all_reduce", "reduce_scatter", "all_gather")
# Collective sizes whose time is mostly latency are kept out of the bandwidth curve, and so
# is any row whose latency (α_base + steps·α_step, read from the probe) explains more than
# half its time: the rest is too small a difference of two timings to read a bandwidth
# from (through torch on H100 / H200 that is most rows up to 4 MiB). There the curve takes
# the datasheet's shape, scaled to meet the smallest row kept.
MIN_CURVE_MESSAGE_BYTES = 1 << 16
MIN_BANDWIDTH_SHARE = 0.5


def ring_steps(op: str, n: int, nodes: int = 1) -> tuple[int, int]:
    """(steps, of which cross nodes) of one ``op`` on a ring of ``n`` ranks over ``nodes``
    nodes (NCCL ``ncclTopoTuneModel``: nsteps and nInterSteps)."""
    if n <= 1:
        return 0, 0
    k = max(1, nodes)
    if op == "all_reduce":
        return 2 * (n - 1), 2 * (k - 1)
    if op in ("reduce_scatter", "all_gather", "broadcast"):
        return n - 1, k - 1
    if op == "p2p":
        return 1, 1 if k > 1 else 0
    if op == "all_to_all":
        return n - 1, n - n // k
    raise ProfileError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")


def bus_bytes(op: str, n: int, nbytes: float) -> float:
    """Bytes each rank moves for one ``op`` of an ``nbytes`` buffer (ring algorithms;
    nccl-tests doc/PERFORMANCE.md bus bandwidth)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n * nbytes
    if op in ("reduce_scatter", "all_gather"):
        return (n - 1) / n * nbytes
    if op in ("p2p", "broadcast"):   # broadcast: pipelined along the ring, busbw = algbw
        return float(nbytes)
    if op == "all_to_all":           # the (n - 1)/n of the buffer that leaves the rank
        return (n - 1) / n * nbytes
    raise ProfileError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")


def call_latency_s(op: str, n: int, base_s: float, step_s: float) -> float:
    """Latency of one ``op`` on ``n`` ranks of one node."""
    return base_s + ring_steps(op, n)[0] * step_s if n > 1 else 0.0


def split_latency(probes: Iterable[tuple[int, float]]) -> tuple[float, float] | None:
    """(α_base s, α_step s) from small all-reduces ``(group size, seconds)`` at ≥ 2 group
    sizes: least squares of ``t = α_base + 2(n − 1)·α_step`` over the per-size medians,
    each term kept ≥ 0: a larger group timed faster is noise (then α_base is the mean time
    and α_step 0); a negative α_base (steps slower than the calls, as on CPU ranks over
    gloo) refits α_step through the origin. None with fewer than two group sizes."""
    by_size: dict[int, list[float]] = {}
    for n, t in probes:
        by_size.setdefault(int(n), []).append(float(t))
    if len(by_size) < 2:
        return None
    xs = [2.0 * (n - 1) for n in by_size]
    ys = [statistics.median(v) for v in by_size.values()]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if slope <= 0:
        return my, 0.0
    if my - slope * mx < 0:
        return 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return my - slope * mx, slope


def legacy_split(half_probe_us: float, step_us: float) -> tuple[float, float]:
    """(α_base µs, α_step µs) of a profile that has only the old ``intra_latency_us`` (half
    of its 2-rank probe): the probe's time less two steps of the datasheet's ``step_us``."""
    return max(0.0, 2.0 * half_probe_us - 2.0 * step_us), step_us


def row_efficiency(op: str, n: int, nbytes: float, seconds: float, link_gbps: float,
                   base_s: float, step_s: float) -> float:
    """The curve's efficiency at ``nbytes`` that makes the model reproduce one timed row
    (bandwidth time at least :data:`MIN_BANDWIDTH_SHARE` of the row's, so that a row the
    latency over-explains stays finite; :func:`nvlink_curve` leaves such rows out)."""
    t = max(seconds - call_latency_s(op, n, base_s, step_s), MIN_BANDWIDTH_SHARE * seconds)
    return bus_bytes(op, n, nbytes) / (t * link_gbps * 1e9)


def bandwidth_bound(row: Mapping[str, Any], base_s: float, step_s: float) -> bool:
    """Whether a timed row's time is at least :data:`MIN_BANDWIDTH_SHARE` bandwidth."""
    lat = call_latency_s(row["op"], row["group_size"], base_s, step_s)
    return (row.get("nbytes", 0) >= MIN_CURVE_MESSAGE_BYTES
            and row["seconds"] - lat >= MIN_BANDWIDTH_SHARE * row["seconds"])


def nvlink_curve(rows: Iterable[Mapping[str, Any]], link_gbps: float, base_s: float,
                 step_s: float, base_curve: Curve | None,
                 ops: tuple[str, ...] = CURVE_OPS) -> Curve | None:
    """The NVLink efficiency curve of timed collective rows (op, group_size, nbytes,
    seconds) of ``ops`` (p2p and broadcast rows, and rows mostly latency, left out:
    :func:`bandwidth_bound`), outside the sizes kept the ``base_curve``'s shape. None
    without usable rows."""
    pts = merge_points((r["nbytes"], row_efficiency(r["op"], r["group_size"], r["nbytes"],
                                                    r["seconds"], link_gbps, base_s, step_s))
                       for r in rows if r.get("op") in ops and r.get("seconds", 0) > 0
                       and bandwidth_bound(r, base_s, step_s))
    return extend_with_base(pts, base_curve) if pts else None


def broadcast_curve(rows: Iterable[Mapping[str, Any]], link_gbps: float, base_s: float,
                    step_s: float, base_curve: Curve | None) -> Curve | None:
    """The NVLink efficiency curve of the timed broadcast rows alone (read as
    :func:`nvlink_curve` reads the other collectives; bus bytes = the buffer). None without
    broadcast rows."""
    return nvlink_curve(rows, link_gbps, base_s, step_s, base_curve, ops=("broadcast",))


def all_to_all_curve(rows: Iterable[Mapping[str, Any]], link_gbps: float, base_s: float,
                     step_s: float, base_curve: Curve | None) -> Curve | None:
    """The NVLink efficiency curve of the timed all-to-all rows alone (bus bytes: the
    (n − 1)/n of each rank's buffer that leaves it, nccl-tests PERFORMANCE.md; latency
    n − 1 steps). MoE's dispatch and combine (:func:`meshplan.costmodel.comm.all_to_all_s`)
    run at it inside a node. None without all-to-all rows."""
    return nvlink_curve(rows, link_gbps, base_s, step_s, base_curve, ops=("all_to_all",))


__all__ = ["CURVE_OPS", "MIN_CURVE_MESSAGE_BYTES", "MIN_BANDWIDTH_SHARE", "all_to_all_curve",
           "bandwidth_bound", "broadcast_curve", "bus_bytes", "call_latency_s", "legacy_split",
           "nvlink_curve", "ring_steps", "row_efficiency", "split_latency"]
