"""What meshplan's ring attention executes, counted, against what the cost model prices:
attention kernel calls and their query-key pairs (costmodel.context eq. 2), and the memory
traffic of its copies, casts and merges (costmodel.ring_memory eq. 7-8), on 2 and 4 gloo
ranks with :class:`meshplan.executor.op_count.OpCounter`."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.costmodel import context as cx
from meshplan.costmodel import ring_memory as rm

# 4 query heads, 2 kv heads (GQA rep 2), head_dim 8
SPEC = mp.ModelSpec(name="w", num_layers=1, hidden_size=32, num_heads=4, num_kv_heads=2,
                    vocab_size=16)
TOKENS_PER_RANK = 8                                                # 2 chunks of 4


def test_ring_memory_bytes_by_hand():
    """heads 2, kv heads 1, head_dim 4, s = 8, cp = 2, bf16: Q = 4 tokens·8 = 32 elements,
    K = 16, L = 8, rep 2, e = 2, a = 4 (module docstring's terms, summed by hand)."""
    spec = mp.ModelSpec(name="h", num_layers=1, hidden_size=8, num_heads=2, num_kv_heads=1,
                        vocab_size=16)
    # forward: entry 2e(Q+2K) = 256; step 0: repeat 2e(K+Q) = 192, cast (e+a)Q = 192;
    # step 1 (the larger of the two halves, all queries over half the block): K/V halves
    # 4e·K/2 = 64, repeat 96, cast 192, merge a(9Q + 17L) = 1696; exit (a+e)Q = 192
    fwd = 256 + (192 + 192) + (64 + 96 + 192 + 1696) + 192
    # backward: entry (2e+a)Q = 256; step 0: output copy 2eQ = 128, repeat 192, dQ cast and
    # add (e+a)Q + 3aQ = 576, dK/dV zeroed 2aK = 128, dK/dV 2[(e+a)Q + a(Q+K) + 3aK] = 1152;
    # step 1 (the larger: half the queries over the whole block): halves 6e·Q/2 + 2a·L/2 =
    # 224, repeat 192, dQ 96 + 192, dK/dV 1152; exit (a+e)(Q+2K) = 384
    bwd = 256 + (128 + 192 + 576 + 128 + 1152) + (224 + 192 + 288 + 1152) + 384
    assert rm.ring_memory_bytes(spec, 8, 1, 1, 2, 2) == (fwd, bwd)
    assert rm.ring_memory_bytes(spec, 8, 1, 1, 1, 2) == (0.0, 0.0)
    # per-token tensors: twice the batch or twice the tokens per rank, twice the bytes
    f2, b2 = rm.ring_memory_bytes(spec, 8, 2, 1, 2, 2)
    assert (f2, b2) == (2 * fwd, 2 * bwd)


def _count_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from _gloo import write_rank_result
    from meshplan.executor.context_parallel import RingAttentionCore
    from meshplan.executor.model import _RecomputedCore
    from meshplan.executor.op_count import OpCounter
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    g = torch.Generator().manual_seed(rank)
    b, t, d = 1, TOKENS_PER_RANK, SPEC.head_dim

    def inputs():      # transposed views of (b, s, h, d) tensors, as the executor's Attention
        x = [torch.randn(b, t, n, d, generator=g).to(torch.bfloat16).requires_grad_()
             for n in (SPEC.num_heads, SPEC.num_kv_heads, SPEC.num_kv_heads)]
        return [y.transpose(1, 2) for y in x]

    def calls(c):
        return [[a.direction, a.q_len, a.k_len, a.causal, a.pairs] for a in c.attention]
    core = RingAttentionCore(dist.group.WORLD)
    out = {}
    for name, run in (("plain", core),
                      ("recomputed", lambda q, k, v: _RecomputedCore.apply(core, q, k, v))):
        q, k, v = inputs()
        with OpCounter() as fwd:
            y = run(q, k, v)
        dout = torch.randn(b, t, SPEC.num_heads, d, generator=g).to(torch.bfloat16)
        with OpCounter() as bwd:      # grads of the views themselves: no accumulation copy
            torch.autograd.grad(y, (q, k, v), dout.transpose(1, 2))
        out[name] = {"forward_calls": calls(fwd), "backward_calls": calls(bwd),
                     "forward_bytes": fwd.memory_bytes, "backward_bytes": bwd.memory_bytes}
    write_rank_result(out_dir, rank, out)


def _modes(rank: int, cp: int) -> list[tuple[float, float]]:
    """(f_q, f_k) of each ring step on ``rank`` (context_parallel._step_slices)."""
    modes = [(1.0, 1.0)]
    for i in range(1, cp):
        modes.append((1.0, 0.5) if (rank - i) % cp < rank else (0.5, 1.0))
    return modes


@pytest.mark.distributed
@pytest.mark.parametrize("cp", [2, 4])
def test_ring_executes_what_the_cost_model_counts(cp, tmp_path):
    """Per rank and pass: cp block kernels, the causal local block then half blocks, their
    pairs summing to eq. (2); the backward runs one backward kernel per block and no forward
    (selective recompute runs the cp forward blocks again in backward); the bytes of every other op equal
    eq. (7) and (8) for that rank's steps. Two layout differences between the CPU kernel the
    test runs and CUDA's flash kernel are added explicitly: the CPU kernel writes its output
    contiguous (the whole-output copy of a full-query backward step, 2e·Q, does not happen)
    and its log-sum-exp (b, s, h)-strided (copied there instead, 2a·L)."""
    pytest.importorskip("torch")
    from _gloo import run_gloo_ranks
    seq = TOKENS_PER_RANK * cp
    c = seq // (2 * cp)
    e, a = 2, rm.ACCUM_BYTES
    q_el = TOKENS_PER_RANK * SPEC.q_dim
    lse_el = TOKENS_PER_RANK * SPEC.num_heads
    args = (SPEC, seq, 1, 1, cp, e)
    for rank, got in enumerate(run_gloo_ranks(_count_worker, cp, tmp_path)):
        plain, rec = got["plain"], got["recomputed"]
        fwd = plain["forward_calls"]
        assert [x[0] for x in fwd] == ["forward"] * cp
        assert fwd[0][1:4] == [2 * c, 2 * c, True]
        assert all(x[4] == cx.ring_step_pairs(seq, cp) and not x[3] for x in fwd[1:])
        assert sum(x[4] for x in fwd) == cx.attention_pairs_per_rank(seq, cp)
        assert plain["backward_calls"] == [["backward", *x[1:]] for x in fwd]
        assert rec["forward_calls"] == fwd          # the forward, without keeping its graph
        assert rec["backward_calls"] == fwd + plain["backward_calls"]

        modes = _modes(rank, cp)
        want_f = rm.ring_entry_exit_bytes(*args, backward=False) + sum(
            rm.ring_memory_bytes_per_step(*args, fq, fk, step=i, backward=False)
            for i, (fq, fk) in enumerate(modes))
        full_q_steps = sum(1 for fq, _ in modes if fq == 1.0)
        want_b = (rm.ring_entry_exit_bytes(*args, backward=True) + sum(
            rm.ring_memory_bytes_per_step(*args, fq, fk, step=i, backward=True)
            for i, (fq, fk) in enumerate(modes))
            - full_q_steps * 2 * e * q_el + full_q_steps * 2 * a * lse_el)
        assert plain["forward_bytes"] == want_f, (rank, plain["forward_bytes"], want_f)
        assert plain["backward_bytes"] == want_b, (rank, plain["backward_bytes"], want_b)


def test_busiest_rank_bounds_every_rank():
    """ring_memory_bytes takes the larger half-block mode at each step: no rank's steps
    add up to more."""
    for cp in (2, 4, 8):
        seq = TOKENS_PER_RANK * cp
        args = (SPEC, seq, 1, 1, cp, 2)
        f, b = rm.ring_memory_bytes(*args)
        for rank in range(cp):
            for backward, total in ((False, f), (True, b)):
                ranks = rm.ring_entry_exit_bytes(*args, backward=backward) + sum(
                    rm.ring_memory_bytes_per_step(*args, fq, fk, step=i, backward=backward)
                    for i, (fq, fk) in enumerate(_modes(rank, cp)))
                assert ranks <= total
