"""Context parallelism: attention over sequences whose tokens are split over the cp ranks.

:func:`meshplan.executor.data.shard_sequence` cuts every sequence into 2·cp chunks and gives
cp rank r chunks r and 2·cp−1−r (load balancing under the causal mask, as Megatron-Core and
TransformerEngine do). Everything but attention works token by token and runs unchanged on
the local tokens; positions (RoPE or learned) come from :meth:`Transformer.set_positions`.
:func:`apply_context_parallel` puts one of two attention cores on every ``Attention.core``:

* **ring** (:class:`RingAttentionCore`), Ring Attention (Liu, Zaharia & Abbeel 2023, arXiv
  2310.01889): each rank keeps its queries and passes its key/value block to the next rank
  of the cp ring, cp−1 times per pass (p2p ``batch_isend_irecv``; the next block's transfer
  runs while the current block is computed). Block results merge by the online-softmax
  rule (Milakov & Gimelshein 2018, arXiv 1805.02867; FlashAttention, Dao et al. 2022, arXiv
  2205.14135 §3.1): for block outputs o₁, o₂ with log-sum-exps l₁, l₂,
  l = log(e^l₁ + e^l₂) and o = e^(l₁−l)·o₁ + e^(l₂−l)·o₂. With the load-balanced order, at
  step i rank r holds the block of rank src = (r − i) mod cp and computes (as TE and torch's
  ring do): i = 0, its local queries over its local keys, causal; src < r, all local
  queries over the block's first chunk (its second chunk is in every local query's future);
  src > r, the second local chunk's queries over the whole block — half a block's work on
  every rank at every step after the first. Backward is an autograd function of its own:
  the ring runs again and each rank computes its block's dQ, dK, dV from the saved global
  output and log-sum-exp (FlashAttention-2's backward, Dao 2023, arXiv 2307.08691 Alg. 2);
  dK/dV accumulators travel with their key/value block and reach their owner after cp
  steps. Per pass: forward cp−1 K/V exchanges; backward cp−1 K/V exchanges and cp dK/dV
  exchanges. K/V travel with the key/value heads only (GQA: 2·nkv·d values per token) and
  are repeated to the query heads inside a block.

* **all-to-all** (:class:`AllToAllAttentionCore`), DeepSpeed-Ulysses (Jacobs et al. 2023,
  arXiv 2309.14509): all-to-alls turn q, k and v from (local tokens, all heads) into (all
  tokens, heads/cp), the ordinary causal SDPA runs on whole sequences, and one all-to-all
  turns the output back — 4 all-to-alls in forward and their 4 adjoints in backward. The
  gathered tokens arrive in load-balanced order and are put in sequence order around the
  attention (TransformerEngine's a2a context parallelism does the same).

Block kernels (forward returns the log-sum-exp; backward takes the merged output and
log-sum-exp): on CUDA in bf16/fp16 the fused kernel SDPA itself would pick for the local
block (``torch._fused_sdp_choice``): cuDNN's (``aten._scaled_dot_product_cudnn_attention``)
where SDPA prefers it — Hopper and Blackwell with cuDNN > 9.15 (torch's sdp_utils.cpp
``check_prefer_cudnn_attention``; torch 2.11's CUDA 13 wheels) — else flash-attention 2
(``aten._scaled_dot_product_flash_attention``); both are kernels torch's experimental
``context_parallel`` calls. On 1 × H200 (``benchmarks/cp_ring_kernels_gpu.py``, 2026-11-28)
cuDNN's block took 26 ms where flash-attention 2 took 48 ms at 16k local tokens, with the
same numerics against fp32; ``MESHPLAN_RING_KERNEL=flash`` forces flash-attention 2, the
kernel of the first GPU check (docs/benchmarks/cp_checks.md). The ring thus runs the kernel
the rest of the model's attention (and the cost model's attention curve) runs. On CPU the
CPU flash kernel; else (CUDA fp32) an explicit math kernel. torch's ``context_parallel`` itself is not used: it handles only the
CUDA SDPA ops (so the CPU gloo tests could not exercise the code the GPUs run), its
default rotation all-gathers K/V instead of passing them around a ring, it sees K/V after
the GQA repeat (nh/nkv times the bytes), and its context manager reshards buffers in place
across forward and backward, which a pipeline schedule interleaves.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.attention import SDPBackend

from meshplan.errors import ConfigError, ExecutorError
from meshplan.executor.attention_core import FORCED_FLASH, RING_KERNEL_ENV, uneven_ring_refusal
from meshplan.executor.data import load_balanced_positions
from meshplan.executor.functional_comm import all_to_all
from meshplan.executor.model import AttentionCore, Transformer

aten = torch.ops.aten
_KV_TAG, _DKV_TAG = 0, 1


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    """Accumulate softmax statistics and gradients in fp32 (fp64 stays fp64)."""
    return torch.promote_types(t.dtype, torch.float32)


# ---- block kernels: (q, k, v, causal) -> (out, lse); backward from the global out, lse ----
class _MathKernel:
    """softmax(QKᵀ/√d)V with explicit scores, in fp32 or wider (CUDA fp32; tests)."""

    def forward(self, q, k, v, causal):
        s = self._scores(q, k, causal)
        lse = torch.logsumexp(s, dim=-1)
        return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.to(s.dtype)).to(q.dtype), lse

    def backward(self, dout, q, k, v, out, lse, causal):
        s = self._scores(q, k, causal)
        p = torch.exp(s - lse.to(s.dtype).unsqueeze(-1))
        do, vf = dout.to(s.dtype), v.to(s.dtype)
        dv = torch.matmul(p.transpose(-2, -1), do)
        delta = (do * out.to(s.dtype)).sum(-1, keepdim=True)
        ds = p * (torch.matmul(do, vf.transpose(-2, -1)) - delta) * q.shape[-1] ** -0.5
        return (torch.matmul(ds, k.to(s.dtype)), torch.matmul(ds.transpose(-2, -1), q.to(s.dtype)),
                dv)

    @staticmethod
    def _scores(q, k, causal):
        acc = _acc_dtype(q)
        s = torch.matmul(q.to(acc), k.to(acc).transpose(-2, -1)) * q.shape[-1] ** -0.5
        if causal:
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
        return s


class _CpuKernel:
    def forward(self, q, k, v, causal):
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)

    def backward(self, dout, q, k, v, out, lse, causal):
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, causal)


class _FlashKernel:
    """The CUDA flash kernel; keeps the random-state outputs of a forward for the backward
    (unused without dropout, but the op takes them), as torch's ring attention does."""

    rng: tuple = (None, None)

    def forward(self, q, k, v, causal):
        r = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)
        self.rng = (r[6], r[7])
        return r[0], r[1]

    def backward(self, dout, q, k, v, out, lse, causal):
        return aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, None, None, q.shape[2], k.shape[2], 0.0, causal, *self.rng)


class _CudnnKernel:
    """cuDNN's fused attention; keeps a forward's sequence and random-state outputs for the
    backward, as torch's ring attention does. Its log-sum-exp is (b, h, s, 1)."""

    saved: tuple = ()

    def forward(self, q, k, v, causal):
        r = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False)
        self.saved = (r[2], r[3], r[6], r[7])
        lse = r[1]
        return r[0], lse.squeeze(-1) if lse.dim() == q.dim() else lse

    def backward(self, dout, q, k, v, out, lse, causal):
        cum_q, cum_k, seed, offset = self.saved
        return aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse.unsqueeze(-1), seed, offset, None, cum_q, cum_k,
            q.shape[2], k.shape[2], 0.0, causal)


KERNELS = {"math": _MathKernel, "cpu": _CpuKernel, "flash": _FlashKernel,
           "cudnn": _CudnnKernel}



def block_kernel(q: torch.Tensor, v: torch.Tensor | None = None):
    """The block kernel for ``q``'s device and dtype. On CUDA in bf16/fp16: the kernel SDPA
    itself would pick for the local block (cuDNN's where torch prefers it: 1.85x as fast as
    flash-attention 2 on H200), or flash-attention 2 with ``MESHPLAN_RING_KERNEL=flash``.

    ``v`` (the block's values) matters where its head dim differs from q's — multi-head
    latent attention's d_v against d_n + d_r: neither flash kernel (CPU or CUDA) takes that,
    so on CPU the explicit math kernel runs, and on CUDA cuDNN's where SDPA picks it for
    these dims (it ran MLA's natively on one H200: docs/benchmarks/moe_checks.md "MLA on one
    H200"); otherwise an :class:`ExecutorError` names the all-to-all style, whose core is
    SDPA itself."""
    choice_env = os.environ.get(RING_KERNEL_ENV, "sdpa")
    if choice_env not in ("sdpa", "flash"):
        raise ConfigError(f"{RING_KERNEL_ENV}={choice_env!r}: expected 'sdpa' (default) "
                          "or 'flash'")
    uneven = v is not None and v.shape[-1] != q.shape[-1]
    if q.device.type == "cpu":
        return _MathKernel() if uneven else _CpuKernel()
    if q.device.type == "cuda" and q.dtype in (torch.bfloat16, torch.float16):
        if choice_env == "sdpa":
            # q's shape with v's head dim: the choice reads shapes, dtypes and strides only
            vq = q.new_empty(*q.shape[:-1], v.shape[-1]) if uneven else q
            choice = torch._fused_sdp_choice(q, q, vq, is_causal=True)
            if int(choice) == int(SDPBackend.CUDNN_ATTENTION.value):
                return _CudnnKernel()
        if uneven:
            raise ExecutorError(uneven_ring_refusal(
                q.shape[-1], v.shape[-1], FORCED_FLASH if choice_env == "flash" else
                "SDPA does not pick cuDNN's attention for these dims here"))
        return _FlashKernel()
    return _MathKernel()


# ---- the ring -------------------------------------------------------------------------
class _Ring:
    """Neighbours of this rank in the cp group; :meth:`start` sends tensors to the next
    rank and receives same-shaped ones from the previous rank, asynchronously."""

    def __init__(self, group):
        self.group = group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def start(self, tensors, tag: int):
        recv = [torch.empty_like(t) for t in tensors]
        ops = ([dist.P2POp(dist.isend, t, peer=self.next, group=self.group, tag=tag)
                for t in tensors]
               + [dist.P2POp(dist.irecv, t, peer=self.prev, group=self.group, tag=tag)
                  for t in recv])
        return dist.batch_isend_irecv(ops), recv, tensors   # sent tensors stay alive

    @staticmethod
    def finish(pending) -> list[torch.Tensor]:
        works, recv, _ = pending
        for w in works:
            w.wait()
        return recv


def _step_slices(i: int, src: int, rank: int, half: int) -> tuple[slice, slice, bool]:
    """(query slice, key/value slice, causal) of ring step ``i`` under load balancing."""
    if i == 0:
        return slice(None), slice(None), True
    if src < rank:
        return slice(None), slice(None, half), False
    return slice(half, None), slice(None), False


def _repeat(t: torch.Tensor, rep: int) -> torch.Tensor:
    return t if rep == 1 else t.repeat_interleave(rep, dim=1)


def _fold(g: torch.Tensor, rep: int) -> torch.Tensor:
    """Sum a gradient over the query heads that share one key/value head."""
    return g if rep == 1 else g.unflatten(1, (-1, rep)).sum(2)


class _RingAttention(torch.autograd.Function):
    """Causal attention of local q (b, nh, 2c, d) over the K/V (b, nkv, 2c, d) of every cp
    rank, the local tokens being chunks r and 2·cp−1−r of the sequence."""

    @staticmethod
    def forward(ctx, q, k, v, ring: _Ring, kernel):
        kernel = kernel or block_kernel(q, v)
        rep, half, acc = q.shape[1] // k.shape[1], q.shape[2] // 2, _acc_dtype(q)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        kv, out, lse = [k, v], None, None
        for i in range(ring.size):
            pending = ring.start(kv, _KV_TAG) if i < ring.size - 1 else None
            qs, ks, causal = _step_slices(i, (ring.rank - i) % ring.size, ring.rank, half)
            o, l = kernel.forward(q[:, :, qs].contiguous(),
                                  _repeat(kv[0][:, :, ks].contiguous(), rep),
                                  _repeat(kv[1][:, :, ks].contiguous(), rep), causal)
            o, l = o.to(acc), l.to(acc)
            if out is None:
                out, lse = o, l
            else:
                merged = torch.logaddexp(lse[:, :, qs], l)
                out[:, :, qs] = (out[:, :, qs] * torch.exp(lse[:, :, qs] - merged).unsqueeze(-1)
                                 + o * torch.exp(l - merged).unsqueeze(-1))
                lse[:, :, qs] = merged
            if pending is not None:
                kv = ring.finish(pending)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.kernel = ring, kernel
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, kernel = ctx.ring, ctx.kernel
        rep, half, acc = q.shape[1] // k.shape[1], q.shape[2] // 2, _acc_dtype(q)
        dout = dout.contiguous()
        dq = torch.zeros_like(q, dtype=acc)
        kv, pending_dkv = [k, v], None
        for i in range(ring.size):
            pending_kv = ring.start(kv, _KV_TAG) if i < ring.size - 1 else None
            qs, ks, causal = _step_slices(i, (ring.rank - i) % ring.size, ring.rank, half)
            gq, gk, gv = kernel.backward(
                dout[:, :, qs].contiguous(), q[:, :, qs].contiguous(),
                _repeat(kv[0][:, :, ks].contiguous(), rep),
                _repeat(kv[1][:, :, ks].contiguous(), rep),
                out[:, :, qs].contiguous(), lse[:, :, qs].contiguous(), causal)
            dq[:, :, qs] += gq.to(acc)
            # the dK/dV accumulator of the block held now arrives from the previous rank
            dkv = ([torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)]
                   if i == 0 else ring.finish(pending_dkv))
            dkv[0][:, :, ks] += _fold(gk.to(acc), rep)
            dkv[1][:, :, ks] += _fold(gv.to(acc), rep)
            pending_dkv = ring.start(dkv, _DKV_TAG)
            if pending_kv is not None:
                kv = ring.finish(pending_kv)
        dk, dv = ring.finish(pending_dkv)      # after cp steps: this rank's own K/V's grads
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


class RingAttentionCore(nn.Module):
    """Drop-in for :class:`AttentionCore` on a cp rank: ring attention over the cp group.

    ``kernel``: the block kernel, one of :data:`KERNELS` (:func:`block_kernel`'s choice by
    device and dtype if None; tests pass ``"math"`` to check the CUDA fp32 fallback on CPU,
    benchmarks ``"flash"`` or ``"cudnn"`` to compare them)."""

    def __init__(self, group, kernel: str | None = None):
        super().__init__()
        self.ring = _Ring(group)
        self.kernel = None if kernel is None else KERNELS[kernel]

    def forward(self, q, k, v):
        return _RingAttention.apply(q, k, v, self.ring, self.kernel and self.kernel())


# ---- all-to-all (Ulysses) -------------------------------------------------------------
class _AllToAll(torch.autograd.Function):
    """Equal-split all-to-all over dim 0 (part j goes to rank j); a permutation, so its
    adjoint is the same exchange."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_to_all(x, group)

    @staticmethod
    def backward(ctx, g):
        return all_to_all(g, ctx.group), None


def seq_to_heads(t: torch.Tensor, group, cp: int) -> torch.Tensor:
    """(b, H, 2c, d) local tokens of all heads -> (b, H/cp, 2·cp·c, d), all tokens in
    sequence order, of this rank's head group."""
    b, heads, local, d = t.shape
    c = local // 2
    x = t.reshape(b, cp, heads // cp, local, d).transpose(0, 1)     # part j: head group j
    y = _AllToAll.apply(x.contiguous(), group).reshape(cp, b, heads // cp, 2, c, d)
    # rank j sent chunks j and 2cp-1-j: chunks 0..cp-1 in rank order, then the rest reversed
    chunks = torch.cat((y[:, :, :, 0], y[:, :, :, 1].flip(0)), dim=0)   # (2cp, b, H/cp, c, d)
    return chunks.permute(1, 2, 0, 3, 4).reshape(b, heads // cp, 2 * cp * c, d)


def heads_to_seq(t: torch.Tensor, group, cp: int) -> torch.Tensor:
    """Inverse of :func:`seq_to_heads`: (b, H/cp, S, d) -> (b, H, S/cp, d)."""
    b, hl, s, d = t.shape
    c = s // (2 * cp)
    chunks = t.reshape(b, hl, 2 * cp, c, d).permute(2, 0, 1, 3, 4)   # (2cp, b, hl, c, d)
    x = torch.stack((chunks[:cp], chunks[cp:].flip(0)), dim=3)       # (cp, b, hl, 2, c, d)
    y = _AllToAll.apply(x.reshape(cp, b, hl, 2 * c, d).contiguous(), group)
    return y.transpose(0, 1).reshape(b, cp * hl, 2 * c, d)


class AllToAllAttentionCore(nn.Module):
    """Drop-in for :class:`AttentionCore` on a cp rank: DeepSpeed-Ulysses over the cp group."""

    def __init__(self, group):
        super().__init__()
        self.group, self.cp = group, dist.get_world_size(group)
        self.inner = AttentionCore()

    def forward(self, q, k, v):
        q, k, v = (seq_to_heads(t, self.group, self.cp) for t in (q, k, v))
        return heads_to_seq(self.inner(q, k, v), self.group, self.cp)


def apply_context_parallel(model: Transformer, group, *, style: str, seq_len: int) -> None:
    """Make ``model`` (a part on one cp rank) attend over the whole sequence of the group:
    global positions for its local tokens, and a ring or all-to-all attention core."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    device = next(model.parameters()).device
    model.set_positions(load_balanced_positions(seq_len, cp, rank, device=device))
    for block in model.layers.values():
        block.attn.core = RingAttentionCore(group) if style == "ring" else \
            AllToAllAttentionCore(group)


__all__ = ["KERNELS", "AllToAllAttentionCore", "RingAttentionCore", "apply_context_parallel",
           "block_kernel", "heads_to_seq", "seq_to_heads"]
