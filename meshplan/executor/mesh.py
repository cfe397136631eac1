"""The dp × pp × tp device mesh and the process groups the executor passes around.

Rank order follows the cluster's ``rank_order`` (Megatron's default "tp-dp-pp": tp ranks
are adjacent, then dp, then pp; Narayanan et al. 2021, arXiv 2104.04473 §3.3 — keep the
tp group inside a node). The mesh is built with ``init_device_mesh`` and named dims.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshplan.spec import Layout
from meshplan.errors import ExecutorError


@dataclass(frozen=True, kw_only=True)
class MeshGroups:
    """Process groups and coordinates of this rank in the dp × pp × tp mesh."""

    mesh: DeviceMesh
    dp: int
    pp: int
    tp: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    dp_group: object
    pp_group: object
    tp_group: object
    embed_group: object | None      # first and last pp rank of this (dp, tp): tied embeddings

    @property
    def dp_mesh(self) -> DeviceMesh:
        return self.mesh["dp"]

    @property
    def is_first_pp(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_pp(self) -> bool:
        return self.pp_rank == self.pp - 1


def build_mesh(layout: Layout, device_type: str, *, rank_order: str = "tp-dp-pp",
               tied_embeddings: bool = False) -> MeshGroups:
    """Create the mesh for ``layout`` on the current (initialized) default process group."""
    world = dist.get_world_size()
    if world != layout.num_gpus:
        raise ExecutorError(
            f"the plan's layout {layout.short()} needs dp·pp·tp = {layout.num_gpus} ranks, "
            f"but the process group has world size {world}; launch with "
            f"--nproc-per-node/--nnodes giving {layout.num_gpus} processes")
    if rank_order == "tp-dp-pp":
        shape, names = (layout.pp, layout.dp, layout.tp), ("pp", "dp", "tp")
    elif rank_order == "tp-pp-dp":
        shape, names = (layout.dp, layout.pp, layout.tp), ("dp", "pp", "tp")
    else:
        raise ExecutorError(f"unknown rank order {rank_order!r}; use 'tp-dp-pp' or 'tp-pp-dp'")
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
    coord = dict(zip(names, mesh.get_coordinate()))
    embed_group = None
    if tied_embeddings and layout.pp > 1:
        # every rank creates every group, in the same order (new_group is collective)
        ranks = mesh.mesh   # tensor of global ranks indexed by (names...)
        for d in range(layout.dp):
            for t in range(layout.tp):
                idx_first = {"dp": d, "pp": 0, "tp": t}
                idx_last = {"dp": d, "pp": layout.pp - 1, "tp": t}
                pair = [int(ranks[tuple(i[n] for n in names)]) for i in (idx_first, idx_last)]
                g = dist.new_group(pair)
                if d == coord["dp"] and t == coord["tp"] and coord["pp"] in (0, layout.pp - 1):
                    embed_group = g
    return MeshGroups(mesh=mesh, dp=layout.dp, pp=layout.pp, tp=layout.tp,
                      dp_rank=coord["dp"], pp_rank=coord["pp"], tp_rank=coord["tp"],
                      dp_group=mesh.get_group("dp"), pp_group=mesh.get_group("pp"),
                      tp_group=mesh.get_group("tp"), embed_group=embed_group)


__all__ = ["MeshGroups", "build_mesh"]
