"""Context parallelism pieces: the load-balanced sharding, the block kernels, the layout
rules, and (one spawned group of 4 gloo ranks) the ring and all-to-all attention cores
against one full-sequence attention in float64."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.errors import ConfigError
from meshplan.spec.validate import check_context_parallel, check_layout

torch = pytest.importorskip("torch")

from _gloo import run_gloo_ranks, write_rank_result  # noqa: E402
from meshplan.executor.data import load_balanced_positions, shard_sequence  # noqa: E402

LLAMA8 = mp.ModelSpec.preset("llama3-8b")        # 32 heads, 8 kv heads


# ---- sharding -----------------------------------------------------------------------------
def test_load_balanced_positions_hold_chunks_r_and_2cp_minus_1_minus_r():
    assert load_balanced_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert load_balanced_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert load_balanced_positions(16, 4, 1).tolist() == [2, 3, 12, 13]
    # every position once over the ranks; each rank's causal work (sum of positions + 1)
    # is the same, which is what the balancing is for
    for cp in (2, 4, 8):
        parts = [load_balanced_positions(64, cp, r) for r in range(cp)]
        assert sorted(torch.cat(parts).tolist()) == list(range(64))
        assert len({int((p + 1).sum()) for p in parts}) == 1


def test_shard_sequence_cuts_inputs_and_targets_alike():
    batch = torch.arange(2 * 17).view(2, 17)
    x, y = batch[:, :-1], batch[:, 1:]
    for r in range(4):
        xs, ys = shard_sequence(x, 4, r), shard_sequence(y, 4, r)
        assert xs.shape == (2, 4)
        assert torch.equal(ys, xs + 1)           # each local target is its input's next token
    assert shard_sequence(x, 1, 0) is x


# ---- block kernels --------------------------------------------------------------------------
@pytest.mark.parametrize("kernel_name", ["math", "cpu"])
@pytest.mark.parametrize("causal", [True, False])
def test_block_kernels_match_sdpa_and_take_the_merged_lse(kernel_name, causal):
    """Forward gives SDPA's output and the row log-sum-exp; backward from the *merged* output
    and log-sum-exp of two key blocks adds up to SDPA's gradients (what the ring relies on)."""
    from meshplan.executor.context_parallel import _CpuKernel, _MathKernel
    kernel = {"math": _MathKernel, "cpu": _CpuKernel}[kernel_name]()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 8, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out, lse = kernel.forward(q, k, v, causal)
    s = q @ k.transpose(-2, -1) / 2.0
    if causal:
        s = s.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), rtol=1e-12, atol=1e-12)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)
    dout = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    ref.backward(dout)
    # two key blocks of 4: block outputs merged as the ring merges them
    halves = [slice(0, 4), slice(4, 8)]
    if causal:   # queries 0..3 see block 0 causally; queries 4..7 see block 0 fully, 1 causally
        o0, l0 = kernel.forward(q[:, :, :4], k[:, :, :4], v[:, :, :4], True)
        oa, la = kernel.forward(q[:, :, 4:], k[:, :, :4], v[:, :, :4], False)
        ob, lb = kernel.forward(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], True)
        blocks = [(slice(0, 4), halves[0], True), (slice(4, 8), halves[0], False),
                  (slice(4, 8), halves[1], True)]
    else:
        oa, la = kernel.forward(q, k[:, :, :4], v[:, :, :4], False)
        ob, lb = kernel.forward(q, k[:, :, 4:], v[:, :, 4:], False)
        blocks = [(slice(None), h, False) for h in halves]
    m = torch.logaddexp(la, lb)
    merged = oa * torch.exp(la - m).unsqueeze(-1) + ob * torch.exp(lb - m).unsqueeze(-1)
    if causal:
        merged, m = torch.cat((o0, merged), 2), torch.cat((l0, m), 2)
    torch.testing.assert_close(merged, ref.detach(), rtol=1e-12, atol=1e-12)
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    for qs, ks, c in blocks:
        gq, gk, gv = kernel.backward(dout[:, :, qs].contiguous(), q[:, :, qs].contiguous(),
                                     k[:, :, ks].contiguous(), v[:, :, ks].contiguous(),
                                     merged[:, :, qs].contiguous(), m[:, :, qs].contiguous(), c)
        dq[:, :, qs] += gq
        dk[:, :, ks] += gk
        dv[:, :, ks] += gv
    for got, want in ((dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_flash_kernel_calls_fit_the_cuda_ops_schemas():
    """The CUDA flash kernel's forward and backward calls, on meta tensors (the kernels
    themselves run only on GPUs): argument order, the outputs kept for the backward, and
    the shapes of the log-sum-exp and gradients."""
    from meshplan.executor.context_parallel import _FlashKernel
    kernel = _FlashKernel()
    q = torch.empty(2, 4, 16, 64, device="meta", dtype=torch.bfloat16)
    out, lse = kernel.forward(q, q, q, True)
    assert out.shape == q.shape and lse.shape == (2, 4, 16) and lse.dtype == torch.float32
    half = q[:, :, 8:]
    grads = kernel.backward(half, half, q, q, out[:, :, 8:], lse[:, :, 8:], False)
    assert [g.shape for g in grads] == [half.shape, q.shape, q.shape]


def test_cudnn_kernel_calls_fit_the_cuda_ops_schemas():
    """The cuDNN kernel (what SDPA runs on Hopper/Blackwell with cuDNN > 9.15, and so the
    ring there): its (b, h, s, 1) log-sum-exp comes back as (b, h, s) for the merges and
    goes back to (b, h, s, 1) for the backward; shapes on meta tensors."""
    from meshplan.executor.context_parallel import KERNELS, _CudnnKernel, block_kernel
    kernel = _CudnnKernel()
    q = torch.empty(2, 4, 16, 64, device="meta", dtype=torch.bfloat16)
    out, lse = kernel.forward(q, q[:, :, :8], q[:, :, :8], False)
    assert out.shape == q.shape and lse.shape == (2, 4, 16) and lse.dtype == torch.float32
    half = q[:, :, 8:]
    grads = kernel.backward(half, half, q, q, out[:, :, 8:], lse[:, :, 8:], False)
    assert [g.shape for g in grads] == [half.shape, q.shape, q.shape]
    assert set(KERNELS) == {"math", "cpu", "flash", "cudnn"}
    assert type(block_kernel(torch.empty(1, 2, 4, 8))).__name__ == "_CpuKernel"


def test_block_kernel_for_a_value_head_dim_unlike_the_query_one():
    """Multi-head latent attention's blocks (d_v ≠ d_n + d_r): the CPU flash kernel refuses
    them, so the math kernel runs, and it matches SDPA, which takes them."""
    from meshplan.executor.context_parallel import block_kernel
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 8, 12, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 2, 8, 6, generator=g, dtype=torch.float64)
    assert type(block_kernel(q, q)).__name__ == "_CpuKernel"
    kernel = block_kernel(q, v)
    assert type(kernel).__name__ == "_MathKernel"
    out, _ = kernel.forward(q, k, v, True)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, want)


# ---- the cores over 4 ranks -----------------------------------------------------------------
def _attention_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import torch.distributed as dist

    from meshplan.executor import context_parallel as cpm
    from meshplan.executor.context_parallel import AllToAllAttentionCore, RingAttentionCore
    from meshplan.executor.model import AttentionCore
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    g = torch.Generator().manual_seed(0)                  # the same full tensors on every rank
    b, nh, nkv, s, d = 2, 8, 4, 32, 8
    q = torch.randn(b, nh, s, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, nkv, s, d, generator=g, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(b, nh, s, d, generator=g, dtype=torch.float64)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = AttentionCore()(*full)
    ref.backward(dout)
    pos = load_balanced_positions(s, world, rank)
    group = dist.group.WORLD
    sent = []                              # (tag, bytes) of every ring exchange, to count them
    start = cpm._Ring.start

    def counted_start(self, tensors, tag):
        sent.append((tag, sum(t.numel() * t.element_size() for t in tensors)))
        return start(self, tensors, tag)
    cpm._Ring.start = counted_start
    out = {"diffs": {}}
    for name, core in (("ring", RingAttentionCore(group)),
                       ("ring-math-kernel", RingAttentionCore(group, kernel="math")),
                       ("all-to-all", AllToAllAttentionCore(group))):
        local = [t[:, :, pos].clone().requires_grad_() for t in (q, k, v)]
        sent.clear()
        y = core(*local)
        forward = list(sent)
        y.backward(dout[:, :, pos])
        if name == "ring":
            out["exchanges"] = {"forward": forward, "backward": sent[len(forward):]}
        diffs = {"out": (y.detach() - ref.detach()[:, :, pos]).abs().max().item()}
        for label, t, f in zip("qkv", local, full):
            diffs[f"d{label}"] = (t.grad - f.grad[:, :, pos]).abs().max().item()
        out["diffs"][name] = diffs
    write_rank_result(out_dir, rank, out)


@pytest.mark.distributed
def test_ring_and_all_to_all_match_full_attention_over_4_ranks(tmp_path):
    """cp = 4, GQA (8 query / 4 kv heads), 32 tokens in 8 chunks of 4: every rank's output
    and q, k, v gradients equal full causal attention's at its positions (float64, 1e-12).
    The ring sends what costmodel.context counts: cp−1 K/V exchanges forward, cp−1 K/V and
    cp dK/dV exchanges backward, of ring_kv_bytes each."""
    from meshplan.costmodel import context as cx
    spec = mp.ModelSpec(name="w", num_layers=1, hidden_size=64, num_heads=8, num_kv_heads=4,
                        vocab_size=16)                                 # head_dim 8, as above
    kv_bytes = cx.ring_kv_bytes(spec, 32, 2, 1, 4, bytes_per_element=8)     # float64
    want = cx.ring_exchanges(4)
    for rank, got in enumerate(run_gloo_ranks(_attention_worker, 4, tmp_path)):
        for core, diffs in got["diffs"].items():
            bad = {k: v for k, v in diffs.items() if v > 1e-12}
            assert not bad, f"rank {rank} {core}: {bad}"
        fwd, bwd = got["exchanges"]["forward"], got["exchanges"]["backward"]
        assert fwd == [[0, kv_bytes]] * want["forward_kv"]
        assert sorted(map(tuple, bwd)) == sorted([(0, kv_bytes)] * want["backward_kv"]
                                                 + [(1, kv_bytes)] * want["backward_dkv"])


@pytest.mark.parametrize("order", ["tp-dp-pp", "tp-pp-dp"])
def test_executor_mesh_puts_cp_next_to_tp_as_the_cost_model_counts(order):
    from meshplan.costmodel.context import rank_strides
    from meshplan.executor.mesh import mesh_dims
    shape, names = mesh_dims(mp.Layout(tp=2, cp=4, dp=3, pp=5), order)
    strides = {n: 1 for n in names}
    for i, n in enumerate(names):
        for size in shape[i + 1:]:
            strides[n] *= size
    assert strides == rank_strides(2, 4, 3, 5, order)


# ---- layout rules ---------------------------------------------------------------------------
@pytest.mark.parametrize("model,seq_len,kwargs,words", [
    (LLAMA8, 1004, dict(cp=4), r"seq_len = 1004 must be divisible by 2·cp = 8"),
    (LLAMA8, 8192, dict(cp=4, tp=8, sequence_parallel=True), None),
    (LLAMA8, 4104, dict(cp=2, tp=8, sequence_parallel=True),
     r"seq_len/cp = 4104/2 = 2052 tokens are split over tp = 8"),
    (LLAMA8, 8192, dict(cp=4, tp=4, cp_style="all-to-all"),
     r"tp·cp = 4·4 = 16 must divide ModelSpec.num_kv_heads = 8 .* cp valid with tp = 4: "
     r"\[1, 2\]"),
    (LLAMA8, 8192, dict(cp=4, tp=2, cp_style="all-to-all"), None),
    (LLAMA8, 8192, dict(cp=16, tp=1, cp_style="ring"), None),      # ring: no head rule
])
def test_context_parallel_rules_name_the_values(model, seq_len, kwargs, words):
    job = mp.Job(global_batch=8, seq_len=seq_len)
    layout = mp.Layout(**kwargs)
    if words is None:
        check_context_parallel(model, job, layout)
        return
    with pytest.raises(ConfigError, match=words):
        check_context_parallel(model, job, layout)


def test_check_layout_gives_cp_rules_and_accepts_valid_cp():
    cluster = mp.Cluster.preset("dgx-h100", nodes=1)
    with pytest.raises(ConfigError, match="divisible by 2·cp"):
        check_layout(LLAMA8, cluster, mp.Job(global_batch=8, seq_len=1004), mp.Layout(cp=4))
    assert check_layout(LLAMA8, cluster, mp.Job(global_batch=8, seq_len=1024),
                        mp.Layout(cp=4)) == (LLAMA8.num_layers,)


def test_executor_accepts_cp_and_refuses_what_it_cannot_shard():
    from meshplan.executor.parallelize import check_layout_runnable
    tiny = mp.ModelSpec(name="t", num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2,
                        vocab_size=64, max_seq_len=64)
    job = mp.Job(global_batch=4, seq_len=64, precision="fp32")
    assert check_layout_runnable(tiny, job, mp.Layout(cp=4, tp=2)) == 4
    with pytest.raises(ConfigError, match="num_kv_heads = 2"):
        check_layout_runnable(tiny, job, mp.Layout(cp=2, tp=2, cp_style="all-to-all"))
