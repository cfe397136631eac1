"""The compiled dense block's kept bytes on CPU (benchmarks/compiled_dense_saved_bytes.py,
the named memory correction ``compiled_dense_block_kept`` of
meshplan.costmodel.compiled_block_memory): what an executor dense block compiled by
Inductor saves for its backward is the cost model's compiled-block count byte for byte a
token, well under the eager count, and the rule prices a compiled dense layout without rows
so (bf16, one rank, one 1F1B stage) and nowhere else."""

import pytest

TOKENS = (256, 512)


@pytest.mark.slow
def test_compiled_dense_block_keeps_what_the_compiled_block_formula_says(load_benchmark):
    """Llama-style, h 160, 4 heads of 64 (2 K/V), SwiGLU of 224, two sequences, no
    recomputation: the block saves 4,824 B a token — its input, the QKV input, the residual
    and the MLP input (4·e·h = 1,280), the RMSNorms' rsqrt (8), the rotated Q, expanded K
    and V and the attention output (4·e·q = 2,048), the log-sum-exp (16), fc1's output and
    the SwiGLU product (3·e·f = 1,344), the rotary tables (2·s·d·e: 128 a token here). The
    eager count reads 6,680: the norms' fp32 input copies (8·h) and outputs before the
    gain (2·e·h), SiLU's output (e·f) and a second rotary cast, less the input and residual
    it does not keep. At the larger count the whole block, its 16-bit weight copies
    included, is the formula byte for byte."""
    b = load_benchmark("compiled_dense_saved_bytes")
    r = b.measure(b.model_spec(seq=max(TOKENS)), TOKENS)
    assert r["per_token"] == r["formula_per_token"] == 4824.0
    assert r["bytes"] == r["formula"]
    assert r["eager_per_token"] == 6680.0


def _cluster(corrections_off: bool = False):
    from dataclasses import replace

    import meshplan as mp
    from meshplan.costmodel.compiled_block_memory import COMPILED_DENSE_BLOCK
    on = mp.Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1)
    if not corrections_off:
        return on
    gpu = on.gpu
    return on.replace(gpu=replace(gpu, corrections=gpu.corrections.without(
        COMPILED_DENSE_BLOCK)))


def _spec(**kw):
    import meshplan as mp
    return mp.ModelSpec(
        name="d", num_layers=8, hidden_size=1024, num_heads=8, num_kv_heads=2, head_dim=128,
        ffn_hidden_size=2816, vocab_size=32000, max_seq_len=2048, activation="swiglu",
        norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False, **kw)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_a_compiled_dense_layout_without_rows_is_priced_as_the_compiled_block(recompute):
    """Datasheet, one GPU, compiled, bf16: the layer keeps the compiled block's bytes (with
    its 16-bit copies, which leave the weights); under full recomputation its input, and
    the copies are gone from every layer's states. Switched off: the eager count back;
    step time unmoved."""
    import meshplan as mp
    from meshplan.costmodel import estimate
    from meshplan.costmodel.compiled_block_memory import (COMPILED_DENSE_BLOCK,
                                                          compiled_dense_kept_bytes,
                                                          linear_copy_bytes)
    from meshplan.costmodel.tables import layer_tables
    spec, on, off = _spec(), _cluster(), _cluster(corrections_off=True)
    job = mp.Job(global_batch=8, seq_len=2048, precision="bf16", runtime="torch")
    lay = mp.Layout(micro_batch=4, compile=True, recompute=recompute)
    copies = linear_copy_bytes(spec, job, spec.ffn_hidden_size)
    t, t0 = layer_tables(spec, on, job, lay), layer_tables(spec, off, job, lay)
    kept = compiled_dense_kept_bytes(spec, job, 4 * 2048, recompute)
    assert t.layer_activation_bytes == pytest.approx(
        kept + (copies if recompute != "full" else 0.0))
    if recompute != "full":
        assert t0.layer_activation_bytes > 1.2 * kept
    # the copies counted with the weights before: every linear's, and the norms' gains
    # (2 B each) that the compiled block does not save
    assert t0.layer_state_bytes - t.layer_state_bytes == pytest.approx(copies + 2 * 2 * 1024)
    e = estimate(spec, on, job, lay)
    assert COMPILED_DENSE_BLOCK in {c.name for c in e.corrections}
    assert e.step_time_s == estimate(spec, off, job, lay).step_time_s
    assert e.memory_peak_bytes < estimate(spec, off, job, lay).memory_peak_bytes


@pytest.mark.parametrize("change", [
    dict(schedule="gpipe"), dict(pp=2, schedule="gpipe"), dict(pp=2, dp=2),
    dict(pp=2, schedule="interleaved-1f1b", vpp=2), dict(dp=2), dict(tp=2),
    dict(compile=False), dict(zero=2, dp=2)],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_the_compiled_dense_rule_stays_off_where_it_was_not_read(change):
    """1F1B stages of one rank each, compiled, bf16: anywhere else (GPipe, interleaved,
    DDP or FSDP2 cutting the graph, tp, eager) the layout is priced as before, and the estimate
    names no such correction; nor in fp8 but under the tensorwise recipe it was checked
    on, nor for an MoE model (its own rule)."""
    import meshplan as mp
    from meshplan.costmodel import estimate
    from meshplan.costmodel.compiled_block_memory import (COMPILED_DENSE_BLOCK,
                                                          compiled_dense_applies)
    spec = _spec()
    lay = mp.Layout(micro_batch=2, compile=True).replace(**change)
    cluster = mp.Cluster.preset("dgx-h100", nodes=1, gpus_per_node=lay.num_gpus)
    job = mp.Job(global_batch=16, seq_len=2048, runtime="torch")
    base = mp.Layout(micro_batch=2, compile=True)
    numbers = cluster.gpu.corrections
    assert compiled_dense_applies(spec, job, base, numbers)
    assert not compiled_dense_applies(spec, job, lay, numbers)
    assert COMPILED_DENSE_BLOCK not in {c.name for c in estimate(spec, cluster, job,
                                                                  lay).corrections}
    fp8 = mp.Job(global_batch=16, seq_len=2048, runtime="torch", precision="fp8",
                 fp8_recipe="tensorwise")
    assert compiled_dense_applies(spec, fp8, base, numbers)
    rowwise = mp.Job(global_batch=16, seq_len=2048, runtime="torch", precision="fp8",
                     fp8_recipe="rowwise")
    assert not compiled_dense_applies(spec, rowwise, base, numbers)
    moe = _spec(num_experts=8, experts_per_token=2, moe_ffn_hidden_size=512)
    assert not compiled_dense_applies(moe, job, base, numbers)


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_a_compiled_fp8_tensorwise_layout_is_the_compiled_block_moved_by_fp8(recompute):
    """fp8 (tensorwise): the compiled block's bf16-arm count moved by the executor's fp8
    terms (the 16-bit linear inputs the partitioner recomputes), no 16-bit copies."""
    import meshplan as mp
    from meshplan.costmodel.compiled_block_memory import compiled_dense_kept_bytes
    from meshplan.costmodel.fp8_cost import torch_memory
    from meshplan.costmodel.tables import layer_tables
    spec = _spec()
    job = mp.Job(global_batch=8, seq_len=2048, precision="fp8", fp8_recipe="tensorwise",
                 runtime="torch")
    lay = mp.Layout(micro_batch=4, compile=True, recompute=recompute)
    t, t0 = layer_tables(spec, _cluster(), job, lay), layer_tables(spec, _cluster(True), job,
                                                                  lay)
    moved = torch_memory(spec, job, 4, 1, False, recompute, 0.0, compile=True, fsdp=False,
                         compiled_row=False)["activation_delta_bytes"]
    assert t.layer_activation_bytes == pytest.approx(
        compiled_dense_kept_bytes(spec, job, 4 * 2048, recompute) + moved)
    assert t.layer_activation_bytes < t0.layer_activation_bytes


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_compiled_dense_rule_applies_to_1f1b_stages(recompute):
    """pp 2 under 1F1B (one rank a stage): the rule applies as on one stage (read POST HOC
    on the 2-GPU checks' pp 2 arms, ``one_compiled_graph``): named in the estimate, the
    first stage's memory below the eager count's, no stage's above (full recomputation: the
    last stage's peak is at its output layer), step time unmoved."""
    from _compiled_rules import rule_at_pp2

    from meshplan.costmodel.compiled_block_memory import (COMPILED_DENSE_BLOCK,
                                                          compiled_dense_applies)
    e, e0 = rule_at_pp2(_spec(), COMPILED_DENSE_BLOCK, compiled_dense_applies, recompute)
    assert e.memory[0].total_bytes < e0.memory[0].total_bytes
    for s, s0 in zip(e.memory, e0.memory):
        assert s.total_bytes <= s0.total_bytes
