"""fp8 weights in the estimate: TransformerEngine's fp8 weight cache and the executor's
missing autocast copies counted by ``estimate()`` as by the planner's tables (they disagreed
by 2 bytes a linear parameter until 2026-12-01), and ``Job.fp8_param_gather`` (Megatron-LM
``--fp8-param-gather``): the linears' weights gathered and kept in fp8."""

import pytest

import meshplan as mp
from meshplan.costmodel import comm
from meshplan.costmodel.compute import linear_shapes
from meshplan.costmodel.data_parallel import group_links, zero3_layer
from meshplan.costmodel.fp8_cost import fp8_gathered_params
from meshplan.costmodel.memory import param_gather_bytes, stage_params
from meshplan.costmodel.tables import layer_tables
from meshplan.errors import ConfigError

MODEL = mp.ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                     max_seq_len=1024)
CLUSTER = mp.Cluster.preset("dgx-h100", nodes=2)


def job(precision="fp8", runtime="megatron", gather=False):
    return mp.Job(global_batch=64, seq_len=1024, precision=precision, runtime=runtime,
                  fp8_param_gather=gather)


def linear_params(tp):
    return sum(k * n for (_, k, n), _ in linear_shapes(MODEL, job(), 1, tp))


@pytest.mark.parametrize("runtime,per_param", [("megatron", 2.0), ("torch", -2.0)])
def test_estimate_counts_the_fp8_weight_copies_the_tables_count(runtime, per_param):
    # megatron: TE caches each fp8 weight and its transpose (+2 B); torch eager ZeRO-1: the
    # fp8 linears cast from the fp32 parameter, so autocast keeps no 16-bit copy (-2 B)
    lay = mp.Layout(dp=4, pp=2, tp=2, micro_batch=1, zero=1, sequence_parallel=True)
    e8, e16 = (mp.estimate(MODEL, CLUSTER, job(p, runtime), lay) for p in ("fp8", "bf16"))
    for r in range(2):
        assert e8.memory[r].weights_bytes - e16.memory[r].weights_bytes == pytest.approx(
            4 * per_param * linear_params(2))
    t = layer_tables(MODEL, CLUSTER, job("fp8", runtime), lay)
    assert e8.memory_peak_bytes == pytest.approx(max(t.rank_memory_bytes(r, 4)
                                                     for r in range(2)), rel=1e-12)


def test_fp8_param_gather_needs_fp8_under_megatron():
    for kw in (dict(precision="bf16"), dict(runtime="torch")):
        with pytest.raises(ConfigError, match="fp8_param_gather"):
            job(gather=True, **{**dict(precision="fp8"), **kw})
    with pytest.raises(ConfigError, match="True or False"):
        mp.Job(global_batch=8, seq_len=8, precision="fp8", fp8_param_gather="yes")


def test_gathered_bytes_move_the_linears_at_one_byte():
    params, lin = 1000.0, 600.0
    assert param_gather_bytes(job(), params, lin) == 2 * params
    assert param_gather_bytes(job(gather=True), params, lin) == 2 * (params - lin) + lin
    assert fp8_gathered_params(MODEL, job(), 2) == 0.0
    assert fp8_gathered_params(MODEL, job(gather=True), 2) == linear_params(2)


def test_zero1_parameter_all_gather_halves_for_the_linears():
    lay = mp.Layout(dp=16, pp=1, tp=1, micro_batch=1, zero=1)
    plain, fp8w = (mp.estimate(MODEL, CLUSTER, job(gather=g), lay) for g in (False, True))
    saved = MODEL.num_layers * linear_params(1) * (2 - 1)
    assert plain.comm_bytes["dp"] - fp8w.comm_bytes["dp"] == pytest.approx(
        comm.wire_bytes_gather(16, saved))
    assert fp8w.time.dp_comm_total_s < plain.time.dp_comm_total_s
    # the fp8 weight and its transpose replace the 16-bit weight and TE's cache
    assert plain.memory[0].weights_bytes - fp8w.memory[0].weights_bytes == pytest.approx(
        MODEL.num_layers * 2 * linear_params(1))
    assert fp8w.step_time_s <= plain.step_time_s


def test_zero3_layer_gathers_the_linears_in_fp8():
    lay = mp.Layout(dp=16, micro_batch=1, zero=3)
    link = group_links(CLUSTER, lay).dp
    t = layer_tables(MODEL, CLUSTER, job(), lay)
    p = stage_params(MODEL, 1, 1, first=False, last=False, pp=1)
    plain = zero3_layer(t.parts.layer, p, link, 16, 3, job(), 1, 0.0)
    fp8w = zero3_layer(t.parts.layer, p, link, 16, 3, job(gather=True), 1, 0.0,
                       linear_params(1))
    gathers = 2                               # forward and backward, ZeRO-3
    assert plain.wire_bytes - fp8w.wire_bytes == pytest.approx(
        gathers * comm.wire_bytes_gather(16, linear_params(1)))
