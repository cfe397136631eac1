"""The host's share of a cp layer (costmodel/cp_host.py): the cores' operator counts against
what torch dispatches on 2-4 gloo ranks, the max(CPU, GPU) arithmetic, and the key
calibrate measures (bench_host_comm) written into and read from a profile."""

from __future__ import annotations

from dataclasses import replace

import pytest

import meshplan as mp
from meshplan.costmodel import cp_host as ch
from meshplan.hardware_profiles import Cluster


def _ops_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    """Every aten and c10d operator one forward and one backward of each core dispatch."""
    from collections import Counter

    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    from _gloo import write_rank_result
    from meshplan.executor.context_parallel import AllToAllAttentionCore, RingAttentionCore
    from meshplan.executor.model import AttentionCore

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops["comm" if func.name().startswith("c10d") else "aten"] += 1
            return func(*args, **(kwargs or {}))

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    g = torch.Generator().manual_seed(rank)
    out = {}
    for heads, kv in ((8, 4), (8, 8)):
        for name, core in (("ring", RingAttentionCore(dist.group.WORLD)),
                           ("all-to-all", AllToAllAttentionCore(dist.group.WORLD)),
                           ("plain", AttentionCore())):
            x = [torch.randn(1, 8, n, 8, generator=g).to(torch.bfloat16).requires_grad_()
                 for n in (heads, kv, kv)]
            qkv = [t.transpose(1, 2) for t in x]
            with Count() as f:
                y = core(*qkv)
            with Count() as b:
                torch.autograd.grad(y, qkv, torch.ones_like(y))
            out[f"{name} {heads}/{kv}"] = [dict(f.ops), dict(b.ops)]
    write_rank_result(out_dir, rank, out)


@pytest.mark.distributed
@pytest.mark.parametrize("cp", [2, 4])
def test_core_operator_counts_match_torch(cp, tmp_path):
    """The ring's counts exactly, the all-to-all's within 3 operators (views PyTorch elides
    with the head split), the plain core's exactly, MHA and GQA, on every rank."""
    pytest.importorskip("torch")
    from _gloo import run_gloo_ranks
    ranks = run_gloo_ranks(_ops_worker, cp, tmp_path)
    for heads, kv in ((8, 4), (8, 8)):
        spec = mp.ModelSpec(name="c", num_layers=1, hidden_size=8 * heads,
                            num_heads=heads, num_kv_heads=kv, vocab_size=16)
        for style in ("ring", "all-to-all"):
            want = ch.cp_core_ops(spec, mp.Layout(cp=cp, cp_style=style))
            for p, w in enumerate(want):
                counted = [got[f"{style} {heads}/{kv}"][p] for got in ranks]
                assert all(c.get("comm", 0) == w.comm for c in counted), (style, heads, kv)
                aten = [c["aten"] for c in counted]
                if style == "ring":    # the busiest rank (the others wait for it), exactly
                    assert max(aten) == w.aten and min(aten) >= w.aten - (cp - 1), (aten, w)
                else:
                    assert all(abs(a - w.aten) <= 3 for a in aten), (aten, w)
        for got in ranks:
            for counted, w in zip(got[f"plain {heads}/{kv}"], ch.plain_core_ops(spec)):
                assert counted["aten"] == w.aten and "comm" not in counted


SPEC = mp.ModelSpec(name="c", num_layers=4, hidden_size=1408, num_heads=22, num_kv_heads=2,
                    ffn_hidden_size=4864, vocab_size=65536, max_seq_len=65536,
                    activation="swiglu", norm="rmsnorm", position_embedding="rope", bias=False)


def _gpu(t_op=11.6e-6, t_comm=0.0):
    gpu = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=4).gpu
    return replace(gpu, host_op_dispatch_s=t_op, host_comm_op_s=t_comm)


def test_host_terms_are_what_the_cpu_exceeds():
    """CPU − GPU per pass where the CPU is longer, 0 where the GPU is, none without the
    executor's runtime, the profile's t_op, or cp."""
    job = mp.Job(global_batch=8, seq_len=16384, runtime="torch")
    lay = mp.Layout(cp=4, recompute="selective", zero=1)
    gpu = _gpu(t_comm=100e-6)
    cpu_f, cpu_b, rerun = ch.layer_cpu_s(SPEC, job, lay, gpu)
    core_f, core_b = ch.cp_core_ops(SPEC, lay)
    assert rerun == pytest.approx(core_f.aten * 11.6e-6 + core_f.comm * 100e-6)
    assert cpu_b > cpu_f > core_f.comm * 100e-6
    t = ch.cp_host_terms(SPEC, job, lay, gpu, forward_s=cpu_f / 2, backward_s=10.0,
                         rerun_s=0.1)
    assert t.forward_s == pytest.approx(cpu_f / 2) and t.backward_s == 0.0
    assert (t.cpu_forward_s, t.cpu_backward_s) == pytest.approx((cpu_f, cpu_b + rerun))
    assert ch.cp_host_terms(SPEC, replace(job, runtime="megatron"), lay, gpu, forward_s=0.0,
                            backward_s=0.0, rerun_s=0.0).forward_s == 0.0
    assert ch.cp_host_terms(SPEC, job, lay, _gpu(t_op=0.0), forward_s=0.0, backward_s=0.0,
                            rerun_s=0.0).forward_s == 0.0
    # the caveat where the call cost is assumed and the CPU comes near the GPU's forward
    assert ch.comm_assumed_caveat(SPEC, job, lay, _gpu(), forward_s=cpu_f) == (
        ch.HOST_COMM_ASSUMED_CAVEAT,)
    assert ch.comm_assumed_caveat(SPEC, job, lay, _gpu(), forward_s=100 * cpu_f) == ()
    assert ch.comm_assumed_caveat(SPEC, job, lay, gpu, forward_s=cpu_f) == ()
    # the all-to-all core's calls need their own cost measured
    a2a = mp.Layout(cp=2, cp_style="all-to-all", zero=1)
    a2a_f = ch.layer_cpu_s(SPEC, job, a2a, gpu)[0]
    assert ch.comm_assumed_caveat(SPEC, job, a2a, gpu, forward_s=a2a_f) == (
        ch.HOST_COMM_ASSUMED_CAVEAT,)
    assert ch.comm_assumed_caveat(SPEC, job, a2a, replace(gpu, host_all_to_all_s=1e-4),
                                  forward_s=a2a_f) == ()


def test_full_recompute_compares_the_rerun_and_the_backward_apart():
    """A host-bound re-run forward is not hidden behind a GPU-bound backward proper."""
    job = mp.Job(global_batch=8, seq_len=16384, runtime="torch")
    lay = mp.Layout(cp=4, recompute="full", zero=1)
    gpu = _gpu(t_comm=100e-6)
    cpu_f, cpu_b, rerun = ch.layer_cpu_s(SPEC, job, lay, gpu)
    assert rerun == cpu_f
    t = ch.cp_host_terms(SPEC, job, lay, gpu, forward_s=0.0, backward_s=0.0 + 10.0,
                         rerun_s=0.0)
    assert t.backward_s == pytest.approx(rerun)


def test_estimate_grows_where_the_ring_is_host_bound():
    """cp 4 at 16k tokens (4,096 a rank) slows with the call cost; at 64k it does not."""
    h200 = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=4)
    assert h200.gpu.host_comm_op_s == pytest.approx(28.6e-6)     # measured (gpus.toml)
    cluster = h200.replace(gpu=replace(h200.gpu, host_comm_op_s=0.0))   # call cost assumed
    slow = cluster.replace(gpu=replace(cluster.gpu, host_comm_op_s=150e-6))
    lay = mp.Layout(cp=4, recompute="selective", zero=1)
    short, long_ = (mp.Job(global_batch=131072 // s, seq_len=s, runtime="torch")
                    for s in (16384, 65536))
    assert mp.estimate(SPEC, slow, short, lay).step_time_s > \
        1.2 * mp.estimate(SPEC, cluster, short, lay).step_time_s
    assert mp.estimate(SPEC, slow, long_, lay).step_time_s == pytest.approx(
        mp.estimate(SPEC, cluster, long_, lay).step_time_s, rel=1e-9)
    caveats = mp.estimate(SPEC, cluster, short, lay).caveats
    assert ch.HOST_COMM_ASSUMED_CAVEAT in caveats
    assert ch.HOST_COMM_ASSUMED_CAVEAT not in mp.estimate(SPEC, slow, short, lay).caveats


def _bench_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from _gloo import write_rank_result
    from meshplan.calibrate.bench_host_comm import bench_host_comm
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    write_rank_result(out_dir, rank, bench_host_comm(torch.device("cpu"), world, iters=5,
                                                     repeats=2))


@pytest.mark.distributed
def test_bench_host_comm_writes_the_profile_key(tmp_path):
    """Rank 0 times the ring's exchange; the profile's [gpu] gets its seconds per call,
    and a profile file carries the key into the cluster."""
    pytest.importorskip("torch")
    from _gloo import run_gloo_ranks
    from meshplan.calibrate.bench_host_comm import host_comm_op_s
    from meshplan.calibrate.profile import build_profile
    from meshplan.calibrate.bench_host_comm import host_all_to_all_s
    ranks = run_gloo_ranks(_bench_worker, 2, tmp_path)
    rows = ranks[0]
    assert ranks[1] is None
    assert [(r["kind"], r["calls"]) for r in rows] == [("p2p", 4), ("all_to_all", 1)]
    assert all(r["seconds"] > 0 for r in rows)
    per_call = host_comm_op_s(rows)
    assert per_call == pytest.approx(rows[0]["seconds"] / 4)
    assert host_all_to_all_s(rows) == pytest.approx(rows[1]["seconds"])
    base = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=4).gpu
    doc = build_profile(measurements={"host_comm": rows}, base=base, device="cuda",
                        provenance={})
    assert doc["gpu"]["host_comm_op_s"] == pytest.approx(per_call)
    assert doc["gpu"]["host_all_to_all_s"] == pytest.approx(rows[1]["seconds"])


def test_the_all_to_all_core_prices_its_calls_at_the_all_to_all_cost():
    """The ring's sends and receives at host_comm_op_s, the all-to-all core's 4 calls a pass
    at host_all_to_all_s where measured (else host_comm_op_s)."""
    job = mp.Job(global_batch=8, seq_len=16384, runtime="torch")
    a2a, ring = (mp.Layout(cp=2, cp_style=s, zero=1) for s in ("all-to-all", "ring"))
    gpu = _gpu(t_comm=30e-6)
    dear = replace(gpu, host_all_to_all_s=230e-6)
    f0, b0, _ = ch.layer_cpu_s(SPEC, job, a2a, gpu)
    f1, b1, _ = ch.layer_cpu_s(SPEC, job, a2a, dear)
    assert (f1 - f0, b1 - b0) == pytest.approx((4 * 200e-6, 4 * 200e-6))
    assert ch.layer_cpu_s(SPEC, job, ring, dear) == ch.layer_cpu_s(SPEC, job, ring, gpu)
