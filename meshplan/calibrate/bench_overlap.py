"""How much communication that overlaps compute still costs: the overlap interference.

Data-parallel gradient reduction runs on NCCL's stream while the backward's GEMMs run on the
compute stream (PyTorch DDP, FSDP2); the NCCL kernels take SMs and memory bandwidth from the
GEMMs (Rashidi et al. 2021, "Enabling Compute-Communication Overlap in Distributed Deep
Learning Training Platforms", ISCA, §3), so hiding communication behind compute is not free.
The cost model charges ``interference × hidden communication`` (``estimate._exposed``);
datasheet profiles assume 0.15. This measures it on the calibration world: an all-reduce of
DDP-sized buckets (fp32, 25 MiB each) launched asynchronously, then a loop of bf16 GEMMs on
the compute stream sized to take about three times as long, then the compute stream waits for
the all-reduce — DDP's pattern. With ``t_c`` the all-reduce alone, ``t_g`` the GEMMs alone
and ``t_both`` the two together::

    interference = (t_both − max(t_g, t_c)) / min(t_g, t_c)

0: perfect overlap; 1: as if run one after the other (clamped to [0, 2]). Round 5 of issue 5
(2 × H200) found data-parallel layouts under-predicted by about their whole gradient
all-reduce, which an interference near 1 would explain.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

BUCKET_BYTES = 25 * 2**20     # PyTorch DDP's default bucket_cap_mb
BUCKETS_CUDA, BUCKETS_CPU = 16, 2
GEMM_N_CUDA, GEMM_N_CPU = 8192, 256
MAX_GEMMS = 400


def interference(t_compute_s: float, t_comm_s: float, t_both_s: float) -> float:
    """Fraction of the shorter operation's time that overlapping still adds (see module)."""
    short = min(t_compute_s, t_comm_s)
    if short <= 0:
        return 0.0
    return min(2.0, max(0.0, (t_both_s - max(t_compute_s, t_comm_s)) / short))


def bench_overlap(device, world: int, *, iters: int = 3) -> dict[str, Any]:
    """Collective over the world (world >= 2): every rank runs the same sequence. Returns
    ``{"kind": "overlap_interference", "value", "compute_s", "comm_s", "both_s", "gemms",
    "comm_bytes"}`` (medians over ``iters``; the slowest rank's times)."""
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"
    n = GEMM_N_CUDA if cuda else GEMM_N_CPU
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    buckets = [torch.ones(BUCKET_BYTES // 4, device=device, dtype=torch.float32)
               for _ in range(BUCKETS_CUDA if cuda else BUCKETS_CPU)]

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def timed(fn) -> float:
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    def comm_async():
        return [dist.all_reduce(t, async_op=True) for t in buckets]

    def comm():
        for w in comm_async():
            w.wait()

    def gemms(k: int):
        for _ in range(k):
            torch.mm(a, b)

    for _ in range(2):                               # warm-up: NCCL channels, GEMM kernels
        timed(comm)
        timed(lambda: gemms(2))
    t_comm = statistics.median(timed(comm) for _ in range(iters))
    t_one = statistics.median(timed(lambda: gemms(4)) for _ in range(iters)) / 4
    k = int(min(MAX_GEMMS, max(4, round(3 * t_comm / max(t_one, 1e-9)))))
    k = int(_max_over_ranks(torch, dist, device, float(k)))   # every rank: the same loop
    t_gemm = statistics.median(timed(lambda: gemms(k)) for _ in range(iters))

    def both():
        works = comm_async()
        gemms(k)
        for w in works:
            w.wait()
    t_both = statistics.median(timed(both) for _ in range(iters))
    t_gemm, t_comm, t_both = (_max_over_ranks(torch, dist, device, v)
                              for v in (t_gemm, t_comm, t_both))
    return {"kind": "overlap_interference", "value": interference(t_gemm, t_comm, t_both),
            "compute_s": t_gemm, "comm_s": t_comm, "both_s": t_both, "gemms": k,
            "comm_bytes": BUCKET_BYTES * (BUCKETS_CUDA if cuda else BUCKETS_CPU)}


def _max_over_ranks(torch, dist, device, value: float) -> float:
    """The slowest rank's value: it sets a collective's pace."""
    t = torch.tensor([value], dtype=torch.float64,
                     device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


__all__ = ["bench_overlap", "interference", "BUCKET_BYTES"]
