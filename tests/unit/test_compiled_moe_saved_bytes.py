"""The compiled MoE block's kept bytes on CPU (benchmarks/compiled_moe_saved_bytes.py, the
named memory correction ``compiled_moe_block_kept`` of meshplan.costmodel.moe_torch_memory):
what an executor MoE block compiled by Inductor saves for its backward is the cost model's
compiled-block count byte for byte a token, well under the eager count, and the
checkpointed (fully recomputed) block keeps no 16-bit weight copy."""

import pytest

TOKENS = (256, 512)


def _spec(b):
    # q (4 x 64) differs from h, K/V grouped, shared experts: every term of the formula
    return b.model_spec(hidden=160, heads=4, kv_heads=2, ffn=48, shared_ffn=96, experts=8,
                        top_k=2, shared=1, seq=max(TOKENS))


@pytest.mark.slow
def test_compiled_moe_block_keeps_what_the_compiled_block_formula_says(load_benchmark):
    """h 160, 4 heads of 64 (2 K/V), 8 experts of 48, top-2, one shared expert of 96, two
    sequences: the block saves 6,020 B a token — its input, the QKV input, the residual and
    the MLP input (4·e·h = 1,280), the norms' rsqrt (8), the rotated Q, expanded K and V and
    the attention output (4·e·q = 2,048) and the log-sum-exp (16), the shared experts'
    3·e·f_s (576), the router's 4E + 16k + 4k + 4 (76), per copy 16 + e·h (672), per padded
    row e·(h + 3·f_e) (1,216), the rotary tables (128: a position a token here). The eager
    count reads 8,476: the fp32 norm and router inputs (12·h), the norm outputs before their
    gain, SiLU's outputs, a second rotary cast, the top-k values and the padding index,
    which Inductor's partitioner re-runs in the backward. At the larger count the whole
    block, its 16-bit weight copies included, is the formula but for the grouped GEMM's
    int32 offsets (12 B an expert)."""
    b = load_benchmark("compiled_moe_saved_bytes")
    r = b.measure(_spec(b), TOKENS)
    assert r["per_token"] == pytest.approx(r["formula_per_token"], abs=1.0)
    assert r["per_token"] == pytest.approx(6020.0, abs=1.0)
    assert r["bytes"] == pytest.approx(r["formula"], abs=12 * 8)
    assert r["eager_per_token"] == pytest.approx(8476.0, abs=1.0)


@pytest.mark.slow
def test_checkpointed_compiled_moe_block_keeps_no_weight_copy(load_benchmark):
    """Full recomputation: the checkpointed compiled block saves its input (and the rotary
    tables, a few bytes of RNG state), not the 16-bit weight copies its uncheckpointed twin
    saves per call — so they exist for the one layer being recomputed, not for every layer
    all step as the weights' count had them."""
    b = load_benchmark("compiled_moe_saved_bytes")
    spec = _spec(b)
    kept = b.saved(b.compiled_block(spec, full=True), spec, TOKENS[1])
    sixteen = [v for v in kept.values() if v[1] == "bfloat16"]
    assert [v[3] for v in sixteen] == ["input"]
    # besides: the fp32 cos / sin tables (a position each) and the RNG state
    others = [v[1:3] for v in kept.values() if v[3] == ""]
    assert sorted(o for o in others if o[0] != "uint8") == [("float32", (TOKENS[1] // 2, 64))] * 2
    assert sum(v[0] for v in kept.values() if v[1] == "uint8") < 8192


def test_a_compiled_moe_layout_without_rows_is_priced_as_the_compiled_block():
    """Datasheet, one GPU, compiled: the layer keeps the compiled block's bytes with its
    16-bit copies, which leave the weights; under full recomputation it keeps its input
    and the copies are gone from every layer's states (the correction names itself, and
    switched off gives the eager count back)."""
    from dataclasses import replace

    import meshplan as mp
    from meshplan.costmodel import estimate
    from meshplan.costmodel.moe_torch_memory import (COMPILED_MOE_BLOCK,
                                                     compiled_block_copy_bytes,
                                                     compiled_block_kept_bytes)
    from meshplan.costmodel.tables import layer_tables
    spec = mp.ModelSpec(
        name="m", num_layers=8, hidden_size=1024, num_heads=8, num_kv_heads=2, head_dim=128,
        ffn_hidden_size=512, vocab_size=32000, max_seq_len=2048, activation="swiglu",
        norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False,
        num_experts=16, experts_per_token=4, moe_ffn_hidden_size=512, num_shared_experts=1,
        shared_expert_ffn_hidden_size=512)
    on = mp.Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1)
    gpu = on.gpu
    off = on.replace(gpu=replace(gpu, corrections=gpu.corrections.without(COMPILED_MOE_BLOCK)))
    job = mp.Job(global_batch=8, seq_len=2048, precision="bf16", runtime="torch")
    tokens, copies = 4 * 2048, compiled_block_copy_bytes(spec, job)
    lay = mp.Layout(micro_batch=4, compile=True)
    t, t0 = layer_tables(spec, on, job, lay), layer_tables(spec, off, job, lay)
    assert t.layer_activation_bytes == pytest.approx(
        compiled_block_kept_bytes(spec, job, tokens, 4 * tokens) + copies)
    assert t0.layer_activation_bytes > 1.3 * (t.layer_activation_bytes - copies)
    # the copies counted with the weights before: every linear's and expert's, and the
    # norms' and router's few (2 B each) that the compiled block does not save
    small = 2 * (2 * 1024 + 1024 * 16)
    assert t0.layer_state_bytes - t.layer_state_bytes == pytest.approx(copies + small)
    full = lay.replace(recompute="full")
    tf, tf0 = layer_tables(spec, on, job, full), layer_tables(spec, off, job, full)
    assert tf.layer_activation_bytes == tf0.layer_activation_bytes == tokens * 1024 * 2
    assert tf0.layer_state_bytes - tf.layer_state_bytes == pytest.approx(copies + small)
    e = estimate(spec, on, job, full)
    moved = {c.name: c.memory_delta_bytes for c in e.corrections}
    assert COMPILED_MOE_BLOCK in moved and moved[COMPILED_MOE_BLOCK] < -6 * copies
    assert e.step_time_s == estimate(spec, off, job, full).step_time_s


@pytest.mark.parametrize("change", [
    dict(schedule="gpipe"), dict(pp=2, schedule="gpipe"), dict(pp=2, dp=2), dict(dp=2),
    dict(recompute="selective"), dict(pp=2, recompute="selective"), dict(compile=False)],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_the_compiled_moe_rule_stays_off_where_it_was_not_read(change):
    """1F1B stages of one rank each, recompute none or full, compiled: anywhere else
    (GPipe's micro-batches in flight, DDP cutting the graph, selective recompute, eager)
    the layout is priced as before, and the estimate names no such correction."""
    import meshplan as mp
    from meshplan.costmodel import estimate
    from meshplan.costmodel.moe_torch_memory import COMPILED_MOE_BLOCK, compiled_block_applies
    spec = mp.ModelSpec(
        name="m", num_layers=8, hidden_size=1024, num_heads=8, num_kv_heads=2, head_dim=128,
        ffn_hidden_size=512, vocab_size=32000, max_seq_len=2048, activation="swiglu",
        norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False,
        num_experts=16, experts_per_token=4, moe_ffn_hidden_size=512)
    lay = mp.Layout(micro_batch=2, compile=True).replace(**change)
    cluster = mp.Cluster.preset("dgx-h100", nodes=1, gpus_per_node=lay.num_gpus)
    job = mp.Job(global_batch=16, seq_len=2048, runtime="torch")
    base = mp.Layout(micro_batch=2, compile=True)
    assert compiled_block_applies(spec, job, base, cluster.gpu.corrections)
    assert not compiled_block_applies(spec, job, lay, cluster.gpu.corrections)
    assert COMPILED_MOE_BLOCK not in {c.name for c in estimate(spec, cluster, job,
                                                                lay).corrections}
    tensorwise = mp.Job(global_batch=16, seq_len=2048, runtime="torch", precision="fp8",
                        fp8_recipe="tensorwise")
    assert not compiled_block_applies(spec, tensorwise, base, cluster.gpu.corrections)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_compiled_moe_rule_applies_to_1f1b_stages(recompute):
    """pp 2 under 1F1B (one rank a stage): the rule applies as on one stage (read POST HOC
    on the 2-GPU checks' pp 2 arms, ``one_compiled_graph``): named in the estimate, the
    peak memory below the eager count's, step time unmoved."""
    from _compiled_rules import rule_at_pp2

    import meshplan as mp
    from meshplan.costmodel.moe_torch_memory import COMPILED_MOE_BLOCK, compiled_block_applies
    spec = mp.ModelSpec(
        name="m", num_layers=8, hidden_size=1024, num_heads=8, num_kv_heads=2, head_dim=128,
        ffn_hidden_size=512, vocab_size=32000, max_seq_len=2048, activation="swiglu",
        norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False,
        num_experts=16, experts_per_token=4, moe_ffn_hidden_size=512)
    e, e0 = rule_at_pp2(spec, COMPILED_MOE_BLOCK, compiled_block_applies, recompute)
    assert e.memory_peak_bytes < e0.memory_peak_bytes
