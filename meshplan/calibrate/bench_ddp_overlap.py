"""DDP's gradient all-reduce beside the backward it overlaps: the interference data parallelism pays.

The cost model prices a DDP rank's gradient reduction as ``max(last bucket, exposed(t_c, t_b,
k))`` with ``exposed = t_c − hidden + k · hidden``, ``hidden = min(t_c, t_b)``
(:func:`meshplan.costmodel.data_parallel.exposed_dp_s`; PyTorch DDP's bucketed overlap, Li et
al. 2020, arXiv 2006.15704 §3.2.3; NCCL kernels take SMs and memory bandwidth from the
compute they overlap, Rashidi et al. 2021, ISCA §3). :mod:`bench_overlap` measures ``k`` on
square GEMMs beside one batch of all-reduces; round 39 of issue 36 (2 × H200) found that
probe at 1.01-1.21 while the executor's DDP layouts hid about half of their all-reduce
(docs/benchmarks/transfer.md, "Round 39: where the errors come from"): the probe's
8192² GEMMs are not a backward. This probe times the overlap the executor runs:

* a stack of the executor's own blocks (:class:`meshplan.executor.model.Transformer`, a
  layers-only part of a calibrated model, or a default GPT shape without ``--model``),
  wrapped by :func:`meshplan.executor.data_parallel.wrap_data_parallel` exactly as a ZeRO-0
  layout is (DDP, 25 MiB buckets, ``gradient_as_bucket_view``), under the same autocast;
* the backward alone under ``no_sync()`` (``t_b``), the backward with DDP reducing its
  buckets as gradients become ready (``t_s``), and the same bytes all-reduced alone in
  25 MiB fp32 buckets (``t_c``); forward and backward are synchronized apart, so the
  backward's times hold no forward;
* ``k`` is the cost model's formula solved for the measured extra time ``Δ = t_s − t_b``::

      k = (Δ − (t_c − hidden)) / hidden,   hidden = min(t_c, t_b),   clamped to [0, 2]

Blocks are stacked until their gradients fill :data:`MIN_BUCKETS` buckets (at most the
model's layers and :data:`MAX_LAYERS`), at the model's sequence length and the middle of the
calibrated micro-batch sizes, so the all-reduce/backward ratio is the model's own (both scale
with the layers). Every rank runs the same code; the slowest rank's times are kept.
"""

from __future__ import annotations

import math
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

from meshplan.calibrate.bench_overlap import BUCKET_BYTES, _max_over_ranks
from meshplan.spec import ModelSpec

MIN_BUCKETS = 8
MAX_LAYERS = 8
DEFAULT_MICRO_BATCH = 4
WARMUP, ITERS = 2, 5
#: without ``--model``: a mid-sized GPT block (hidden 2048, seq 2048)
DEFAULT_MODEL = ModelSpec(name="ddp-probe-gpt-2048", num_layers=MAX_LAYERS, hidden_size=2048,
                          num_heads=16, vocab_size=32000, max_seq_len=2048)
CPU_MODEL = ModelSpec(name="ddp-probe-cpu", num_layers=2, hidden_size=256, num_heads=4,
                      vocab_size=512, max_seq_len=128)


@dataclass(frozen=True)
class _DPGroup:
    """The two attributes of MeshGroups that wrap_data_parallel reads for ZeRO-0."""

    dp_group: Any
    dp: int


def interference_from(t_backward_s: float, t_sync_s: float, t_comm_s: float) -> float:
    """``k`` such that the cost model's ``exposed(t_comm, t_backward, k)`` equals the measured
    extra time ``t_sync − t_backward`` (see module), within [0, 2]."""
    hidden = min(t_comm_s, t_backward_s)
    if hidden <= 0:
        return 0.0
    k = (t_sync_s - t_backward_s - (t_comm_s - hidden)) / hidden
    return min(2.0, max(0.0, k))


def probe_layers(layer_params: int, num_layers: int) -> int:
    """Blocks to stack: enough for :data:`MIN_BUCKETS` fp32 gradient buckets, at most the
    model's layers and :data:`MAX_LAYERS`, at least one."""
    need = math.ceil(MIN_BUCKETS * BUCKET_BYTES / max(1, 4 * layer_params))
    return max(1, min(need, num_layers, MAX_LAYERS))


def probe_micro_batch(micro_batches: tuple[int, ...] | None) -> int:
    """The middle of the calibrated micro-batch sizes (the default without a list)."""
    if not micro_batches:
        return DEFAULT_MICRO_BATCH
    ordered = sorted(micro_batches)
    return ordered[len(ordered) // 2]


def bench_ddp_overlap(device, world: int, model: ModelSpec | None, seq_len: int | None,
                      micro_batches: tuple[int, ...] | None) -> dict[str, Any]:
    """One row ``{"kind": "ddp_overlap_interference", "value", "backward_s", "sync_s",
    "comm_s", "forward_s", "comm_bytes", "layers", "micro_batch", "seq_len", "model"}``
    (medians over the timed iterations, the slowest rank's). Collective: world >= 2."""
    import torch
    import torch.distributed as dist

    from meshplan.executor.data_parallel import wrap_data_parallel
    from meshplan.executor.model import Transformer

    cuda = device.type == "cuda"
    spec = model or (DEFAULT_MODEL if cuda else CPU_MODEL)
    seq = min(seq_len or spec.max_seq_len, spec.max_seq_len) if cuda else min(
        spec.max_seq_len, 128)
    mb = probe_micro_batch(micro_batches) if cuda else 2
    with torch.device("meta"):
        one = Transformer(replace(spec, num_layers=1)).keep_part(
            0, 1, embeds_input=False, computes_logits=False)
    layers = probe_layers(sum(p.numel() for p in one.parameters()), spec.num_layers)
    with torch.device("meta"):
        m = Transformer(replace(spec, num_layers=layers))
    m.keep_part(0, layers, embeds_input=False, computes_logits=False)
    m.to_empty(device=device)
    m.init_weights(0)
    m.activation_dtype = torch.bfloat16 if cuda else None
    ddp = wrap_data_parallel(m, zero=0, groups=_DPGroup(None, world), device=device,
                             bf16=cuda, pipelined=False)
    act = torch.bfloat16 if cuda else torch.float32
    x = torch.randn(mb, seq, spec.hidden_size, device=device, dtype=act, requires_grad=True)
    grad_bytes = sum(p.numel() * 4 for p in m.parameters())
    buckets = [torch.ones(min(BUCKET_BYTES, grad_bytes - o) // 4, device=device,
                          dtype=torch.float32) for o in range(0, grad_bytes, BUCKET_BYTES)]

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def step(reduce: bool) -> tuple[float, float]:
        """(forward s, backward s) of one micro-batch, synchronized apart."""
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()
        with nullcontext() if reduce else ddp.no_sync():
            with amp:
                out = ddp(x)
            loss = out.float().square().mean()
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
        t2 = time.perf_counter()
        x.grad = None
        return t1 - t0, t2 - t1

    def comm() -> float:
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for w in [dist.all_reduce(b, async_op=True) for b in buckets]:
            w.wait()
        sync()
        return time.perf_counter() - t0

    for _ in range(WARMUP):        # DDP builds its buckets, NCCL its channels
        step(True)
        step(False)
        comm()
    fwd, bwd, syn, com = [], [], [], []
    for _ in range(ITERS):         # interleaved: drift hits all three alike
        f, b = step(False)
        fwd.append(f)
        bwd.append(b)
        syn.append(step(True)[1])
        com.append(comm())
    t_f, t_b, t_s, t_c = (_max_over_ranks(torch, dist, device, statistics.median(v))
                          for v in (fwd, bwd, syn, com))
    return {"kind": "ddp_overlap_interference", "value": interference_from(t_b, t_s, t_c),
            "backward_s": t_b, "sync_s": t_s, "comm_s": t_c, "forward_s": t_f,
            "comm_bytes": grad_bytes, "layers": layers, "micro_batch": mb, "seq_len": seq,
            "model": spec.name}


__all__ = ["bench_ddp_overlap", "interference_from", "probe_layers", "probe_micro_batch",
           "MIN_BUCKETS", "MAX_LAYERS"]
