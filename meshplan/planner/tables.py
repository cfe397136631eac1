"""Per-configuration cost tables: what a stage partition costs, without calling ``estimate``.

:func:`meshplan.costmodel.estimate` is the single source of predictions, but at ~1-2k
calls/s it is too slow to call once per layout of a 1000-GPU search space (tens of
thousands of configurations, each with many stage partitions). This module takes the *same*
building blocks ``estimate`` is made of — the cached per-layer pass costs
(``estimate._layer_parts``), :func:`~meshplan.costmodel.memory.stage_params`,
:func:`~meshplan.costmodel.memory.model_state_bytes`, the collectives of
:mod:`meshplan.costmodel.comm`, :func:`~meshplan.costmodel.pipeline.inflight_microbatches`
and :func:`~meshplan.costmodel.pipeline.closed_form_step_time` — and arranges them as the
linear-in-layers pieces the solver needs (``LayerTables``' decomposition, with the data-
parallel tail added per rank). ``tests/unit/test_planner_tables.py`` checks that
:meth:`ConfigTables.step_time_s` and :meth:`ConfigTables.rank_memory_bytes` equal
``estimate``'s numbers on random partitions; the planner re-runs ``estimate`` on every
layout it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from meshplan.costmodel import comm
from meshplan.costmodel.compute import hbm_s
from meshplan.costmodel.estimate import (DP_BUCKET_BYTES, OPTIMIZER_BYTES_PER_PARAM, _layer_parts,
                                         group_links)
from meshplan.costmodel.memory import (activation_bytes_per_element, logits_bytes,
                                       model_state_bytes, stage_params, state_bytes_per_param)
from meshplan.costmodel.pipeline import closed_form_step_time, inflight_microbatches
from meshplan.costmodel.specs import Job, ModelSpec
from meshplan.hardware_profiles import Cluster
from meshplan.planner.space import Config


@dataclass(frozen=True)
class ConfigTables:
    """Costs of one configuration as functions of the layers each (virtual) stage holds.

    Virtual stage ``c`` (``0 ≤ c < S = pp·vpp``) holding ``n_c`` layers runs, per micro-batch,
    ``f_c = n_c·layer_forward_s + overhead_s + [c=0]·first_forward_s + [c=S-1]·last_forward_s``
    (backward and weight-gradient alike). Pipeline rank ``r`` holds ``N_r = Σ_{c≡r mod pp} n_c``
    layers and needs ``N_r·(layer_state_bytes + inflight[r]·layer_activation_bytes)
    + const_bytes[r]`` of memory.
    """

    config: Config
    num_layers: int
    num_microbatches: int
    layer_forward_s: float
    layer_backward_s: float
    layer_wgrad_s: float
    first_forward_s: float
    first_backward_s: float
    last_forward_s: float
    last_backward_s: float
    last_wgrad_s: float
    overhead_s: float
    p2p_s: float
    layer_state_bytes: float
    layer_activation_bytes: float
    inflight: tuple[float, ...]
    const_bytes: tuple[float, ...]
    # for the data-parallel tail (computed lazily per rank and layer count)
    _ctx: tuple

    # ---- per-stage times -------------------------------------------------------------
    def stage_times(self, stage_layers: Sequence[int]) -> tuple[list[float], list[float], list[float]]:
        S = len(stage_layers)
        f = [n * self.layer_forward_s + self.overhead_s for n in stage_layers]
        b = [n * self.layer_backward_s + self.overhead_s for n in stage_layers]
        w = [n * self.layer_wgrad_s for n in stage_layers]
        f[0] += self.first_forward_s
        b[0] += self.first_backward_s
        f[S - 1] += self.last_forward_s
        b[S - 1] += self.last_backward_s
        w[S - 1] += self.last_wgrad_s
        return f, b, w

    def pipeline_s(self, stage_layers: Sequence[int]) -> float:
        c = self.config
        f, b, w = self.stage_times(stage_layers)
        return closed_form_step_time(c.schedule, f, b, self.num_microbatches, pp=c.pp, vpp=c.vpp,
                                     wgrad_s=w, p2p_s=self.p2p_s)

    def rank_layers(self, stage_layers: Sequence[int]) -> list[int]:
        pp = self.config.pp
        return [sum(stage_layers[r::pp]) for r in range(pp)]

    # ---- per-rank tail: exposed data-parallel communication + optimizer step ----------
    def rank_tail_s(self, rank: int, layers: int) -> float:
        """Exposed DP communication + optimizer time of ``rank`` holding ``layers`` layers
        (the tail ``estimate`` adds after the pipeline; its formulas and sources are in
        :mod:`meshplan.costmodel.estimate`)."""
        model, cluster, job, per, link = self._ctx
        c = self.config
        pp, v, dp = c.pp, c.vpp, c.dp
        first, last = rank == 0, rank == pp - 1
        params = stage_params(model, layers, c.tp, first=first, last=last, pp=pp)
        exposed = 0.0
        if dp > 1:
            grad_bytes = params * per.grads
            last_bwd = layers * self.layer_backward_s + v * self.overhead_s
            first_fwd = layers * self.layer_forward_s + v * self.overhead_s
            if first:
                first_fwd += self.first_forward_s
                last_bwd += self.first_backward_s
            if last:
                first_fwd += self.last_forward_s
                last_bwd += self.last_backward_s
            tail = comm.all_reduce_s(link, min(grad_bytes, DP_BUCKET_BYTES)) \
                if job.overlap_dp_comm else 0.0
            if c.zero == 0:
                dp_s = comm.all_reduce_s(link, grad_bytes)
                exposed = max(tail, dp_s - last_bwd) if job.overlap_dp_comm else dp_s
            elif c.zero in (1, 2):
                rs = comm.reduce_scatter_s(link, grad_bytes)
                ag = comm.all_gather_s(link, params * per.weights)
                if job.overlap_dp_comm:
                    exposed = max(tail, rs - last_bwd) + max(0.0, ag - first_fwd)
                else:
                    exposed = rs + ag
        local = params / dp if c.zero >= 1 else params
        return exposed + hbm_s(cluster.gpu, local * OPTIMIZER_BYTES_PER_PARAM)

    # ---- totals ----------------------------------------------------------------------
    def step_time_s(self, stage_layers: Sequence[int]) -> float:
        return self.pipeline_s(stage_layers) + max(
            self.rank_tail_s(r, n) for r, n in enumerate(self.rank_layers(stage_layers)))

    def rank_memory_bytes(self, rank: int, layers: int) -> float:
        return layers * (self.layer_state_bytes + self.inflight[rank] * self.layer_activation_bytes) \
            + self.const_bytes[rank]

    def peak_memory_bytes(self, stage_layers: Sequence[int]) -> float:
        return max(self.rank_memory_bytes(r, n)
                   for r, n in enumerate(self.rank_layers(stage_layers)))

    def max_rank_layers(self, rank: int, capacity_bytes: float) -> int:
        """The most layers ``rank`` can hold within ``capacity_bytes`` (-1: not even 0)."""
        per = self.layer_state_bytes + self.inflight[rank] * self.layer_activation_bytes
        room = capacity_bytes - self.const_bytes[rank]
        if room < 0:
            return -1
        n = min(self.num_layers, int(room // per) if per > 0 else self.num_layers)
        # guard the floor against rounding: the float check is the one estimate makes
        while n > 0 and self.rank_memory_bytes(rank, n) > capacity_bytes:
            n -= 1
        while n < self.num_layers and self.rank_memory_bytes(rank, n + 1) <= capacity_bytes:
            n += 1
        return n

    # ---- bounds used to prune before the solver --------------------------------------
    def stage_sum_s(self) -> float:
        """Σ_c (f_c + b_c): the same for every partition (every layer runs once per pass)."""
        S = self.config.stages
        return (self.num_layers * (self.layer_forward_s + self.layer_backward_s)
                + 2 * S * self.overhead_s + self.first_forward_s + self.first_backward_s
                + self.last_forward_s + self.last_backward_s)


def build_tables(model: ModelSpec, cluster: Cluster, job: Job, cfg: Config) -> ConfigTables:
    """The tables of ``cfg`` (mirrors ``meshplan.costmodel.estimate._estimate``)."""
    dp, pp, tp, v = cfg.dp, cfg.pp, cfg.tp, cfg.vpp
    mb, sp = cfg.micro_batch, cfg.sequence_parallel
    m = job.global_batch // (dp * mb)
    links = _links(cluster, dp, pp, tp)
    layer, (emb_f, emb_b), (log_f, log_b, log_w), acts, msg, p2p = _layer_parts(
        model, cluster, job, mb, tp, sp, cfg.recompute, links.tp, links.pp)
    per = state_bytes_per_param(job)
    layer_params = stage_params(model, 1, tp, first=False, last=False, pp=pp)
    layer_param_bytes = layer_params * per.weights
    z3_fwd = z3_bwd = 0.0
    if cfg.zero == 3 and dp > 1:
        ag = comm.all_gather_s(links.dp, layer_param_bytes)
        rs = comm.reduce_scatter_s(links.dp, layer_param_bytes)
        z3_fwd = max(0.0, ag - layer.forward.total_s)
        z3_bwd = max(0.0, ag + rs - layer.backward.total_s)
    e = activation_bytes_per_element(job)
    state_layer = sum(model_state_bytes(layer_params, job, cfg.zero, dp))
    act_layer = acts.stored(cfg.recompute)
    inflight = tuple(inflight_microbatches(cfg.schedule, pp, v, m, r) for r in range(pp))
    buf = 2 * msg if pp > 1 else 0.0
    if dp > 1 and cfg.zero < 3:
        buf += 2 * DP_BUCKET_BYTES
    if cfg.zero == 3 and dp > 1:
        buf += 2 * layer_param_bytes
    if cfg.recompute != "none":
        buf += acts.full_bytes   # every rank holds >= 1 layer in the planner's space
    const = []
    for r in range(pp):
        first, last = r == 0, r == pp - 1
        extra_params = stage_params(model, 0, tp, first=first, last=last, pp=pp)
        c = sum(model_state_bytes(extra_params, job, cfg.zero, dp)) + buf
        if first:
            c += inflight[r] * job.seq_len * mb * model.hidden_size * e / (tp if sp else 1)
        if last:
            c += logits_bytes(model, job, mb, tp) * (inflight[r] if cfg.schedule == "gpipe"
                                                     else 1.0)
        const.append(c)
    return ConfigTables(
        config=cfg, num_layers=model.num_layers, num_microbatches=m,
        layer_forward_s=layer.forward.total_s + z3_fwd,
        layer_backward_s=layer.backward.total_s + z3_bwd,
        layer_wgrad_s=layer.wgrad_s,
        first_forward_s=emb_f.total_s, first_backward_s=emb_b.total_s,
        last_forward_s=log_f.total_s, last_backward_s=log_b.total_s, last_wgrad_s=log_w,
        overhead_s=cluster.gpu.microbatch_overhead_s / (2 * v),
        p2p_s=p2p if pp > 1 else 0.0,
        layer_state_bytes=state_layer, layer_activation_bytes=act_layer,
        inflight=inflight, const_bytes=tuple(const),
        _ctx=(model, cluster, job, per, links.dp))


def _links(cluster: Cluster, dp: int, pp: int, tp: int):
    from meshplan.costmodel.specs import Layout
    return group_links(cluster, Layout(dp=dp, pp=pp, tp=tp))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["ConfigTables", "build_tables", "ceil_div", "math"]
