"""Expert-parallel process groups and the hooks that apply them to the executor's model.

Megatron-Core's MoE parallel folding (Megatron-Core docs, "MoE Parallel Folding"; Liu et
al. 2025, arXiv 2504.14960): inside one pipeline stage the attention layers use the
tp × cp × dp ranks and the expert layers regroup the same ranks as an expert mesh
ep × etp × edp. Number the stage's ranks in the dense mesh's order — tp fastest, then cp,
then dp (DESIGN: "tp fastest, then cp, then dp, then pp") — as the local index i; the expert
mesh reads i with etp fastest, then ep, then edp:

    etp_rank = i % etp,   ep_rank = (i // etp) % ep,   edp_rank = i // (etp · ep).

Worked example (the way Megatron-Core's RankGenerator documents its groups): 16 ranks,
dp 4 × pp 2 × tp 2 in the rank order tp-dp-pp, so stage 0 holds ranks 0-7 and stage 1
ranks 8-15, local index i = global rank - 8·stage.

* ep 4, etp 1 (edp = 8/4 = 2): ep groups [0 1 2 3] [4 5 6 7] [8 9 10 11] [12 13 14 15];
  edp groups [0 4] [1 5] [2 6] [3 7] [8 12] [9 13] [10 14] [11 15]; etp groups single ranks.
  Expert e of E = 8 lives on ep rank e // 2, i.e. experts 0-1 on ranks 0, 4, 8, 12.
* ep 2, etp 2 (edp 2): etp groups [0 1] [2 3] [4 5] [6 7] ...; ep groups [0 2] [1 3] [4 6]
  [5 7] ...; edp groups [0 4] [1 5] [2 6] [3 7] ...

The ep group exchanges tokens (all-to-all); the edp group holds replicas of the same
experts, each fed disjoint tokens, so an expert's gradient is the sum over edp of the
replicas' gradients; divided by dp it is the mean over the dp ranks' losses, as for every
other parameter (every token of the stage reaches exactly one replica of its experts).

With etp > 1 each expert's width is split over the etp group as a dense MLP's over tp
(:meth:`meshplan.executor.moe.GroupedExperts.keep_width`), the layer gathering the group's
rows and adding the partial outputs up (:meth:`meshplan.executor.moe.MoELayer._local_experts`);
the edp group then holds replicas of the same width shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import NamedTuple, Sequence

import torch
import torch.distributed as dist

from meshplan.errors import ExecutorError


# ---- rank arithmetic (pure) ----------------------------------------------------------------
def expert_coords(local_index: int, ep: int, etp: int) -> tuple[int, int, int]:
    """(edp_rank, ep_rank, etp_rank) of the stage's ``local_index``-th rank."""
    return local_index // (etp * ep), (local_index // etp) % ep, local_index % etp


def expert_rank_grid(stage_ranks: Sequence[int], ep: int, etp: int) -> list[list[list[int]]]:
    """The stage's global ranks (in local order) as grid[edp_rank][ep_rank][etp_rank]."""
    n = len(stage_ranks)
    if n % (ep * etp):
        raise ExecutorError(f"ep·etp = {ep}·{etp} does not divide the {n} ranks of a pipeline "
                            f"stage (tp·cp·dp)")
    edp = n // (ep * etp)
    return [[[stage_ranks[(d * ep + e) * etp + t] for t in range(etp)] for e in range(ep)]
            for d in range(edp)]


def expert_groups(stage_table: Sequence[Sequence[int]], ep: int, etp: int,
                  dim: str) -> list[list[int]]:
    """Every group along ``dim`` ("ep", "etp" or "edp") of every stage."""
    out = []
    for stage in stage_table:
        grid = expert_rank_grid(stage, ep, etp)
        edp = len(grid)
        if dim == "etp":
            out += [grid[d][e] for d in range(edp) for e in range(ep)]
        elif dim == "ep":
            out += [[grid[d][e][t] for e in range(ep)] for d in range(edp) for t in range(etp)]
        elif dim == "edp":
            out += [[grid[d][e][t] for d in range(edp)] for e in range(ep) for t in range(etp)]
        else:
            raise ExecutorError(f"unknown expert mesh dimension {dim!r}; use ep, etp or edp")
    return out


def stage_rank_table(mesh) -> list[list[int]]:
    """Global ranks of each pipeline stage in local order (dp slowest, then cp, tp fastest),
    read from the dense DeviceMesh by its dimension names."""
    names = list(mesh.mesh_dim_names)
    order = [n for n in ("pp", "dp", "cp", "tp") if n in names]
    if set(names) != set(order) or "pp" not in names:
        raise ExecutorError(f"the device mesh has dimensions {names}; expert parallelism "
                            f"reads pp, dp, tp (and cp)")
    t = mesh.mesh.permute([names.index(n) for n in order])
    return t.reshape(t.shape[0], -1).tolist()


# ---- process groups ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ExpertGroups:
    """This rank's place in the expert mesh and its groups."""

    ep: int
    etp: int
    edp: int
    ep_rank: int
    edp_rank: int
    ep_group: object
    edp_group: object
    edp_mesh: object            # 1-D DeviceMesh over edp (FSDP2 shards experts on it)
    etp_rank: int = 0
    etp_group: object = None    # etp > 1: the ranks that split each expert's width


def build_expert_groups(mesh, ep: int, etp: int, device_type: str) -> ExpertGroups:
    """The expert mesh of ``mesh`` (the dense DeviceMesh); collective over the world.

    The ep groups are communicators of their own, never the DeviceMesh's: DeviceMesh hands
    out the default group for a dimension that spans the world (dp 2 · ep 2 on two GPUs:
    dp, ep and the world one communicator), and then FSDP2's gathers and reduce-scatters,
    tp's collectives and the experts' all-to-alls share one sequence of operations, which
    deadlocks as soon as two ranks issue them in different orders. Under ``torch.compile``
    the all-to-all and its backward run inside compiled graphs while FSDP2's collectives fire
    from eager hooks, and ranks that compiled different graphs (each recompiles on its own
    split sizes) may interleave them differently: PrimeIntellect-ai/prime-rl#3195 found two
    ranks stuck at one NCCL sequence number, one in FSDP's reduce-scatter, the other in an
    all-to-all, under FSDP × compile; moeh16's compiled ZeRO-3 ep 2 layout hung on 2 x H200
    with both GPUs spinning, likely so (2026-11-30, not confirmed: docs/benchmarks/moe_checks.md
    "moeh16"). On its own communicator the all-to-all's order cannot cross FSDP2's."""
    from torch.distributed.device_mesh import DeviceMesh
    table = stage_rank_table(mesh)
    grid = torch.tensor([expert_rank_grid(stage, ep, etp) for stage in table], dtype=torch.int)
    emesh = DeviceMesh(device_type, grid, mesh_dim_names=("stage", "edp", "ep", "etp"))
    _, edp_rank, ep_rank, etp_rank = emesh.get_coordinate()
    # every rank creates every ep (and etp) group, in the same order (new_group's contract)
    ep_group, _ = dist.new_subgroups_by_enumeration(expert_groups(table, ep, etp, "ep"))
    etp_group = (dist.new_subgroups_by_enumeration(expert_groups(table, ep, etp, "etp"))[0]
                 if etp > 1 else None)
    return ExpertGroups(ep=ep, etp=etp, edp=grid.shape[1], ep_rank=ep_rank, edp_rank=edp_rank,
                        ep_group=ep_group, edp_group=emesh.get_group("edp"),
                        edp_mesh=emesh["edp"], etp_rank=etp_rank, etp_group=etp_group)


# ---- hooks on a model part -------------------------------------------------------------------
def moe_layers(module) -> list:
    from meshplan.executor.moe import MoELayer
    return [m for m in module.modules() if isinstance(m, MoELayer)]


def place_experts(module, eg: ExpertGroups) -> None:
    """Keep this ep rank's contiguous share of every MoE layer's experts, and with etp > 1
    this etp rank's share of their width (meta device)."""
    for layer in moe_layers(module):
        per = layer.num_experts // eg.ep
        layer.experts.keep_experts(eg.ep_rank * per, per)
        layer.experts.keep_width(eg.etp_rank, eg.etp)


def expert_param_names(module) -> list[str]:
    return [n for n, _ in module.named_parameters() if ".experts." in n]


def router_param_names(module) -> list[str]:
    return [n for n, _ in module.named_parameters() if ".router." in n]


def etp_summed_param_names(module) -> list[str]:
    """The routed experts' output biases: whole on every etp rank, each rank's gradient
    covering its own rows (summed over the etp group by the trainer)."""
    return [n for n, _ in module.named_parameters() if n.endswith(".experts.b_out")]


def apply_tensor_parallel_moe(layer, group, spec, *, sequence_parallel: bool,
                              prefix: str) -> dict:
    """tp for an MoE layer: shared experts split like a dense MLP; the routed part runs on
    this rank's sequence slice (its router gradients are then partial sums over tp, which
    the trainer adds up). Returns the ShardSpecs of the shared experts."""
    from meshplan.executor.tensor_parallel import parallelize_mlp
    layer.tp_group = group
    layer.sequence_parallel = sequence_parallel
    layer.slice_tokens = not sequence_parallel
    if layer.shared is None:
        return {}
    width = spec.num_shared_experts * spec.shared_expert_ffn_hidden_size
    return parallelize_mlp(layer.shared, group, width, spec, sequence_parallel=sequence_parallel,
                           prefix=prefix + "shared.")


def configure_moe(module, eg: ExpertGroups | None, *, aux_divisor: int,
                  cp_group=None) -> None:
    """Install the ep group, and the cp group (cp > 1: each rank routes its chunks of every
    sequence; None: cp 1); the load-balancing gradient per micro-batch is α / aux_divisor
    (the number the trainer divides each micro-batch's loss by)."""
    for layer in moe_layers(module):
        layer.ep_group = eg.ep_group if eg is not None and eg.ep > 1 else None
        layer.etp_group = eg.etp_group if eg is not None else None
        layer.cp_group = cp_group
        layer.aux_grad_scale = layer.aux_grad_scale / aux_divisor


def prepare_data_parallel(module, eg: ExpertGroups, *, zero: int, bf16: bool) -> None:
    """Before :func:`meshplan.executor.data_parallel.wrap_data_parallel`: with ZeRO-2/3,
    FSDP2 shards each layer's experts over edp (it averages their gradients over edp;
    :func:`reduce_expert_grads` rescales); with ZeRO-0/1, DDP leaves the expert weights to
    :func:`reduce_expert_grads`."""
    if zero >= 2:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if bf16 else MixedPrecisionPolicy())
        for layer in moe_layers(module):
            fully_shard(layer.experts, mesh=eg.edp_mesh, reshard_after_forward=zero == 3,
                        mp_policy=mp)
        return
    from torch.nn.parallel import DistributedDataParallel
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        module, expert_param_names(module))


def reduce_expert_grads(params: list, eg: ExpertGroups, *, dp: int, zero: int) -> None:
    """Make each expert gradient the sum over edp divided by dp: ZeRO-0/1 all-reduce over
    edp here; under ZeRO-2/3 FSDP2 has averaged over edp, so rescale by edp/dp (FSDP2's own
    divide factor uses ReduceOp.PREMUL_SUM, which gloo lacks)."""
    from meshplan.executor.data_parallel import allreduce_grads
    if zero < 2 and eg.edp > 1:
        allreduce_grads(params, eg.edp_group, dp)
        return
    factor = (eg.edp if zero >= 2 else 1) / dp
    if factor != 1:
        for p in params:
            if p.grad is not None:
                (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).mul_(factor)


def build_expert_optimizer(params: list, eg: ExpertGroups, *, zero: int, device, config):
    """AdamW over the expert weights; with ZeRO-1 its states shard over edp."""
    from meshplan.executor.data_parallel import build_optimizer
    return build_optimizer(params, zero=zero, device=device, config=config,
                           groups=SimpleNamespace(dp=eg.edp, dp_group=eg.edp_group))


class JointOptimizer:
    """Steps several optimizers as one (dense weights over dp, experts over edp)."""

    def __init__(self, optimizers: list):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list:
        return [g for o in self.optimizers for g in o.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def state_dict(self) -> dict:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        for o, s in zip(self.optimizers, state["optimizers"]):
            o.load_state_dict(s)


def gather_expert_params(trainer, kind: str) -> dict[str, torch.Tensor] | None:
    """Full expert weights (or gradients) on rank 0: ``name`` and ``name@edp{d}`` for every
    replica over edp. Collective over the world."""
    eg, names = trainer.expert_groups, set(trainer.expert_param_names)
    mine = []
    for part in trainer.parts:
        for layer_name, p in part.module.named_parameters():
            if layer_name not in names:
                continue
            t = p if kind == "param" else p.grad
            if t is not None and hasattr(t, "full_tensor"):
                t = t.full_tensor()
            cut = expert_cut_of(part.module, layer_name)
            mine.append((layer_name, cut.first, cut.width,
                         None if t is None else t.detach().float().cpu()))
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object((eg.edp_rank, eg.etp_rank, mine), gathered, dst=0)
    if dist.get_rank() != 0:
        return None
    by_name: dict[str, dict[int, dict]] = {}
    for edp_rank, etp_rank, items in gathered:
        for name, first, spec, t in items:
            by_first = by_name.setdefault(name, {}).setdefault(edp_rank, {})
            by_first.setdefault(first, (spec, {}))[1][etp_rank] = t
    out = {}
    for name, replicas in by_name.items():
        for d, by_first in sorted(replicas.items()):
            blocks = []
            for _, (spec, shards) in sorted(by_first.items()):
                ts = [shards[r] for r in sorted(shards)]
                blocks.append(None if any(t is None for t in ts)
                              else spec.unshard(ts) if spec is not None else ts[0])
            full = None if any(b is None for b in blocks) else torch.cat(blocks)
            out[f"{name}@edp{d}"] = full
            out.setdefault(name, full)
    return out


class ExpertCut(NamedTuple):
    """Where a rank's piece of a routed-expert parameter sits in the layer's full tensor:
    experts ``first`` .. of ``total`` (dim 0), and with etp > 1 the width shard ``width``
    (a :class:`~meshplan.executor.tensor_parallel.ShardSpec`, None where whole) of rank
    ``etp_rank`` of ``etp``."""

    first: int
    total: int
    width: object
    etp_rank: int
    etp: int


def expert_cut_of(module, param_name: str) -> ExpertCut:
    """The :class:`ExpertCut` of ``module``'s routed-expert parameter ``param_name`` (one of
    :func:`expert_param_names`)."""
    owner_name, pname = param_name.rsplit(".", 1)
    owner = module.get_submodule(owner_name)
    return ExpertCut(owner.first, owner.total,
                     owner.width_spec(pname) if owner.etp > 1 else None, owner.etp_rank,
                     owner.etp)


__all__ = ["expert_coords", "expert_rank_grid", "expert_groups", "stage_rank_table",
           "ExpertGroups", "build_expert_groups", "place_experts", "configure_moe",
           "apply_tensor_parallel_moe", "prepare_data_parallel", "reduce_expert_grads",
           "build_expert_optimizer", "JointOptimizer", "gather_expert_params",
           "expert_param_names", "router_param_names", "etp_summed_param_names",
           "ExpertCut", "expert_cut_of",
           "moe_layers"]
