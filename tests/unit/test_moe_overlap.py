"""Megatron-Core's combined 1F1B (``Job.moe_a2a_overlap``): each direction's expert-parallel
all-to-alls priced beside the paired direction's compute (meshplan.costmodel.moe_overlap)."""

import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.costmodel.compute import PassCost
from meshplan.costmodel.moe_overlap import a2a_overlapped, overlapped_ep_s, paired_share

MODEL = mp.ModelSpec.preset("qwen3-30b-a3b")
CLUSTER = mp.Cluster.preset("dgx-h100", nodes=4)
INTERLEAVED = mp.Layout(dp=16, pp=2, ep=8, vpp=4, schedule="interleaved-1f1b", zero=1,
                        micro_batch=1)


def job(overlap: bool, **kw) -> mp.Job:
    return mp.Job(global_batch=1024, seq_len=4096, moe_a2a_overlap=overlap, **kw)


def test_an_all_to_all_costs_what_its_cover_does_not_hide_plus_the_interference():
    attn_f, exp_f = PassCost(gemm_s=2.0), PassCost(gemm_s=1.0, memory_bound_s=1.0)
    attn_b, exp_b = PassCost(attention_s=4.0), PassCost(gemm_s=4.0)
    # ample cover: each half-all-to-all hides whole and costs the interference of it
    assert overlapped_ep_s(attn_f, exp_f, attn_b, exp_b, 1.0, 1.0, 1.0, 0.15) == \
        pytest.approx((0.15, 0.15))
    # the forward's 10 s: halves of 5 s behind the backward's 4 s of MLP and of attention
    f, b = overlapped_ep_s(attn_f, exp_f, attn_b, exp_b, 10.0, 6.0, 1.0, 0.0)
    assert f == pytest.approx(1.0 + 1.0) and b == pytest.approx(1.0 + 1.0)
    # nothing paired: every all-to-all exposed as before
    assert overlapped_ep_s(attn_f, exp_f, attn_b, exp_b, 10.0, 6.0, 0.0, 0.15) == (10.0, 6.0)


def test_warm_up_and_cool_down_passes_run_alone():
    assert paired_share(mp.Layout(dp=8, ep=8), 4) == pytest.approx(0.75)
    # first pipeline rank's interleaved warm-up: 2·(pp − 1) + (vpp − 1)·pp = 2 + 6 = 8
    assert paired_share(INTERLEAVED, 64) == pytest.approx(1 - 8 / 256)
    assert paired_share(INTERLEAVED, 1) == 0.0


def test_it_applies_only_where_megatron_runs_it():
    assert a2a_overlapped(job(True), INTERLEAVED)
    assert not a2a_overlapped(job(False), INTERLEAVED)
    assert not a2a_overlapped(job(True), INTERLEAVED.replace(ep=1))
    plain = mp.Layout(dp=16, pp=2, ep=8, zero=1, micro_batch=1)
    assert not a2a_overlapped(job(True), plain)            # pp > 1 needs interleaving


def test_the_overlapped_step_is_shorter_by_no_more_than_its_all_to_alls():
    off = mp.estimate(MODEL, CLUSTER, job(False), INTERLEAVED)
    on = mp.estimate(MODEL, CLUSTER, job(True), INTERLEAVED)
    assert 0 < on.time.ep_comm_s < off.time.ep_comm_s
    assert off.step_time_s - off.time.ep_comm_s <= on.step_time_s < off.step_time_s
    assert on.time.gemm_s == off.time.gemm_s


@pytest.mark.parametrize("layout", [INTERLEAVED.replace(ep=1),
                                    mp.Layout(dp=16, pp=2, ep=8, zero=1, micro_batch=1)],
                         ids=["ep 1", "pp 2 without interleaving"])
def test_where_megatron_does_not_run_it_nothing_changes(layout):
    a, b = (mp.estimate(MODEL, CLUSTER, job(ov), layout) for ov in (False, True))
    assert a.step_time_s == b.step_time_s and a.memory_peak_bytes == b.memory_peak_bytes


def test_the_estimate_says_where_it_applies_and_where_it_does_not():
    from meshplan.costmodel.moe_overlap import OVERLAP_CAVEAT
    assert OVERLAP_CAVEAT in mp.estimate(MODEL, CLUSTER, job(True), INTERLEAVED).caveats
    assert not any("moe_a2a_overlap" in c for c in
                   mp.estimate(MODEL, CLUSTER, job(False), INTERLEAVED).caveats)
    no_ep = mp.estimate(MODEL, CLUSTER, job(True), INTERLEAVED.replace(ep=1)).caveats
    assert any("no effect on this layout: Layout.ep = 1" in c for c in no_ep)
    plain = mp.Layout(dp=16, pp=2, ep=8, zero=1, micro_batch=1)
    assert any("pp = 2 without the interleaved schedule" in c
               for c in mp.estimate(MODEL, CLUSTER, job(True), plain).caveats)
    dense = mp.estimate(mp.ModelSpec.preset("llama3-8b"), CLUSTER, job(True),
                        mp.Layout(dp=32, micro_batch=1)).caveats
    assert any("the model has no routed experts" in c for c in dense)


def test_the_executor_does_not_run_it():
    with pytest.raises(mp.ConfigError, match="moe_a2a_overlap = True needs runtime = 'megatron'"):
        job(True, runtime="torch")
    with pytest.raises(mp.ConfigError, match="moe_a2a_overlap"):
        mp.Job(global_batch=8, seq_len=64, moe_a2a_overlap="yes")


def test_the_command_line_takes_it(capsys):
    argv = ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "4",
            "--global-batch", "1024", "--seq-len", "4096", "--dp", "16", "--pp", "2",
            "--ep", "8", "--schedule", "interleaved-1f1b", "--vpp", "4"]
    assert main(argv) == 0
    off = capsys.readouterr().out
    assert main(argv + ["--moe-a2a-overlap"]) == 0
    on = capsys.readouterr().out
    assert off != on and "step time" in on
