"""What the executor's eager layer moves outside its GEMMs and attention kernel, counted
with :class:`meshplan.executor.op_count.OpCounter`, against
:mod:`meshplan.costmodel.torch_membound`; and where ``layer_cost`` uses that count."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.costmodel import torch_membound as tm
from meshplan.costmodel.compute import hbm_s, layer_cost
from meshplan.hardware_profiles import Cluster

# GEMMs are priced by their FLOPs; _unsafe_view is a view (it moves nothing)
NOT_MEMORY_BOUND = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_unsafe_view")


def _spec(**kw) -> mp.ModelSpec:
    base = dict(name="t", num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=4,
                ffn_hidden_size=96, vocab_size=128, max_seq_len=64, activation="swiglu",
                norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False)
    return mp.ModelSpec(**{**base, **kw})


def _block_bytes(spec: mp.ModelSpec, seq: int, bf16: bool) -> tuple[int, int]:
    """(forward, backward) bytes of one executor Block on ``seq`` tokens, under autocast
    with fp32 weights and a bf16 residual stream (the executor's ZeRO-0/1 set-up) or in
    fp32."""
    import torch

    from meshplan.executor.model import Block, rope_tables
    from meshplan.executor.op_count import OpCounter
    torch.manual_seed(0)
    block = Block(spec)
    rope = rope_tables(seq, spec.head_dim)
    dtype = torch.bfloat16 if bf16 else torch.float32
    x = torch.randn(1, seq, spec.hidden_size).to(dtype).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        with OpCounter() as fwd:
            y = block(x, rope)
        g = torch.randn_like(y)
        with OpCounter() as bwd:
            y.backward(g)
    return tuple(sum(v for k, v in c.memory_ops.items() if k not in NOT_MEMORY_BOUND)
                 for c in (fwd, bwd))


@pytest.mark.parametrize("kv_heads,bf16", [(4, True), (4, False), (2, True), (1, False)])
def test_block_moves_what_the_count_says(kv_heads, bf16):
    """Per token (two sequence lengths, so per-parameter casts cancel): the forward exactly;
    the backward exactly for multi-head attention, and with GQA plus the CPU kernel's
    layout copy: its K/V gradients come back (b, s, h, d)-strided, so the repeat's backward
    copies them (2e·Q; cuDNN returns them in K's layout, module docstring)."""
    pytest.importorskip("torch")
    spec = _spec(num_kv_heads=kv_heads)
    e = 2 if bf16 else 4
    (f1, b1), (f2, b2) = _block_bytes(spec, 16, bf16), _block_bytes(spec, 32, bf16)
    kw = dict(tp=1, sequence_parallel=False, mlp_width=spec.ffn_hidden_size, e=e)
    lo, hi = (tm.eager_layer_bytes(spec, tokens=t, **kw) for t in (16, 32))
    assert f2 - f1 == hi.forward - lo.forward
    # (with a single kv head the strided gradient still views as the repeat's shape)
    layout_copy = 2 * e * 16 * spec.q_dim if 1 < kv_heads < spec.num_heads else 0
    assert b2 - b1 == hi.backward - lo.backward + layout_copy


def test_gelu_moves_what_the_count_says():
    pytest.importorskip("torch")
    import torch
    import torch.nn.functional as F

    from meshplan.executor.op_count import OpCounter
    x = torch.randn(8, 24).to(torch.bfloat16).requires_grad_()
    with OpCounter() as fwd:
        y = F.gelu(x, approximate="tanh")
    g = torch.ones_like(y)
    with OpCounter() as bwd:
        torch.autograd.grad(y, x, g)
    spec = _spec(activation="gelu", norm="layernorm", ffn_hidden_size=24)
    eb = tm.eager_layer_bytes(spec, tokens=8, tp=1, sequence_parallel=False, mlp_width=24, e=2)
    assert (fwd.memory_bytes, bwd.memory_bytes) == (eb.act_fwd, eb.act_bwd)


def test_count_by_hand():
    """hidden 8, 2 heads / 1 kv head of 4, SwiGLU 16, 4 tokens, bf16, tp 2 with sequence
    parallelism: N = 4·8/2 = 16, r = 2, F = 4·16/2 = 32, Q = 4·8/2 = 16, K = 4·4/2 = 8,
    R = 4 rows of d = 4, rep 2, e = 2, a = 4, c = 1."""
    spec = mp.ModelSpec(name="h", num_layers=1, hidden_size=8, num_heads=2, num_kv_heads=1,
                        ffn_hidden_size=16, vocab_size=16, activation="swiglu",
                        norm="rmsnorm", position_embedding="rope")
    eb = tm.eager_layer_bytes(spec, tokens=4, tp=2, sequence_parallel=True, mlp_width=16, e=2)
    assert eb.norm_fwd == 2 * ((12 + 20 + 4) * 16 + 24 * 2)          # 2·(36·N + 24·r)
    assert eb.norm_bwd == 2 * ((12 + 68 + 12) * 16 + 40 * 2)         # 2·(92·N + 40·r)
    assert (eb.residual_fwd, eb.residual_bwd) == (2 * 6 * 16, 2 * 6 * 16)
    assert (eb.act_fwd, eb.act_bwd) == (10 * 32, 26 * 32)
    assert eb.copies_fwd == 20 * (16 + 8) + 2 * (12 + 4) * 4 * 4     # RoPE; tables per call
    assert eb.copies_bwd == 4 * (16 + 16) + 20 * (16 + 8) + 2 * 4 * 4 * 4   # split + RoPE
    assert (eb.core_fwd, eb.core_bwd) == (4 * (8 + 16), 4 * (16 + 8))
    # fp32: no casts (c = 0), the gain read at 4 bytes
    f32 = tm.eager_layer_bytes(spec, tokens=4, tp=2, sequence_parallel=True, mlp_width=16, e=4)
    assert f32.norm_fwd == 2 * ((20 + 8) * 16 + 24 * 2)


H200 = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=4)
LLAMA = mp.ModelSpec(name="llama-1.3b", num_layers=24, hidden_size=2048, num_heads=16,
                     num_kv_heads=8, ffn_hidden_size=5632, vocab_size=32000,
                     max_seq_len=65536, activation="swiglu", norm="rmsnorm",
                     position_embedding="rope", tied_embeddings=False, bias=False)


def _layer(runtime: str, cluster: Cluster = H200, **kw):
    job = mp.Job(global_batch=8, seq_len=16384, precision="bf16", runtime=runtime)
    args = dict(micro_batch=1, tp=1, sequence_parallel=False, recompute="none",
                tp_link=cluster.group_link(1, 1))
    return layer_cost(LLAMA, cluster, job, **{**args, **kw})


def test_layer_cost_prices_the_eager_count_under_runtime_torch():
    """Predicate: runtime "torch" (a compiled layout without compiled rows is priced as
    eager, with a caveat); Megatron's fused kernels keep the fused count. Effect: the
    memory-bound seconds are the count at the datasheet's HBM efficiency, the GQA repeat
    goes with the attention core (also re-run by selective recomputation)."""
    torch_l, mega = _layer("torch"), _layer("megatron")
    eb = tm.eager_layer_bytes(LLAMA, tokens=16384, tp=1, sequence_parallel=False,
                              mlp_width=LLAMA.ffn_hidden_size, e=2)
    gpu = H200.gpu
    assert torch_l.forward.memory_bound_s == pytest.approx(
        hbm_s(gpu, eb.forward - eb.core_fwd))
    assert torch_l.backward.memory_bound_s == pytest.approx(
        hbm_s(gpu, eb.backward - eb.core_bwd))
    assert torch_l.forward.attention_s == pytest.approx(
        mega.forward.attention_s + hbm_s(gpu, eb.core_fwd))
    # 0.95 MB per token and layer against the fused 0.26 MB (module docstring)
    assert (eb.forward + eb.backward) / 16384 == pytest.approx(0.95e6, rel=0.01)
    assert torch_l.forward.memory_bound_s > 3 * mega.forward.memory_bound_s
    sel = _layer("torch", recompute="selective")
    assert sel.recompute.attention_s == pytest.approx(torch_l.forward.attention_s)


def test_measured_op_efficiency_keeps_its_own_bytes():
    """A profile that timed the executor's RMSNorm prices it as calibrate measured it (the
    fused count at the measured efficiency: the benchmark timed the eager op itself)."""
    from dataclasses import replace
    gpu = replace(H200.gpu, membound_efficiency={"rmsnorm": 0.058})
    cl = H200.replace(gpu=gpu)
    with_row, without = _layer("torch", cl), _layer("torch")
    n = 16384 * LLAMA.hidden_size
    eb = tm.eager_layer_bytes(LLAMA, tokens=16384, tp=1, sequence_parallel=False,
                              mlp_width=LLAMA.ffn_hidden_size, e=2)
    measured = 4 * 2 * n / (gpu.hbm_gbps * 1e9 * 0.058)
    assert with_row.forward.memory_bound_s - without.forward.memory_bound_s == pytest.approx(
        measured - hbm_s(gpu, eb.norm_fwd))
