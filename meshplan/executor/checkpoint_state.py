"""A rank's training state in a layout-free form: full-size tensors, of which it holds pieces.

A checkpoint must load into any layout (dp 2 · pp 2 → dp 4, tp 2 → FSDP2, ZeRO-1 → ZeRO-3),
so every tensor is saved under its full model name (``model.<fqn>``,
``optim.<fqn>.exp_avg``, …) at its full, unsharded shape, and each rank writes the
rectangular pieces of it that it holds. ``torch.distributed.checkpoint`` (DCP) records each
piece as a chunk (offsets, sizes) of that full tensor and, on load, reads whatever stored
chunks overlap the pieces the new layout asks for: DCP's resharding, on any cut.

The pieces come from two cuts applied in order:

* tensor parallelism (``tensor_parallel.ShardSpec``): this rank's slice of each section
  (q | k | v rows, SwiGLU gate | up rows) along the split dimension — a fused QKV weight is
  three pieces of the full tensor, not one;
* FSDP2 (ZeRO-2/3): ``fully_shard`` keeps rows [a, b) of the tensor-parallel slice as a
  ``DTensor`` on the dp mesh; its offsets come from DTensor's own
  ``compute_local_shape_and_global_offset`` (the function DCP uses for DTensors).

Replicas hold identical pieces (dp replicas under DDP / ZeRO-1, tp-replicated norms and
biases, the two copies of a tied embedding on the first and last pipeline stage); DCP's
planner writes each (name, offsets) once (``dedup_save_plans``). Optimizer states follow
their parameter's cut; a ZeRO-1 rank holds AdamW states only for its own partition, so each
state piece comes from its owner.

A DTensor itself cannot describe these cuts (sections are not one regular shard), so
:class:`Pieces` implements DCP's checkpointable protocol (``__create_write_items__``,
``__create_chunk_list__``, ``__get_tensor_shard__``, present in torch 2.4 onwards and in
2.11 and 2.13): a tensor subclass that only carries its pieces.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator

import torch
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                   TensorProperties)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from meshplan.errors import ExecutorError

Segment = tuple[int, int, int]      # (start in the local tensor, length, start in the full one)


class Pieces(torch.Tensor):
    """A full-size tensor of which this rank holds ``pieces``: [(offsets, local tensor)].

    Only DCP's checkpointable protocol is implemented; any tensor operation raises.
    """

    pieces: list[tuple[tuple[int, ...], torch.Tensor]]

    @staticmethod
    def __new__(cls, full_shape, dtype, pieces):
        obj = torch.Tensor._make_wrapper_subclass(cls, torch.Size(full_shape), dtype=dtype,
                                                  device=torch.device("cpu"),
                                                  requires_grad=False)
        obj.pieces = list(pieces)
        return obj

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise TypeError(f"Pieces holds checkpoint pieces and supports no tensor operation "
                        f"({func})")

    def __repr__(self) -> str:
        return f"Pieces(shape={tuple(self.shape)}, pieces={len(self.pieces)})"

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        return [WriteItem(index=MetadataIndex(fqn, torch.Size(off)), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(
                              chunk=ChunkStorageMetadata(offsets=torch.Size(off),
                                                         sizes=t.size()),
                              properties=TensorProperties.create_from_tensor(t),
                              size=self.size()))
                for off, t in self.pieces]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=torch.Size(off), sizes=t.size())
                for off, t in self.pieces]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        for off, t in self.pieces:
            if torch.Size(off) == index.offset:
                return t
        raise ValueError(f"no piece of {index.fqn} at offsets {tuple(index.offset or ())}")


# ---- where a local tensor sits in the full one -------------------------------------------
def tp_segments(spec, local_shape, tp_rank: int, tp: int):
    """(full shape, per-dimension segments) of a tensor-parallel slice (``ShardSpec`` or
    None for a tensor replicated over tp)."""
    segs: list[list[Segment]] = [[(0, n, 0)] for n in local_shape]
    full = list(local_shape)
    if spec is None or tp == 1:
        return tuple(full), segs
    d = spec.dim
    sections = spec.sections or (local_shape[d] * tp,)
    out, local_start, full_start = [], 0, 0
    for s in sections:
        n = s // tp
        out.append((local_start, n, full_start + tp_rank * n))
        local_start += n
        full_start += s
    if local_start != local_shape[d]:
        raise ExecutorError(f"internal: tensor-parallel sections {sections} over tp = {tp} "
                            f"do not make the local size {local_shape[d]}")
    segs[d], full[d] = out, full_start
    return tuple(full), segs


def _restrict(segs: list[Segment], start: int, length: int) -> list[Segment]:
    """The segments of local rows [start, start + length), re-based to start at 0."""
    out = []
    for ls, n, fs in segs:
        a, b = max(ls, start), min(ls + n, start + length)
        if a < b:
            out.append((a - start, b - a, fs + a - ls))
    return out


def tensor_pieces(t: torch.Tensor, spec, tp_rank: int, tp: int):
    """(full shape, [(offsets, view of this rank's data)]) for a parameter or a state tensor
    shaped like it; empty pieces are left out."""
    if isinstance(t, DTensor):
        local = t.to_local()
        shape = tuple(t.shape)
        full, segs = tp_segments(spec, shape, tp_rank, tp)
        sizes, offsets = compute_local_shape_and_global_offset(t.shape, t.device_mesh,
                                                               t.placements)
        for d, (size, off) in enumerate(zip(sizes, offsets)):
            if size != shape[d] or off != 0:
                segs[d] = _restrict(segs[d], off, size)
    else:
        local = t
        full, segs = tp_segments(spec, tuple(t.shape), tp_rank, tp)
    out = []
    for combo in itertools.product(*segs):
        view = local.detach()
        for d, (ls, n, _) in enumerate(combo):
            view = view.narrow(d, ls, n)
        if view.numel() or view.dim() == 0:
            out.append((tuple(fs for _, _, fs in combo), view))
    return full, out


def expert_cut(full, pieces, first: int, total: int):
    """(full shape, pieces) of one rank's routed experts ``first .. first + count - 1`` (dim 0
    of the stacked expert weights, :class:`meshplan.executor.moe.GroupedExperts`) placed in
    the layer's ``total`` experts: the expert-parallel cut, applied after the others (FSDP2
    shards the rank's own experts over edp)."""
    return ((total, *full[1:]),
            [((off[0] + first, *off[1:]), view) for off, view in pieces])


# ---- the training state -------------------------------------------------------------------
def _inner_optimizers(optimizer) -> list:
    """The AdamW instances behind ``optimizer``: itself, ZeroRedundancyOptimizer's partition
    (``.optim``), or each of an MoE model's optimizers (``JointOptimizer``: the dense weights
    over dp, the experts over edp)."""
    joint = getattr(optimizer, "optimizers", None)
    if joint is not None:
        return [inner for o in joint for inner in _inner_optimizers(o)]
    return [getattr(optimizer, "optim", optimizer)]


def _expert_cuts(trainer) -> dict:
    """``{parameter name: ExpertCut}`` of this rank's routed experts (empty for a dense
    model; :func:`meshplan.executor.expert_parallel.expert_cut_of`)."""
    from meshplan.executor.expert_parallel import expert_cut_of, expert_param_names
    return {name: expert_cut_of(part.module, name) for part in trainer.parts
            for name in expert_param_names(part.module)}


def named_params(trainer) -> Iterator[tuple[str, torch.nn.Parameter]]:
    seen = set()
    for part in trainer.parts:
        for name, p in part.module.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p


def ensure_optimizer_state(optimizer) -> None:
    """Create AdamW's per-parameter state (step, exp_avg, exp_avg_sq) where it does not exist
    yet, as ``torch.optim.AdamW`` does at its first step, so a checkpoint can load into it."""
    inners = _inner_optimizers(optimizer)
    for inner in inners:
        if not isinstance(inner, torch.optim.AdamW):
            raise ExecutorError(f"checkpointing knows AdamW's state; the optimizer is "
                                f"{type(inner).__name__}")
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    for inner, group in ((o, g) for o in inners for g in o.param_groups):
        on_device = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            st = inner.state[p]
            if st:
                continue
            st["step"] = torch.zeros((), dtype=scalar,
                                     device=p.device if on_device else torch.device("cpu"))
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group.get("amsgrad"):
                st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def training_state(trainer, *, copy_to_cpu: bool) -> dict[str, Any]:
    """``{key: Pieces or 0-dim tensor}`` of the model and optimizer on this rank.

    ``copy_to_cpu``: stage contiguous host copies (saving; the training goes on while they
    are written); otherwise the pieces are views of the live tensors (loading in place).
    """
    g = trainer.groups
    inners = _inner_optimizers(trainer.optimizer)
    cuts = _expert_cuts(trainer)
    out: dict[str, Any] = {}
    copies: list[tuple[torch.Tensor, torch.Tensor]] = []

    def stage(t: torch.Tensor) -> torch.Tensor:
        if not copy_to_cpu:
            return t
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu",
                           pin_memory=t.device.type == "cuda")
        copies.append((host, t))
        return host

    def add(key: str, t: torch.Tensor, spec, cut) -> None:
        if t.dim() == 0:
            out[key] = stage(t.detach())
            return
        if cut is None:
            full, pieces = tensor_pieces(t, spec, g.tp_rank, g.tp)
        else:     # the experts' width over etp, then their place among the layer's
            full, pieces = expert_cut(*tensor_pieces(t, cut.width, cut.etp_rank, cut.etp),
                                      cut.first, cut.total)
        if pieces:
            out[key] = Pieces(full, t.dtype, [(off, stage(v)) for off, v in pieces])

    for name, p in named_params(trainer):
        spec, cut = trainer.shards.get(name), cuts.get(name)
        add(f"model.{name}", p, spec, cut)
        state = next((o.state[p] for o in inners if p in o.state), {})
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                add(f"optim.{name}.{k}", v, spec, cut)
    with torch.no_grad():
        for host, t in copies:
            host.copy_(t, non_blocking=True)
    if copies and any(t.device.type == "cuda" for _, t in copies):
        torch.cuda.synchronize()
    return out


def state_bytes(state: dict[str, Any]) -> int:
    """Bytes of the pieces this rank holds in ``state`` (before DCP removes duplicates)."""
    n = 0
    for v in state.values():
        if isinstance(v, Pieces):
            n += sum(t.numel() * t.element_size() for _, t in v.pieces)
        elif isinstance(v, torch.Tensor):
            n += v.numel() * v.element_size()
    return n


def rng_state(rank: int, device: torch.device) -> dict[str, torch.Tensor]:
    """This rank's random-number generators, under keys of its own (never deduplicated)."""
    out = {f"rng.rank{rank}.cpu": torch.get_rng_state()}
    if device.type == "cuda":
        out[f"rng.rank{rank}.cuda"] = torch.cuda.get_rng_state(device)
    return out


def set_rng_state(state: dict[str, torch.Tensor], rank: int, device: torch.device) -> None:
    torch.set_rng_state(state[f"rng.rank{rank}.cpu"])
    if device.type == "cuda" and f"rng.rank{rank}.cuda" in state:
        torch.cuda.set_rng_state(state[f"rng.rank{rank}.cuda"], device)


__all__ = ["Pieces", "tensor_pieces", "tp_segments", "expert_cut", "training_state",
           "ensure_optimizer_state", "state_bytes", "rng_state", "set_rng_state",
           "named_params"]
