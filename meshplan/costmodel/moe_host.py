"""The host's share of an MoE layer: device-to-host synchronisations and eager CPU dispatch.

PyTorch queues kernels ahead of the GPU, so a layer normally costs max(CPU dispatch, GPU
work) and the CPU's share hides. A device-to-host synchronisation (``.item()``,
``.tolist()``, ``.cpu()``, or an operator that reads a device value on the host) drains the
queue: the GPU runs dry, the host waits for it, and after the sync the GPU waits for the host
to dispatch the next kernels. Between two syncs the layer's time is max(CPU dispatch of the
operators in that segment, GPU work queued in it); each sync adds its latency:

    t_pass = Σ_segments max(C_j, G_j) + n_sync · t_sync,    C_j = ops_j · t_op

with t_op the profile's ``host_op_dispatch_s`` (the calibration's per-layer CPU dispatch of
its tiny layer over that layer's operator count, :mod:`meshplan.costmodel.dispatch`) and
t_sync its ``host_sync_s``. The dense model priced G only; :func:`host_terms` returns what
the syncs add to each pass (the segments' maxima less the GPU time already priced).

**Runtime "torch"** (meshplan's executor, ``executor/moe.py``), syncs per MoE layer forward,
from its code:

* ``torch.bincount`` on CUDA reads ``self.min()`` and ``self.max()`` on the host
  (ATen ``native/cuda/SummaryOps.cu``, ``_bincount_cuda_template``): 2 syncs each, called
  twice (the router's per-sequence counts, the per-expert counts): 4;
* the grouped GEMM sizes its padded buffer with ``int(padded.sum())`` (the per-expert loop:
  ``counts.tolist()``): 1;
* ep > 1: the exchanged counts read as split lists (``.tolist()`` twice) and the regroup
  index's ``int(sizes.sum())``: 3;
* a capacity factor: the kept copies' ``nonzero()``: 1.

So 5 per forward with ep = 1, 8 with ep > 1. The backward has none (the all-to-alls reuse
the forward's split lists); full recomputation repeats the forward's in backward.

Segments (forward, in code order): the big one — the previous layer's experts, combine
and the attention block up to the router's top-k — overlaps as before; between the first
and the last sync run the routing bookkeeping (sort, index, the second bincount), the
permutation gather, the count exchange (an all-to-all call latency that was not priced
before), the dispatch all-to-all of the rows and the regroup index: a few kernels each,
so each of those segments costs its CPU dispatch, or its GPU time where larger (the rows'
all-to-all). Backward: no sync, so one segment: max(C_b, G_b).

Operator counts (aten operators a ``TorchDispatchMode`` sees for the routed part on one
rank, ep = 1, grouped GEMM; tests/unit/test_moe_host.py checks them against torch on CPU):
forward 74 / backward 72 for a softmax router with top-k renormalisation and the balance
loss, no bias, bf16 weights; renormalisation off −2 / −8, balance loss off −9 / −12,
sigmoid gates +2 / +8, biases +7 / +10, autocast +2 / +2. The segments between the syncs
hold 38 of the forward's operators. ep > 1 adds, counted from the code (view, the count
exchange, two ``.tolist()``, the row all-to-alls, the regroup index and its inverse): +32
forward, +10 backward, and 67 operators between syncs. The dense part of the layer
(norms, attention, shared experts) counts as :func:`meshplan.costmodel.dispatch.
layer_dispatch_ops` with the MLP taken out (or the shared experts' MLP kept).

**Runtime "megatron"**: Megatron-Core's ``MoEAlltoAllTokenDispatcher`` (dropless) copies the
split sizes to the host on a side stream and synchronises once per dispatch at its
``cuda_sync_point`` (``megatron/core/transformer/moe/token_dispatcher.py``,
``_maybe_dtoh_and_synchronize``: ``self.d2h_event.synchronize()``); the backward reuses the
host splits. One sync per forward, priced as its latency plus one operator's dispatch (the
kernel the GPU then waits for); Megatron's fused permutation kernels are not counted
operator by operator.

Measured error: post hoc against the 8 as-run layouts of docs/moe.md "GPU check" (4 × H200,
2026-11-28); see the POST HOC table there. The syncs explain a small part of the gap.
"""

from __future__ import annotations

from typing import NamedTuple

from meshplan.costmodel import comm
from meshplan.costmodel.dispatch import layer_dispatch_ops
from meshplan.spec import Job, Layout, ModelSpec

# (forward, backward) operators of the routed part, ep = 1 (module docstring)
ROUTED_OPS = (74, 72)
ROUTED_OPS_NO_RENORM = (-2, -8)
ROUTED_OPS_NO_AUX = (-9, -12)
ROUTED_OPS_SIGMOID = (2, 8)
ROUTED_OPS_BIAS = (7, 10)
ROUTED_OPS_AUTOCAST = (2, 2)
ROUTED_OPS_EP = (32, 10)
BETWEEN_SYNC_OPS = {False: 38, True: 67}     # keyed by ep > 1
A2A_SEGMENT_OPS = 11      # ep > 1: the segment holding the rows' dispatch all-to-all
SYNCS_BINCOUNT = 4
SYNCS_EXPERTS = 1
SYNCS_EP = 3
SYNCS_CAPACITY = 1
MEGATRON_SYNCS = 1


class HostTerms(NamedTuple):
    """What an MoE layer's host synchronisations add to a micro-batch's passes."""

    forward_s: float
    backward_s: float
    syncs_forward: int
    syncs_backward: int


def torch_syncs(model: ModelSpec, layout: Layout) -> int:
    """Host syncs per MoE layer forward in meshplan's executor (module docstring)."""
    n = SYNCS_BINCOUNT + SYNCS_EXPERTS
    if layout.ep > 1:
        n += SYNCS_EP
    if model.capacity_factor is not None:
        n += SYNCS_CAPACITY
    return n


def routed_ops(model: ModelSpec, layout: Layout, *, autocast: bool) -> tuple[int, int]:
    """(forward, backward) operators the executor's routed part dispatches (docstring)."""
    f, b = ROUTED_OPS
    adds = [(not model.router_norm_topk, ROUTED_OPS_NO_RENORM),
            (model.router_aux_loss_coeff <= 0, ROUTED_OPS_NO_AUX),
            (model.router == "sigmoid", ROUTED_OPS_SIGMOID), (bool(model.bias), ROUTED_OPS_BIAS),
            (autocast, ROUTED_OPS_AUTOCAST), (layout.ep > 1, ROUTED_OPS_EP)]
    for on, (df, db) in adds:
        if on:
            f, b = f + df, b + db
    return f, b


def dense_ops(model: ModelSpec, layout: Layout, *, autocast: bool) -> tuple[int, int]:
    """(forward, backward) operators of the layer's norms, attention and shared experts: the
    dense block's count without its MLP unless the model has shared experts."""
    kw = dict(tp=layout.tp, sequence_parallel=layout.sequence_parallel, recompute="none",
              autocast=autocast)
    f, b = layer_dispatch_ops(model, **kw)
    if not model.num_shared_experts:
        swiglu = model.activation == "swiglu"
        f, b = f - (11 if swiglu else 9), b - (23 if swiglu else 20) - 6 * bool(model.bias)
    return f, b


def host_terms(model: ModelSpec, job: Job, layout: Layout, gpu, links, *, forward_s: float,
               backward_s: float, dispatch_a2a_s: float) -> HostTerms:
    """Seconds the host syncs add to one MoE layer's forward and backward (one micro-batch),
    given the layer's priced GPU time per pass and the forward's dispatch all-to-all (the
    rows' exchange that runs inside a short segment). 0 where the profile has no host
    numbers (``host_op_dispatch_s`` / ``host_sync_s``)."""
    t_op, t_sync = gpu.host_op_dispatch_s, gpu.host_sync_s
    if t_op <= 0 and t_sync <= 0:
        return HostTerms(0.0, 0.0, 0, 0)
    full = layout.recompute == "full"
    if job.runtime != "torch":
        fwd = MEGATRON_SYNCS * (t_sync + t_op)
        return HostTerms(fwd, fwd if full else 0.0, MEGATRON_SYNCS,
                         MEGATRON_SYNCS if full else 0)
    autocast = layout.zero < 2 and job.precision != "fp32"
    n = torch_syncs(model, layout)
    rf, rb = routed_ops(model, layout, autocast=autocast)
    df, db = dense_ops(model, layout, autocast=autocast)
    ep = layout.ep > 1
    between = BETWEEN_SYNC_OPS[ep]
    a2a_ops = A2A_SEGMENT_OPS if ep else 0
    # the count exchange: one more all-to-all call, waited on by the next sync
    count_a2a = comm.call_latency_s(links.ep, "all_to_all") if ep else 0.0
    big_gpu = max(0.0, forward_s - dispatch_a2a_s)
    fwd_time = (max((df + rf - between) * t_op, big_gpu) + (between - a2a_ops) * t_op
                + max(a2a_ops * t_op, dispatch_a2a_s + count_a2a) + n * t_sync)
    fwd_extra = max(0.0, fwd_time - forward_s)
    # no sync in backward: the host can fall behind only where its dispatch exceeds the GPU
    bwd_gpu = backward_s - (forward_s if full else 0.0)
    bwd_extra = max(0.0, (db + rb) * t_op - bwd_gpu) + (fwd_extra if full else 0.0)
    return HostTerms(fwd_extra, bwd_extra, n, n if full else 0)


__all__ = ["HostTerms", "host_terms", "torch_syncs", "routed_ops", "dense_ops"]
