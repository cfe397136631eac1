"""The calibration's ranks: the process groups a layer row runs on, values agreed over ranks.

Every rank walks the same grid, so every rank creates the same groups in the same order
(``new_group`` is collective), and every decision (skip a row, size the spin, stop a round)
is taken from values reduced over the ranks, so that all take the same one.
"""

from __future__ import annotations

from typing import Any, Iterable

from meshplan.errors import ConfigError


class _Groups:
    """Process groups, created on first use. Every rank walks the same grid, so every rank
    creates every group in the same order (``new_group`` is collective)."""

    def __init__(self, world: int, rank: int, device_type: str):
        self.world, self.rank, self.device_type = world, rank, device_type
        self._tp: dict[int, Any] = {}
        self._dp: dict[int, Any] = {}
        self._ep: dict[tuple[int, int, int], Any] = {}

    def tp(self, size: int):
        import torch.distributed as dist
        if size == 1:
            return None
        if size not in self._tp:
            mine = None
            for start in range(0, self.world, size):   # consecutive ranks, as the mesh's tp
                g = dist.new_group(list(range(start, start + size)))
                if start <= self.rank < start + size:
                    mine = g
            self._tp[size] = mine
        return self._tp[size]

    def dp_mesh(self, size: int, tp: int = 1):
        """The FSDP2 mesh of ``size`` ranks: ranks ``tp`` apart, like the executor's
        (pp, dp, tp) mesh (:func:`dp_mesh_shape`), so that a layer's tp group (consecutive
        ranks, :meth:`tp`) and its dp group cross."""
        if (size, tp) not in self._dp:
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh(self.device_type, dp_mesh_shape(self.world, size, tp),
                                    mesh_dim_names=("rep", "dp", "tp"))
            self._dp[size, tp] = mesh["dp"]
        return self._dp[size, tp]

    def experts(self, ep: int, tp: int = 1, dp: int | None = None):
        """The executor's expert groups (:class:`meshplan.executor.expert_parallel.
        ExpertGroups`) of ``ep`` ranks folded over a stage of ``dp`` × ``tp`` ranks (default:
        the whole world), the world laid out as (stages, dp, tp) like :meth:`dp_mesh`, each
        stage the executor's mesh for that layout (its experts' edp = dp·tp / ep)."""
        dp = self.world // tp if dp is None else dp
        if (ep, tp, dp) not in self._ep:
            from torch.distributed.device_mesh import init_device_mesh

            from meshplan.executor.expert_parallel import build_expert_groups
            mesh = init_device_mesh(self.device_type, dp_mesh_shape(self.world, dp, tp),
                                    mesh_dim_names=("pp", "dp", "tp"))
            self._ep[ep, tp, dp] = build_expert_groups(mesh, ep, 1, self.device_type)
        return self._ep[ep, tp, dp]


def dp_mesh_shape(world: int, dp: int, tp: int) -> tuple[int, int, int]:
    """(replicas, dp, tp) of the calibration's FSDP2 mesh.

    Example: world 4, dp 2, tp 2 → (1, 2, 2): the dp groups are ranks {0, 2} and {1, 3},
    the tp groups {0, 1} and {2, 3} (Megatron's tp-dp-pp order); world 4, dp 2, tp 1 →
    (2, 2, 1): dp groups {0, 1} and {2, 3}."""
    if dp < 1 or tp < 1 or world % (dp * tp):
        raise ConfigError(f"an FSDP2 row of dp {dp} × tp {tp} does not tile a world of {world}")
    return (world // (dp * tp), dp, tp)


def _reduce(values: Iterable[float], max_fields: Iterable[int], device, world: int
            ) -> list[float]:
    """Across ranks: the mean of each value, the max of those at ``max_fields``."""
    import torch
    import torch.distributed as dist
    vals = list(values)
    if world == 1 or not dist.is_initialized():
        return vals
    hi = set(max_fields)
    t = torch.tensor(vals, dtype=torch.float64, device=device)
    mx = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    return [float(mx[j]) if j in hi else float(t[j]) / world for j in range(len(vals))]


def _any_rank(flag: bool, device, world: int) -> bool:
    """Whether ``flag`` holds on any rank (every rank must call it): what lets the ranks
    take the same branch before a collective, e.g. skip a stack one of them cannot fit."""
    return bool(_reduce([1.0 if flag else 0.0], [0], device, world)[0])
