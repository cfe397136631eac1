"""meshplan.costmodel.context against hand-computed numbers (Llama-3-8B: 32 heads of 128,
8 kv heads: q_dim 4096, kv_dim 1024)."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.costmodel import context as cx
from meshplan.costmodel.memory import layer_activations, logits_bytes

L8 = mp.ModelSpec.preset("llama3-8b")


def test_llama3_8b_shapes_used_below():
    assert (L8.q_dim, L8.kv_dim) == (4096, 1024)


def test_tokens_and_per_rank_memory_divide_by_cp():
    assert cx.tokens_per_rank(131072, 1, 4) == 32768
    assert cx.per_rank_bytes(8e9, 4) == 2e9
    # eq. (1) agrees with the memory model run at s/cp: with a fused attention kernel every
    # activation term is per token, so the per-rank bytes are the full-sequence bytes / cp
    full = layer_activations(L8, mp.Job(global_batch=8, seq_len=65536), 1, 2, True)
    local = layer_activations(L8, mp.Job(global_batch=8, seq_len=16384), 1, 2, True)
    for f in ("replicated_bytes", "sharded_bytes", "attention_core_bytes", "input_bytes"):
        assert getattr(local, f) == pytest.approx(cx.per_rank_bytes(getattr(full, f), 4))
    assert logits_bytes(L8, mp.Job(global_batch=8, seq_len=16384), 1, 2) == \
        cx.per_rank_bytes(logits_bytes(L8, mp.Job(global_batch=8, seq_len=65536), 1, 2), 4)


def _pairs_by_brute_force(seq_len: int, cp: int, rank: int, balanced: bool) -> int:
    """Causal pairs of a rank's queries: a query at position p sees p + 1 keys."""
    if balanced:
        c = seq_len // (2 * cp)
        pos = [*range(rank * c, rank * c + c),
               *range((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)]
    else:
        n = seq_len // cp
        pos = range(rank * n, rank * n + n)
    return sum(p + 1 for p in pos)


@pytest.mark.parametrize("seq_len,cp", [(16, 4), (48, 3), (64, 8), (8, 1)])
def test_attention_pairs_match_counting_positions(seq_len, cp):
    bal = [_pairs_by_brute_force(seq_len, cp, r, True) for r in range(cp)]
    assert set(bal) == {cx.attention_pairs_per_rank(seq_len, cp)}          # all ranks alike
    assert sum(bal) == seq_len * (seq_len + 1) // 2
    cont = [_pairs_by_brute_force(seq_len, cp, r, False) for r in range(cp)]
    assert max(cont) == cx.attention_pairs_per_rank(seq_len, cp, balanced=False)


def test_attention_pairs_and_flops_by_hand():
    # s = 16, cp = 4: c = 2, rank 0 holds 0, 1, 14, 15: 1 + 2 + 15 + 16 = 34 = 2·4·2² + 2
    assert cx.attention_pairs_per_rank(16, 4) == 34
    # contiguous: the last rank holds 12..15: 13 + 14 + 15 + 16 = 58
    assert cx.attention_pairs_per_rank(16, 4, balanced=False) == 58
    assert cx.causal_imbalance(4, balanced=False) == 7 / 4
    assert cx.causal_imbalance(4, balanced=True) == 1.0
    # 128k tokens, cp 4: c = 16384, pairs = 8·16384² + 16384 = 2 147 500 032;
    # 4·q_dim/tp = 4·4096/8 = 2048 FLOPs a pair
    assert cx.attention_pairs_per_rank(131072, 4) == 2_147_500_032
    assert cx.attention_flops_per_rank(L8, 131072, 1, 8, 4) == 2_147_500_032 * 2048
    # the papers' count (no causal halving): 32768 queries × 131072 keys × 2048
    assert cx.attention_flops_per_rank(L8, 131072, 1, 8, 4, causal_skip=False) == \
        32768 * 131072 * 2048
    assert cx.ring_step_pairs(131072, 4) == 2 * 16384 ** 2
    with pytest.raises(ValueError, match="2·cp = 8"):
        cx.attention_pairs_per_rank(1004, 4)


def test_ring_bytes_and_exchange_counts_by_hand():
    # K and V of 32768 tokens × 8 kv heads / tp 8 × 128 × 2 bytes = 16 MiB per exchange
    assert cx.ring_kv_bytes(L8, 131072, 1, 8, 4, 2) == 2 * 32768 * 128 * 2 == 16_777_216
    assert cx.ring_dkv_bytes(L8, 131072, 1, 8, 4) == 33_554_432          # fp32 accumulators
    assert cx.ring_exchanges(4) == {"forward_kv": 3, "backward_kv": 3, "backward_dkv": 4}
    assert cx.ring_exchanges(1) == {"forward_kv": 0, "backward_kv": 0, "backward_dkv": 0}


def test_ring_exposed_time_only_where_transfer_outlasts_compute():
    bw = 16_777_216 / 2e-3                      # a 16 MiB K/V block takes 2 ms
    kw = dict(kv_bytes=16_777_216, bandwidth_bytes_per_s=bw)
    assert cx.ring_exposed_forward_s(4, step_compute_s=1e-3, **kw) == pytest.approx(3e-3)
    assert cx.ring_exposed_forward_s(4, step_compute_s=3e-3, **kw) == 0.0
    assert cx.ring_exposed_forward_s(1, step_compute_s=0.0, **kw) == 0.0
    # latency adds to each transfer: 2 ms + 0.5 ms against 1 ms of compute, 3 times
    assert cx.ring_exposed_forward_s(4, step_compute_s=1e-3, latency_s=5e-4, **kw) == \
        pytest.approx(4.5e-3)
    # backward, cp 4, step 2.5 ms, K/V 2 ms, dK/dV 4 ms: step 0 hides K/V (0), steps 1, 2
    # carry K/V + dK/dV = 6 ms (3.5 each), step 3 the last-but-one dK/dV (1.5), and the
    # final dK/dV home (4): 12.5 ms
    assert cx.ring_exposed_backward_s(4, step_compute_s=2.5e-3, dkv_bytes=2 * 16_777_216,
                                      **kw) == pytest.approx(12.5e-3)
    # cp 2: no middle steps: max(0, 2 − 5) + max(0, 4 − 5) + 4 = 4 ms
    assert cx.ring_exposed_backward_s(2, step_compute_s=5e-3, dkv_bytes=2 * 16_777_216,
                                      **kw) == pytest.approx(4e-3)


def test_all_to_all_bytes_and_time_by_hand():
    # 64k tokens, cp 4, tp 2: 16384 tokens; q: 16384 × 4096/2 × 2 B; k, v: 16384 × 1024/2 × 2 B
    q, k, v, o = cx.all_to_all_buffers_bytes(L8, 65536, 1, 2, 4, 2)
    assert (q, k, v, o) == (67_108_864, 16_777_216, 16_777_216, 67_108_864)
    assert cx.all_to_all_sent_bytes(q, 4) == 50_331_648
    assert cx.all_to_all_s(q, 4, bandwidth_bytes_per_s=100e9, latency_s=1e-5) == \
        pytest.approx(50_331_648 / 100e9 + 1e-5)
    assert cx.all_to_all_s(q, 1, bandwidth_bytes_per_s=100e9) == 0.0


def test_mla_values_and_output_are_d_v_wide():
    # DeepSeek-V3: 128 heads, keys d_n + d_r = 192 wide a head, values and output d_v = 128
    ds = mp.ModelSpec.preset("deepseek-v3")
    assert (ds.kv_dim, ds.v_dim, ds.q_dim, ds.attn_out_dim) == (24576, 16384, 24576, 16384)
    tokens = 131072 // 4
    assert cx.ring_kv_bytes(ds, 131072, 1, 8, 4, 2) == tokens * (24576 + 16384) / 8 * 2
    assert cx.all_to_all_buffers_bytes(ds, 131072, 1, 8, 4, 2) == tuple(
        tokens * w / 8 * 2 for w in (24576, 24576, 16384, 16384))
    assert (L8.v_dim, L8.attn_out_dim) == (L8.kv_dim, L8.q_dim)   # not MLA: as before


def test_gradient_group_and_rank_strides():
    assert cx.gradient_reduction_ranks(8, 16) == 128
    assert cx.rank_strides(8, 4, 2, 2, "tp-dp-pp") == {"tp": 1, "cp": 8, "dp": 32, "pp": 64}
    assert cx.rank_strides(8, 4, 2, 2, "tp-pp-dp") == {"tp": 1, "cp": 8, "pp": 32, "dp": 64}
    with pytest.raises(ValueError, match="rank order"):
        cx.rank_strides(8, 4, 2, 2, "pp-dp-tp")
