"""Memory traffic of meshplan's own eager layer (runtime "torch"): the bytes its norms,
residual adds, activation, rotary embedding and layout copies move, counted op by op.

Why: the analytical count of :func:`meshplan.costmodel.compute.layer_cost` is a fused
kernel's (one read and one write per element: what Megatron-Core's TransformerEngine
kernels move). The executor (meshplan/executor/model.py, mlp.py) runs eager PyTorch: its
RMSNorm casts to fp32 and runs five separate kernels each way, RoPE builds the rotated half
with ``neg`` and ``cat`` and three more element-wise kernels, the grouped-query core repeats
K and V to the query heads, and backward concatenates the q/k/v and gate/up gradients. For
the 1.26B Llama-style model of the context-parallel GPU check (hidden 2048, 16 heads / 8 kv,
SwiGLU 5632, bf16) that is 0.95 MB per token and layer where the fused count says 0.26 MB:
0.14 s of each step's 131,072 tokens on 4 × H200 at 0.8 × 4.8 TB/s — what the GPU check's
rows missed (docs/benchmarks/cp_checks.md, "Outside attention").

Source: the executor's code, counted; ``tests/unit/test_torch_membound.py`` runs one
:class:`meshplan.executor.model.Block` (and GELU alone) forward and backward under
:class:`meshplan.executor.op_count.OpCounter` in bf16 and fp32 and checks the per-token
bytes against this module exactly (with GQA, plus the CPU kernel's layout copy below).
Each op reads its inputs and writes its output once (no
fusion, no cache reuse); an expanded (broadcast) input is read once.

Notation, per layer and micro-batch on one GPU, t = tp, σ = t with sequence parallelism
else 1: N = b·s·h/σ elements of the residual stream, r = b·s/σ its rows, F = b·s·f/t
elements of the MLP's activation output, Q = b·s·q_dim/t, K = b·s·kv_dim/t, R = b·s rows
of the RoPE tables of head dim d, rep = heads/kv_heads, e bytes per activation element,
a = 4 (fp32 statistics), c = 1 where e ≠ a (the fp32 casts exist), else 0:

    RMSNorm, each of 2     fwd  2c(e+a)·N + (5a + 2e)·N + 6a·r   x.float(), pow, mean, ·rsqrt,
                                                                .to(e), ·gain
                           bwd  2c(e+a)·N + (17a + 6e)·N + 10a·r  the chain back, the gain's
                                                                gradient (·, sum) included
    residual add, each of 2  fwd 3e·N; bwd 3e·N (the gradient of the branch point summed)
    SwiGLU                 fwd  5e·F (silu, ·up)    bwd 13e·F (two products, silu's backward,
                                                       the gate|up gradients concatenated)
    GELU (tanh)            fwd  2e·F                bwd 3e·F
    RoPE, on q and on k    fwd  10e·(Q + K) + 2·[2c(a+e) + 2e]·d·R   (neg, cat, two products,
                                                       add; cos/sin cast and read per call)
                           bwd  10e·(Q + K) + 2·2e·d·R
    q/k/v split            bwd  2e(Q + 2K)          their gradients concatenated
    GQA repeat (core)      fwd  [rep>1]·2e(K + Q)   bwd [rep>1]·2e(Q + K)  (repeat_interleave
                                                       of K and V; its backward sums)

The attention kernels and GEMMs are priced elsewhere; per-parameter traffic (the gains'
casts, autocast's weight casts) is not counted here. LayerNorm is torch's fused kernel:
it keeps the fused count. cuDNN's attention (torch SDPA on Hopper and Blackwell) writes its
output in q's layout, so the output's transpose-reshape is a view (the CPU kernel's too);
the CPU kernel returns the repeated K/V gradients in a layout the repeat's backward copies
first, 2e·Q with two or more kv heads (the test counts it apart). That cuDNN needs neither
copy is an assumption until benchmarks/eager_membound_gpu.py runs on a GPU.

Time: an op the profile timed (``membound_efficiency``: calibrate's benchmark of the
executor's own RMSNorm, activation and residual add, :mod:`meshplan.calibrate.bench_compute`)
keeps the fused count at its measured efficiency — the benchmark's bytes are the fused count,
so its efficiency already holds the extra passes; every other op is its counted bytes at the
profile's HBM bandwidth × ``hbm_efficiency`` (RoPE, the split and the repeat at the residual
add's efficiency where measured: plain element-wise copies like it). The core's GQA repeat
is the attention core's traffic (it runs inside what selective recompute re-runs, and the
context-parallel cores replace it: :mod:`meshplan.costmodel.ring_memory`).

Measured error: GPU check, 4 × H200, 10 layouts at 16k-64k tokens, runtime "torch",
datasheet profile (docs/benchmarks/cp_checks.md, "Outside attention", POST HOC: the
measurements were known): step time 9.3 % mean / 16.2 % max, all ten too fast, before this
count; 2.0 % / 4.3 % after (with the all-to-all core's copies, :mod:`.a2a_memory`), the
forward of a micro-batch within 2 ms of the measured one on the 16k-32k rows. The 0.8 HBM
efficiency is the datasheet's: calibrate's H200 benchmark of the same eager ops (round 26)
ran the RMSNorm's counted bytes at 0.62 and SwiGLU's at 0.47 of 4.8 TB/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costmodel.memory import layer_tp_params
from meshplan.hardware_profiles import GPUSpec
from meshplan.spec import ModelSpec

#: bytes of the executor's fp32 statistics (RMSNorm's x.float(), RoPE tables)
STAT_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class EagerBytes:
    """Bytes of one layer's pass groups (module docstring), per micro-batch on one GPU."""

    norm_fwd: float
    norm_bwd: float
    residual_fwd: float
    residual_bwd: float
    act_fwd: float
    act_bwd: float
    copies_fwd: float        # RoPE
    copies_bwd: float        # RoPE and the q/k/v split
    core_fwd: float          # the core's GQA repeat
    core_bwd: float
    rope_products: float = 0.0   # RoPE's neg/cat/products/add on q and k, inside copies_*

    @property
    def forward(self) -> float:
        return self.norm_fwd + self.residual_fwd + self.act_fwd + self.copies_fwd + self.core_fwd

    @property
    def backward(self) -> float:
        return self.norm_bwd + self.residual_bwd + self.act_bwd + self.copies_bwd + self.core_bwd


def eager_layer_bytes(model: ModelSpec, *, tokens: int, tp: int, sequence_parallel: bool,
                      mlp_width: int, e: int) -> EagerBytes:
    """The module docstring's counts for ``tokens`` = b·s tokens of one micro-batch."""
    a = STAT_BYTES
    c = 1 if e != a else 0
    sigma = tp if sequence_parallel else 1
    n, rows = tokens * model.hidden_size / sigma, tokens / sigma
    if model.norm == "rmsnorm":
        norm_f = 2 * ((2 * c * (e + a) + 5 * a + 2 * e) * n + 6 * a * rows)
        norm_b = 2 * ((2 * c * (e + a) + 17 * a + 6 * e) * n + 10 * a * rows)
    else:                                   # torch's fused LayerNorm: the fused count
        norm_f, norm_b = 2 * 2 * e * n, 2 * 4 * e * n
    f_el = tokens * mlp_width / tp
    if model.activation == "swiglu":
        act_f, act_b = 5 * e * f_el, 13 * e * f_el
    else:
        act_f, act_b = 2 * e * f_el, 3 * e * f_el
    q, k = tokens * model.q_dim / tp, tokens * model.kv_dim / tp
    copies_f, copies_b = 0.0, 2 * e * (q + 2 * k)
    products = 0.0
    if model.position_embedding == "rope":
        table = tokens * model.head_dim
        products = 10 * e * (q + k)
        copies_f += products + 2 * (2 * c * (a + e) + 2 * e) * table
        copies_b += products + 2 * 2 * e * table
    core = gqa_repeat_bytes(model, tokens=tokens, tp=tp, e=e)
    return EagerBytes(norm_fwd=norm_f, norm_bwd=norm_b, residual_fwd=2 * 3 * e * n,
                      residual_bwd=2 * 3 * e * n, act_fwd=act_f, act_bwd=act_b,
                      copies_fwd=copies_f, copies_bwd=copies_b, core_fwd=core, core_bwd=core,
                      rope_products=products)


def gqa_repeat_bytes(model: ModelSpec, *, tokens: int, tp: int, e: int) -> float:
    """Bytes of the core's repeat of K and V to the query heads, each pass (0 without
    grouped-query attention): 2e·(K + Q) of the module docstring."""
    if model.num_heads // model.num_kv_heads <= 1:
        return 0.0
    return 2 * e * tokens * (model.kv_dim + model.q_dim) / tp


def _fused_s(gpu: GPUSpec, op: str, fused_fwd_bytes: float) -> tuple[float, float] | None:
    """(forward s, backward s) of ``op`` at the profile's measured efficiency on the fused
    count (backward twice the forward bytes, as calibrate counts them); None if unmeasured."""
    eff = gpu.membound_efficiency.get(op)
    if eff is None:
        return None
    t = fused_fwd_bytes / (gpu.hbm_gbps * 1e9 * float(eff))
    return t, 2 * t


def eager_layer_s(model: ModelSpec, gpu: GPUSpec, *, tokens: int, tp: int,
                  sequence_parallel: bool, mlp_width: int, e: int
                  ) -> tuple[float, float, float, float]:
    """(forward memory-bound s, backward memory-bound s, forward core s, backward core s)
    of one layer and micro-batch under runtime "torch" (module docstring, "Time")."""
    eb = eager_layer_bytes(model, tokens=tokens, tp=tp, sequence_parallel=sequence_parallel,
                           mlp_width=mlp_width, e=e)
    bw = gpu.hbm_gbps * 1e9
    plain = bw * gpu.hbm_efficiency
    copy = bw * gpu.op_hbm_efficiency("residual-add")
    n = tokens * model.hidden_size / (tp if sequence_parallel else 1)
    f_el = tokens * mlp_width / tp
    fused_in = (2 if model.activation == "swiglu" else 1) * f_el
    fwd = bwd = 0.0
    for op, counted, fused in ((model.norm, (eb.norm_fwd, eb.norm_bwd), 4 * e * n),
                               ("residual-add", (eb.residual_fwd, eb.residual_bwd), 6 * e * n),
                               (model.activation, (eb.act_fwd, eb.act_bwd),
                                (fused_in + f_el) * e)):
        measured = _fused_s(gpu, op, fused)
        f_s, b_s = measured if measured else (counted[0] / plain, counted[1] / plain)
        fwd, bwd = fwd + f_s, bwd + b_s
    if gpu.microbench_timing == "queued":
        # GPU-alone curves (GPUSpec.microbench_timing): the work synchronized and datasheet
        # curves hold implicitly is added — the weights' gradient work, and RoPE's products
        # at the executor's RoPE rate (strided q/k views) where calibrate timed it
        bwd += weight_grad_bytes(model, tokens=tokens, tp=tp, mlp_width=mlp_width, e=e) / copy
        rope = (_fused_s(gpu, "rope", 2 * e * tokens * (model.q_dim + model.kv_dim) / tp)
                if model.position_embedding == "rope" else None)
        if rope is not None:
            fwd += rope[0] - eb.rope_products / copy
            bwd += rope[1] - eb.rope_products / copy
    fwd += eb.copies_fwd / copy
    bwd += eb.copies_bwd / copy
    return fwd, bwd, eb.core_fwd / copy, eb.core_bwd / copy


def weight_grad_bytes(model: ModelSpec, *, tokens: int, tp: int, mlp_width: int,
                      e: int) -> float:
    """What a layer's parameters' gradients move per micro-batch outside the GEMMs: each
    16-bit gradient cast to the fp32 parameter's dtype (autocast's cast backward: read e,
    write 4) and added into ``.grad`` (read 4 + 4, write 4; a calibration row accumulates
    on every iteration, a step's first micro-batch assigns instead: counted the same), and
    each bias's gradient summed over the tokens (the output gradient read once). Traced on
    1 × H200 (docs/benchmarks/calibration_checks.md, "What the composition misses"): 0.25 ms a layer
    for a 0.59 B GPT at micro-batch 4, 0.62 ms for a 2.68 B Llama at micro-batch 8."""
    a = STAT_BYTES
    per_param = (e + a if e != a else 0) + 3 * a
    biased = 0.0
    if model.bias:
        biased = ((model.q_dim + 2 * model.kv_dim + model.ffn_matrices * mlp_width) / tp
                  + model.hidden_size * (2 if mlp_width else 1))
    return layer_tp_params(model, tp, mlp_width) * per_param + tokens * biased * e


__all__ = ["EagerBytes", "STAT_BYTES", "eager_layer_bytes", "eager_layer_s",
           "weight_grad_bytes"]
