"""The operations one executor layer dispatches: what its CPU time scales with.

PyTorch's eager CPU cost of a layer is a fixed cost per dispatched operator (the dispatcher,
autograd's node, the kernel launch), whatever the tensor sizes, so two layers of the same
*family* (activation, norm, position embedding, bias, attention grouping) and the same
layout knobs dispatch the same operators and cost the CPU the same, at any width. Between
families the cost scales with the operator count (views included: each is a dispatch and an
autograd node), which this module counts for meshplan's executor block
(:class:`meshplan.executor.model.Block`: pre-norm, fused QKV, rotary embedding applied with
``rotate_half``, grouped-query K/V expanded by ``repeat_interleave``, GELU or SwiGLU MLP),
operator by operator from its code, as PyTorch decomposes it. The counts are the aten
operators a ``TorchDispatchMode`` sees for the block in bf16 (FSDP2's compute dtype) on one
rank, checked exactly against torch on CPU (tests/unit/test_dispatch_ops.py):

===================  ==============  ========================================
piece                forward         backward
===================  ==============  ========================================
LayerNorm            1               3, +1 with a bias
RMSNorm (fp32 math)  9               21
attention            19              30, +6 with biases
  rotary (q and k)   +18             +14
  grouped K/V        +8              +8   (two repeat_interleave; one K/V head: +6)
MLP, GELU            9               20, +6 with biases
MLP, SwiGLU          11              23
the block            2               −1
===================  ==============  ========================================

(the pieces counted alone, each with its input's gradient accumulated; in the block the two
residual additions add 2 forward operators, and the residual gradients' sums one fewer than
the pieces' own input accumulations)

Layout knobs, the same for every family (so they shrink a ratio, never flip it): autocast
(ZeRO-0/1 under the torch runtime; CUDA's autocast runs LayerNorm in fp32, casting its input
up and its output down: +2 per LayerNorm and pass; RMSNorm's bf16 gain: +1 per norm and
pass; weight casts are cached), tensor-parallel collectives (2 per pass; 4 with sequence
parallelism), selective recompute (the attention core again in backward, +1) and full
recompute (the whole forward again in backward).

Used by :mod:`meshplan.costmodel.nearest_rows` to carry a timed shape's measured CPU
dispatch to another family's layer: CPU(target) = CPU(source) × ops(target) / ops(source).
Measured check (round 26 and 18 profiles, H200 / H100, tp 1, no recompute): Llama-1.64B
over GPT-0.54B dispatch measured 2.4 / 2.5 × (forward) and 1.3 / 1.8 × (backward); these
counts give 2.1 × and 1.6 ×.
"""

from __future__ import annotations

from meshplan.spec import ModelSpec


def layer_dispatch_ops(model: ModelSpec, *, tp: int, sequence_parallel: bool,
                       recompute: str, autocast: bool = True) -> tuple[int, int]:
    """(forward, backward) operators one layer dispatches for one micro-batch (table above)."""
    rope = model.position_embedding == "rope"
    grouped = model.num_kv_heads < model.num_heads
    bias = bool(model.bias)
    if model.norm == "rmsnorm":
        norm_f, norm_b = 9 + autocast, 21 + autocast
    else:
        norm_f, norm_b = 1 + 2 * autocast, 3 + bias + 2 * autocast
    attn_f = 19 + 18 * rope + 8 * grouped
    attn_b = 30 + 6 * bias + 14 * rope + (6 if model.num_kv_heads == 1 else 8) * grouped
    if model.activation == "swiglu":
        mlp_f, mlp_b = 11, 23 + 6 * bias
    else:
        mlp_f, mlp_b = 9, 20 + 6 * bias
    fwd = 2 * norm_f + attn_f + mlp_f + 2
    bwd = 2 * norm_b + attn_b + mlp_b - 1
    if tp > 1:
        coll = 4 if sequence_parallel else 2
        fwd, bwd = fwd + coll, bwd + coll
    if recompute == "full":
        bwd += fwd
    elif recompute == "selective":
        bwd += 1
    return fwd, bwd


def layer_dispatch_ratio(target: ModelSpec, source: ModelSpec, *, tp: int,
                         sequence_parallel: bool, recompute: str,
                         autocast: bool = True) -> tuple[float, float]:
    """(forward, backward) dispatch of ``target``'s layer over ``source``'s at the same knobs."""
    kw = dict(tp=tp, sequence_parallel=sequence_parallel, recompute=recompute,
              autocast=autocast)
    ft, bt = layer_dispatch_ops(target, **kw)
    fs, bs = layer_dispatch_ops(source, **kw)
    return ft / fs, bt / bs


__all__ = ["layer_dispatch_ops", "layer_dispatch_ratio"]
