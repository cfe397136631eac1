"""Collective latency: per-call base + per-ring-step term (costmodel/comm.py,
hardware_profiles/collective_latency.py), its calibration and old profiles' reading."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan.calibrate import profile as prof
from meshplan.calibrate.tomlfile import dumps, write_text_atomic
from meshplan.costmodel import comm
from meshplan.errors import ConfigError
from meshplan.hardware_profiles import Cluster, builtin_gpu
from meshplan.hardware_profiles import collective_latency as cl
from meshplan.hardware_profiles.calibrated import apply_profile, load_profile

ROOT = Path(__file__).parents[2]
PROFILES = ROOT / "docs" / "benchmarks" / "data" / "profiles"
H100 = Cluster.preset("dgx-h100", nodes=1)
MIB = 1 << 20


# ---- the formula -----------------------------------------------------------------------------
def test_datasheet_latency_is_nccls_ring_simple_split():
    # NCCL 2.30.7 tuning.cc, Ring/Simple: baseLatencies 8.4 µs, hwLatencies NVLink 3.4, NET 14
    assert H100.collective_base_latency_us == 8.4 and H100.intra_latency_us == 3.4
    assert H100.network.latency_us == 14.0
    link = H100.group_link(4, 1)
    assert comm.call_latency_s(link, "all_reduce") == pytest.approx((8.4 + 6 * 3.4) * 1e-6)
    assert comm.call_latency_s(link, "all_gather") == pytest.approx((8.4 + 3 * 3.4) * 1e-6)
    assert comm.call_latency_s(link, "reduce_scatter") == pytest.approx((8.4 + 3 * 3.4) * 1e-6)
    assert comm.call_latency_s(link, "p2p") == pytest.approx((8.4 + 3.4) * 1e-6)
    assert comm.call_latency_s(link, "all_to_all") == pytest.approx((8.4 + 3 * 3.4) * 1e-6)
    bw = 1.5 * MIB / link.bandwidth_bytes_per_s(MIB)
    assert comm.all_reduce_s(link, MIB) == pytest.approx(28.8e-6 + bw)
    # one rank or no bytes: nothing to pay
    assert comm.all_reduce_s(H100.group_link(1, 1), MIB) == 0.0
    assert comm.all_gather_s(link, 0) == 0.0 and comm.call_latency_s(H100.group_link(1, 1),
                                                                      "p2p") == 0.0


def test_base_is_paid_once_and_steps_grow_with_the_group():
    t = {n: comm.call_latency_s(H100.group_link(n, 1), "all_reduce") for n in (2, 4, 8)}
    assert t[4] - t[2] == pytest.approx(4 * 3.4e-6)       # 2(n-1) steps: 2 -> 6
    assert t[8] - t[4] == pytest.approx(8 * 3.4e-6)       # 6 -> 14
    assert t[2] == pytest.approx((8.4 + 2 * 3.4) * 1e-6)


def test_ring_over_nodes_pays_the_network_only_on_node_crossings():
    c = Cluster.preset("dgx-h100", nodes=4)
    link = c.group_link(32, 1)                             # 8 per node, 4 nodes
    assert link.nodes_spanned == 4 and link.link_class == "network"
    # the ring leaves a node from GPU 7 and enters the next at GPU 0: rails 7 and 0, so the
    # hop crosses leaf, spine and leaf (topology.hop_path): two network latencies
    assert link.hop_latency_s == pytest.approx(28e-6)
    # NCCL nInterSteps: all-reduce 2(k-1) = 6 of 62 steps cross nodes, the rest NVLink
    assert comm.call_latency_s(link, "all_reduce") == pytest.approx(
        (8.4 + 56 * 3.4 + 6 * 28.0) * 1e-6)
    assert comm.call_latency_s(link, "all_gather") == pytest.approx(
        (8.4 + 28 * 3.4 + 3 * 28.0) * 1e-6)
    one_per_node = c.group_link(4, 8)                     # every step crosses nodes
    assert comm.call_latency_s(one_per_node, "all_reduce") == pytest.approx(
        (8.4 + 6 * 14.0) * 1e-6)
    assert comm.call_latency_s(one_per_node, "p2p") == pytest.approx((8.4 + 14.0) * 1e-6)


def test_ring_steps_refuse_unknown_ops():
    assert cl.ring_steps("all_reduce", 8, 2) == (14, 2)
    assert cl.ring_steps("all_to_all", 16, 2) == (15, 8)   # 8 of the 15 peers are remote
    assert cl.ring_steps("broadcast", 8, 2) == (7, 1)      # pipelined along the ring
    with pytest.raises(Exception, match="'scatter'"):
        cl.ring_steps("scatter", 4)


def test_a_cluster_file_without_the_base_key_keeps_per_step_latency(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('gpu = "H100-SXM5-80GB"\ngpus_per_node = 8\n'
                 'intra_node = { latency_us = 3.0 }\nnetwork = { nics_per_node = 8, nic_gbps = 50.0 }\n')
    c = Cluster.from_toml(p)
    assert c.collective_base_latency_us == 0.0
    assert comm.call_latency_s(c.group_link(4, 1), "all_reduce") == pytest.approx(18e-6)
    with pytest.raises(ConfigError, match="collective_base_latency_us = -1"):
        H100.replace(collective_base_latency_us=-1.0)


# ---- calibration: splitting the two terms ----------------------------------------------------
def test_split_latency_from_two_group_sizes():
    base, step = cl.split_latency([(2, 30e-6), (4, 36e-6)])
    assert base == pytest.approx(27e-6) and step == pytest.approx(1.5e-6)
    # per-size medians, then least squares over the sizes
    base, step = cl.split_latency([(2, 30e-6), (2, 31e-6), (2, 29e-6), (8, 48e-6)])
    assert step == pytest.approx(18e-6 / 12) and base == pytest.approx(30e-6 - 2 * step)
    # the larger group timed faster (noise): no per-step part, the mean time is the base
    assert cl.split_latency([(2, 40e-6), (4, 36e-6)]) == pytest.approx((38e-6, 0.0))
    assert cl.split_latency([(2, 40e-6), (2, 41e-6)]) is None
    # steps costlier than the call (gloo on CPU: 0.4 ms on 2 ranks, 2.7 ms on 4): no negative
    # base; the step is fitted through the origin
    base, step = cl.split_latency([(2, 0.4e-3), (4, 2.7e-3)])
    assert base == 0.0 and step == pytest.approx((2 * 0.4e-3 + 6 * 2.7e-3) / (4 + 36))


def test_profile_from_one_group_size_keeps_the_old_key():
    rows = {"latency": [{"group_size": 2, "seconds": 50e-6}],
            "collectives": [{"op": "all_reduce", "group_size": 2, "nbytes": 1 << 26,
                             "seconds": 50e-6 + (1 << 26) / (450e9 * 0.7)}]}
    cluster: dict = {}
    measured: list = []
    assert prof.latency_keys(rows["latency"], cluster, measured) == (50e-6, 0.0)
    assert cluster == {"intra_latency_us": pytest.approx(25.0)}
    assert measured == ["intra_latency_us"]
    doc = prof.build_profile(measurements=rows, base=builtin_gpu("H100-SXM5-80GB"),
                             device="cuda", provenance={"machine": "t"})
    # the row is read with its whole probe time as latency: bandwidth share 0.7 exactly
    assert Curve_at(doc, 1 << 26) == pytest.approx(0.7, rel=1e-4)


def Curve_at(doc: dict, x: float) -> float:
    from meshplan.hardware_profiles.curve import Curve
    return Curve(tuple(tuple(p) for p in doc["gpu"]["nvlink_efficiency"]))(x)


def test_rows_mostly_latency_stay_out_of_the_curve():
    base_s, step_s = 40e-6, 2e-6
    lat = base_s + 6 * step_s
    mostly_latency = {"op": "all_reduce", "group_size": 4, "nbytes": MIB, "seconds": 1.4 * lat}
    bandwidth = {"op": "all_reduce", "group_size": 4, "nbytes": 1 << 26,
                 "seconds": lat + 1.5 * (1 << 26) / (450e9 * 0.6)}
    assert not cl.bandwidth_bound(mostly_latency, base_s, step_s)
    assert cl.bandwidth_bound(bandwidth, base_s, step_s)
    curve = cl.nvlink_curve([mostly_latency, bandwidth], 450.0, base_s, step_s,
                            builtin_gpu("H100-SXM5-80GB").nvlink_efficiency)
    assert curve(1 << 26) == pytest.approx(0.6, rel=1e-4)
    # below the kept row: the datasheet's shape scaled to meet it, not the 1 MiB row
    ds = builtin_gpu("H100-SXM5-80GB").nvlink_efficiency
    assert curve(1e6) == pytest.approx(ds(1e6) * 0.6 / ds(1 << 26), rel=1e-3)
    assert cl.nvlink_curve([mostly_latency], 450.0, base_s, step_s, None) is None


# ---- old profiles ----------------------------------------------------------------------------
def _legacy_profile(path: Path, half_probe_us: float) -> Path:
    doc = prof.build_profile(measurements={"latency": [{"group_size": 2,
                                                        "seconds": 2 * half_probe_us * 1e-6}]},
                             base=builtin_gpu("H100-SXM5-80GB"), device="cuda",
                             provenance={"machine": "t"})
    assert doc["cluster"] == {"intra_latency_us": pytest.approx(half_probe_us)}
    return write_text_atomic(path, dumps(doc))


def test_old_key_is_read_as_the_2_rank_probe(tmp_path):
    cal = apply_profile(H100, _legacy_profile(tmp_path / "old.toml", 23.336))
    # α_base = the probe (46.672 µs) less two datasheet steps; α_step stays the datasheet's
    assert cal.collective_base_latency_us == pytest.approx(46.672 - 6.8)
    assert cal.intra_latency_us == 3.4
    # so the 2-rank small all-reduce costs what the probe measured
    assert comm.call_latency_s(cal.group_link(2, 1), "all_reduce") == pytest.approx(46.672e-6)
    # a probe shorter than two datasheet steps: no negative base
    tiny = apply_profile(H100, _legacy_profile(tmp_path / "tiny.toml", 1.0))
    assert tiny.collective_base_latency_us == 0.0


def test_new_keys_win_over_the_old_one(tmp_path):
    text = _legacy_profile(tmp_path / "p.toml", 30.0).read_text().replace(
        "intra_latency_us = 30.0",
        "intra_latency_us = 30.0, collective_base_latency_us = 20.0, intra_step_latency_us = 1.0")
    (tmp_path / "q.toml").write_text(text)
    cal = apply_profile(H100, tmp_path / "q.toml")
    assert cal.collective_base_latency_us == 20.0 and cal.intra_latency_us == 1.0


def test_every_stored_profile_loads_and_prices_collectives():
    paths = sorted(PROFILES.glob("*.toml"))
    assert len(paths) >= 20
    for path in paths:
        p = load_profile(path)
        c = apply_profile(Cluster.preset("dgx-h200" if "h200" in path.name else "dgx-h100",
                                         nodes=1), path)
        link = c.group_link(2, 1)
        if p.provenance.get("world_size") == 1:
            # one rank times no collective: the GPU preset's latency stays
            assert p.intra_latency_us is None and p.collective_base_latency_us is None
            continue
        if p.collective_base_latency_us is None:
            # the older profiles: one 2-rank probe, read as the whole 2-rank call latency
            assert p.intra_latency_us is not None
            assert comm.call_latency_s(link, "all_reduce") == pytest.approx(
                2 * p.intra_latency_us * 1e-6)
        else:
            # split latency (calibrate since issue 36): base + 2·(n − 1) ring steps
            assert comm.call_latency_s(link, "all_reduce") == pytest.approx(
                (c.collective_base_latency_us + 2 * c.intra_latency_us) * 1e-6)
        assert 0 < c.gpu.nvlink_efficiency(MIB) <= 1


def test_worked_example_1mib_all_reduce_on_4_ranks():
    """Round 26's 4 × H200 calibration (torch 2.11.0+cu130, NCCL 2.28.9) timed a 1 MiB
    all-reduce on 4 ranks at 86.3 µs (its [[measurements.collectives]] row; docs/benchmarks/
    gpu8.md). Its 2-rank 256-byte probe read 105.5 µs (intra_latency_us = 52.76), which the
    old model charged 6 times: 317 µs of latency, 383 µs in all. Read as the probe now, the
    latency is 105.5 − 2·3.4 + 6·3.4 = 119.1 µs; the prediction's remaining excess over the
    measurement is the probe itself, slower than that calibration's 1 MiB rows."""
    path = PROFILES / "profile_h200x4_round26.toml"
    c = apply_profile(Cluster.preset("dgx-h200", nodes=1), path)
    link = c.group_link(4, 1)
    assert comm.call_latency_s(link, "all_reduce") == pytest.approx(
        (2 * 52.76000127196311 + 4 * 3.4) * 1e-6, rel=1e-9)
    measured = 86.32e-6
    old = 6 * 52.76e-6 + 1.5 * MIB / (450e9 * 0.05279110164166058)   # the old curve at 1 MiB
    new = comm.all_reduce_s(link, MIB)
    assert old / measured > 4.4
    assert measured < new < 1.5 * measured


# ---- the probe on CPU ranks (gloo) -----------------------------------------------------------
class _Steps:
    def __init__(self):
        self.labels: list[str] = []

    def step(self, label: str) -> None:
        self.labels.append(label)


def _probe_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from _gloo import write_rank_result
    from meshplan.calibrate import bench_comm
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    steps = _Steps()
    rows = bench_comm.bench_collectives([1 << 12, 1 << 16], torch.device("cpu"), iters=3,
                                        progress=steps)
    write_rank_result(out_dir, rank, {"rows": rows, "steps": len(steps.labels),
                                      "expected_steps": bench_comm.count_steps(world, world, 2)})


@pytest.mark.distributed
def test_probe_runs_on_2_ranks_and_the_whole_node_and_splits(tmp_path):
    pytest.importorskip("torch")
    from _gloo import run_gloo_ranks
    got = run_gloo_ranks(_probe_worker, 4, tmp_path)
    assert all(g["steps"] == g["expected_steps"] for g in got)
    rows = got[0]["rows"]
    empty = {"collectives": [], "latency": [], "host_comm": []}
    assert all(g["rows"] == empty for g in got[1:])  # rank 0 reports
    # and the CPU cost of the ring's exchange on the whole node (bench_host_comm)
    assert [(r["kind"], r["group_size"], r["calls"]) for r in rows["host_comm"]] == [
        ("p2p", 4, 4), ("all_to_all", 4, 1)]
    assert all(r["seconds"] > 0 for r in rows["host_comm"])
    probes = rows["latency"]
    assert sorted(r["group_size"] for r in probes) == [2, 4]
    assert all(r["nbytes"] == 256 and r["iters"] == 50 and r["seconds"] > 0 for r in probes)
    cluster: dict = {}
    measured: list = []
    base_s, step_s = prof.latency_keys(probes, cluster, measured)
    assert set(cluster) == {"collective_base_latency_us", "intra_step_latency_us"}
    assert measured == ["collective_base_latency_us", "intra_step_latency_us"]
    # the fit reproduces the two probes where both terms come out >= 0 (else: clamped)
    t = {r["group_size"]: r["seconds"] for r in probes}
    assert (base_s, step_s) == pytest.approx(cl.split_latency([(2, t[2]), (4, t[4])]))
    assert base_s >= 0 and step_s >= 0
    if 3 * t[2] >= t[4] >= t[2]:
        assert base_s + 2 * step_s == pytest.approx(t[2])
        assert base_s + 6 * step_s == pytest.approx(t[4])
    # and a CPU profile of these rows loads and applies with the measured split
    doc = prof.build_profile(measurements=rows, base=None, device="cpu",
                             provenance={"machine": "t"}, cpu_peak_tflops=0.1,
                             cpu_memory_gbps=10.0, memory_bytes=1 << 34)
    path = write_text_atomic(tmp_path / "cpu.toml", dumps(doc))
    c = apply_profile(H100, path, override=True)
    assert c.collective_base_latency_us == pytest.approx(base_s * 1e6, rel=1e-4)
    assert c.intra_latency_us == pytest.approx(step_s * 1e6, rel=1e-4, abs=1e-9)
    # broadcasts ran at the same sizes and groups as the all-gathers, and the profile keeps them
    def sizes(op):
        return sorted((r["group_size"], r["nbytes"]) for r in rows["collectives"]
                      if r["op"] == op)
    assert sizes("broadcast") == sizes("all_gather") and len(sizes("broadcast")) == 4
    assert all(r["seconds"] > 0 for r in rows["collectives"] if r["op"] == "broadcast")
    kept = {r["op"] for r in load_profile(path).collective_rows}
    assert "broadcast" in kept
    has_curve = cl.broadcast_curve(rows["collectives"], doc["gpu"]["nvlink_gbps"], base_s,
                                   step_s, None) is not None
    assert ("nvlink_broadcast_efficiency" in doc["measured"]) == has_curve
    # all-to-alls too (MoE's dispatch), with their own curve where they were bandwidth-bound
    assert sizes("all_to_all") == sizes("all_gather")
    assert all(r["seconds"] > 0 for r in rows["collectives"] if r["op"] == "all_to_all")
    has_a2a = cl.all_to_all_curve(rows["collectives"], doc["gpu"]["nvlink_gbps"], base_s,
                                  step_s, None) is not None
    assert ("nvlink_all_to_all_efficiency" in doc["measured"]) == has_a2a


def test_all_to_all_rows_give_their_own_curve_and_the_cost_model_uses_it():
    from dataclasses import replace

    from meshplan.hardware_profiles.topology import group_link
    # 4 ranks, 64 MiB buffers: (3/4) · 64 MiB leave each rank in 1 ms + 3 steps of latency
    rows = [{"op": "all_to_all", "group_size": 4, "nbytes": 64 << 20,
             "seconds": 1e-3 + 10e-6 + 3 * 2e-6}]
    assert cl.bus_bytes("all_to_all", 4, 64 << 20) == 0.75 * (64 << 20)
    curve = cl.all_to_all_curve(rows, 450.0, 10e-6, 2e-6, None)
    assert curve(64 << 20) == pytest.approx(0.75 * (64 << 20) / 1e-3 / 450e9, rel=1e-4)  # rounded
    assert cl.nvlink_curve(rows, 450.0, 10e-6, 2e-6, None) is None   # not a ring collective
    cluster = H100.replace(gpu=replace(H100.gpu, nvlink_gbps=450.0,
                                       nvlink_all_to_all_efficiency=curve),
                           collective_base_latency_us=10.0, intra_latency_us=2.0)
    link = group_link(cluster, 4, 1)
    assert link.all_to_all_efficiency is curve
    # the cost model reproduces the timed row (the link's bus bandwidth is NVLink's)
    assert link.busbw_gbps == 450.0
    assert comm.all_to_all_s(link, 0.75 * (64 << 20)) == pytest.approx(rows[0]["seconds"],
                                                                       rel=1e-4)
    # without the curve: the collectives' curve
    plain = group_link(H100, 4, 1)
    assert plain.all_to_all_efficiency is None
    assert plain.all_to_all_bytes_per_s(1 << 20) == plain.bandwidth_bytes_per_s(1 << 20)


def test_moe_dispatch_runs_at_the_all_to_all_curve_inside_and_across_nodes():
    """MoE's dispatch and combine (costmodel/moe_layer.py) at the profile's all-to-all curve:
    the whole exchange inside a node (comm.all_to_all_s), the node's own share of it across
    two (moe.all_to_all_s)."""
    from dataclasses import replace

    from meshplan.costmodel.data_parallel import group_links
    from meshplan.costmodel.moe_layer import routed_mlp
    from meshplan.costmodel.moe_tables import expert_links
    from meshplan.hardware_profiles.curve import Curve
    from meshplan.spec import Job, Layout, ModelSpec
    model = ModelSpec.preset("qwen3-30b-a3b")
    c = Cluster.preset("dgx-h100", nodes=2)
    slow = c.replace(gpu=replace(c.gpu, nvlink_all_to_all_efficiency=Curve(((1.0, 0.005),))))
    job = Job(global_batch=64, seq_len=4096)

    def ep_s(cluster, ep):
        layout = Layout(dp=16, ep=ep, micro_batch=1)
        links = replace(group_links(cluster, layout), **expert_links(cluster, layout))
        assert links.ep.nodes_spanned == (2 if ep > 8 else 1)
        return routed_mlp(model, cluster, job, layout, links, 1.0).forward.ep_comm_s
    for ep in (8, 16):
        assert ep_s(slow, ep) > 5 * ep_s(c, ep) > 0
