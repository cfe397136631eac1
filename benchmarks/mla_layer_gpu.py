"""Multi-head latent attention's attention part on one tensor-parallel rank, timed on one GPU
piece by piece against the cost model's price of the same pieces (MLA has never been run:
meshplan.costmodel.mla says "Measured error: none").

What is priced (meshplan/costmodel/mla.py; DeepSeek-V2, arXiv 2405.04434 §2.1, eqs. 9-19;
DeepSeek-V3, arXiv 2412.19437 §2.1.1), with h hidden, n = n_h/tp heads on the rank, d_n / d_r
the non-rotary / rotary query-key head dims, d_v the value head dim, r_q / r_kv the latent
ranks, T tokens:

* GEMMs (``mla.gemm_shapes`` through ``compute.linear_shapes``, each ``compute.gemm_s`` of
  2mkn FLOPs, backward 2x): q down h → r_q and kv down with the shared rotary key
  h → r_kv + d_r, replicated on every tp rank; q up r_q → n(d_n + d_r) and kv up
  r_kv → n(d_n + d_v), column-parallel; the output n·d_v → h, row-parallel. Without
  ``q_lora_rank`` (DeepSeek-V2-Lite) one column-parallel h → n(d_n + d_r) query GEMM.
* Core (``compute.layer_cost``'s ``attention_s``): causal, 2(d_n + d_r + d_v) FLOPs a
  query-key pair and head (``mla.pair_flops``), half the pairs executed, at the GPU's one
  attention curve (``compute.kernel_head_dim``: None for MLA), backward 2.5x.
* RoPE (memory-bound, ``mla.rope_elements``): q's rotary part in place, and since
  2026-12-01 the key / value split Megatron-Core's fused kernel makes (the kv
  up-projection's output and the shared rotary key read, the key — rotary key broadcast to
  the heads — and the value written); taken from ``compute.layer_cost`` as the difference
  between the model's memory-bound forward and the same model's without RoPE. Measured:
  the eager rotate-half alone ("rope") and the splits and concatenations within "glue".
* The two latent RMSNorms (c_Q, c_KV; ``mla.latent_norm_elements``, in the layer's time
  since 2026-12-01, before: not priced): ``compute.hbm_s`` at the profile's norm
  efficiency, backward 2x, shown apart and kept out of the attention part's price.

The attention part's price is the cost model's: ``layer_cost(..., mlp_width=0)``'s GEMMs
and core plus its RoPE term (no tp communication, no layer overhead, no hidden-size norms
or residual adds: one GPU times one rank's share of the attention block). Measured, in
plain torch, bf16: each GEMM alone (``F.linear``, input and weight gradients by autograd),
the core (``F.scaled_dot_product_attention``, causal, q/k head dim d_n + d_r, v head dim
d_v) under each of the flash / efficient / cuDNN backends (``torch.nn.attention.
sdpa_kernel``; the fastest that runs is the core's time) and again with v zero-padded to
d_n + d_r and the output sliced back (what FlashAttention-style kernels need), RoPE
(rotate-half, eager), the latent norms (``F.rms_norm``), and the whole attention part
(the pieces plus the layout glue: splits, concatenations, the shared key broadcast to the
heads) with the fastest core. Forward, and forward + backward, each: CUDA events, median of
``--iters`` after 3 warm-ups, the GPU kept busy ahead of each timed call by large GEMMs
sized to the call's host enqueue time, so the time is the GPU's, not the launches'. Error =
predicted / measured - 1. Cases: DeepSeek-V3 at tp 1, 2, 4, 8 (seq 4096) and tp 1 at
seq 8192; DeepSeek-V2 (h 5120) and DeepSeek-V2-Lite (h 2048, 16 heads, no q latent;
huggingface.co/deepseek-ai/DeepSeek-V2-Lite config.json) at tp 1, seq 4096; micro-batch 1.

    python benchmarks/mla_layer_gpu.py --out $OUT                 # 1 x H200, ~1-2 minutes
    python benchmarks/mla_layer_gpu.py --out $OUT --profile PROFILE.toml   # calibrated price
    python benchmarks/mla_layer_gpu.py --estimate --out DIR       # the prices only, no GPU
    python benchmarks/mla_layer_gpu.py --device cpu --tiny --out DIR   # the code path, CPU

Prices on ``--preset`` (default dgx-h200: the datasheet H200) or with ``--profile`` a
calibrated profile of the same GPU (``calibrated.apply_profile``). Writes
``$OUT/mla_layer.json`` (measured fields null under ``--estimate``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplan.costmodel import compute, mla, window  # noqa: E402
from meshplan.costmodel.memory import activation_bytes_per_element  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.spec import Job, ModelSpec  # noqa: E402

# DeepSeek-V2-Lite's attention (huggingface.co/deepseek-ai/DeepSeek-V2-Lite config.json):
# DeepSeek-V2's head dims and kv latent, h 2048, 16 heads, queries not compressed
V2_LITE = dict(name="deepseek-v2-lite", hidden_size=2048, num_heads=16, num_kv_heads=16,
               q_lora_rank=None)
# a tiny MLA model: the code path on CPU (``--tiny``), nothing to compare
TINY = dict(name="tiny-mla", num_layers=1, hidden_size=64, num_heads=4, vocab_size=128,
            q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16, activation="swiglu", norm="rmsnorm", position_embedding="rope",
            bias=False)

# (case, model, tp, seq); micro-batch 1
CASES = [
    ("deepseek-v3 tp1 s4096", "deepseek-v3", 1, 4096),
    ("deepseek-v3 tp2 s4096", "deepseek-v3", 2, 4096),
    ("deepseek-v3 tp4 s4096", "deepseek-v3", 4, 4096),
    ("deepseek-v3 tp8 s4096", "deepseek-v3", 8, 4096),
    ("deepseek-v3 tp1 s8192", "deepseek-v3", 1, 8192),
    ("deepseek-v2 tp1 s4096", "deepseek-v2", 1, 4096),
    ("deepseek-v2-lite tp1 s4096", "deepseek-v2-lite", 1, 4096),
]
TINY_CASES = [
    ("tiny tp1 s64", "tiny-mla", 1, 64),
    ("tiny tp2 s64", "tiny-mla", 2, 64),
    ("tiny no-q-latent tp1 s64", "tiny-mla-noq", 1, 64),
]
MICRO_BATCH = 1
BACKENDS = ("flash", "efficient", "cudnn")
# mla.py: the down-projections replicated on every tp rank, the ups column-parallel, the
# output row-parallel; the order is mla.gemm_shapes'
GEMMS_Q_LATENT = (("q_up", "column"), ("q_down", "replicated"), ("kv_down", "replicated"),
                  ("kv_up", "column"), ("out", "row"))
GEMMS_NO_Q_LATENT = (("q", "column"), ("kv_down", "replicated"), ("kv_up", "column"),
                     ("out", "row"))


def model_of(name: str) -> ModelSpec:
    if name == "deepseek-v2-lite":
        return replace(ModelSpec.preset("deepseek-v2"), **V2_LITE)
    if name == "tiny-mla":
        return ModelSpec(**TINY)
    if name == "tiny-mla-noq":
        return ModelSpec(**{**TINY, "name": name, "q_lora_rank": None})
    return ModelSpec.preset(name)


def gemm_names(model: ModelSpec) -> tuple[tuple[str, str], ...]:
    return GEMMS_NO_Q_LATENT if model.q_lora_rank is None else GEMMS_Q_LATENT


def cluster_of(preset: str, profile: str | None) -> Cluster:
    """``preset`` (8 GPUs a node, so every tp here has a link), with ``profile``'s GPU."""
    cluster = Cluster.preset(preset)
    if profile:
        from meshplan.hardware_profiles.calibrated import apply_profile
        cluster = apply_profile(cluster, profile)
    return cluster


def _piece(name: str, parallel: str, fwd: float, fwd_bwd: float, flops: float | None,
           in_layer: bool, **extra) -> dict:
    return {"piece": name, "parallel": parallel, "flops_fwd_bwd": flops,
            "predicted_fwd_s": fwd, "predicted_fwd_bwd_s": fwd_bwd, "in_layer_price": in_layer,
            **extra, "measured_fwd_s": None, "measured_fwd_bwd_s": None,
            "error_fwd": None, "error_fwd_bwd": None}


def prices(model: ModelSpec, cluster: Cluster, tp: int, seq: int,
           micro_batch: int = MICRO_BATCH) -> dict:
    """The cost model's price of the case's pieces and of the attention part (seconds)."""
    job = Job(global_batch=micro_batch, seq_len=seq)
    kw = dict(micro_batch=micro_batch, tp=tp, sequence_parallel=False, recompute="none",
              tp_link=cluster.group_link(tp, 1), mlp_width=0)
    layer = compute.layer_cost(model, cluster, job, **kw)
    no_rope = compute.layer_cost(replace(model, position_embedding="learned"), cluster, job,
                                 **kw)
    fwd, bwd = layer.forward, layer.backward
    gpu = cluster.gpu
    peak = gpu.peak_flops(compute.sixteen_bit_precision(job))
    gemm_bwd = bwd.gemm_s / fwd.gemm_s          # layer_cost: data + weight gradients, 2x
    mb_bwd = bwd.memory_bound_s / fwd.memory_bound_s
    pieces = []
    linears = compute.linear_shapes(model, job, micro_batch, tp, mlp_width=0)
    names = gemm_names(model)
    assert len(linears) == len(names), (linears, names)
    for (name, parallel), ((m, k, n), _) in zip(names, linears):
        g = compute.gemm_s(gpu, peak, 2.0 * m * k * n)
        pieces.append(_piece(name, parallel, g, g * (1 + gemm_bwd),
                             2.0 * m * k * n * (1 + gemm_bwd), True, shape=[m, k, n]))
    executed = sum(share * frac for share, frac in window.layer_mix(model, seq))
    core_flops = micro_batch * seq * seq * mla.pair_flops(model, tp) * executed
    core_flops *= 1 + compute.FLASH_BACKWARD_FACTOR
    core = (fwd.attention_s, fwd.attention_s + bwd.attention_s)
    pieces.append(_piece("core", "heads", *core, core_flops, True))
    pieces.append(_piece("core_pad_v", "heads", *core, core_flops, False,
                         note="v padded to d_n + d_r: priced as the core"))
    rope = (fwd.memory_bound_s - no_rope.forward.memory_bound_s,
            fwd.memory_bound_s - no_rope.forward.memory_bound_s
            + bwd.memory_bound_s - no_rope.backward.memory_bound_s)
    pieces.append(_piece("rope", "heads", *rope, None, True))
    e = activation_bytes_per_element(job)
    norms = compute.hbm_s(gpu, e * micro_batch * seq * mla.latent_norm_elements(model),
                          model.norm)
    pieces.append(_piece("latent_norms", "replicated", norms, norms * (1 + mb_bwd), None,
                         False, note="in the layer's time, not in the attention part's"))
    in_layer = [p for p in pieces if p["in_layer_price"]]
    attention = {
        "predicted_fwd_s": fwd.gemm_s + fwd.attention_s + rope[0],
        "predicted_fwd_bwd_s": (fwd.gemm_s + fwd.attention_s + bwd.gemm_s + bwd.attention_s
                                + rope[1]),
        "predicted_with_latent_norms_fwd_s": None, "predicted_with_latent_norms_fwd_bwd_s": None,
        "sum_of_in_layer_pieces_fwd_s": sum(p["predicted_fwd_s"] for p in in_layer),
        "sum_of_in_layer_pieces_fwd_bwd_s": sum(p["predicted_fwd_bwd_s"] for p in in_layer),
        "core_variant": None, "measured_fwd_s": None, "measured_fwd_bwd_s": None,
        "error_fwd": None, "error_fwd_bwd": None,
        "error_with_latent_norms_fwd": None, "error_with_latent_norms_fwd_bwd": None,
        "measured_unpriced_remainder_fwd_s": None, "measured_unpriced_remainder_fwd_bwd_s": None}
    attention["predicted_with_latent_norms_fwd_s"] = attention["predicted_fwd_s"] + norms
    attention["predicted_with_latent_norms_fwd_bwd_s"] = (attention["predicted_fwd_bwd_s"]
                                                          + norms * (1 + mb_bwd))
    # the layer_cost terms this check leaves out (one GPU: no tp communication; the
    # hidden-size norms and residual adds belong to the layer, not the attention part)
    left_out = {"forward_tp_comm_s": fwd.tp_comm_s, "forward_overhead_s": fwd.overhead_s,
                "forward_other_memory_bound_s": fwd.memory_bound_s - rope[0]}
    return {"pieces": pieces, "attention": attention, "layer_cost_left_out": left_out,
            "layer_cost_forward_gemm_s": fwd.gemm_s,
            "layer_cost_forward_attention_s": fwd.attention_s}


def case_record(cluster: Cluster, name: str, model_name: str, tp: int, seq: int) -> dict:
    model = model_of(model_name)
    if model.num_heads % tp:
        raise SystemExit(f"{name}: {model.num_heads} heads do not split over tp {tp}")
    dims = {"h": model.hidden_size, "heads": model.num_heads, "q_lora_rank": model.q_lora_rank,
            "kv_lora_rank": model.kv_lora_rank, "qk_nope_head_dim": model.qk_nope_head_dim,
            "qk_rope_head_dim": model.qk_rope_head_dim, "v_head_dim": model.v_head_dim}
    return {"case": name, "model": model.name, "tp": tp, "micro_batch": MICRO_BATCH,
            "seq": seq, "tokens": MICRO_BATCH * seq, "heads_per_rank": model.num_heads // tp,
            "dims": dims, **prices(model, cluster, tp, seq)}


# ---- measurement ----------------------------------------------------------------------

class Timer:
    """Median seconds of a step: CUDA events with the queue filled ahead by large GEMMs
    (sized to the step's host enqueue time) on CUDA, ``perf_counter`` on CPU."""

    def __init__(self, torch, device: str, iters: int, warmup: int = 3):
        self.t, self.dev, self.iters, self.warmup = torch, device, iters, warmup
        self.cuda = torch.device(device).type == "cuda"
        self.big_s = 0.0
        if self.cuda:
            self.big = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
            self.big_out = torch.empty_like(self.big)
            self.big_s = self._time_big()

    def _time_big(self) -> float:
        t = self.t
        for _ in range(3):
            t.mm(self.big, self.big, out=self.big_out)
        times = []
        for _ in range(5):
            a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            a.record()
            t.mm(self.big, self.big, out=self.big_out)
            b.record()
            t.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return statistics.median(times)

    def __call__(self, step) -> dict:
        """{"gpu_s" (or the CPU's seconds), "host_s", "cover_gemms"}: medians."""
        t = self.t
        host = 0.0
        for _ in range(self.warmup):
            if self.cuda:
                t.cuda.synchronize()
            h0 = time.perf_counter()
            step()
            host = time.perf_counter() - h0
        if not self.cuda:
            times = []
            for _ in range(self.iters):
                h0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - h0)
            return {"gpu_s": statistics.median(times), "host_s": statistics.median(times),
                    "cover_gemms": 0}
        t.cuda.synchronize()
        cover = min(64, 1 + math.ceil(1.5 * host / self.big_s))
        gpu, hosts = [], []
        for _ in range(self.iters):
            for _ in range(cover):       # the GPU busy while the host enqueues the step
                t.mm(self.big, self.big, out=self.big_out)
            a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            a.record()
            h0 = time.perf_counter()
            step()
            hosts.append(time.perf_counter() - h0)
            b.record()
            t.cuda.synchronize()
            gpu.append(a.elapsed_time(b) / 1e3)
        return {"gpu_s": statistics.median(gpu), "host_s": statistics.median(hosts),
                "cover_gemms": cover}


class MLARank:
    """One tp rank's attention part of ``model`` in plain torch (bf16, micro-batch 1)."""

    def __init__(self, torch, model: ModelSpec, tp: int, seq: int, device: str):
        t, bf = torch, torch.bfloat16
        self.t, self.F = t, t.nn.functional
        self.T, self.h, self.n = seq, model.hidden_size, model.num_heads // tp
        self.dn, self.dr, self.dv = (model.qk_nope_head_dim, model.qk_rope_head_dim,
                                     model.v_head_dim)
        self.rq, self.rkv = model.q_lora_rank, model.kv_lora_rank
        dev = t.device(device)
        n, dqk = self.n, self.dn + self.dr

        def w(out_f, in_f):
            return (t.randn(out_f, in_f, device=dev, dtype=bf) * in_f ** -0.5).requires_grad_()
        self.w = {}
        if self.rq is None:
            self.w["q"] = w(n * dqk, self.h)
        else:
            self.w["q_up"], self.w["q_down"] = w(n * dqk, self.rq), w(self.rq, self.h)
            self.q_norm = t.ones(self.rq, device=dev, dtype=bf, requires_grad=True)
        self.w["kv_down"] = w(self.rkv + self.dr, self.h)
        self.w["kv_up"] = w(n * (self.dn + self.dv), self.rkv)
        self.w["out"] = w(self.h, n * self.dv)
        self.kv_norm = t.ones(self.rkv, device=dev, dtype=bf, requires_grad=True)
        pos = t.arange(seq, device=dev, dtype=t.float32)[:, None]
        inv = 10000.0 ** (-t.arange(0, self.dr, 2, device=dev, dtype=t.float32) / self.dr)
        ang = t.cat([pos * inv, pos * inv], -1)[:, None, :]          # (T, 1, d_r)
        self.cos, self.sin = ang.cos().to(bf), ang.sin().to(bf)
        self.dev, self.bf = dev, bf
        self._grad_cache = {}
        self.leaves = list(self.w.values()) + [self.kv_norm] + (
            [self.q_norm] if self.rq is not None else [])

    def rand(self, *shape, grad: bool = True):
        return self.t.randn(*shape, device=self.dev, dtype=self.bf).requires_grad_(grad)

    # -- the computation ------------------------------------------------------------
    def rope(self, x):
        """Rotate-half RoPE of (T, heads, d_r) by the (T, 1, d_r) tables."""
        x1, x2 = x.chunk(2, -1)
        return x * self.cos + self.t.cat([-x2, x1], -1) * self.sin

    def rms(self, x, weight):
        return self.F.rms_norm(x, (x.shape[-1],), weight, 1e-6)

    def core(self, q, k, v, backend: str, pad: bool):
        """Causal SDPA of (T, heads, d) q, k, v under one backend; (T, heads·d_v)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kind = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend]
        qb, kb, vb = (x.unsqueeze(0).transpose(1, 2) for x in (q, k, v))
        if pad:
            vb = self.F.pad(vb, (0, q.shape[-1] - v.shape[-1]))
        with sdpa_kernel([kind]):
            o = self.F.scaled_dot_product_attention(qb, kb, vb, is_causal=True)
        if pad:
            o = o[..., :v.shape[-1]]
        return o.transpose(1, 2).reshape(self.T, self.n * v.shape[-1])

    def forward(self, x, backend: str, pad: bool):
        F, t, w, n, T = self.F, self.t, self.w, self.n, self.T
        if self.rq is None:
            q = F.linear(x, w["q"])
        else:
            q = F.linear(self.rms(F.linear(x, w["q_down"]), self.q_norm), w["q_up"])
        c_kv, k_r = F.linear(x, w["kv_down"]).split([self.rkv, self.dr], -1)
        kv = F.linear(self.rms(c_kv, self.kv_norm), w["kv_up"]).view(T, n, self.dn + self.dv)
        q_n, q_r = q.view(T, n, self.dn + self.dr).split([self.dn, self.dr], -1)
        q = t.cat([q_n, self.rope(q_r)], -1)
        k_n, v = kv.split([self.dn, self.dv], -1)
        k = t.cat([k_n, self.rope(k_r.unsqueeze(1)).expand(T, n, self.dr)], -1)
        return F.linear(self.core(q, k, v, backend, pad), w["out"])

    # -- the timed steps: (forward, forward + backward) -------------------------------
    def _steps(self, run, leaves):
        t = self.t

        def fwd():
            run()

        def fwd_bwd():
            for leaf in leaves:
                leaf.grad = None
            outs = run()
            t.autograd.backward(outs, self._grads(outs))
        return fwd, fwd_bwd

    def _grads(self, outs):
        """Output gradients, one random tensor per output shape, made once."""
        key = tuple(tuple(o.shape) for o in outs)
        if key not in self._grad_cache:
            self._grad_cache[key] = [self.t.randn_like(o) for o in outs]
        return self._grad_cache[key]

    def gemm_steps(self, name: str):
        weight = self.w[name]
        x = self.rand(self.T, weight.shape[1])
        return self._steps(lambda: (self.F.linear(x, weight),), [x, weight])

    def core_steps(self, backend: str, pad: bool):
        n, dqk = self.n, self.dn + self.dr
        q, k = self.rand(self.T, n, dqk), self.rand(self.T, n, dqk)
        kv = self.rand(self.T, n, self.dn + self.dv)      # v a slice of kv, as in the layer
        return self._steps(lambda: (self.core(q, k, kv[..., self.dn:], backend, pad),),
                           [q, k, kv])

    def rope_steps(self):
        q = self.rand(self.T, self.n, self.dn + self.dr)
        k_r = self.rand(self.T, self.dr)
        return self._steps(lambda: (self.rope(q[..., self.dn:]), self.rope(k_r.unsqueeze(1))),
                           [q, k_r])

    def norm_steps(self):
        c_kv = self.rand(self.T, self.rkv + self.dr)
        leaves = [c_kv, self.kv_norm]
        if self.rq is None:
            return self._steps(lambda: (self.rms(c_kv[..., :self.rkv], self.kv_norm),), leaves)
        c_q = self.rand(self.T, self.rq)
        return self._steps(lambda: (self.rms(c_q, self.q_norm),
                                    self.rms(c_kv[..., :self.rkv], self.kv_norm)),
                           leaves + [c_q, self.q_norm])

    def attention_steps(self, backend: str, pad: bool):
        x = self.rand(self.T, self.h)
        return self._steps(lambda: (self.forward(x, backend, pad),), [x] + self.leaves)


def _error(pred, meas):
    return None if pred is None or not meas else pred / meas - 1


def _timed(timer: Timer, steps) -> dict:
    fwd, fwd_bwd = steps
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f, fb = timer(fwd), timer(fwd_bwd)
    return {"fwd_s": f["gpu_s"], "fwd_bwd_s": fb["gpu_s"], "fwd_host_s": f["host_s"],
            "fwd_bwd_host_s": fb["host_s"], "cover_gemms": [f["cover_gemms"],
                                                            fb["cover_gemms"]]}


def _fill(rec: dict, m: dict) -> None:
    rec["measured_fwd_s"], rec["measured_fwd_bwd_s"] = m["fwd_s"], m["fwd_bwd_s"]
    rec["error_fwd"] = _error(rec["predicted_fwd_s"], m["fwd_s"])
    rec["error_fwd_bwd"] = _error(rec["predicted_fwd_bwd_s"], m["fwd_bwd_s"])
    rec["host_s"] = [m["fwd_host_s"], m["fwd_bwd_host_s"]]


def _err_text(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def measure(torch, rec: dict, timer: Timer, device: str, backends) -> None:
    """Times the case's pieces and its attention part; fills ``rec``'s measured fields."""
    model = model_of(rec["model"])
    rank = MLARank(torch, model, rec["tp"], rec["seq"], device)
    by = {p["piece"]: p for p in rec["pieces"]}
    for name, _ in gemm_names(model):
        _fill(by[name], _timed(timer, rank.gemm_steps(name)))
    best = {}
    for piece, pad in (("core", False), ("core_pad_v", True)):
        runs = {}
        tried = list(backends)
        for backend in tried + ["math"]:
            if backend == "math" and any("fwd_bwd_s" in r for r in runs.values()):
                break                     # the reference kernel only where none other runs
            try:
                runs[backend] = _timed(timer, rank.core_steps(backend, pad))
            except Exception as exc:  # noqa: BLE001 - recorded; the other backends still run
                runs[backend] = {"error": _err_text(exc)}
            if timer.cuda:
                torch.cuda.empty_cache()
        by[piece]["backends"] = runs
        ok = {b: r for b, r in runs.items() if "fwd_bwd_s" in r}
        if ok:
            b = min(ok, key=lambda k: ok[k]["fwd_bwd_s"])
            by[piece]["backend"] = b
            _fill(by[piece], ok[b])
            best[piece] = (ok[b]["fwd_bwd_s"], b, pad)
    _fill(by["rope"], _timed(timer, rank.rope_steps()))
    _fill(by["latent_norms"], _timed(timer, rank.norm_steps()))
    att = rec["attention"]
    if not best:
        att["error"] = "no SDPA backend ran"
        return
    _, backend, pad = min(best.values())
    att["core_variant"] = f"{backend}{' v padded' if pad else ''}"
    _fill(att, _timed(timer, rank.attention_steps(backend, pad)))
    for mode in ("fwd", "fwd_bwd"):
        meas = att[f"measured_{mode}_s"]
        att[f"error_with_latent_norms_{mode}"] = _error(
            att[f"predicted_with_latent_norms_{mode}_s"], meas)
        core = "core_pad_v" if pad else "core"
        parts = [p for p in rec["pieces"] if p["piece"] not in ("core", "core_pad_v")]
        summed = sum(p[f"measured_{mode}_s"] for p in parts) + by[core][f"measured_{mode}_s"]
        att[f"measured_unpriced_remainder_{mode}_s"] = meas - summed


# ---- output ---------------------------------------------------------------------------

def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:8.3f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:+6.1f}%"


def table(cases: list[dict]) -> str:
    head = (f"{'piece':14s} {'parallel':10s} {'pred fwd':>9s} {'meas fwd':>9s} {'err':>7s} "
            f"{'pred f+b':>9s} {'meas f+b':>9s} {'err':>7s}  note")
    lines = []
    for c in cases:
        lines += ["", f"{c['case']}: {c['heads_per_rank']} heads a rank, {c['tokens']} tokens"
                  f" (ms; err = predicted/measured - 1)", head]
        rows = [(p["piece"], p["parallel"], p) for p in c["pieces"]]
        rows.append(("attention", "", c["attention"]))
        for name, par, p in rows:
            note = []
            if p.get("backend"):
                note.append(p["backend"])
            if name == "attention" and p.get("core_variant"):
                note.append(f"core: {p['core_variant']}")
            if not p.get("in_layer_price", True):
                note.append("not in the layer's price")
            lines.append(f"{name:14s} {par:10s} {_ms(p['predicted_fwd_s']):>9s} "
                         f"{_ms(p['measured_fwd_s']):>9s} {_pct(p['error_fwd']):>7s} "
                         f"{_ms(p['predicted_fwd_bwd_s']):>9s} "
                         f"{_ms(p['measured_fwd_bwd_s']):>9s} {_pct(p['error_fwd_bwd']):>7s}"
                         f"  {'; '.join(note)}")
        a = c["attention"]
        lines.append(f"{'+latent norms':14s} {'':10s} "
                     f"{_ms(a['predicted_with_latent_norms_fwd_s']):>9s} {'':>9s} "
                     f"{_pct(a['error_with_latent_norms_fwd']):>7s} "
                     f"{_ms(a['predicted_with_latent_norms_fwd_bwd_s']):>9s} {'':>9s} "
                     f"{_pct(a['error_with_latent_norms_fwd_bwd']):>7s}")
        if a.get("measured_unpriced_remainder_fwd_s") is not None:
            lines.append(f"{'glue (meas.)':14s} {'':10s} {'':>9s} "
                         f"{_ms(a['measured_unpriced_remainder_fwd_s']):>9s} {'':>7s} "
                         f"{'':>9s} {_ms(a['measured_unpriced_remainder_fwd_bwd_s']):>9s}"
                         f"  layer - sum of its pieces timed alone")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for mla_layer.json")
    ap.add_argument("--estimate", action="store_true", help="the prices only, no GPU")
    ap.add_argument("--preset", default="dgx-h200", help="cluster preset priced")
    ap.add_argument("--profile", default=None, help="a calibrated profile (.toml) of its GPU")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes: the code path only")
    ap.add_argument("--backends", default=",".join(BACKENDS),
                    help="SDPA backends to try, comma-separated (math is tried where none runs)")
    args = ap.parse_args(argv)
    cluster = cluster_of(args.preset, args.profile)
    torch, device_name = None, "none"
    if not args.estimate:
        import torch
        if args.device.startswith("cuda"):
            if not torch.cuda.is_available():
                raise SystemExit("no CUDA device: use --estimate, or --device cpu --tiny")
            device_name = torch.cuda.get_device_name(0)
        else:
            device_name = args.device
    cases = TINY_CASES if args.tiny else CASES
    backends = [b for b in args.backends.split(",") if b]
    timer = None
    if torch is not None:
        torch.manual_seed(0)
        timer = Timer(torch, args.device, args.iters, warmup=min(3, args.iters))
    meta = {"device": device_name, "preset": cluster.name, "gpu": cluster.gpu.name,
            "profile": args.profile, "estimate": args.estimate, "tiny": args.tiny,
            "torch": getattr(torch, "__version__", None),
            "cudnn": torch.backends.cudnn.version() if timer is not None and timer.cuda else None,
            "iters": None if args.estimate else args.iters,
            "cover_gemm_s": timer.big_s if timer is not None else None}
    out = []
    for name, model_name, tp, seq in cases:
        rec = case_record(cluster, name, model_name, tp, seq)
        if torch is not None:
            try:
                measure(torch, rec, timer, args.device, backends)
            except Exception as exc:  # noqa: BLE001 - recorded; what was measured is kept
                rec["error"] = _err_text(exc)
            if timer.cuda:
                torch.cuda.empty_cache()
        out.append(rec)
        print(table([rec]) + (f"\n{name}: {rec['error']}" if "error" in rec else ""),
              flush=True)
        if args.out:                 # after every case: a later failure keeps these
            path = Path(args.out)
            path.mkdir(parents=True, exist_ok=True)
            (path / "mla_layer.json").write_text(json.dumps({**meta, "cases": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
