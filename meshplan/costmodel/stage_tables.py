"""A layout's step time as a function of the layers each (virtual) stage holds.

Virtual stage c (chunk c lives on rank c % pp) holding n_c layers runs, per micro-batch,
forward ``f_c = n_c·layer_forward_s + overhead_s + [c = 0]·first_forward_s +
[c = last]·last_forward_s`` (backward and weight-gradient alike), each slowed by its rank's
p2p factor where that correction applies (``slowdown``). The pipeline puts these through
the schedule's closed form (:mod:`meshplan.costmodel.pipeline`, Narayanan et al. 2021 §2.2,
Qi et al. 2023 §3.1) — or torch's own p2p order where it binds
(:mod:`meshplan.costmodel.torch_p2p`) — and each rank adds its exposed data-parallel
communication and optimizer step (:mod:`meshplan.costmodel.data_parallel`). The planner's
CP-SAT model uses exactly these pieces to choose the stage partition.

:class:`TablesBase` holds what every part of the tables shares; :class:`StageTimes` the
time terms. Host dispatch (:mod:`meshplan.costmodel.host`) and memory
(:mod:`meshplan.costmodel.rank_memory`) are the other parts of
:class:`meshplan.costmodel.tables.LayerTables`.

Measured error: these sums equal ``estimate``'s step time on random partitions
(tests/unit/test_planner_tables.py); the closed forms' error against the simulator is in
:mod:`meshplan.costmodel.pipeline`, the estimate's against runs in
:mod:`meshplan.costmodel.estimate`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from meshplan.costmodel import torch_p2p
from meshplan.costmodel.data_parallel import (Groups, RankState, Zero3Layer, combined_state,
                                              exposed_dp_s, params_state, rank_state,
                                              reduced_after_backward)
from meshplan.costmodel.parts import LayerParts
from meshplan.costmodel.pipeline import closed_form_unchecked, inflight_microbatches
from meshplan.costmodel.runtime import (expert_grad_copies, fsdp_per_microbatch,
                                        zb_first_stage_fused)
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec


@lru_cache(maxsize=65536)
def _pipeline_time(schedule: str, f_s: tuple, b_s: tuple, w_s: tuple, m: int, pp: int, v: int,
                   p2p: float) -> tuple[float, float]:
    """Pipeline time with and without point-to-point transfers (cached: ZeRO 0-2 layouts
    of the same shape share it)."""
    with_p2p = closed_form_unchecked(schedule, f_s, b_s, w_s, m, pp, v, p2p)
    without = closed_form_unchecked(schedule, f_s, b_s, w_s, m, pp, v, 0.0) if p2p else with_p2p
    return with_p2p, without


@lru_cache(maxsize=4096)
def inflight_table(schedule: str, pp: int, v: int, m: int) -> tuple[float, ...]:
    return tuple(inflight_microbatches(schedule, pp, v, m, r) for r in range(pp))


@dataclass(frozen=True, eq=False, kw_only=True)
class TablesBase:
    """What every part of a layout's tables shares."""

    model: ModelSpec
    cluster: Cluster
    job: Job
    layout: Layout
    links: Groups
    parts: LayerParts
    zero3: Zero3Layer
    num_layers: int
    num_microbatches: int
    last_rank: int
    inflight: tuple[float, ...]    # per pipeline rank: micro-batches in flight at its peak
    grad_copies: int = 1           # fp32 gradient copies (+ 1 where runtime.ddp_accumulates)
    # the layers are priced compiled (Layout.compile): no autocast cache of their weights
    # (torch_memory.compute_copy_bytes)
    compiled_layers: bool = False
    corrections: tuple[str, ...] = ()   # corrections.applied: the named ones that apply
    caveats: tuple[str, ...] = ()       # Estimate.caveats
    # the layout as given, where the tables price an equivalent one (context parallelism:
    # costmodel.context_tables); None where ``layout`` is the one given
    given_layout: Layout | None = None
    # MoE models: the experts' states and the dense layers (costmodel.moe_tables.
    # ExpertTerms); None for dense models
    experts: object = None

    def __post_init__(self) -> None:
        # memo of rank_state by (layers, first, last): the planner prices many partitions
        object.__setattr__(self, "_states", {})
        object.__setattr__(self, "_relief", {})

    def rank_layers(self, stage_layers) -> list[int]:
        pp = self.layout.pp
        return [sum(stage_layers[r::pp]) for r in range(pp)]

    @property
    def num_dense_layers(self) -> int:
        """An MoE model's dense layers (0 for dense models: one layer kind)."""
        return len(self.experts.dense_layers) if self.experts is not None else 0

    def dense_counts(self, stage_layers) -> list[int]:
        """Per virtual stage: the MoE model's dense layers it holds (stages hold consecutive
        layers in model order); zeros for dense models."""
        if not self.num_dense_layers:
            return [0] * len(stage_layers)
        out, start = [], 0
        for n in stage_layers:
            out.append(sum(start <= i < start + n for i in self.experts.dense_layers))
            start += n
        return out

    def rank_dense_counts(self, stage_layers) -> list[int]:
        counts, pp = self.dense_counts(stage_layers), self.layout.pp
        return [sum(counts[r::pp]) for r in range(pp)]

    def rank_state(self, rank: int, layers: int, dense: int = 0) -> RankState:
        key = (layers, rank == 0, rank == self.last_rank, dense)
        st = self._states.get(key)  # type: ignore[attr-defined]
        if st is None:
            lay = self.layout
            ex = self.experts
            # Only these layout fields matter (m only through ZeRO-3's per-layer traffic), so
            # layouts differing in schedule, recompute or micro-batch share the result.
            st = rank_state(
                self.model, self.cluster, self.job, lay.dp, lay.pp, lay.tp, lay.zero,
                self._fsdp_microbatches, self.links.dp, layers,
                key[1], key[2], self.zero3, self.grad_copies,
                dense * ex.dense_extra_params if dense else 0.0, compiled=self.compiled_layers)
            if ex is not None:      # the routed experts of its MoE layers, over edp
                params = (layers - dense) * ex.params_per_layer
                experts = params_state(
                    self.cluster, self.job, params, ex.edp, lay.pp, lay.zero,
                    self._fsdp_microbatches, ex.edp_link, layers - dense, ex.zero3,
                    expert_grad_copies(self.job, self.grad_copies),
                    ex.copy_bytes(params, self.job, lay.zero), params)
                if self.job.runtime == "torch" and lay.zero < 2:
                    experts = reduced_after_backward(experts)     # outside DDP
                st = combined_state(st, experts)
            f8 = self.parts.fp8
            if f8 is not None and (f8.weight_copy_bytes or f8.expert_weight_copy_bytes):
                # fp8's weight copies per layer (TransformerEngine's fp8 weight cache, its
                # routed experts' on MoE layers; the executor's fp8 linears, no autocast
                # copy): with the weights, as layer_state_bytes counts them, so estimate()
                # and the planner agree
                copies = (layers * f8.weight_copy_bytes
                          + (layers - dense) * f8.expert_weight_copy_bytes)
                st = replace(st, weights_bytes=st.weights_bytes + copies)
            self._states[key] = st  # type: ignore[attr-defined]
        return st

    @property
    def _fsdp_microbatches(self) -> int:
        """rank_state's micro-batch count: only per-micro-batch FSDP traffic depends on it,
        so other layouts share one memoized result."""
        lay = self.layout
        return self.num_microbatches if fsdp_per_microbatch(self.job, lay.zero, lay.pp) else 0


@dataclass(frozen=True, eq=False, kw_only=True)
class StageTimes(TablesBase):
    """Per-micro-batch seconds of a layer, of the first and last stage's extra work, and of
    a stage's fixed overhead; the p2p time; the corrections that act on them."""

    layer_forward_s: float
    layer_backward_s: float
    layer_wgrad_s: float
    first_forward_s: float
    first_backward_s: float
    last_forward_s: float
    last_backward_s: float
    last_wgrad_s: float
    overhead_s: float              # per virtual stage, added to its forward and its backward
    p2p_s: float
    # per virtual stage: compute slowed by the rank's p2p kernels (corrections.
    # stage_slowdown); () = none
    slowdown: tuple[float, ...] = ()
    # MoE models: a dense layer's seconds less an MoE layer's (costmodel.moe_tables)
    dense_delta_forward_s: float = 0.0
    dense_delta_backward_s: float = 0.0
    dense_delta_wgrad_s: float = 0.0
    # GPU time a step beyond the passes (corrections.fsdp2_step_s), on the GPU's side of
    # the pipeline-or-CPU maximum
    fsdp_step_s: float = 0.0
    # whether torch's p2p order can bound the step (corrections.p2p_order_applies)
    p2p_order: bool = False
    # zero-bubble with full recompute, unmeasured split: the forwards a layer's weight pass
    # runs again (corrections.zb_full_w_passes; in layer_backward_s and layer_wgrad_s)
    zb_w_recompute_passes: float = 0.0
    # zero-bubble under torch, where the first stage's W is one fused backward and its I
    # empty (runtime.zb_first_stage_fused): per layer, what the split B + W cost beyond it
    zb_split_excess_s: float = 0.0

    def stage_times(self, stage_layers) -> tuple[list[float], list[float], list[float]]:
        """Per-micro-batch forward, backward and weight-gradient seconds of each virtual stage."""
        f = [n * self.layer_forward_s + self.overhead_s for n in stage_layers]
        b = [n * self.layer_backward_s + self.overhead_s for n in stage_layers]
        w = [n * self.layer_wgrad_s for n in stage_layers]
        if self.num_dense_layers:
            for c, d in enumerate(self.dense_counts(stage_layers)):
                f[c] += d * self.dense_delta_forward_s
                b[c] += d * self.dense_delta_backward_s
                w[c] += d * self.dense_delta_wgrad_s
        f[0] += self.first_forward_s
        b[0] += self.first_backward_s
        f[-1] += self.last_forward_s
        b[-1] += self.last_backward_s
        w[-1] += self.last_wgrad_s
        if zb_first_stage_fused(self.job, self.layout):
            b[0] -= stage_layers[0] * self.zb_split_excess_s
            w[0] = b[0]
        if self.slowdown:
            k = self.slowdown
            f = [x * y for x, y in zip(f, k)]
            b = [x * y for x, y in zip(b, k)]
            w = [x * y for x, y in zip(w, k)]
        return f, b, w

    def pipeline_s(self, stage_layers, *, torch_order: bool = True) -> float:
        """The pipeline's time for ``stage_layers``: the schedule's closed form, or where
        torch's p2p order holds it longer, that (:meth:`p2p_order_s`). ``torch_order=False``
        leaves the order out — a lower bound, cheap enough for the search's pruning."""
        f, b, w = self.stage_times(stage_layers)
        lay = self.layout
        closed = _pipeline_time(lay.schedule, tuple(f), tuple(b), tuple(w),
                                self.num_microbatches, lay.pp, lay.vpp, self.p2p_s)[0]
        closed += self.fsdp_step_s
        return max(closed, self.p2p_order_s(f, b)) if torch_order else closed

    def p2p_order_s(self, f_s, b_s, *, p2p: bool = True) -> float:
        """Interleaved 1F1B under torch's runtime: the step as torch orders its sends and
        receives on one NCCL stream per rank (:func:`meshplan.costmodel.torch_p2p.
        fifo_step_s`), with the compute unslowed — where the order holds the pipeline
        longer than the per-operation slowdown does, the p2p kernels wait while the GPU
        idles rather than overlap compute. 0.0 where it does not apply
        (``p2p_order``: :func:`meshplan.costmodel.corrections.p2p_order_applies`).
        ``f_s``/``b_s``: stage times as :meth:`stage_times` returns them."""
        if not self.p2p_order:
            return 0.0
        lay = self.layout
        k = self.slowdown or (1.0,) * len(f_s)
        return torch_p2p.fifo_step_s(tuple(x / y for x, y in zip(f_s, k)),
                                     tuple(x / y for x, y in zip(b_s, k)),
                                     self.num_microbatches, lay.pp, lay.vpp,
                                     self.p2p_s if p2p else 0.0)

    def rank_pass_s(self, rank: int, layers: int, dense: int = 0) -> tuple[float, float]:
        """(forward, backward) seconds of one micro-batch through all of a rank's chunks
        (``dense`` of its layers an MoE model's dense ones)."""
        v = self.layout.vpp
        f = layers * self.layer_forward_s + v * self.overhead_s
        b = layers * self.layer_backward_s + v * self.overhead_s
        if dense:
            f, b = f + dense * self.dense_delta_forward_s, b + dense * self.dense_delta_backward_s
        if rank == 0:
            f, b = f + self.first_forward_s, b + self.first_backward_s
        if rank == self.last_rank:
            f, b = f + self.last_forward_s, b + self.last_backward_s
        if self.slowdown:   # every chunk of a rank runs as many p2p operations
            f, b = f * self.slowdown[rank], b * self.slowdown[rank]
        return f, b

    def rank_tail_s(self, rank: int, layers: int, dense: int = 0) -> float:
        """Exposed data-parallel communication + optimizer step of a rank holding ``layers``
        (``dense`` of them an MoE model's dense layers)."""
        st = self.rank_state(rank, layers, dense)
        f, b = self.rank_pass_s(rank, layers, dense)
        return exposed_dp_s(st, self.layout, self.job, f, b,
                            self.cluster.gpu.dp_overlap_interference) + st.optimizer_s

    def tail_lower_bound_s(self) -> float:
        """No partition's tail is smaller: some rank holds ⌈L/pp⌉ layers; a middle rank with
        that many, with unlimited room to overlap, pays at least this."""
        n = -(-self.num_layers // self.layout.pp)
        lay = self.layout
        if self.experts is not None:   # the fewest experts such a rank can hold
            inf, k = float("inf"), self.cluster.gpu.dp_overlap_interference
            return min(exposed_dp_s(st, lay, self.job, inf, inf, k) + st.optimizer_s
                       for st in (self.rank_state(-1, n, d) for d in
                                  {0, min(n, self.num_dense_layers)}))
        st = rank_state(self.model, self.cluster, self.job, lay.dp, lay.pp, lay.tp, lay.zero,
                        self._fsdp_microbatches, self.links.dp, n,
                        False, False, self.zero3, self.grad_copies,
                        compiled=self.compiled_layers)
        return exposed_dp_s(st, self.layout, self.job, float("inf"), float("inf"),
                            self.cluster.gpu.dp_overlap_interference) + st.optimizer_s

    def stage_sum_s(self) -> float:
        """Σ_c (f_c + b_c) without the p2p slowdown (``slowdown``, ≥ 1 per stage): the same
        for every partition (every layer runs once per pass), and a lower bound of the
        slowed sum."""
        return (self.num_layers * (self.layer_forward_s + self.layer_backward_s)
                + 2 * self.layout.pp * self.layout.vpp * self.overhead_s + self.first_forward_s
                + self.first_backward_s + self.last_forward_s + self.last_backward_s
                + self.num_dense_layers * (self.dense_delta_forward_s
                                           + self.dense_delta_backward_s))


__all__ = ["TablesBase", "StageTimes", "inflight_table"]
