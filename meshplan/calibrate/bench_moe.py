"""MoE microbenchmarks: what the MoE cost model (``costmodel/moe_layer.py``, ``moe_host.py``)
reads from a profile, timed with the executor's own kernels (``executor/moe.py``).

* **Grouped expert GEMMs** (``grouped_gemm`` rows): one weight of the stacked experts —
  fc1 (h → m·f) or fc2 (f → h) — on ``groups`` local experts of ``rows`` rows each, forward
  and backward. With torch's grouped kernel on CUDA (bf16 sm90+) timed inside the
  executor's MoE layer, bf16 and fp8 rowwise (:mod:`meshplan.calibrate.bench_grouped_layer`:
  alone, the same calls ran at a lower clock); elsewhere alone through autograd, as
  ``GroupedExperts`` runs it (``torch._grouped_mm`` / ``F.grouped_mm`` with 8-row aligned
  groups, else its per-expert loop).
  Shapes: the model's, at each ep dividing its experts and the world (E/ep local experts),
  tp 1 and 2, micro-batches 1 and 2 and the layer tables' (``--micro-batches``: the sizes
  the layouts run), balanced routing (rows = k·T·ep/E, T = b·s/tp).
* **Permutation** (``moe_permute`` rows): the executor's memory-bound token movement of one
  MoE layer at ep 1 — the gather of the k·T routed copies (``index_select``; backward the
  sum of each token's copies, ``embedding_bag``), the grouped GEMM's padding copy in and
  out (``index_copy`` / ``index_select``) and the gate-weighted combine (``embedding_bag``)
  — forward and backward, at the model's T per micro-batch (the same micro-batches), with
  the executor's own functions. Its efficiency grows with its size (1 × H200, moeh31's
  model: 0.22 at 1 k tokens, 0.25 at 2 k; moeh30's at 8-16 k, 0.35-0.36), so it is timed at
  the sizes the layouts run, not only at one or two sequences.
* **Host synchronisation** (``host_sync`` rows): a device-to-host read (``.item()`` of a
  scalar, ``.tolist()`` of E counts) on an idle stream (wall time) and behind a queued
  spin kernel (``torch.cuda._sleep``): wall time from before the spin's launch to the
  read's return, less the spin's GPU time (CUDA events) — the gap a sync leaves between
  the end of the queued work and the GPU's next kernel, which is what
  ``moe_host`` charges per sync.
* **Host dispatch** (``host_dispatch`` rows): CPU wall time of the executor's MoE layer
  (routed part, ep 1, a tiny hidden size so the GPU keeps up with the host) forward and
  backward; less its syncs at the queued sync time, over the operators ``moe_host``
  counts for it.

Definitions turning the rows into profile keys: :mod:`meshplan.calibrate.moe_profile`.
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from meshplan.calibrate.timing import time_fn
from meshplan.spec import Layout, ModelSpec

SPIN_CYCLES = 200_000          # ~100 µs at H100/H200 clocks: longer than a sync's dispatch
HOST_ITERS = 50
TINY_HIDDEN = 64
TINY_TOKENS = 64


@dataclass(frozen=True, order=True)
class GroupedGemmShape:
    groups: int       # local experts
    rows: int         # rows per expert
    k: int
    n: int


def expert_gemm_shapes(model: ModelSpec, seq_len: int, world: int, *, quick: bool = False,
                       micro_batches: tuple[int, ...] = (1, 2), tps: tuple[int, ...] = (1, 2)
                       ) -> list[GroupedGemmShape]:
    """The grouped GEMMs (fc1 and fc2) of ``model``'s routed experts under balanced routing,
    at each ep dividing its experts and ``world``, each tp in ``tps`` dividing ``world``."""
    e, k, h = model.num_experts, model.experts_per_token, model.hidden_size
    f = model.moe_ffn_hidden_size
    if not e:
        return []
    eps = [ep for ep in (1, 2, 4, 8, 16, 32, 64) if ep <= world and e % ep == 0 and world % ep == 0]
    out = set()
    for tp in (t for t in tps if world % t == 0):
        for mb in micro_batches[:1] if quick else micro_batches:
            tokens = mb * seq_len // tp
            for ep in eps[:2] if quick else eps:
                rows = max(1, round(k * tokens * ep / e))
                out.add(GroupedGemmShape(e // ep, rows, h, model.ffn_matrices * f))
                out.add(GroupedGemmShape(e // ep, rows, f, h))
    return sorted(out)


def grouped_backend(device: torch.device) -> str:
    from meshplan.executor.moe import grouped_mm_usable
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return "grouped_mm" if grouped_mm_usable(device, dtype) else "loop"


def bench_grouped_gemm(shape: GroupedGemmShape, device: torch.device) -> dict[str, Any]:
    """Forward + backward of one grouped GEMM as the executor's ``GroupedExperts`` runs it."""
    from meshplan.executor.moe import GROUP_ALIGN_ROWS, _grouped_mm_fn
    backend = grouped_backend(device)
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = -(-shape.rows // GROUP_ALIGN_ROWS) * GROUP_ALIGN_ROWS if backend != "loop" else shape.rows
    x = torch.randn(shape.groups * rows, shape.k, device=device, dtype=dt, requires_grad=True)
    w = torch.randn(shape.groups, shape.n, shape.k, device=device, dtype=dt,
                    requires_grad=True)
    g = torch.randn(shape.groups * rows, shape.n, device=device, dtype=dt)
    offs = torch.arange(1, shape.groups + 1, device=device, dtype=torch.int32) * rows
    mm = _grouped_mm_fn()

    def step():
        if backend == "loop":
            y = torch.cat([F.linear(xi, w[i]) for i, xi in enumerate(x.split(rows))])
        else:
            y = mm(x, w.transpose(-2, -1), offs=offs)
        y.backward(g)
        x.grad = w.grad = None

    t = time_fn(step, device=device)
    return {"groups": shape.groups, "rows": shape.rows, "padded_rows": rows, "k": shape.k,
            "n": shape.n, "backend": backend, "seconds": t.median_s, "iters": t.iters}


def fp8_grouped_runnable(device: torch.device) -> bool:
    """Whether the executor runs fp8 grouped GEMMs here (recipe rowwise, on the fp8 kernel)."""
    from meshplan.errors import ExecutorError
    from meshplan.executor.fp8 import check_recipe_runnable
    if device.type != "cuda":
        return False
    try:
        check_recipe_runnable("rowwise", device)
    except ExecutorError:
        return False
    return True


#: rows an expert also timed in the layer below a model's own smallest: the curve is keyed by
#: the call, so another model's smaller calls read these points rather than the datasheet's
#: continuation, which priced moeh36's 0.1-0.2 TFLOP calls (64 experts of 512 rows) from
#: moeh23's calibration (smallest 0.4) 4-11 points fast (docs/benchmarks/moe_checks.md)
SMALL_ROWS = (128, 256, 512)


def in_layer_shapes(pairs) -> list[tuple[int, int]]:
    """(groups, rows an expert) to time in the layer: the model's, and for each group count
    the :data:`SMALL_ROWS` below its smallest rows."""
    out = set(pairs)
    for g in {g for g, _ in out}:
        low = min(r for gg, r in out if gg == g)
        out |= {(g, r) for r in SMALL_ROWS if r < low}
    return sorted(out)


def grouped_gemm_rows(models, shapes, device: torch.device) -> list[dict[str, Any]]:
    """The ``grouped_gemm`` rows of ``shapes`` (each model's fc1 and fc2): on CUDA with
    torch's grouped kernel timed inside the executor's MoE layer, bf16 and, where it runs,
    fp8 rowwise (:mod:`meshplan.calibrate.bench_grouped_layer`; a shape the layer cannot
    time falls back to the call alone, ``timing = "alone"``; in the layer also at
    :data:`SMALL_ROWS`: :func:`in_layer_shapes`); elsewhere each call alone."""
    from meshplan.calibrate.bench_grouped_layer import grouped_rows_in_layer
    if device.type != "cuda" or grouped_backend(device) != "grouped_mm":
        return [bench_grouped_gemm(s, device) for s in sorted(shapes)]
    precisions = (None, "rowwise") if fp8_grouped_runnable(device) else (None,)
    out: list[dict[str, Any]] = []
    for m in models:
        h, fc1 = m.hidden_size, m.ffn_matrices * m.moe_ffn_hidden_size
        mine = {s for s in shapes if (s.k, s.n) in ((h, fc1), (m.moe_ffn_hidden_size, h))}
        for groups, rows in in_layer_shapes({(s.groups, s.rows) for s in mine}):
            for fp8 in precisions:
                got = grouped_rows_in_layer(m, groups, rows, device, fp8=fp8)
                if not got and fp8 is None:
                    got = [{**bench_grouped_gemm(s, device), "timing": "alone"}
                           for s in sorted(mine) if (s.groups, s.rows) == (groups, rows)]
                out += got
    return out


def permute_bytes(tokens: int, top_k: int, hidden: int, elem_bytes: int) -> float:
    """Forward bytes of the permutation as ``costmodel.moe_layer`` counts them at ep 1: the
    gather (read + write k·T rows), the padding copy in and out (2 × read + write R rows,
    R = k·T) and the combine (read k copies, write the token)."""
    kt = top_k * tokens
    return float((2 * kt + 4 * kt + (top_k + 1) * tokens) * hidden * elem_bytes)


def bench_permute(tokens: int, top_k: int, num_experts: int, hidden: int,
                  device: torch.device) -> dict[str, Any]:
    """Forward + backward of the executor's permutation (``executor/moe_permute.py``:
    ``sort_copies``, ``dispatch``, ``group_padding``, ``pad_rows`` / ``unpad_rows``,
    ``combine`` — what ``MoELayer._routed`` and ``GroupedExperts._grouped`` run) on T tokens
    with balanced random top-k routing; the expert GEMMs between them are left out (an
    identity)."""
    from meshplan.executor.moe_permute import (combine, dispatch, group_padding, pad_rows,
                                               sort_copies, unpad_rows)
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(0)
    experts = torch.rand(tokens, num_experts, generator=gen).topk(top_k, -1).indices.reshape(-1)
    experts = experts.to(device)
    gates = torch.rand(tokens * top_k, generator=gen).to(device)
    r = sort_copies(experts, None, tokens, top_k, num_experts)
    dest, _, total = group_padding(r.counts, tokens * top_k)
    x = torch.randn(tokens, hidden, device=device, dtype=dt, requires_grad=True)
    g = torch.randn(tokens, hidden, device=device, dtype=dt)

    def step():
        rows = dispatch(x, r)
        combine(unpad_rows(pad_rows(rows, dest, total), dest), gates, r).backward(g)
        x.grad = None

    # queued behind a spin on a GPU: the permutation's GPU time, which the cost model prices
    # by its bytes; timed in step with the host it read the CPU's dispatch of its ~30
    # operators (1.2-2.0 ms whatever the bytes on 1 x H200), which moe_host prices apart
    cuda = device.type == "cuda"
    t = time_fn(step, device=device, queued=cuda)
    fwd = permute_bytes(tokens, top_k, hidden, torch.finfo(dt).bits // 8)
    return {"tokens": tokens, "top_k": top_k, "experts": num_experts, "hidden": hidden,
            "model_bytes": 3.0 * fwd, "seconds": t.median_s, "iters": t.iters,
            "stream": "queued" if cuda else "cpu"}


def bench_host_sync(device: torch.device, *, count: int = 16, iters: int = HOST_ITERS
                    ) -> list[dict[str, Any]]:
    """``.item()`` and ``.tolist()`` on an idle stream and behind a queued spin (docstring)."""
    cuda = device.type == "cuda"
    scalar = torch.ones((), device=device)
    counts = torch.arange(count, device=device)
    reads = {"item": scalar.item, "tolist": counts.tolist}
    rows = []
    for name, read in reads.items():
        for _ in range(5):
            read()
        idle = []
        for _ in range(iters):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            read()
            idle.append(time.perf_counter() - t0)
        rows.append({"read": name, "stream": "idle", "seconds": statistics.median(idle),
                     "iters": iters})
        if not cuda:
            continue
        extra, spin = [], []
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(iters):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            e0.record()
            torch.cuda._sleep(SPIN_CYCLES)
            e1.record()
            read()
            wall = time.perf_counter() - t0
            d = e0.elapsed_time(e1) / 1e3
            spin.append(d)
            extra.append(wall - d)
        rows.append({"read": name, "stream": "queued", "seconds": statistics.median(extra),
                     "spin_s": statistics.median(spin), "iters": iters})
    return rows


def tiny_moe_spec(model: ModelSpec) -> ModelSpec:
    """``model``'s router and expert layout (experts, top-k, gates, biases) at hidden 64."""
    return replace(model, name=f"{model.name}-host", num_layers=1, hidden_size=TINY_HIDDEN,
                   num_heads=1, num_kv_heads=1, head_dim=None, ffn_hidden_size=2 * TINY_HIDDEN,
                   moe_ffn_hidden_size=TINY_HIDDEN, num_shared_experts=0,
                   shared_expert_ffn_hidden_size=None, dense_layers=(),
                   max_seq_len=TINY_TOKENS, mtp_layers=0, q_lora_rank=None, kv_lora_rank=None,
                   qk_nope_head_dim=None, qk_rope_head_dim=None, v_head_dim=None,
                   capacity_factor=None)


def bench_host_dispatch(model: ModelSpec, device: torch.device, sync_s: float, *,
                        iters: int = 20) -> dict[str, Any]:
    """CPU wall time of the executor's routed MoE layer forward + backward (tiny, ep 1);
    ``sync_s``: the queued sync time charged for each of its host syncs."""
    from meshplan.costmodel.moe_host import routed_ops, torch_syncs
    from meshplan.executor.moe import MoELayer
    spec = tiny_moe_spec(model)
    torch.manual_seed(0)
    layer = MoELayer(spec).to(device)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.02)
    cuda = device.type == "cuda"
    x = torch.randn(1, TINY_TOKENS, TINY_HIDDEN, device=device, requires_grad=True)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()

    def step():
        with amp:
            y = layer(x)
        y.float().sum().backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    walls = []
    for _ in range(iters):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
    lay = Layout()
    f, b = routed_ops(spec, lay, autocast=cuda)
    syncs = torch_syncs(spec, lay) if cuda else 0
    return {"model": model.name, "experts": spec.num_experts, "top_k": spec.experts_per_token,
            "seconds": statistics.median(walls), "ops": f + b, "syncs": syncs,
            "sync_s": sync_s if cuda else 0.0, "iters": iters}


def moe_micro_batches(quick: bool, micro_batches: tuple[int, ...] | None) -> tuple[int, ...]:
    """The micro-batches the MoE rows are timed at: 1 and 2 (quick: 1) and the layer
    tables' ``micro_batches``."""
    return (1,) if quick else tuple(sorted({1, 2, *(micro_batches or ())}))


def moe_rows(models: tuple[ModelSpec, ...], seq_len: int | None, device: torch.device,
             world: int, *, quick: bool = False, micro_batches: tuple[int, ...] | None = None
             ) -> dict[str, list[dict[str, Any]]]:
    """Every MoE row for the models with routed experts (none: empty lists), at
    :func:`moe_micro_batches`."""
    moes = [m for m in models if m.num_experts]
    out: dict[str, list[dict[str, Any]]] = {"grouped_gemm": [], "moe_permute": [],
                                            "host_sync": [], "host_dispatch": []}
    if not moes:
        return out
    shapes, perms = set(), set()
    mbs = moe_micro_batches(quick, micro_batches)
    for m in moes:
        seq = seq_len or m.max_seq_len
        shapes.update(expert_gemm_shapes(m, seq, world, quick=quick, micro_batches=mbs))
        for mb in mbs:
            perms.add((mb * seq, m.experts_per_token, m.num_experts, m.hidden_size))
    out["grouped_gemm"] = grouped_gemm_rows(moes, shapes, device)
    out["moe_permute"] = [bench_permute(*p, device) for p in sorted(perms)]
    out["host_sync"] = bench_host_sync(device, iters=20 if quick else HOST_ITERS)
    queued = [r["seconds"] for r in out["host_sync"] if r["stream"] == "queued"]
    sync_s = statistics.median(queued) if queued else 0.0
    out["host_dispatch"] = [bench_host_dispatch(m, device, sync_s, iters=10 if quick else 20)
                            for m in moes]
    return out


__all__ = ["GroupedGemmShape", "expert_gemm_shapes", "moe_micro_batches", "bench_grouped_gemm",
           "grouped_gemm_rows", "fp8_grouped_runnable", "in_layer_shapes", "SMALL_ROWS",
           "bench_permute", "permute_bytes", "bench_host_sync", "bench_host_dispatch",
           "moe_rows", "tiny_moe_spec"]
