"""ZeRO-1 under runtime "torch": ZeroRedundancyOptimizer's parameter sync is one broadcast
per rank in turn (meshplan.costmodel.data_parallel.params_state, comm.broadcast_s), not an
all-gather; Megatron's ZeRO-1 keeps its all-gather."""

import pytest

from meshplan.costmodel import comm
from meshplan.costmodel.memory import stage_params, state_bytes_per_param
from meshplan.costmodel.tables import layer_tables
from meshplan.hardware_profiles import Cluster
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
