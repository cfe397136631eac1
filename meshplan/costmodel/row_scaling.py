"""Scaling one timed shape's measured row to another shape (:mod:`.nearest_rows`).

Each quantity of a row is multiplied by the analytical model's target / source ratio of its
kind: GPU seconds by the analytical pass times (:func:`~meshplan.costmodel.compute.
layer_cost`, the ends' ``embedding_cost`` / ``logits_cost``), kept and working bytes by the
executor's tensors (:mod:`.torch_activations`; the embedding by its dense fp32 weight
gradient plus its output, the output layer by its logits), CPU dispatch by the operators a
layer dispatches (:mod:`.dispatch`: forward fields by the forward's ratio, backward fields by
the backward's; a call's fixed part kept). Also: the row of another family (its CPU dispatch
with the analytical GPU time and bytes) and indexes of a profile's rows by knob.

Formula, sources and measured error: :mod:`.nearest_rows` (value(target) = measured(source) ×
analytical(target) / analytical(source)).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from types import SimpleNamespace

from meshplan.costmodel.compute import embedding_cost, layer_cost, logits_cost
from meshplan.costmodel.memory import logits_bytes
from meshplan.costmodel.moe_layer import routed_added, routed_mlp, shared_width
from meshplan.costmodel.torch_activations import torch_backward_work, torch_layer_activations
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.measured import Interpolated, MeasuredTables
from meshplan.spec import Job, Layout, ModelSpec

# the CPU's dispatch fields of a row: scaled by the forward's / the backward's operator
# ratio (the per-call fixed parts do not grow with a layer's operators: kept)
_CPU_FORWARD = ("forward_cpu_s",)
_CPU_BACKWARD = ("backward_cpu_s", "backward_input_cpu_s", "backward_weight_cpu_s",
                 "backward_input_depth_s", "backward_weight_depth_s")


# ---- the ratios ------------------------------------------------------------------------
@dataclass(frozen=True)
class Ratios:
    """target / source of the analytical model, per kind of quantity."""

    forward: float
    backward: float
    wgrad: float
    kept_bytes: float
    work_bytes: float
    wgrad_share: float = 0.0   # the target's weight-gradient GEMMs over its backward


def _r(a: float, b: float) -> float:
    return a / b if b > 0 else 1.0


@dataclass(frozen=True)
class Analytic:
    """One layer's analytical pass times (s) and bytes, one micro-batch, as the rows hold them."""

    forward_s: float
    backward_s: float
    wgrad_s: float
    kept_bytes: float
    work_bytes: float
    # within forward_s / backward_s: the memory-bound ops and fixed costs, the part a
    # compiled block fuses (:func:`compiled_share`)
    forward_mem_s: float = 0.0
    backward_mem_s: float = 0.0

    def compiled(self, share: tuple[float, float]) -> tuple[float, float]:
        """(forward, backward) with the memory-bound part at ``share`` of its price."""
        return (self.forward_s - (1 - share[0]) * self.forward_mem_s,
                self.backward_s - (1 - share[1]) * self.backward_mem_s)


def _mem(p) -> float:
    return p.memory_bound_s + p.overhead_s


@lru_cache(maxsize=4096)
def analytic(model: ModelSpec, job: Job, mb: float, cluster: Cluster, tp: int, sp: bool,
             recompute: str, tp_link, autocast: bool, compiled: bool = False) -> Analytic:
    """The analytical layer a row is scaled by: :func:`~meshplan.costmodel.compute.
    layer_cost` and the executor's tensors (:mod:`.torch_activations`: autocast for the
    plain rows, ZeRO-0/1; bf16 for the FSDP2 ones); an MoE layer's routed part on top
    (:func:`moe_analytic`)."""
    if model.is_moe:
        return moe_analytic(model, job, mb, cluster, tp, sp, recompute, tp_link, autocast)
    a = layer_cost(model, cluster, job, micro_batch=mb, tp=tp, sequence_parallel=sp,
                   recompute=recompute, tp_link=tp_link, compiled=compiled)
    acts = torch_layer_activations(model, job, mb, tp, sp, autocast=autocast)
    return Analytic(a.forward.total_s, a.backward.total_s, a.wgrad_s, acts.stored(recompute),
                    torch_backward_work(model, job, mb, tp, sp, recompute, autocast=autocast),
                    _mem(a.forward), _mem(a.backward))


def moe_analytic(model: ModelSpec, job: Job, mb: float, cluster: Cluster, tp: int, sp: bool,
                 recompute: str, tp_link, autocast: bool) -> Analytic:
    """An MoE layer as its rows time it (the executor's block at ep = 1, bf16, balanced
    routing): the layer with its shared experts as MLP plus the routed part of
    :func:`meshplan.costmodel.moe_layer.routed_mlp`, combined as
    :func:`~meshplan.costmodel.moe_layer.with_routed_mlp` combines them
    (:func:`~meshplan.costmodel.moe_layer.routed_added`)."""
    bf16 = job.with_precision("bf16") if job.precision == "fp8" else job
    width = shared_width(model)
    a = layer_cost(model, cluster, bf16, micro_batch=mb, tp=tp, sequence_parallel=sp,
                   recompute=recompute, tp_link=tp_link, mlp_width=width)
    acts = torch_layer_activations(model, bf16, mb, tp, sp, autocast=autocast, mlp_width=width)
    work = torch_backward_work(model, bf16, mb, tp, sp, recompute, autocast=autocast,
                               mlp_width=width)
    # one micro-batch of mb sequences as one sequence of their tokens: the routed part
    # depends on the tokens alone
    tokens_job = replace(bf16, seq_len=max(1, round(mb * bf16.seq_len)))
    r = routed_mlp(model, cluster, tokens_job,
                   Layout(tp=tp, sequence_parallel=sp, recompute=recompute),
                   SimpleNamespace(tp=tp_link), 1.0)   # ep = etp = 1: no ep or etp link read
    add = routed_added(r, recompute, job.selective_modules)
    return Analytic(a.forward.total_s + r.forward.total_s,
                    a.backward.total_s + r.backward.total_s + add.rerun.total_s,
                    a.wgrad_s + r.wgrad_s, acts.stored(recompute) + add.kept_bytes,
                    work + add.work_bytes, _mem(a.forward) + _mem(r.forward),
                    _mem(a.backward) + _mem(r.backward) + _mem(add.rerun))


def compiled_share(b: Analytic, eager: tuple[float, float], compiled: tuple[float, float]
                   ) -> tuple[float, float]:
    """(forward, backward): what the source's memory-bound work costs in its compiled block
    over its eager price, read off the source's compiled and eager rows at the same knobs:
    the GEMMs and the attention core (``b``'s analytical share) run the same kernels either
    way, so the compiled row's saving is the fused memory-bound ops'. s = (C/E·(g + m) − g)/m
    per pass, within [0, 1]. Measured (1 × H200, 2026-12-02, the MoE rows at 4 k tokens):
    forward 0.48, backward 0.23 (moeh31's model); eager, a fine-grained MoE block spends
    1.80-1.94× its forward in backward, as a coarse one does, compiled 1.44-1.57× against the
    coarse ones' 1.74-1.99× (docs/benchmarks/moe_checks.md)."""
    out = []
    for total, mem, e, c in ((b.forward_s, b.forward_mem_s, eager[0], compiled[0]),
                             (b.backward_s, b.backward_mem_s, eager[1], compiled[1])):
        if mem <= 0 or e <= 0 or c <= 0:
            out.append(1.0)
            continue
        g = total - mem
        out.append(min(1.0, max(0.0, (c / e * total - g) / mem)))
    return out[0], out[1]


def layer_ratios(target: ModelSpec, job: Job, mb: float, source: ModelSpec, seq_s: int,
                 mb_s: float, cluster: Cluster, tp: int, sp: bool, recompute: str,
                 tp_link, autocast: bool,
                 compiled_twin: tuple[Interpolated, Interpolated] | None = None) -> Ratios:
    """target / source of the analytical layer; for a compiled row with the source's eager
    twin (``compiled_twin``: the eager row, the compiled row), both analytical layers with
    their memory-bound work at the source's :func:`compiled_share`."""
    a = analytic(target, job, mb, cluster, tp, sp, recompute, tp_link, autocast)
    b = analytic(source, replace(job, seq_len=seq_s), mb_s, cluster, tp, sp, recompute,
                 tp_link, autocast)
    share = (1.0, 1.0)
    if compiled_twin is not None:
        eager, compiled = compiled_twin
        share = compiled_share(b, (eager.forward_s, eager.backward_s),
                               (compiled.forward_s, compiled.backward_s))
    (af, ab), (bf, bb) = a.compiled(share), b.compiled(share)
    return Ratios(_r(af, bf), _r(ab, bb), _r(a.wgrad_s, b.wgrad_s),
                  _r(a.kept_bytes, b.kept_bytes), _r(a.work_bytes, b.work_bytes),
                  _r(a.wgrad_s, ab) if ab > 0 else 0.0)


@lru_cache(maxsize=4096)
def end_ratios(part: str, target: ModelSpec, job: Job, mb: float, source: ModelSpec,
                seq_s: int, mb_s: float, cluster: Cluster, tp: int, sp: bool,
                tp_link) -> Ratios:
    job_s = replace(job, seq_len=seq_s)
    kw = dict(tp=tp, sequence_parallel=sp, tp_link=tp_link)
    if part == "embedding":
        a = embedding_cost(target, cluster, job, micro_batch=mb, **kw)
        b = embedding_cost(source, cluster, job_s, micro_batch=mb_s, **kw)
        # what an embedding keeps is its output; its backward allocates the dense weight
        # gradient (embedding_dense_backward) beside the incoming gradient
        kept = _r(job.seq_len * mb * target.hidden_size, seq_s * mb_s * source.hidden_size)
        work = _r(target.vocab_size * target.hidden_size / tp * 4
                  + job.seq_len * mb * target.hidden_size * 2,
                  source.vocab_size * source.hidden_size / tp * 4
                  + seq_s * mb_s * source.hidden_size * 2)
        return Ratios(_r(a[0].total_s, b[0].total_s), _r(a[1].total_s, b[1].total_s), 1.0,
                      kept, work)
    a = logits_cost(target, cluster, job, micro_batch=mb, **kw)
    b = logits_cost(source, cluster, job_s, micro_batch=mb_s, **kw)
    kept = _r(logits_bytes(target, job, mb, tp), logits_bytes(source, job_s, mb_s, tp))
    return Ratios(_r(a[0].total_s, b[0].total_s), _r(a[1].total_s, b[1].total_s),
                  _r(a[2], b[2]), kept, kept)


def analytic_layer(row: Interpolated, model: ModelSpec, job: Job, mb: float,
                   cluster: Cluster, tp: int, sp: bool, recompute: str, tp_link,
                   autocast: bool, compiled: bool = False) -> Interpolated:
    """``row``'s CPU dispatch with the analytical layer's GPU seconds and bytes (and no
    zero-bubble split or split memory: the cost model splits the backward itself)."""
    a = analytic(model, job, mb, cluster, tp, sp, recompute, tp_link, autocast, compiled)
    return replace(row, forward_s=a.forward_s, backward_s=a.backward_s,
                   activation_bytes=a.kept_bytes, peak_bytes=a.work_bytes,
                   backward_input_s=0.0, backward_weight_s=0.0, backward_input_cpu_s=0.0,
                   backward_weight_cpu_s=0.0, split_layers=0.0, backward_input_depth_s=0.0,
                   backward_weight_depth_s=0.0, wgrad_pending_bytes=0.0,
                   wgrad_transient_bytes=0.0, wgrad_memory_layers=0.0,
                   wgrad_pending_stage_bytes=0.0, wgrad_transient_stage_bytes=0.0)


_GPU_FIELDS = {"forward_s": "forward", "backward_s": "backward",
               "backward_input_s": "backward", "backward_weight_s": "wgrad",
               "activation_bytes": "kept_bytes", "peak_bytes": "work_bytes",
               "wgrad_pending_bytes": "work_bytes", "wgrad_transient_bytes": "work_bytes",
               "wgrad_pending_stage_bytes": "work_bytes",
               "wgrad_transient_stage_bytes": "work_bytes"}


def scaled_row(row: Interpolated, k: Ratios, cpu: tuple[float, float]) -> Interpolated:
    out = {}
    for f in fields(Interpolated):
        v = getattr(row, f.name)
        if f.name in _CPU_FORWARD:
            v *= cpu[0]
        elif f.name in _CPU_BACKWARD:
            v *= cpu[1]
        elif f.name in _GPU_FIELDS:
            v *= getattr(k, _GPU_FIELDS[f.name])
        out[f.name] = v
    return Interpolated(**out)


# ---- indexes of a profile's rows (cached per tables object) ------------------------------
@lru_cache(maxsize=64)
def layer_groups(tables: MeasuredTables) -> dict[tuple, tuple[tuple[str, int], ...]]:
    out: dict[tuple, set] = {}
    for r in tables.layers:
        if r.precision != "bf16" or r.ep > 1:   # neither is transferred to others
            continue
        out.setdefault((r.tp, r.sequence_parallel, r.recompute, r.zero,
                        r.dp if r.zero >= 2 else 1, r.compile), set()).add((r.shape, r.seq_len))
    return {k: tuple(sorted(v)) for k, v in out.items()}


@lru_cache(maxsize=64)
def layer_micro_batches(tables: MeasuredTables) -> dict[tuple, tuple[int, ...]]:
    out: dict[tuple, set] = {}
    for r in tables.layers:
        if r.precision != "bf16" or r.ep > 1:   # neither is transferred to others
            continue
        out.setdefault((r.shape, r.seq_len, r.tp, r.sequence_parallel, r.recompute, r.zero,
                        r.dp if r.zero >= 2 else 1, r.compile), set()).add(r.micro_batch)
    return {k: tuple(sorted(v)) for k, v in out.items()}


@lru_cache(maxsize=64)
def end_groups(tables: MeasuredTables) -> dict[tuple, tuple[tuple[str, int], ...]]:
    out: dict[tuple, set] = {}
    for e in tables.ends:
        out.setdefault((e.part, e.tp, e.sequence_parallel), set()).add((e.shape, e.seq_len))
    return {k: tuple(sorted(v)) for k, v in out.items()}


@lru_cache(maxsize=64)
def end_micro_batches(tables: MeasuredTables) -> dict[tuple, tuple[int, ...]]:
    out: dict[tuple, set] = {}
    for e in tables.ends:
        out.setdefault((e.shape, e.part, e.seq_len, e.tp, e.sequence_parallel),
                       set()).add(e.micro_batch)
    return {k: tuple(sorted(v)) for k, v in out.items()}


__all__ = ["Ratios", "analytic_layer", "compiled_share", "end_groups", "end_micro_batches",
           "end_ratios", "layer_groups", "layer_micro_batches", "layer_ratios", "scaled_row"]
