"""The host's share of an MoE layer: device-to-host synchronisations and eager CPU dispatch.

PyTorch queues kernels ahead of the GPU, so a layer normally costs max(CPU dispatch, GPU
work) and the CPU's share hides. A device-to-host synchronisation (``.item()``,
``.tolist()``, ``.cpu()``, or an operator that reads a device value on the host) drains the
queue: the GPU runs dry, the host waits for it, and after the sync the GPU waits for the host
to dispatch the next kernels. Between two syncs the layer's time is max(CPU dispatch of the
operators in that segment, GPU work queued in it), and each sync adds its latency, with
t_op the profile's ``host_op_dispatch_s`` (the calibration's per-layer CPU dispatch of
its tiny layer over that layer's operator count, :mod:`meshplan.costmodel.dispatch`) and
t_sync its ``host_sync_s``. The dense model priced the GPU work G only; :func:`host_terms`
returns what the host adds to each pass beyond it.

**Runtime "torch"** (meshplan's executor, ``executor/moe.py``), syncs per MoE layer forward,
from its code (it counts with ``index_add_``, not ``torch.bincount``, which on CUDA reads its
input's min and max on the host — ATen ``native/cuda/SummaryOps.cu`` — and sizes the grouped
GEMM's buffer from host-known bounds):

* ep > 1: the exchanged counts read back as the split lists ``all_to_all_single`` takes
  (one ``.tolist()`` of both): 1;
* etp > 1: the etp group's gathered row counts read back as the split lists of its two
  all-to-alls (``MoELayer._local_experts``): 1;
* a capacity factor: the kept copies' ``nonzero()``: 1.

So none per forward with ep = etp = 1 and no capacity factor. The backward has none (the
all-to-alls reuse the forward's split lists); full recomputation repeats the forward's in
backward. A sync drains the queue: the GPU runs dry while the host waits, then waits for the
host to dispatch the next kernel, so each costs its latency plus one operator's dispatch,
and ep > 1 puts the count exchange (one small all-to-all call) on the GPU's path before
it. Between syncs the layer costs max(CPU dispatch, GPU work):

    t_fwd = max(ops_f · t_op, G_f + t_a2a_call) + n_sync · (t_sync + t_op)

Operator counts (aten operators a ``TorchDispatchMode`` sees for the routed part on one
rank, grouped GEMM, the permutation's custom operators once each; tests/unit/test_moe_host.py
checks ep = 1 against torch on CPU): forward
77 / backward 74 for a softmax router with top-k renormalisation and the balance loss, no
bias, bf16 weights; renormalisation off −2 / −8, balance loss off −9 / −12, sigmoid gates
+2 / +8, biases +7 / +10, autocast +2 / +2; ep > 1 (the count exchange, its read-back, the
row all-to-alls, the regroup index and its inverse) +33 / +8, counted the same way on two
gloo ranks; etp > 1 (the counts' all-gather and read-back, the rows' gather and return
all-to-alls, the regroup, the partial outputs' sum) +34 / +14 and cp > 1 (the counts'
all-gather over cp and their sum) +4 / 0, counted the same way
(tests/unit/test_moe_host.py). The dense part of the layer (norms, attention, shared experts)
counts as :func:`meshplan.costmodel.dispatch.layer_dispatch_ops` with the MLP taken out (or the
shared experts' MLP kept).

**Runtime "megatron"**: Megatron-Core's ``MoEAlltoAllTokenDispatcher`` (dropless) copies the
split sizes to the host on a side stream and synchronises once per dispatch at its
``cuda_sync_point`` (``megatron/core/transformer/moe/token_dispatcher.py``,
``_maybe_dtoh_and_synchronize``: ``self.d2h_event.synchronize()``); the backward reuses the
host splits. One sync per forward, priced as its latency plus one operator's dispatch (the
kernel the GPU then waits for); Megatron's fused permutation kernels are not counted
operator by operator. The host's whole work per layer is one fitted number instead
(:func:`meshplan.costmodel.corrections.megatron_moe_host_s`): each pass costs at least half
of it. A run that captures CUDA graphs (``Job.cuda_graphs``) has neither.

Measured error: post hoc against the 8 as-run layouts of docs/benchmarks/moe_checks.md "GPU check"
(4 × H200, 2026-11-28, the executor with 5-8 syncs a layer); see the POST HOC table there. The syncs
explained a small part of the gap. The executor without them: docs/benchmarks/moe_checks.md,
"Without the syncs".
"""

from __future__ import annotations

from typing import NamedTuple

from meshplan.costmodel import comm
from meshplan.costmodel.corrections import megatron_moe_host_s
from meshplan.costmodel.dispatch import layer_dispatch_ops
from meshplan.spec import Job, Layout, ModelSpec

# (forward, backward) operators of the routed part, ep = 1 (module docstring)
ROUTED_OPS = (77, 74)
ROUTED_OPS_NO_RENORM = (-2, -8)
ROUTED_OPS_NO_AUX = (-9, -12)
ROUTED_OPS_SIGMOID = (2, 8)
ROUTED_OPS_BIAS = (7, 10)
ROUTED_OPS_AUTOCAST = (2, 2)
ROUTED_OPS_EP = (33, 8)
ROUTED_OPS_ETP = (34, 14)
ROUTED_OPS_CP = (4, 0)
SYNCS_EP = 1
SYNCS_ETP = 1
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
    return syncs_at(model, layout.ep) + (SYNCS_ETP if layout.etp > 1 else 0)


def syncs_at(model: ModelSpec, ep: int) -> int:
    """:func:`torch_syncs` at expert-parallel degree ``ep`` (what the calibration's rows of
    an MoE layer are timed at: ``calibrate.layer_grid.Config.syncs_on_host``)."""
    return (SYNCS_EP if ep > 1 else 0) + (SYNCS_CAPACITY if model.capacity_factor is not None
                                          else 0)


def routed_ops(model: ModelSpec, layout: Layout, *, autocast: bool) -> tuple[int, int]:
    """(forward, backward) operators the executor's routed part dispatches (docstring)."""
    f, b = ROUTED_OPS
    adds = [(not model.router_norm_topk, ROUTED_OPS_NO_RENORM),
            (model.router_aux_loss_coeff <= 0, ROUTED_OPS_NO_AUX),
            (model.router == "sigmoid", ROUTED_OPS_SIGMOID), (bool(model.bias), ROUTED_OPS_BIAS),
            (autocast, ROUTED_OPS_AUTOCAST), (layout.ep > 1, ROUTED_OPS_EP),
            (layout.etp > 1, ROUTED_OPS_ETP), (layout.cp > 1, ROUTED_OPS_CP)]
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
               backward_s: float) -> HostTerms:
    """Seconds the host adds to one MoE layer's forward and backward (one micro-batch),
    given the layer's priced GPU time per pass: its syncs, and its CPU dispatch where that
    exceeds the GPU work (module docstring). 0 where the profile has no host numbers
    (``host_op_dispatch_s`` / ``host_sync_s``)."""
    t_op, t_sync = gpu.host_op_dispatch_s, gpu.host_sync_s
    if t_op <= 0 and t_sync <= 0:
        return HostTerms(0.0, 0.0, 0, 0)
    full = layout.recompute == "full"
    if job.runtime != "torch":
        if job.cuda_graphs:        # a captured graph has no host synchronisation either
            return HostTerms(0.0, 0.0, 0, 0)
        half = megatron_moe_host_s(gpu.corrections, gpu) / 2
        fwd = max(0.0, half - forward_s) + MEGATRON_SYNCS * (t_sync + t_op)
        bwd_gpu = backward_s - (forward_s if full else 0.0)
        bwd = max(0.0, half - bwd_gpu) + (fwd if full else 0.0)
        return HostTerms(fwd, bwd, MEGATRON_SYNCS, MEGATRON_SYNCS if full else 0)
    autocast = layout.zero < 2 and job.precision != "fp32"
    n = torch_syncs(model, layout)
    rf, rb = routed_ops(model, layout, autocast=autocast)
    df, db = dense_ops(model, layout, autocast=autocast)
    # the count exchanges: one more collective call each, on the GPU's path before the syncs
    count_a2a = count_exchange_s(layout, links)
    fwd_time = max((df + rf) * t_op, forward_s + count_a2a) + n * (t_sync + t_op)
    fwd_extra = max(0.0, fwd_time - forward_s)
    # no sync in backward: the host can fall behind only where its dispatch exceeds the GPU
    bwd_gpu = backward_s - (forward_s if full else 0.0)
    bwd_extra = max(0.0, (db + rb) * t_op - bwd_gpu) + (fwd_extra if full else 0.0)
    return HostTerms(fwd_extra, bwd_extra, n, n if full else 0)


def count_exchange_s(layout: Layout, links) -> float:
    """Latency of the executor's count exchanges before its syncs: the ep group's
    all-to-all (ep > 1) and the etp group's all-gather (etp > 1), one call each."""
    out = comm.call_latency_s(links.ep, "all_to_all") if layout.ep > 1 else 0.0
    if layout.etp > 1:
        out += comm.call_latency_s(links.etp or links.tp, "all_gather")
    return out


__all__ = ["HostTerms", "host_terms", "torch_syncs", "routed_ops", "dense_ops",
           "count_exchange_s"]
