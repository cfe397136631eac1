"""What meshplan's all-to-all (Ulysses) core moves outside its exchanges and attention
kernel, counted on 2 and 4 gloo ranks with :class:`meshplan.executor.op_count.OpCounter`,
against :mod:`meshplan.costmodel.a2a_memory` eq. (9)-(10); and where ``estimate`` adds it."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.costmodel import a2a_memory as am
from meshplan.costmodel import ring_memory as rm
from meshplan.costmodel.compute import hbm_s
from meshplan.costmodel.context_tables import cp_attention, cp_group_links
from meshplan.hardware_profiles import Cluster

HEAD_DIM, TOKENS_PER_RANK = 8, 8
# (heads, kv heads, micro-batch): GQA and MHA, one or several heads per rank, b > 1
CASES = [(4, 2, 1), (8, 4, 2), (8, 8, 1), (16, 4, 2)]


def _spec(heads: int, kv: int) -> mp.ModelSpec:
    return mp.ModelSpec(name="w", num_layers=1, hidden_size=heads * HEAD_DIM, num_heads=heads,
                        num_kv_heads=kv, vocab_size=16)


def _count_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from _gloo import write_rank_result
    from meshplan.executor.context_parallel import AllToAllAttentionCore
    from meshplan.executor.op_count import OpCounter
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    g = torch.Generator().manual_seed(rank)
    core = AllToAllAttentionCore(dist.group.WORLD)
    out = []
    for heads, kv, b in CASES:
        if kv % world:               # the all-to-all style needs whole kv heads per rank
            out.append(None)
            continue
        # transposed views of (b, s, h, d) tensors, as the executor's Attention passes them
        x = [torch.randn(b, TOKENS_PER_RANK, n, HEAD_DIM, generator=g).to(torch.bfloat16)
             .requires_grad_() for n in (heads, kv, kv)]
        q, k, v = (t.transpose(1, 2) for t in x)
        with OpCounter() as fwd:
            y = core(q, k, v)
        dout = torch.randn(b, TOKENS_PER_RANK, heads, HEAD_DIM, generator=g).to(torch.bfloat16)
        with OpCounter() as bwd:
            torch.autograd.grad(y, (q, k, v), dout.transpose(1, 2))
        bytes_ = [sum(n for op, n in c.memory_ops.items() if op != "aten::_unsafe_view")
                  for c in (fwd, bwd)]
        out.append(bytes_ + [y.is_contiguous()])
    write_rank_result(out_dir, rank, out)


@pytest.mark.distributed
@pytest.mark.parametrize("cp", [2, 4])
def test_all_to_all_core_moves_what_the_count_says(cp, tmp_path):
    """Every rank, every case: the bytes of eq. (9) and (10) exactly (``_unsafe_view`` is a
    view); the output comes back (b, h, s/cp, d) contiguous, so the attention module's
    reshape copies it (eq. 11)."""
    pytest.importorskip("torch")
    from _gloo import run_gloo_ranks
    for got in run_gloo_ranks(_count_worker, cp, tmp_path):
        for (heads, kv, b), row in zip(CASES, got):
            if row is None:
                continue
            f, bw, contiguous = row
            want = am.all_to_all_memory_bytes(_spec(heads, kv), TOKENS_PER_RANK * cp, b, 1,
                                              cp, 2)
            assert (f, bw) == want, (cp, heads, kv, b, f, bw, want)
            assert contiguous


def test_all_to_all_bytes_by_hand():
    """4 heads / 2 kv heads of 8, 16 tokens, cp 2, b 1, bf16: Q = 8·32 = 256, K = 128 per
    rank; q's 2 heads per rank copied into place, k's and v's single head a view."""
    spec = _spec(4, 2)
    fwd, bwd = am.all_to_all_memory_bytes(spec, 16, 1, 1, 2, 2)
    # q: 7e·Q; k, v: 5e·K each; repeat 2e(K + Q); output flip + stack 3e·Q
    assert fwd == 14 * 256 + 2 * 10 * 128 + 4 * (128 + 256) + 6 * 256
    # output adjoint 9e·Q + the reshape 2e·Q; repeat 2e(Q + K); inputs 7e each
    assert bwd == 22 * 256 + 4 * (256 + 128) + 14 * (256 + 2 * 128)
    assert am.all_to_all_memory_bytes(spec, 16, 1, 1, 1, 2) == (0.0, 0.0)
    assert am.cp_output_copy_bytes(spec, 16, 1, 1, 2, 2) == 4 * 256


@pytest.mark.parametrize("style", ["ring", "all-to-all"])
def test_cp_attention_adds_the_executors_copies_under_runtime_torch(style):
    """Predicate: runtime "torch" only (Megatron's TransformerEngine cores keep theirs in
    their kernels). Effect: the attention part grows by eq. (7)-(8) (ring) or (9)-(10)
    (all-to-all), plus eq. (11) forward, at the profile's HBM bandwidth."""
    model = mp.ModelSpec(name="llama", num_layers=2, hidden_size=2048, num_heads=16,
                         num_kv_heads=8, ffn_hidden_size=5632, vocab_size=32000,
                         max_seq_len=65536)
    cl = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=4)
    layout = mp.Layout(cp=4, zero=1, cp_style=style)
    link = cp_group_links(cl, layout).cp
    s = 65536

    def attn(runtime):
        job = mp.Job(global_batch=2, seq_len=s, precision="bf16", runtime=runtime)
        return cp_attention(model, cl, job, layout, link)
    t, m = attn("torch"), attn("megatron")
    mem = rm.ring_memory_bytes if style == "ring" else am.all_to_all_memory_bytes
    f, b = mem(model, s, 1, 1, 4, 2)
    out = am.cp_output_copy_bytes(model, s, 1, 1, 4, 2)
    assert t[0] - m[0] == pytest.approx(hbm_s(cl.gpu, f + out))
    assert t[1] - m[1] == pytest.approx(hbm_s(cl.gpu, b))
    assert t[2:] == m[2:]
