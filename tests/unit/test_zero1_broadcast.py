"""ZeRO-1 under runtime "torch": ZeroRedundancyOptimizer's parameter sync is one broadcast
per rank in turn (meshplan.costmodel.data_parallel.params_state, comm.broadcast_s), not an
all-gather; Megatron's ZeRO-1 keeps its all-gather."""

import pytest

from meshplan.calibrate import profile as prof
from meshplan.calibrate.tomlfile import dumps, write_text_atomic
from meshplan.costmodel import comm
from meshplan.costmodel.memory import stage_params, state_bytes_per_param
from meshplan.costmodel.tables import layer_tables
from meshplan.hardware_profiles import Cluster, builtin_gpu
from meshplan.hardware_profiles import collective_latency as cl
from meshplan.hardware_profiles.calibrated import apply_profile
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
TORCH = Job(global_batch=16, seq_len=1024, runtime="torch")
MEGATRON = Job(global_batch=16, seq_len=1024)
CLUSTER = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=8)


def _gather_s(job, dp):
    t = layer_tables(MODEL, CLUSTER, job, Layout(dp=dp, micro_batch=1, zero=1))
    return t.rank_state(0, MODEL.num_layers).param_gather_s


def _params():
    return stage_params(MODEL, MODEL.num_layers, 1, first=True, last=True, pp=1)


@pytest.mark.parametrize("dp", [2, 4, 8])
def test_torch_zero1_is_dp_broadcasts_of_a_shard(dp):
    link = CLUSTER.group_link(dp, 1)
    shard = _params() * state_bytes_per_param(TORCH).weights / dp   # fp32 master weights
    assert state_bytes_per_param(TORCH).weights == 4
    assert _gather_s(TORCH, dp) == pytest.approx(dp * comm.broadcast_s(link, shard))
    # at one bandwidth the broadcasts take dp / (dp − 1) times the all-gather's time
    # (latency aside: a few µs against milliseconds here)
    bw = link.bandwidth_bytes_per_s(shard)
    gather = (dp - 1) / dp * _params() * 4 / bw
    assert dp * shard / bw / gather == pytest.approx(dp / (dp - 1))


@pytest.mark.parametrize("dp", [2, 4])
def test_megatron_zero1_keeps_the_all_gather(dp):
    link = CLUSTER.group_link(dp, 1)
    weights = _params() * state_bytes_per_param(MEGATRON).weights    # its 16-bit parameters
    assert _gather_s(MEGATRON, dp) == pytest.approx(comm.all_gather_s(link, weights))


def test_broadcast_moves_the_whole_buffer_at_the_bus_bandwidth():
    link = CLUSTER.group_link(4, 1)
    n = 1e9
    assert comm.broadcast_s(link, n) == pytest.approx(
        n / link.bandwidth_bytes_per_s(n) + comm.call_latency_s(link, "all_gather"))
    assert comm.broadcast_s(CLUSTER.group_link(1, 1), n) == 0.0
    assert comm.broadcast_s(link, 0.0) == 0.0


# ---- the measured broadcast curve (meshplan calibrate's broadcast rows) ---------------------
H100 = builtin_gpu("H100-SXM5-80GB")
BIG = 1 << 28


def _timed(op, n, nbytes, eff, base_s, step_s):
    """A row timed as the model prices ``op`` at efficiency ``eff`` of H100's NVLink."""
    return {"op": op, "group_size": n, "nbytes": nbytes, "iters": 5,
            "seconds": (cl.call_latency_s(op, n, base_s, step_s)
                        + cl.bus_bytes(op, n, nbytes) / (H100.nvlink_gbps * 1e9 * eff))}


def _profile(tmp_path, probes, base_s, step_s, *, broadcast: bool, groups=(2, 8)):
    coll = [_timed("all_reduce", n, BIG, 0.6, base_s, step_s) for n in groups]
    if broadcast:
        coll += [_timed("broadcast", n, BIG, 0.8, base_s, step_s) for n in groups]
    doc = prof.build_profile(measurements={"latency": probes, "collectives": coll}, base=H100,
                             device="cuda", provenance={"machine": "t"})
    path = write_text_atomic(tmp_path / f"b{int(broadcast)}.toml", dumps(doc))
    return doc, coll, apply_profile(CLUSTER, path)


def _split_probes(base_s, step_s):
    return [{"op": "all_reduce", "group_size": n, "nbytes": 256, "iters": 50,
             "seconds": base_s + 2 * (n - 1) * step_s} for n in (2, 8)]


@pytest.mark.parametrize("n", [2, 8])
def test_a_profile_with_broadcast_rows_prices_broadcasts_from_them(tmp_path, n):
    base_s, step_s = 20e-6, 1e-6
    doc, coll, cal = _profile(tmp_path, _split_probes(base_s, step_s), base_s, step_s,
                              broadcast=True)
    assert "nvlink_broadcast_efficiency" in doc["measured"]
    link = cal.group_link(n, 1)
    row = next(r for r in coll if r["op"] == "broadcast" and r["group_size"] == n)
    assert comm.broadcast_s(link, BIG) == pytest.approx(row["seconds"], rel=1e-4)
    # the broadcast rows stay out of the NVLink curve: all-reduce still prices at 0.6
    ar = next(r for r in coll if r["op"] == "all_reduce" and r["group_size"] == n)
    assert comm.all_reduce_s(link, BIG) == pytest.approx(ar["seconds"], rel=1e-4)
    assert link.efficiency(BIG) == pytest.approx(0.6, rel=1e-4)
    assert link.broadcast_efficiency(BIG) == pytest.approx(0.8, rel=1e-4)
    # a plan file's cluster keeps the curve
    again = Cluster.from_dict(cal.to_dict()).group_link(n, 1)
    assert again.broadcast_efficiency == link.broadcast_efficiency


def test_without_broadcast_rows_the_collectives_curve_prices_broadcasts(tmp_path):
    base_s, step_s = 20e-6, 1e-6
    doc, _, cal = _profile(tmp_path, _split_probes(base_s, step_s), base_s, step_s,
                           broadcast=False)
    assert "nvlink_broadcast_efficiency" not in doc["gpu"]
    link = cal.group_link(2, 1)
    assert link.broadcast_efficiency is None
    assert comm.broadcast_s(link, BIG) == pytest.approx(
        BIG / link.bandwidth_bytes_per_s(BIG) + comm.call_latency_s(link, "all_gather"))
    # and a datasheet cluster likewise
    assert CLUSTER.group_link(2, 1).broadcast_efficiency is None


def test_a_2_gpu_node_profile_rereads_its_broadcast_curve_with_the_old_key(tmp_path):
    """A node of 2 GPUs (round 38's 2 x H200) keeps the old latency key; the broadcast
    curve is re-read with the latency apply_profile gives it, as the NVLink curve is, so the
    timed broadcast is reproduced."""
    probe_s = 30e-6
    _, coll, cal = _profile(tmp_path, [{"op": "all_reduce", "group_size": 2, "nbytes": 256,
                                        "iters": 50, "seconds": probe_s}],
                            probe_s, 0.0, broadcast=True, groups=(2,))
    row = next(r for r in coll if r["op"] == "broadcast" and r["group_size"] == 2)
    assert comm.broadcast_s(cal.group_link(2, 1), BIG) == pytest.approx(row["seconds"],
                                                                          rel=1e-4)
