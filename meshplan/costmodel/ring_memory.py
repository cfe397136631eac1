"""Memory traffic of meshplan's own ring attention (runtime "torch"): the copies, casts and
online-softmax merges that :class:`meshplan.executor.context_parallel._RingAttention` runs
around its block kernels, each a separate memory-bound kernel.

Source: the executor's code (meshplan/executor/context_parallel.py), counted op by op;
``tests/unit/test_ring_memory.py`` runs the ring on 2 and 4 gloo ranks under
:class:`meshplan.executor.op_count.OpCounter` and checks the count against this module
exactly. Each op reads its inputs and writes its output once (no fusion, no cache reuse);
the time is the bytes at the HBM bandwidth × ``hbm_efficiency`` of the GPU profile.

Notation, per rank and micro-batch, with t = tp: Q = b·(s/cp)·q_dim/t elements (q, the
output, dout), K = b·(s/cp)·kv_dim/t (k or v), L = b·(s/cp)·heads/t (the log-sum-exp),
rep = heads/kv_heads, e bytes per activation element, a = 4 (fp32 accumulation).
Multi-head latent attention's v, output and dout are d_v wide a head, not the d_n + d_r of
its q and k; they are counted at Q's and K's width here — at most (d_n + d_r)/d_v of their
share (DeepSeek-V3: 1.5x), not checked by an op count.
A step's query and key/value fractions (f_q, f_k) are (1, 1) at step 0; after it a rank
computes either all its queries over half the block (1, ½: the block's owner precedes it)
or half its queries over the whole block (½, 1); at every step i ≥ 1 of cp ≥ 2 some rank
does each, and the ring waits for the slower, so each such step costs the larger of the two.

Forward (eq. 7):

    entry  2e(Q + 2K)                  q, k, v made contiguous (they arrive as transposed
                                       views of the (b, s, h, d) projections)
    step   [f_q<1]·2e·Q·f_q            query half copied
           + [f_k<1]·4e·K·f_k          key/value halves copied
           + [rep>1]·2e(K + Q)·f_k     K and V repeated to the query heads (GQA)
           + (e + a)·Q·f_q             block output cast to fp32
           + [i≥1]·a(9·Q·f_q + 17·L·f_q)   merge: o = e^(l₁−l)·o₁ + e^(l₂−l)·o₂: 9 reads
                                       or writes of each output element (two scalings, a
                                       sum, the slice write-back), 17 of each lse element
    exit   (a + e)·Q                   output cast back

Backward (eq. 8):

    entry  2e·Q + a·Q                  dout made contiguous, dQ accumulator zeroed
    step   [f_q<1](6e·Q·f_q + 2a·L·f_q)    dout, q, output and lse halves copied
           + [f_q=1]·2e·Q              or the whole output (the CUDA flash kernel writes
                                       it (b, s, h, d)-strided; the ring saves it so;
                                       cuDNN's writes q's layout and skips this copy,
                                       ≈ 1 % of the traffic, not distinguished)
           + [f_k<1]·4e·K·f_k + [rep>1]·2e(K + Q)·f_k     as forward
           + (e + a)·Q·f_q + 3a·Q·f_q  dQ cast to fp32 and accumulated
           + [i=0]·2a·K                dK/dV accumulators zeroed
           + 2[(e + a)·Q·f_k + [rep>1]·a(Q + K)·f_k + 3a·K·f_k]   dK, dV cast, summed
                                       over the query heads of a kv head, accumulated
    exit   (a + e)(Q + 2K)             dQ, dK, dV cast back

The block kernels themselves (eq. 2 of :mod:`context`) and the K/V transfers (eq. 3-4)
are priced there. Megatron-Core with TransformerEngine (runtime "megatron") corrects its
outputs in its own kernels; this traffic is not added there.
"""

from __future__ import annotations

from meshplan.spec import ModelSpec

#: bytes per element of the ring's fp32 accumulators (output, log-sum-exp, dQ, dK, dV)
ACCUM_BYTES = 4


def _sizes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, cp: int):
    tokens = micro_batch * seq_len / cp
    return (tokens * model.q_dim / tp, tokens * model.kv_dim / tp,
            tokens * model.num_heads / tp, model.num_heads // model.num_kv_heads)


def _forward_step(q, k, lse, rep, e, a, f_q, f_k, merge):
    b = (2 * e * q * f_q if f_q < 1 else 0.0) + (4 * e * k * f_k if f_k < 1 else 0.0)
    b += 2 * e * (k + q) * f_k if rep > 1 else 0.0
    b += (e + a) * q * f_q
    return b + (a * (9 * q * f_q + 17 * lse * f_q) if merge else 0.0)


def _backward_step(q, k, lse, rep, e, a, f_q, f_k, first):
    # halves copied; a whole output is copied too: the flash kernel writes it (b, s, h, d)
    b = (6 * e * q * f_q + 2 * a * lse * f_q) if f_q < 1 else 2 * e * q
    b += 4 * e * k * f_k if f_k < 1 else 0.0
    b += 2 * e * (k + q) * f_k if rep > 1 else 0.0
    b += (e + a) * q * f_q + 3 * a * q * f_q
    b += 2 * a * k if first else 0.0
    fold = a * (q + k) * f_k if rep > 1 else 0.0
    return b + 2 * ((e + a) * q * f_k + fold + 3 * a * k * f_k)


def ring_memory_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, cp: int,
                      bytes_per_element: float,
                      accum_bytes: float = ACCUM_BYTES) -> tuple[float, float]:
    """Eq. (7) and (8): (forward, backward) bytes the ring moves outside its block kernels,
    on one rank for one layer and micro-batch (the slower rank at each step)."""
    if cp == 1:
        return 0.0, 0.0
    args = (model, seq_len, micro_batch, tp, cp, bytes_per_element)

    def one_pass(backward: bool) -> float:
        step = lambda i, fq, fk: ring_memory_bytes_per_step(       # noqa: E731
            *args, fq, fk, step=i, backward=backward, accum_bytes=accum_bytes)
        return (ring_entry_exit_bytes(*args, backward=backward, accum_bytes=accum_bytes)
                + step(0, 1.0, 1.0) + (cp - 1) * max(step(1, 1.0, 0.5), step(1, 0.5, 1.0)))
    fwd, bwd = one_pass(False), one_pass(True)
    return fwd, bwd


def ring_memory_bytes_per_step(model: ModelSpec, seq_len: int, micro_batch: int, tp: int,
                               cp: int, bytes_per_element: float, f_q: float, f_k: float,
                               *, step: int, backward: bool,
                               accum_bytes: float = ACCUM_BYTES) -> float:
    """One step's bytes for a rank computing the fractions ``(f_q, f_k)`` (entry and exit
    not included): what a given rank moves, for checks against a count of one rank."""
    q, k, lse, rep = _sizes(model, seq_len, micro_batch, tp, cp)
    if backward:
        return _backward_step(q, k, lse, rep, bytes_per_element, accum_bytes, f_q, f_k,
                              step == 0)
    return _forward_step(q, k, lse, rep, bytes_per_element, accum_bytes, f_q, f_k, step > 0)


def ring_entry_exit_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int,
                          cp: int, bytes_per_element: float, *, backward: bool,
                          accum_bytes: float = ACCUM_BYTES) -> float:
    """Bytes of a pass's entry copies and exit casts (eq. 7, 8)."""
    q, k, _, _ = _sizes(model, seq_len, micro_batch, tp, cp)
    e, a = bytes_per_element, accum_bytes
    if backward:
        return (2 * e + a) * q + (a + e) * (q + 2 * k)
    return 2 * e * (q + 2 * k) + (a + e) * q


__all__ = ["ACCUM_BYTES", "ring_entry_exit_bytes", "ring_memory_bytes",
           "ring_memory_bytes_per_step"]
