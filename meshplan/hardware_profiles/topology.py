"""The cluster as a graph, and what a process group's ring collective crosses.

Graph (networkx ``Graph``; edges carry ``bandwidth_gbps`` per direction, ``latency_s`` and
``kind``):

* ``("gpu", n, i)`` — GPU i of node n; ``("nvswitch", n)`` — the node's NVSwitch fabric,
  one edge per GPU at the GPU's NVLink bandwidth;
* ``("nic", n, j)`` — NIC j of node n, joined to the GPUs that use it (rail-optimized: GPU i
  uses NIC ``i * nics // gpus_per_node``) by a PCIe-class edge;
* ``("leaf", j)`` — the rail-j leaf switch joining NIC j of every node; ``("spine",)`` joins
  the leaves, with the leaf uplinks divided by the oversubscription ratio.

A ring collective's per-rank bus bandwidth is the narrowest hop of the ring: a hop inside a
node crosses GPU→NVSwitch→GPU; a hop between nodes crosses the NICs of that node's group
members (NCCL runs one channel per NIC, so the crossing is striped over them) and the leaf
(and spine, if rails differ). Every group of the same shape communicates at once in
data/tensor parallel training, so GPUs that share a NIC share its bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from meshplan.hardware_profiles.curve import Curve, op_curve

_PCIE_GBPS = 50.0  # PCIe Gen4/5 x16 per direction; a NIC never runs faster than its slot


@dataclass(frozen=True)
class GroupLink:
    """How a collective over one process group is carried.

    ``busbw_gbps`` is the per-rank bus bandwidth before message-size efficiency;
    ``hop_latency_s`` the latency of one ring step over the group's link (between nodes
    where it spans nodes); ``intra_hop_latency_s`` that of a step inside a node of a group
    that spans nodes (None: ``hop_latency_s``); ``base_latency_s`` once per call
    (:mod:`meshplan.hardware_profiles.collective_latency`); ``link_class`` "nvlink" or
    "network". ``broadcast_efficiency`` is the measured efficiency curve of broadcasts on
    the link (None: ``efficiency``), ``all_to_all_efficiency`` that of all-to-alls (MoE's
    dispatch and combine; None: ``efficiency``).
    """

    size: int
    link_class: str
    busbw_gbps: float
    hop_latency_s: float
    efficiency: Curve
    nodes_spanned: int
    ranks_per_node: int
    base_latency_s: float = 0.0
    intra_hop_latency_s: float | None = None
    broadcast_efficiency: Curve | None = None
    all_to_all_efficiency: Curve | None = None

    def __hash__(self) -> int:  # cached: links key the cost model's caches
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.size, self.link_class, self.busbw_gbps, self.hop_latency_s,
                      self.efficiency, self.nodes_spanned, self.ranks_per_node,
                      self.base_latency_s, self.intra_hop_latency_s,
                      self.broadcast_efficiency, self.all_to_all_efficiency))
            object.__setattr__(self, "_hash", h)
        return h

    def bandwidth_bytes_per_s(self, message_bytes: float, curve: Curve | None = None) -> float:
        """Bus bytes per second at ``message_bytes``: on ``curve`` where an op has its own
        measured one, else on the collectives' ``efficiency``."""
        return self.busbw_gbps * 1e9 * op_curve(curve, self.efficiency)(message_bytes)

    def broadcast_bytes_per_s(self, message_bytes: float) -> float:
        return self.bandwidth_bytes_per_s(message_bytes, self.broadcast_efficiency)

    def all_to_all_bytes_per_s(self, message_bytes: float) -> float:
        return self.bandwidth_bytes_per_s(message_bytes, self.all_to_all_efficiency)

    def latency_s(self, steps: int, inter_steps: int = 0) -> float:
        """One call of ``steps`` ring steps, ``inter_steps`` of them between nodes."""
        if steps <= 0:
            return 0.0
        if self.nodes_spanned <= 1:
            return self.base_latency_s + steps * self.hop_latency_s
        intra = self.hop_latency_s if self.intra_hop_latency_s is None \
            else self.intra_hop_latency_s
        return (self.base_latency_s + inter_steps * self.hop_latency_s
                + (steps - inter_steps) * intra)


def nic_of(cluster, local_gpu: int) -> int:
    return local_gpu * cluster.network.nics_per_node // cluster.gpus_per_node


def build_topology(cluster, max_nodes: int | None = None) -> nx.Graph:
    """The cluster graph (``max_nodes`` limits it to the first nodes, for large clusters)."""
    g = nx.Graph(name=cluster.name)
    nodes = cluster.nodes if max_nodes is None else min(cluster.nodes, max_nodes)
    net = cluster.network
    nvl = cluster.gpu.nvlink_gbps
    lat_nvl = cluster.intra_latency_us * 1e-6
    lat_net = net.latency_us * 1e-6
    for j in range(net.nics_per_node):
        g.add_node(("leaf", j), kind="switch")
    g.add_node(("spine",), kind="switch")
    uplink = nodes * net.nic_gbps / net.oversubscription
    for j in range(net.nics_per_node):
        g.add_edge(("leaf", j), ("spine",), bandwidth_gbps=uplink, latency_s=lat_net / 2,
                   kind="network")
    for n in range(nodes):
        g.add_node(("nvswitch", n), kind="switch")
        for j in range(net.nics_per_node):
            g.add_node(("nic", n, j), kind="nic")
            g.add_edge(("nic", n, j), ("leaf", j), bandwidth_gbps=net.nic_gbps,
                       latency_s=lat_net / 2, kind="network")
        for i in range(cluster.gpus_per_node):
            g.add_node(("gpu", n, i), kind="gpu", rank=n * cluster.gpus_per_node + i)
            g.add_edge(("gpu", n, i), ("nvswitch", n), bandwidth_gbps=nvl,
                       latency_s=lat_nvl / 2, kind="nvlink")
            g.add_edge(("gpu", n, i), ("nic", n, nic_of(cluster, i)),
                       bandwidth_gbps=_PCIE_GBPS, latency_s=0.0, kind="pcie")
    return g


def hop_path(cluster, a: int, b: int) -> list[tuple]:
    """Graph nodes a ring hop from global rank ``a`` to rank ``b`` passes through."""
    gpn = cluster.gpus_per_node
    na, ia, nb, ib = a // gpn, a % gpn, b // gpn, b % gpn
    if na == nb:
        return [("gpu", na, ia), ("nvswitch", na), ("gpu", nb, ib)]
    ja, jb = nic_of(cluster, ia), nic_of(cluster, ib)
    mid = [("leaf", ja)] if ja == jb else [("leaf", ja), ("spine",), ("leaf", jb)]
    return [("gpu", na, ia), ("nic", na, ja), *mid, ("nic", nb, jb), ("gpu", nb, ib)]


def group_link(cluster, size: int, stride: int) -> GroupLink:
    """Bus bandwidth and latency of a ring over ranks ``0, stride, 2·stride, …``.

    The group's ring is regular (every hop inside a node looks alike, every hop between
    nodes looks alike), so one representative hop of each kind is read off a two-node
    graph. Where members share a NIC with other GPUs of the node, the NIC's bandwidth is
    divided among them (all groups of a kind communicate concurrently).
    """
    gpn = cluster.gpus_per_node
    ranks = [k * stride for k in range(size)]
    node_of = [r // gpn for r in ranks]
    nodes_spanned = len(set(node_of))
    per_node = size // nodes_spanned if nodes_spanned else size
    base_lat = cluster.collective_base_latency_us * 1e-6
    if size == 1:
        return GroupLink(1, "nvlink", float("inf"), 0.0, cluster.gpu.nvlink_efficiency, 1, 1)
    g = build_topology(cluster.replace(nodes=min(cluster.nodes, 2)) if cluster.nodes > 2
                       else cluster, max_nodes=2)
    if nodes_spanned == 1:
        path = hop_path(cluster, ranks[0], ranks[1])
        bw = min(g.edges[u, v]["bandwidth_gbps"] for u, v in zip(path, path[1:]))
        lat = sum(g.edges[u, v]["latency_s"] for u, v in zip(path, path[1:]))
        return GroupLink(size, "nvlink", bw, lat, cluster.gpu.nvlink_efficiency, 1, size,
                         base_latency_s=base_lat,
                         broadcast_efficiency=cluster.gpu.nvlink_broadcast_efficiency,
                         all_to_all_efficiency=cluster.gpu.nvlink_all_to_all_efficiency)
    # A hop between nodes: representative ranks in node 0 and node 1 of the two-node graph.
    members0 = [r % gpn for r in ranks if r // gpn == node_of[0]]
    a_local = members0[-1]
    b_local = next(r % gpn for r in ranks if r // gpn == node_of[per_node])
    path = hop_path(cluster, a_local, gpn + b_local)
    # NCCL stripes the node crossing over the members' distinct NICs; GPUs sharing a NIC
    # (nics_per_node < gpus_per_node) each get their share of it.
    gpus_per_nic = max(1, gpn // cluster.network.nics_per_node)
    nics = {nic_of(cluster, i) for i in members0}
    nic_bw = sum(g.edges[("nic", 0, j), ("leaf", j)]["bandwidth_gbps"] for j in nics)
    nic_bw = nic_bw * min(len(members0), len(nics) * gpus_per_nic) / (len(nics) * gpus_per_nic)
    pcie_bw = _PCIE_GBPS * len(members0)
    # Traffic that leaves the rail's leaf switch, or any traffic on an oversubscribed
    # fabric, gets the uplink's share.
    inter_bw = min(nic_bw, pcie_bw) / cluster.network.oversubscription
    intra_bw = cluster.gpu.nvlink_gbps if per_node > 1 else float("inf")
    busbw = min(inter_bw, intra_bw)
    lat = sum(g.edges[u, v]["latency_s"] for u, v in zip(path, path[1:]))
    return GroupLink(size, "network", busbw, lat, cluster.network.efficiency,
                     nodes_spanned, per_node, base_latency_s=base_lat,
                     intra_hop_latency_s=cluster.intra_latency_us * 1e-6)
