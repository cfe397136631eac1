"""GPU and cluster profiles, TOML errors, and the topology-derived collective bandwidth."""

from __future__ import annotations

import networkx as nx
import pytest

import meshplan as mp
from meshplan.hardware_profiles import Curve, builtin_gpu, builtin_gpu_names

REQUIRED_GPUS = {"V100-SXM3-32GB", "A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5-80GB",
                 "H200-SXM-141GB", "B200"}
REQUIRED_CLUSTERS = {"dgx2h-v100", "dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "dgx-h200"}


def test_required_presets_exist():
    assert REQUIRED_GPUS <= set(builtin_gpu_names())
    assert REQUIRED_CLUSTERS <= set(mp.Cluster.preset_names())
    c = mp.Cluster.preset("dgx2h-v100", nodes=32)
    assert (c.gpus_per_node, c.num_gpus, c.gpu.name) == (16, 512, "V100-SXM3-32GB")


def test_datasheet_peaks():
    assert builtin_gpu("A100-SXM4-80GB").peak_flops("bf16") == 312e12
    assert builtin_gpu("H100-SXM5-80GB").peak_flops("bf16") == 989e12
    # V100 has no bf16 units: bf16 jobs are priced at its fp16 rate
    assert builtin_gpu("V100-SXM3-32GB").peak_flops("bf16") == 130e12


def test_usable_memory_is_capacity_less_documented_reserve():
    c = mp.Cluster.preset("dgx-h100")
    cap = c.gpu.memory_bytes
    assert c.usable_memory_bytes == pytest.approx(cap - 2**30 - 0.05 * cap)
    c2 = mp.Cluster.preset("dgx-h100", memory_reserve_bytes=0, memory_reserve_fraction=0.0)
    assert c2.usable_memory_bytes == cap


def test_curve_interpolates_in_log_space_and_clamps():
    c = Curve(((1e3, 0.1), (1e5, 0.5)))
    assert c(1e4) == pytest.approx(0.3)
    assert c(1) == 0.1 and c(1e9) == 0.5
    with pytest.raises(mp.ProfileError, match="increasing"):
        Curve(((10, 0.1), (5, 0.2)))


def test_topology_graph_has_gpus_switches_and_nics():
    g = mp.Cluster.preset("dgx-h100", nodes=2).topology()
    assert isinstance(g, nx.Graph)
    gpus = [n for n, d in g.nodes(data=True) if d.get("kind") == "gpu"]
    assert len(gpus) == 16
    assert g.edges[("gpu", 0, 0), ("nvswitch", 0)]["bandwidth_gbps"] == 450.0
    assert nx.has_path(g, ("gpu", 0, 0), ("gpu", 1, 7))


def test_tp_group_straddling_nodes_pays_the_network():
    c = mp.Cluster.preset("dgx-a100-80gb", nodes=4)
    inside = c.group_link(8, 1)
    straddling = c.group_link(16, 1)
    assert inside.link_class == "nvlink" and inside.busbw_gbps == 300.0
    assert straddling.link_class == "network" and straddling.busbw_gbps <= 200.0
    # one member per node: each GPU's own rail NIC
    assert c.group_link(4, 8).busbw_gbps == pytest.approx(25.0)
    # 16 GPUs/node sharing 8 NICs: a one-per-node group gets half a NIC
    v = mp.Cluster.preset("dgx2h-v100", nodes=4)
    assert v.group_link(4, 16).busbw_gbps == pytest.approx(6.25)


def test_from_toml_with_own_gpu(tmp_path):
    p = tmp_path / "mine.toml"
    p.write_text('''
[gpus.MYGPU]
peak_tflops = { bf16 = 100.0 }
memory_bytes = 17179869184
hbm_gbps = 1000.0
nvlink_gbps = 100.0
gemm_efficiency = [[1e9, 0.5], [1e12, 0.7]]
attention_efficiency = [[1e9, 0.4]]
hbm_efficiency = 0.8
nvlink_efficiency = [[1e6, 0.5], [1e9, 0.8]]

[clusters.lab]
gpu = "MYGPU"
gpus_per_node = 4
nodes = 2
network = { nics_per_node = 1, nic_gbps = 12.5 }
price_per_gpu_hour = 0.5
''')
    c = mp.Cluster.from_toml(p)
    assert c.num_gpus == 8 and c.gpu.name == "MYGPU" and c.price_per_gpu_hour == 0.5
    assert mp.Cluster.from_toml(p, nodes=3).num_gpus == 12


@pytest.mark.parametrize("body,match", [
    ("[clusters.x]\ngpu = 'A100-SXM4-80GB'\ngpus_per_node = 8\n", "missing key 'network'"),
    ("[clusters.x]\ngpu = 'A100-SXM4-80GB'\ngpus_per_node = 'eight'\n"
     "network = { nics_per_node = 8, nic_gbps = 25.0 }\n", "'gpus_per_node' must be int"),
    ("[clusters.x]\ngpu = 'A100'\ngpus_per_node = 8\n"
     "network = { nics_per_node = 8, nic_gbps = 25.0 }\n", "unknown GPU 'A100'"),
    ("[clusters.x\n", "not valid TOML"),
    ("[clusters.x]\ngpu = 'A100-SXM4-80GB'\ngpus_per_node = 8\n"
     "network = { nics_per_node = 8 }\n", "missing key 'nic_gbps'"),
])
def test_malformed_toml_names_file_key_and_type(tmp_path, body, match):
    p = tmp_path / "bad.toml"
    p.write_text(body)
    with pytest.raises(mp.ProfileError, match=match) as info:
        mp.Cluster.from_toml(p)
    assert "bad.toml" in str(info.value) or "GPU" in str(info.value)


def test_unknown_cluster_preset_suggests():
    with pytest.raises(mp.UnknownPresetError, match="dgx-h100"):
        mp.Cluster.preset("dgx-h10")
