"""Bounds that need no cost table: reject impossible problems before any table is built.

Model states (weights, gradients, optimizer state; :func:`meshplan.costmodel.memory.
model_state_bytes`) are part of every rank's peak in the cost model, and no layout stores
fewer of them than ZeRO-3 over every GPU does:

* the whole problem: Σ over GPUs of the model states ≥ P·(w + g + o) (each parameter's
  states live somewhere at least once; tensor parallelism replicates norms, tied embeddings
  sit on two stages: only more), so the busiest GPU holds at least P·(w + g + o) / N;
* one configuration: the pipeline rank with the most layers holds ⌈L/pp⌉ of them, rank 0
  the embedding and the last rank the output layer beside their fewest layers; their states
  after that configuration's ZeRO sharding bound its peak.

``tests/unit/test_planner_bounds.py`` checks both against ``LayerTables.rank_memory_bytes``
on layouts of both runtimes, ZeRO 0-3 and 1-4 stages.

Time: one step executes at least the model FLOPs (:func:`meshplan.costmodel.flops.
model_flops_per_step`, Narayanan et al. 2021 eq. 3 without recomputation) at the GPUs'
dense peak, which the error message quotes so that the user sees the scale of the problem.
"""

from __future__ import annotations

import math
import time
from functools import lru_cache
from typing import Callable, Sequence

from meshplan.costmodel.flops import model_flops_per_step
from meshplan.costmodel.memory import (dense_layer_extra_params, model_state_bytes, stage_params,
                                       state_bytes_per_param)
from meshplan.costmodel.moe import expert_state_bytes
from meshplan.errors import MeshplanError, NoFeasiblePlan
from meshplan.hardware_profiles import Cluster
from meshplan.planner.constraints import end_stage_min_layers
from meshplan.planner.space import Config
from meshplan.spec import Job, Layout, ModelSpec

GIB = 2**30
PROGRESS_EVERY_S = 1.0   # a long phase's counter moves on screen at this pace


def size_text(nbytes: float) -> str:
    """Bytes in the largest binary unit that keeps the number ≥ 1 (MiB up to PiB)."""
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", GIB)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes / 2**20:.1f} MiB"


def duration_text(seconds: float) -> str:
    for unit, scale in (("years", 365.25 * 86400), ("days", 86400), ("h", 3600),
                        ("min", 60)):
        if seconds >= scale:
            return f"{seconds / scale:,.1f} {unit}"
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def state_bytes_total(model: ModelSpec, job: Job) -> float:
    """Weights + gradients + optimizer state of the whole model, stored once."""
    per = state_bytes_per_param(job)
    return model.num_params() * (per.weights + per.grads + per.optimizer)


def config_memory_lower_bound(model: ModelSpec, job: Job, cfg: Config,
                              min_layers: int = 1) -> float:
    """Model-state bytes some GPU of ``cfg`` holds under every stage partition."""
    L, pp = model.num_layers, cfg.pp
    key = (model, job, cfg.tp, pp, cfg.zero, cfg.dp * cfg.cp, cfg.ep, cfg.etp)
    if pp == 1:
        return _states(*key, L, True, True)
    # an end (chunk) may hold a layer fewer: the account-for-embedding/loss split of
    # search.partition_candidates (interleaved) and of the solver's free partitions
    lo = max(1, min_layers)
    ends = lo * (cfg.vpp - 1) + end_stage_min_layers(pp * cfg.vpp, lo)
    return max(_states(*key, -(-L // pp), False, False), _states(*key, ends, True, False),
               _states(*key, ends, False, True))


@lru_cache(maxsize=65536)
def _states(model: ModelSpec, job: Job, tp: int, pp: int, zero: int, grad_ranks: int, ep: int,
            etp: int, layers: int, first: bool, last: bool) -> float:
    """States of a rank holding ``layers`` (and the ends), ZeRO over ``grad_ranks`` = dp·cp."""
    params = stage_params(model, layers, tp, first=first, last=last, pp=pp)
    if not model.is_moe:
        return sum(model_state_bytes(params, job, zero, grad_ranks))
    # MoE: the rank's experts (over edp), with as many of its layers dense as can be and a
    # dense layer's other parameters only where fewer (a lower bound either way)
    dense = min(layers, len(model.dense_layers))
    params += dense * min(0.0, dense_layer_extra_params(model, tp))
    lay = Layout(dp=grad_ranks, tp=tp, ep=ep, etp=etp, zero=zero)
    return (sum(model_state_bytes(params, job, zero, grad_ranks))
            + sum(expert_state_bytes(model, job, lay, layers - dense)))


def step_time_lower_bound_s(model: ModelSpec, cluster: Cluster, job: Job,
                            gpus: int) -> float | None:
    """Model FLOPs of a step over ``gpus`` GPUs at dense peak (None: no peak known)."""
    try:
        peak = cluster.gpu.peak_flops(job.precision)
    except (MeshplanError, KeyError):
        return None
    return model_flops_per_step(model, job.global_batch, job.seq_len) / (gpus * peak)


def check_memory_floor(model: ModelSpec, cluster: Cluster, job: Job, counts: Sequence[int],
                       capacity_bytes: float, headroom: float) -> None:
    """Raise :class:`NoFeasiblePlan` when the model states alone, spread evenly over the
    largest GPU count allowed, exceed a GPU's usable memory."""
    n = max(counts)
    total = state_bytes_total(model, job)
    need = total / n
    if need <= capacity_bytes:
        return
    per = state_bytes_per_param(job)
    min_gpus = math.ceil(total / capacity_bytes)
    min_nodes = math.ceil(min_gpus / cluster.gpus_per_node)
    t_s = step_time_lower_bound_s(model, cluster, job, n)
    timing = (f" Even if it fit, one step of {job.global_batch} × {job.seq_len} tokens "
              f"would take at least {duration_text(t_s)} on {n:,} GPUs at their dense "
              f"{job.precision} peak." if t_s is not None else "")
    ways = (f"at least {min_gpus:,} GPUs ({min_nodes:,} nodes of {cluster.gpus_per_node}) "
            f"just to hold the model states",
            "a smaller model", "a GPU with more memory")
    msg = (f"no layout of {model.name!r} on {n:,} GPU(s) of {cluster.name!r} fits in memory: "
           f"the weights, gradients and optimizer state of its {model.num_params():.3g} "
           f"parameters alone take "
           f"{per.weights + per.grads + per.optimizer:g} bytes per parameter "
           f"(runtime {job.runtime!r}, {job.precision}, {job.optimizer}) = "
           f"{size_text(total)}, {size_text(need)} per GPU even with ZeRO-3 sharding them "
           f"over every GPU, but {size_text(capacity_bytes)} is usable per GPU "
           f"({cluster.gpu.name}, after the reserve and {headroom:.0%} headroom). "
           f"Binding constraint: GPU memory.{timing} Ways out: " + "; ".join(ways))
    raise NoFeasiblePlan(msg, min_memory_bytes=need, usable_memory_bytes=capacity_bytes,
                         binding="memory", suggestions=ways)


class Ticker:
    """Calls ``progress`` on the first item and then at most every ``every_s`` seconds
    (default :data:`PROGRESS_EVERY_S`), so a long phase's counter moves on screen without
    flooding it; the message is built only when shown."""

    def __init__(self, progress: Callable[[str], None] | None, every_s: float | None = None):
        self.progress = progress
        self.every_s = PROGRESS_EVERY_S if every_s is None else every_s
        self.last = -math.inf

    def __call__(self, message: Callable[[], str]) -> None:
        if self.progress is None:
            return
        now = time.perf_counter()
        if now - self.last >= self.every_s:
            self.last = now
            self.progress(message())


__all__ = ["check_memory_floor", "config_memory_lower_bound", "step_time_lower_bound_s",
           "state_bytes_total", "size_text", "duration_text", "Ticker"]
