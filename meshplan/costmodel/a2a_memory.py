"""Memory traffic of meshplan's own all-to-all (DeepSpeed-Ulysses) attention core (runtime
"torch"): the copies that :class:`meshplan.executor.context_parallel.AllToAllAttentionCore`
runs around its all-to-alls and its attention kernel, each a separate memory-bound kernel;
and the attention output's layout copy both context-parallel cores cause.

Source: the executor's code (meshplan/executor/context_parallel.py ``seq_to_heads``,
``heads_to_seq``), counted op by op; ``tests/unit/test_a2a_memory.py`` runs the core on 2
and 4 gloo ranks under :class:`meshplan.executor.op_count.OpCounter` and checks this count
exactly. Each op reads its inputs and writes its output once; the time is the bytes at the
HBM bandwidth × ``hbm_efficiency`` of the GPU profile, with the core's kernel.

Notation, per rank and micro-batch, with t = tp: Q = b·(s/cp)·q_dim/t elements (q, the
output), K = b·(s/cp)·kv_dim/t (k or v) — an all-to-all keeps a rank's element count —,
H_x = the tensor's heads on the rank (q: heads/t, k and v: kv_heads/t), rep = heads/kv_heads,
(multi-head latent attention's v and output, d_v wide a head, are counted at Q's and K's
d_n + d_r here: at most (d_n + d_r)/d_v of their share, not checked by an op count),
e bytes per activation element, [p] = 1 where p holds:

Forward (eq. 9):

    seq_to_heads(x), x ∈ {q, k, v}:  2e·X    the head groups made contiguous for the exchange
                                     + e·X   the second chunk of each rank flipped
                                     + 2e·X  the chunks concatenated in sequence order
                                     + [b·H_x/cp > 1]·2e·X   (b, H/cp, S, d) made contiguous
    GQA repeat (the inner core)      [rep>1]·2e(K + Q)
    heads_to_seq(output)             e·Q + 2e·Q (flip, stack) + [b > 1]·2e·Q

Backward (eq. 10):

    heads_to_seq's adjoint           2e·Q    the gradient made contiguous for the exchange
                                     + e·Q + 3e·Q + 3e·Q    flip; the two slices' gradients
                                             (each written whole: zeros and the slice) summed
                                     + [b·H_q/cp > 1]·2e·Q   the permuted gradient reshaped
    GQA repeat's adjoint             [rep>1]·2e(Q + K)    (a sum over the repeats)
    seq_to_heads' adjoint, each x    e·X + 3e·X + 3e·X    flip; the two selects' gradients
                                                        summed
                                     + [b > 1][H_x/cp > 1]·2e·X   the gradient's permute

The output copy (eq. 11): both cores return (b, h, s/cp, d) contiguous, so the attention
module's transpose-reshape to (b, s/cp, h·d) copies it, 2e·Q forward (its backward is a
view; the ring's and this core's entry copies make it contiguous, counted there). torch's
own SDPA kernels (cuDNN, flash) write their output in q's layout, where that reshape is a
view: the plain core has no such copy.

The all-to-alls themselves are priced by :mod:`meshplan.costmodel.context` eq. (5).
"""

from __future__ import annotations

from meshplan.spec import ModelSpec


def _sizes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, cp: int):
    tokens = micro_batch * seq_len / cp
    return tokens * model.q_dim / tp, tokens * model.kv_dim / tp


def all_to_all_memory_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int,
                            cp: int, bytes_per_element: float) -> tuple[float, float]:
    """Eq. (9) and (10): (forward, backward) bytes the all-to-all core moves outside its
    exchanges and attention kernel, on one rank for one layer and micro-batch."""
    if cp == 1:
        return 0.0, 0.0
    q, k = _sizes(model, seq_len, micro_batch, tp, cp)
    e, b = bytes_per_element, micro_batch
    rep = model.num_heads // model.num_kv_heads
    hq, hkv = model.num_heads / tp, model.num_kv_heads / tp

    def into_heads(x: float, heads: float) -> float:
        return 5 * e * x + (2 * e * x if b * heads / cp > 1 else 0.0)
    repeat = 2 * e * (k + q) if rep > 1 else 0.0
    fwd = (into_heads(q, hq) + 2 * into_heads(k, hkv) + repeat
           + 3 * e * q + (2 * e * q if b > 1 else 0.0))
    def out_of_heads(x: float, heads: float) -> float:
        return 7 * e * x + (2 * e * x if b > 1 and heads / cp > 1 else 0.0)
    bwd = (9 * e * q + (2 * e * q if b * hq / cp > 1 else 0.0) + repeat
           + out_of_heads(q, hq) + 2 * out_of_heads(k, hkv))
    return fwd, bwd


def cp_output_copy_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int,
                         cp: int, bytes_per_element: float) -> float:
    """Eq. (11): the forward copy of a context-parallel core's output into (b, s/cp, h·d)."""
    if cp == 1:
        return 0.0
    q, _ = _sizes(model, seq_len, micro_batch, tp, cp)
    return 2 * bytes_per_element * q


__all__ = ["all_to_all_memory_bytes", "cp_output_copy_bytes"]
