"""The host's share of a context-parallel layer: the executor's eager cores dispatch more
operators than the GPU work they queue once the tokens per rank are few.

PyTorch's CPU queues kernels ahead of the GPU, so a layer costs max(CPU dispatch, GPU work)
(:mod:`meshplan.costmodel.moe_host` states the rule). The executor's ring core
(``executor/context_parallel.py``) is a Python loop: each of its cp steps slices, copies,
repeats K/V to the query heads (GQA), runs the block kernel, casts, merges by the
online-softmax rule and starts the next K/V exchange, so its operator count grows with cp
while each step's GPU work shrinks with the tokens per rank. A layer of the executor on a
cp rank therefore dispatches, per micro-batch,

    CPU_f = (ops_f(layer) − ops_f(core) + ops_f(cp core)) · t_op + comm_f(cp core) · t_comm
    CPU_b = the same for the backward, plus the forward's again where it is recomputed

with ``ops(layer)`` :func:`meshplan.costmodel.dispatch.layer_dispatch_ops`, t_op the
profile's ``host_op_dispatch_s`` and t_comm its ``host_comm_op_s`` (one c10d operation —
``send``, ``recv_`` — with its Python wrapping: ``P2POp``, ``batch_isend_irecv``'s
coalescing, the work's ``wait``) or, for the all-to-all core's ``alltoall_base_`` calls,
its ``host_all_to_all_s`` where measured (NCCL runs one as grouped sends and receives to
every peer); :mod:`meshplan.calibrate.bench_host_comm` measures both; t_op where a profile
lacks them, an assumption a caveat names. What the host adds to a pass is max(0, CPU − GPU)
(:func:`cp_host_terms`).

Operator counts of the cores (aten and c10d operators a ``TorchDispatchMode`` sees on the
busiest rank — the ring's ranks differ by up to cp − 1 views, and each step waits for the
slowest — forward, and backward with the inputs' gradients; tests/unit/test_cp_host.py
checks them against torch on 2 and 4 gloo ranks), with rep = heads / kv heads:

===============  =========================================  ===========================
core             forward                                    backward
===============  =========================================  ===========================
ring, aten       (25 + 8·[rep>1])·cp − 14                   (28 + 12·[rep>1])·cp + 3
ring, c10d       4·(cp − 1)                                 8·cp − 4
all-to-all, aten 45 + ops_f(core)                           49 + ops_b(core)
all-to-all, c10d 4                                          4
the plain core   2 + 8·[rep>1]  (SDPA and the GQA repeat)   3 + 6·[rep>1]
===============  =========================================  ===========================

Counted on CPU (its flash kernel returns the log-sum-exp as the ring wants it); on CUDA the
cuDNN block kernel adds one view per step and pass (the log-sum-exp's squeeze, unsqueeze),
not counted. The all-to-all core's count moves by up to 3 operators with the head split
(views PyTorch elides when a group holds one head): 43-46 aten operators forward, 48-49
backward over the plain core's, counted at 2 and 4 ranks, MHA and GQA. Selective recomputation re-runs the core (its
exchanges too); full recomputation the whole forward.

Source of the mechanism: cp41 (docs/benchmarks/cp_checks.md), 4 × H200: cp 4 at 16k tokens
(4,096 a rank) ran its forward in 145 ms a micro-batch where its GPU work was priced at 70
ms, while at 32k / 64k the same layouts ran within 0-13 % of their GPU price. Measured
(4 × H200, same day): ``host_comm_op_s`` 28.6 µs; the cores alone at tiny shapes cost their
count at cp 4 with GQA (1,700 against 1,712 µs forward, +9 % backward) and 1.3-2.5 × it for
ring cp 2, ring cp 4 MHA and the all-to-all core (a fixed cost per call the per-operator
price misses); with the measured key cp41's two CPU-bound layouts are predicted −30 / −42 %
(−51 / −55 % without the term): it explains about a third of their miss (POST HOC,
docs/benchmarks/cp_checks.md).
"""

from __future__ import annotations

from typing import NamedTuple

from meshplan.costmodel.dispatch import layer_dispatch_ops
from meshplan.spec import Job, Layout, ModelSpec

HOST_COMM_ASSUMED_CAVEAT = (
    "the CPU cost of the cp core's communication calls is assumed (the profile has no "
    "host_comm_op_s for the ring's sends and receives, or no host_all_to_all_s for the "
    "all-to-all core's calls: `meshplan calibrate --nproc N` measures both); where the "
    "core's dispatch, not the GPU, sets the layer's time the step may be longer than "
    "predicted")


class CoreOps(NamedTuple):
    """Operators of an attention core in one pass: aten ones and c10d ones."""

    aten: int
    comm: int


def plain_core_ops(model: ModelSpec) -> tuple[CoreOps, CoreOps]:
    """(forward, backward) of the executor's own ``AttentionCore`` (SDPA, the GQA repeat)."""
    grouped = model.num_kv_heads < model.num_heads
    return CoreOps(2 + 8 * grouped, 0), CoreOps(3 + 6 * grouped, 0)


def cp_core_ops(model: ModelSpec, layout: Layout) -> tuple[CoreOps, CoreOps]:
    """(forward, backward) operators of the layout's cp core (table above)."""
    cp = layout.cp
    if cp == 1:
        return plain_core_ops(model)
    grouped = model.num_kv_heads < model.num_heads
    if layout.cp_style == "ring":
        return (CoreOps((25 + 8 * grouped) * cp - 14, 4 * (cp - 1)),
                CoreOps((28 + 12 * grouped) * cp + 3, 8 * cp - 4))
    plain_f, plain_b = plain_core_ops(model)
    return CoreOps(45 + plain_f.aten, 4), CoreOps(49 + plain_b.aten, 4)


class CpHostTerms(NamedTuple):
    """Seconds the host adds to one layer's forward and backward (one micro-batch), and the
    CPU dispatch priced for each pass."""

    forward_s: float
    backward_s: float
    cpu_forward_s: float
    cpu_backward_s: float


def layer_cpu_s(model: ModelSpec, job: Job, layout: Layout, gpu) -> tuple[float, float, float]:
    """(forward, backward, forward re-run in backward) CPU seconds of one cp layer's dispatch
    per micro-batch (module docstring), the backward without the re-run forward."""
    t_op = gpu.host_op_dispatch_s
    t_comm = gpu.host_comm_op_s if gpu.host_comm_op_s > 0 else t_op
    if layout.cp_style != "ring" and gpu.host_all_to_all_s > 0:
        t_comm = gpu.host_all_to_all_s
    autocast = layout.zero < 2 and job.precision != "fp32"
    dense_f, dense_b = layer_dispatch_ops(model, tp=layout.tp,
                                          sequence_parallel=layout.sequence_parallel,
                                          recompute="none", autocast=autocast)
    plain_f, plain_b = plain_core_ops(model)
    core_f, core_b = cp_core_ops(model, layout)
    fwd = (dense_f - plain_f.aten + core_f.aten) * t_op + core_f.comm * t_comm
    bwd = (dense_b - plain_b.aten + core_b.aten) * t_op + core_b.comm * t_comm
    if layout.recompute == "full":
        rerun = fwd
    elif layout.recompute == "selective":
        rerun = core_f.aten * t_op + core_f.comm * t_comm
    else:
        rerun = 0.0
    return fwd, bwd, rerun


def comm_assumed_caveat(model: ModelSpec, job: Job, layout: Layout, gpu,
                        forward_s: float, *, near: float = 0.5) -> tuple[str, ...]:
    """:data:`HOST_COMM_ASSUMED_CAVEAT` where the profile lacks the call cost of the layout's
    core (``host_comm_op_s`` for the ring, ``host_all_to_all_s`` for the all-to-all core) and
    the layer's priced CPU forward reaches ``near`` of its forward (``forward_s``, host share
    included): where an unmeasured call cost could set the step."""
    measured = (gpu.host_comm_op_s if layout.cp_style == "ring" else gpu.host_all_to_all_s)
    if (job.runtime != "torch" or layout.cp == 1 or gpu.host_op_dispatch_s <= 0
            or measured > 0):
        return ()
    cpu_f = layer_cpu_s(model, job, layout, gpu)[0]
    return (HOST_COMM_ASSUMED_CAVEAT,) if cpu_f >= near * forward_s else ()


def cp_host_terms(model: ModelSpec, job: Job, layout: Layout, gpu, *, forward_s: float,
                  backward_s: float, rerun_s: float) -> CpHostTerms:
    """What the host adds to a cp layer's passes beyond their priced GPU time (``forward_s``,
    ``backward_s`` with its recomputation, ``rerun_s`` the recomputed part's GPU time).
    0 where the runtime is not the executor's or the profile has no ``host_op_dispatch_s``.
    Full recomputation: the re-run forward and the backward proper are compared apart, the
    host falling behind in either."""
    if job.runtime != "torch" or gpu.host_op_dispatch_s <= 0 or layout.cp == 1:
        return CpHostTerms(0.0, 0.0, 0.0, 0.0)
    cpu_f, cpu_b, cpu_rerun = layer_cpu_s(model, job, layout, gpu)
    fwd_extra = max(0.0, cpu_f - forward_s)
    if layout.recompute == "full":
        bwd_extra = (max(0.0, cpu_rerun - rerun_s)
                     + max(0.0, cpu_b - (backward_s - rerun_s)))
    else:
        bwd_extra = max(0.0, cpu_b + cpu_rerun - backward_s)
    return CpHostTerms(fwd_extra, bwd_extra, cpu_f, cpu_b + cpu_rerun)


__all__ = ["HOST_COMM_ASSUMED_CAVEAT", "CoreOps", "CpHostTerms", "comm_assumed_caveat",
           "cp_core_ops", "cp_host_terms", "layer_cpu_s", "plain_core_ops"]
