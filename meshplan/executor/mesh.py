"""The dp × pp × cp × tp device mesh and the process groups the executor passes around.

Rank order follows the cluster's ``rank_order`` (Megatron's default "tp-dp-pp": tp ranks
are adjacent, then dp, then pp; Narayanan et al. 2021, arXiv 2104.04473 §3.3 — keep the
tp group inside a node). The context-parallel dim sits between tp and dp, as in
Megatron-Core's default order "tp-cp-ep-dp-pp": cp ranks are the next-closest after tp,
since the ring passes key/value blocks every layer. The mesh is built with
``init_device_mesh`` and named dims.

Parameters are replicated over dp and cp alike (cp ranks hold the same weights and see
different tokens of the same sequences), so gradients are averaged over the dp × cp ranks
and ZeRO / FSDP2 shard over them, as Megatron-Core does with its data-parallel-with-cp
group: :attr:`MeshGroups.grad_groups`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshplan.spec import Layout
from meshplan.errors import ExecutorError


@dataclass(frozen=True, kw_only=True)
class ReplicaGroups:
    """The ranks that hold replicas of the same parameters: dp × cp.

    Has the ``dp``, ``dp_group`` and ``dp_mesh`` that data parallelism and the optimizer
    read (:mod:`meshplan.executor.data_parallel`); ``dp`` is the group's size."""

    dp: int
    dp_group: object
    dp_mesh: DeviceMesh


@dataclass(frozen=True, kw_only=True)
class MeshGroups:
    """Process groups and coordinates of this rank in the dp × pp × cp × tp mesh."""

    mesh: DeviceMesh
    dp: int
    pp: int
    tp: int
    cp: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    cp_rank: int
    dp_group: object
    pp_group: object
    tp_group: object
    cp_group: object
    grad_groups: ReplicaGroups     # gradient reduction and ZeRO sharding: dp × cp
    embed_group: object | None      # first and last pp rank of this (dp, cp, tp): tied embeddings

    @property
    def dp_mesh(self) -> DeviceMesh:
        return self.mesh["dp"]

    @property
    def is_first_pp(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_pp(self) -> bool:
        return self.pp_rank == self.pp - 1


def mesh_dims(layout: Layout, rank_order: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Shape and names of the mesh, slowest-varying dim first (cp just outside tp)."""
    if rank_order == "tp-dp-pp":
        return (layout.pp, layout.dp, layout.cp, layout.tp), ("pp", "dp", "cp", "tp")
    if rank_order == "tp-pp-dp":
        return (layout.dp, layout.pp, layout.cp, layout.tp), ("dp", "pp", "cp", "tp")
    raise ExecutorError(f"unknown rank order {rank_order!r}; use 'tp-dp-pp' or 'tp-pp-dp'")


def _replica_groups(mesh: DeviceMesh, layout: Layout, names: tuple[str, ...]) -> ReplicaGroups:
    if layout.cp == 1:
        sub = mesh["dp"]
    else:
        dims = tuple(n for n in names if n in ("dp", "cp"))
        sub = mesh[dims]._flatten("dp_cp")
    return ReplicaGroups(dp=layout.dp * layout.cp, dp_group=sub.get_group(), dp_mesh=sub)


def build_mesh(layout: Layout, device_type: str, *, rank_order: str = "tp-dp-pp",
               tied_embeddings: bool = False) -> MeshGroups:
    """Create the mesh for ``layout`` on the current (initialized) default process group."""
    world = dist.get_world_size()
    if world != layout.num_gpus:
        raise ExecutorError(
            f"the plan's layout {layout.short()} needs dp·pp·tp·cp = {layout.num_gpus} ranks, "
            f"but the process group has world size {world}; launch with "
            f"--nproc-per-node/--nnodes giving {layout.num_gpus} processes")
    shape, names = mesh_dims(layout, rank_order)
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
    coord = dict(zip(names, mesh.get_coordinate()))
    embed_group = None
    if tied_embeddings and layout.pp > 1:
        # every rank creates every group, in the same order (new_group is collective)
        ranks = mesh.mesh   # tensor of global ranks indexed by (names...)
        for d in range(layout.dp):
            for c in range(layout.cp):
                for t in range(layout.tp):
                    ends = [{"dp": d, "pp": p, "cp": c, "tp": t} for p in (0, layout.pp - 1)]
                    pair = [int(ranks[tuple(i[n] for n in names)]) for i in ends]
                    g = dist.new_group(pair)
                    if ((d, c, t) == (coord["dp"], coord["cp"], coord["tp"])
                            and coord["pp"] in (0, layout.pp - 1)):
                        embed_group = g
    return MeshGroups(mesh=mesh, dp=layout.dp, pp=layout.pp, tp=layout.tp, cp=layout.cp,
                      dp_rank=coord["dp"], pp_rank=coord["pp"], tp_rank=coord["tp"],
                      cp_rank=coord["cp"], dp_group=mesh.get_group("dp"),
                      pp_group=mesh.get_group("pp"), tp_group=mesh.get_group("tp"),
                      cp_group=mesh.get_group("cp"),
                      grad_groups=_replica_groups(mesh, layout, names),
                      embed_group=embed_group)


__all__ = ["MeshGroups", "ReplicaGroups", "build_mesh", "mesh_dims"]
