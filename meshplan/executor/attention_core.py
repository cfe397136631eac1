"""The pieces both attentions share: RMSNorm, rotary position embeddings, the attention
core and its selective recomputation.

:class:`meshplan.executor.model.Attention` (multi-head / grouped-query) and
:class:`meshplan.executor.mla.MLAttention` (multi-head latent attention) are built from
them; they live here, below both, so that model.py can use mla.py without an import cycle
(tests/unit/test_import_graph.py). model.py re-exports them under their old names.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

#: environment variable: ``flash`` forces flash-attention 2 for the context-parallel ring's
#: CUDA bf16/fp16 blocks instead of SDPA's own kernel choice (the default, ``sdpa``);
#: :mod:`meshplan.executor.context_parallel` reads it, the MLA check refuses it
RING_KERNEL_ENV = "MESHPLAN_RING_KERNEL"


def uneven_ring_refusal(dqk: int, dv: int, why: str) -> str:
    """The refusal of ring attention over a value head dim ``dv`` unlike the query-key one
    ``dqk`` (multi-head latent attention), ``why`` no kernel here takes it; the preflight
    check and the ring's kernel choice both word it so."""
    return (f"ring attention: the value head dim {dv} differs from the query-key head dim "
            f"{dqk} (multi-head latent attention), which flash-attention 2 does not take, "
            f"and {why}; use Layout(cp_style='all-to-all'), whose core is SDPA itself")


#: ``why`` of :func:`uneven_ring_refusal` where the environment forces flash-attention 2
FORCED_FLASH = f"{RING_KERNEL_ENV}=flash forces it (unset it)"


class RMSNorm(nn.Module):
    """Zhang & Sennrich 2019 (arXiv 1910.07467), eq. 4: x / rms(x) · g, statistics in fp32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        # cast before the gain so bf16 activations stay bf16 under autocast (fp32 gain)
        return y.to(x.dtype) * self.weight.to(x.dtype)


def rope_tables(seq_len: int, head_dim: int, *, base: float = 10000.0,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of rotary position embeddings (Su et al. 2021, arXiv 2104.09864, eq. 34).

    Pairs are (i, i + head_dim/2) ("rotate half"), as in GPT-NeoX and Hugging Face Llama.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device,
                                             dtype=torch.float32) / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)               # (s, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)        # (s, hd)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (b, nh, s, hd); cos/sin: (s, hd)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


class AttentionCore(nn.Module):
    """softmax(QKᵀ/√d)V with a causal mask; the part selective recompute re-runs.

    Korthikanti et al. 2022 (arXiv 2205.05198) §4.2: the attention core holds the
    5·a·s²·b activation bytes per layer that are cheap to recompute.
    """

    def forward(self, q, k, v):
        # q: (b, nh, s, hd); k, v: (b, nkv, s, hd) — v's head dim may differ (MLA's d_v)
        if k.shape[1] != q.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(rep, dim=1)    # (b, nh, s, hd)
            v = v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class _RecomputedCore(torch.autograd.Function):
    """Selective recomputation of the attention core: forward without keeping the core's
    intermediates, re-run it in backward from the saved q, k, v.

    Not ``torch.utils.checkpoint``: its recompute enters and leaves ``torch.autocast`` on the
    autograd engine's thread, where autocast's nesting count is 0, and leaving clears
    autocast's weight-cast cache, which every thread shares. Under a pipeline the next
    forward then casts every weight again while each in-flight micro-batch keeps its own
    casts (one extra copy of the stage's 16-bit weights per micro-batch in flight; measured
    2.1 GiB on a Llama-1.64B pp 2 rank, docs/benchmarks/accuracy.md round 12). The core
    has no weights and its inputs are already in the compute dtype, so the recompute here
    needs no autocast context at all.
    """

    @staticmethod
    def forward(ctx, core, q, k, v):
        ctx.core = core
        ctx.save_for_backward(q, k, v)
        with torch.no_grad():
            return core(q, k, v)

    @staticmethod
    def backward(ctx, grad_out):
        inputs = [t.detach().requires_grad_(need)
                  for t, need in zip(ctx.saved_tensors, ctx.needs_input_grad[1:])]
        with torch.enable_grad():
            out = ctx.core(*inputs)
        wanted = [t for t in inputs if t.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad_out) if wanted else ())
        return (None, *(next(grads) if t.requires_grad else None for t in inputs))


def recomputed_core(core: nn.Module, q, k, v):
    """``core(q, k, v)`` with its intermediates recomputed in backward (selective recompute).

    Inside ``torch.compile`` (a compiled block) and for the plain :class:`AttentionCore`, as
    ``torch.utils.checkpoint``, which dynamo traces into the block's one graph: the
    recompute then runs inside the compiled backward, with no autocast context entered or
    left at run time, so the cache :class:`_RecomputedCore` protects is not touched. Through
    :class:`_RecomputedCore` dynamo cannot trace the backward's ``torch.autograd.grad`` and
    splits the block into 5 graphs with the core eager, and the block's forward dispatched
    1.1-2.4 x the host time of the block without recomputation (22 compiled modules' rows,
    docs/benchmarks/host.md section 6). Eager, and for context parallelism's cores (their
    collectives), :class:`_RecomputedCore`."""
    if type(core) is AttentionCore and torch.compiler.is_compiling():
        from torch.utils.checkpoint import checkpoint
        return checkpoint(core, q, k, v, use_reentrant=False)
    return _RecomputedCore.apply(core, q, k, v)


__all__ = ["RMSNorm", "rope_tables", "apply_rope", "AttentionCore", "_RecomputedCore",
           "recomputed_core", "RING_KERNEL_ENV", "FORCED_FLASH", "uneven_ring_refusal"]
