"""Clusters: nodes of GPUs on an NVSwitch fabric, joined by a rail-optimized InfiniBand network."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from meshplan.errors import (ConfigError, ProfileError, closest_names, require_positive_int,
                             unknown_name_error)
from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.gpu import GPUSpec
from meshplan.hardware_profiles.loader import (_NUM, builtin_gpu, builtin_table,
                                                efficiency_curve, get, gpu_from_table,
                                                read_toml)

RANK_ORDERS = ("tp-dp-pp", "tp-pp-dp")


@dataclass(frozen=True, kw_only=True)
class NetworkSpec:
    """Inter-node fabric: ``nics_per_node`` NICs of ``nic_gbps`` GB/s each per direction."""

    nics_per_node: int
    nic_gbps: float
    latency_us: float
    topology: str = "fat-tree"
    oversubscription: float = 1.0
    efficiency: Curve = Curve(((1e9, 0.9),))


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """GPUs, how they are wired, and what they cost.

    >>> c = Cluster.preset("dgx-a100-80gb", nodes=2)
    >>> c.num_gpus, c.gpu.name
    (16, 'A100-SXM4-80GB')
    """

    name: str
    gpu: GPUSpec
    gpus_per_node: int
    nodes: int
    intra_latency_us: float          # one ring step inside a node (NVLink / NVSwitch)
    network: NetworkSpec
    price_per_gpu_hour: float
    memory_reserve_bytes: int = 1 << 30
    memory_reserve_fraction: float = 0.05
    rank_order: str = "tp-dp-pp"
    # once per collective or p2p call (NCCL's base latency; hardware_profiles/
    # collective_latency.py); a cluster file without the key keeps per-step latency only
    collective_base_latency_us: float = 0.0

    def __post_init__(self) -> None:
        require_positive_int("Cluster", "gpus_per_node", self.gpus_per_node)
        require_positive_int("Cluster", "nodes", self.nodes)
        if self.price_per_gpu_hour < 0:
            raise ConfigError(f"Cluster.price_per_gpu_hour must be >= 0, got {self.price_per_gpu_hour}")
        if self.memory_reserve_bytes < 0 or not 0 <= self.memory_reserve_fraction < 1:
            raise ConfigError(
                f"Cluster memory reserve must be >= 0 bytes and a fraction in [0, 1); got "
                f"{self.memory_reserve_bytes} bytes, fraction {self.memory_reserve_fraction}")
        if self.intra_latency_us < 0 or self.collective_base_latency_us < 0:
            raise ConfigError(f"Cluster latencies must be >= 0 µs; got intra_latency_us = "
                              f"{self.intra_latency_us}, collective_base_latency_us = "
                              f"{self.collective_base_latency_us}")
        if self.rank_order not in RANK_ORDERS:
            raise ConfigError(f"Cluster.rank_order = {self.rank_order!r}; choose one of {RANK_ORDERS}")
        if self.usable_memory_bytes <= 0:
            raise ConfigError(f"Cluster {self.name!r}: the memory reserve exceeds the GPU's "
                              f"{self.gpu.memory_bytes} bytes")

    def __hash__(self) -> int:  # cached: clusters key the cost model's caches
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.name, self.gpu, self.gpus_per_node, self.nodes, self.intra_latency_us,
                      self.network, self.price_per_gpu_hour, self.memory_reserve_bytes,
                      self.memory_reserve_fraction, self.rank_order,
                      self.collective_base_latency_us))
            object.__setattr__(self, "_hash", h)
        return h

    # ---- sizes -----------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def shape(self) -> str:
        """``"2 nodes × 8"``, ``"1 node × 8"``: the cluster's nodes and GPUs per node, for
        messages."""
        return f"{self.nodes} node{'s' * (self.nodes != 1)} × {self.gpus_per_node}"

    @property
    def usable_memory_bytes(self) -> float:
        """GPU memory a training process can fill: capacity less the documented reserve."""
        cap = self.gpu.memory_bytes
        return cap - self.memory_reserve_bytes - self.memory_reserve_fraction * cap

    @property
    def nic_gbps_per_gpu(self) -> float:
        return self.network.nics_per_node * self.network.nic_gbps / self.gpus_per_node

    # ---- construction ----------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, nodes: int | None = None, **overrides: Any) -> "Cluster":
        """A built-in cluster; ``meshplan profiles`` lists them. ``overrides`` replace fields."""
        table = builtin_table("clusters.toml")
        if name not in table:
            raise unknown_name_error("cluster preset", name, table)
        c = _cluster_from_table(name, table[name], f"built-in clusters.toml [{name}]", None)
        if nodes is not None:
            overrides["nodes"] = nodes
        return replace(c, **overrides) if overrides else c

    @classmethod
    def preset_names(cls) -> list[str]:
        return list(builtin_table("clusters.toml"))

    @classmethod
    def from_toml(cls, path: str | Path, name: str | None = None,
                  nodes: int | None = None) -> "Cluster":
        """Read a cluster from a TOML file.

        The file holds ``[clusters.NAME]`` tables, ``[NAME]`` tables as in the built-in
        ``clusters.toml``, or one cluster table at top level, and may define its own GPUs
        under ``[gpus.NAME]``; ``gpu = "NAME"`` may also name a built-in GPU. ``name`` picks
        one cluster when the file has several.
        """
        data = read_toml(path, "cluster file")
        where_file = str(path)
        gpus = data.get("gpus", {})
        if not isinstance(gpus, dict):
            raise ProfileError(f"{where_file}: [gpus] must be a table of GPU tables")
        clusters = data.get("clusters")
        if clusters is None:
            clusters = _section_clusters(data, where_file) or \
                {name or data.get("name", Path(path).stem): data}
        if not isinstance(clusters, dict) or not clusters:
            raise ProfileError(f"{where_file}: [clusters] must hold at least one cluster table")
        if name is None:
            if len(clusters) > 1:
                raise ProfileError(f"{where_file} defines clusters {sorted(clusters)}; pick one "
                                   f"with name= (Python) or --cluster {where_file}:NAME")
            name = next(iter(clusters))
        if name not in clusters:
            raise unknown_name_error(f"cluster in {where_file}", name, clusters)
        t = clusters[name]
        section = (f"[clusters.{name}]" if "clusters" in data else f"[{name}]"
                   if t is not data else "(top level)")
        c = _cluster_from_table(name, t, f"{where_file} {section}", (gpus, where_file))
        return replace(c, nodes=nodes) if nodes is not None else c

    def with_gpu(self, gpu: GPUSpec) -> "Cluster":
        return replace(self, gpu=gpu)

    def replace(self, **changes: Any) -> "Cluster":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("gpu", "network")}
        d["gpu"] = self.gpu.to_dict()
        net = asdict(self.network)
        net["efficiency"] = self.network.efficiency.to_list()
        d["network"] = net
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Cluster":
        """Inverse of :meth:`to_dict` (used by plan files)."""
        try:
            d = dict(d)
            g = dict(d.pop("gpu"))
            gname = g.pop("name")
            gpu = gpu_from_table(gname, g, f"plan file cluster.gpu [{gname}]")
            net = dict(d.pop("network"))
            net["efficiency"] = Curve(tuple(tuple(p) for p in net["efficiency"]))
            return cls(gpu=gpu, network=NetworkSpec(**net), **d)
        except (KeyError, TypeError) as exc:
            raise ProfileError(f"cluster description is incomplete or has unknown keys: {exc}") from None

    # ---- wiring ----------------------------------------------------------------------
    def topology(self, max_nodes: int | None = None):
        """The cluster as a networkx graph (see :mod:`meshplan.hardware_profiles.topology`)."""
        from meshplan.hardware_profiles.topology import build_topology
        return build_topology(self, max_nodes=max_nodes)

    def group_link(self, size: int, stride: int):
        """How a ring collective over ``size`` ranks spaced ``stride`` apart is carried.

        Cached per cluster; see :func:`meshplan.hardware_profiles.topology.group_link`.
        """
        return _group_link_cached(self, size, stride)


@lru_cache(maxsize=4096)
def _group_link_cached(cluster: Cluster, size: int, stride: int):
    from meshplan.hardware_profiles.topology import group_link
    return group_link(cluster, size, stride)


def _section_clusters(data: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """``[NAME]`` cluster tables (the built-in file's form) when the top level is no cluster
    itself; None when it is one (it has ``gpu`` or ``gpus_per_node``) or holds no tables."""
    if "gpu" in data or "gpus_per_node" in data:
        return None
    tables = {k: v for k, v in data.items() if isinstance(v, dict) and k != "gpus"}
    if not tables:
        return None
    odd = sorted(k for k, v in tables.items() if "gpu" not in v)
    if odd:
        raise ProfileError(
            f"{where}: table(s) {odd} have no 'gpu' key; a cluster file holds one cluster at "
            f"top level (gpu = ..., gpus_per_node = ..., network = {{...}}), [NAME] tables "
            f"like the built-in clusters.toml, or [clusters.NAME] tables, each with 'gpu'")
    return tables


# "name" and "gpus" (the file's own GPU tables) sit beside a cluster written at top level
_CLUSTER_KEYS = ("gpu", "gpus_per_node", "nodes", "intra_node", "network", "network_efficiency",
                 "price_per_gpu_hour", "memory_reserve_bytes", "memory_reserve_fraction",
                 "rank_order", "collective_base_latency_us", "name", "gpus")
_INTRA_KEYS = ("fabric", "latency_us")
_NETWORK_KEYS = ("nics_per_node", "nic_gbps", "latency_us", "topology", "oversubscription")


def _known_keys(t: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    """A misspelt key would be dropped and its default used without a word: refuse it."""
    odd = sorted(k for k in t if k not in known)
    if odd:
        close = sorted({c for k in odd for c in closest_names(k, known, n=1)})
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise ProfileError(f"{where}: unknown key(s) {', '.join(map(repr, odd))}{hint}; valid "
                           f"keys: {', '.join(known)}")


def _only(table: Mapping[str, Any], key: str, modelled: str, where: str, why: str) -> None:
    value = get(table, key, str, where, modelled)
    if value != modelled:
        raise ProfileError(f"{where}: {key} = {value!r} is not modelled; only {modelled!r} "
                           f"({why})")


def _cluster_from_table(name: str, t: Mapping[str, Any], where: str,
                        file_gpus: tuple[Mapping[str, Any], str] | None) -> Cluster:
    _known_keys(t, _CLUSTER_KEYS, where)
    gname = get(t, "gpu", (str, dict), where)
    if isinstance(gname, dict):
        gpu = gpu_from_table(f"{name}-gpu", gname, f"{where}.gpu")
    elif file_gpus is not None and gname in file_gpus[0]:
        gpu = gpu_from_table(gname, file_gpus[0][gname], f"{file_gpus[1]} [gpus.{gname}]")
    else:
        try:
            gpu = builtin_gpu(gname)
        except ConfigError as exc:
            raise ProfileError(f"{where}: key 'gpu': {exc}") from None
    intra = get(t, "intra_node", dict, where, {})
    net = get(t, "network", dict, where)
    nwhere = f"{where}.network"
    _known_keys(intra, _INTRA_KEYS, f"{where}.intra_node")
    _known_keys(net, _NETWORK_KEYS, nwhere)
    _only(intra, "fabric", "nvswitch", f"{where}.intra_node",
          "every GPU of a node reaches every other at the GPU's nvlink_gbps")
    _only(net, "topology", "fat-tree", nwhere, "a non-blocking fat tree, thinned by "
          "oversubscription")
    network = NetworkSpec(
        nics_per_node=get(net, "nics_per_node", int, nwhere),
        nic_gbps=float(get(net, "nic_gbps", _NUM, nwhere)),
        latency_us=float(get(net, "latency_us", _NUM, nwhere, 5.0)),
        topology=get(net, "topology", str, nwhere, "fat-tree"),
        oversubscription=float(get(net, "oversubscription", _NUM, nwhere, 1.0)),
        efficiency=efficiency_curve(t, "network_efficiency", where) if "network_efficiency" in t
        else Curve(((1e9, 0.9),)),
    )
    if network.nics_per_node < 1 or network.nic_gbps <= 0 or network.oversubscription < 1:
        raise ProfileError(f"{nwhere}: nics_per_node >= 1, nic_gbps > 0 and oversubscription "
                           f">= 1 are required, got {net!r}")
    try:
        return Cluster(
            name=name, gpu=gpu,
            gpus_per_node=get(t, "gpus_per_node", int, where),
            nodes=get(t, "nodes", int, where, 1),
            intra_latency_us=float(get(intra, "latency_us", _NUM, f"{where}.intra_node", 3.0)),
            network=network,
            price_per_gpu_hour=float(get(t, "price_per_gpu_hour", _NUM, where, 0.0)),
            memory_reserve_bytes=int(get(t, "memory_reserve_bytes", int, where, 1 << 30)),
            memory_reserve_fraction=float(get(t, "memory_reserve_fraction", _NUM, where, 0.05)),
            rank_order=get(t, "rank_order", str, where, "tp-dp-pp"),
            collective_base_latency_us=float(get(t, "collective_base_latency_us", _NUM, where,
                                                 0.0)),
        )
    except ProfileError:
        raise                                    # already names the file and key
    except ConfigError as exc:
        raise ProfileError(f"{where}: {exc}") from None
