"""The layout search space: every discrete choice the planner may make, before partitioning.

A :class:`Config` is a :class:`~meshplan.Layout` without ``stage_layers``; the planner then
decides how the model's layers are split over the ``pp·vpp`` (virtual) stages.

The space holds, for each allowed GPU count ``n``: ``tp`` dividing the attention heads,
the key/value heads and the MLP width (≤ ``max_tp``; a divisor of the node size when
``tp_within_node``), ``cp`` from :func:`cp_options` (cp = 1 below 16k tokens by default)
with each valid style (:func:`cp_styles`), ``pp`` dividing ``n / (tp·cp)`` with
``layers ≥ pp``, ``dp = n / (tp·cp·pp)`` dividing the global batch, for MoE models ``ep``
and ``etp`` from :func:`expert_options`, ``micro_batch`` dividing ``global_batch / dp`` (≤
``max_micro_batch``), every allowed schedule (``interleaved-1f1b`` with ``vpp ≥ 2``,
``layers ≥ pp·vpp``, micro-batches a multiple of ``pp``: Narayanan et al. 2021 §2.2.2),
recompute, ZeRO stage, sequence parallelism (only with ``tp > 1``, Korthikanti et al.
2022 §4.2.2) and ``compile`` (only where the GPU profile prices it compiled: compiled
layer rows of the model at the layout's tp, SP and recompute mode, or another mode's
compiled/eager pair at that tp and SP: :func:`compile_options`, :func:`compiled_settings`).
These are exactly the layouts :func:`meshplan.spec.validate.check_layout` accepts. Three
redundant encodings are left out: ZeRO stages > 0 when ``dp·cp = 1`` (nothing to shard over:
the smallest allowed stage stands for all), ``interleaved-1f1b`` with ``vpp = 1`` (it *is*
1F1B) and ``zero-bubble`` with ``pp = 1`` when ``1f1b`` is allowed (with one stage there is
no bubble to fill: the cost model gives both the same time and the same in-flight
activations).
"""

from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple, Sequence

from meshplan.spec import (Job, Layout, ModelSpec, default_stage_layers,
                           embedding_loss_stage_layers)
from meshplan.costmodel.fp8_cost import check_fp8_supported
from meshplan.spec.validate import (capacity_cuts_cp_chunks, check_model_modelled,
                                    check_seq_len, divisors, zero_bubble_under_zero3)
from meshplan.errors import ConfigError
from meshplan.hardware_profiles import Cluster
from meshplan.planner.constraints import Constraints, stage_min_layers


# Schedules whose stage partition the solver does not choose: the planner prices a fixed
# few (search.partition_candidates) and keeps the fastest.
# interleaved-1f1b: its closed form (meshplan.costmodel.pipeline_interleaved) is exact
# for uniform chunks but, per its docstring, -16 % to +11 % off the simulation with uneven
# layers per chunk — a solver free to choose the chunks would exploit that error — so it
# is offered with uniform chunks only: the even split where the layers divide the chunks
# (L % (pp·vpp) == 0, Megatron-LM's requirement) and Megatron's account-for-embedding/loss
# split where (L + 2) % (pp·vpp) == 0 (uniform middle chunks, the two ends one layer short;
# closed form and simulation agree on it: tests/unit/test_planner_interleaved_split.py).
# zero-bubble: its closed form is never high but up to -6.7 % low on uneven
# cuts with m < pp, and it was still being revised when this was written; the planner
# prices the near-even split (layer counts differing by at most one) and does not
# optimise over partitions. gpipe and 1f1b partitions are the CP-SAT model's choice.
EVEN_PARTITION_SCHEDULES = ("interleaved-1f1b", "zero-bubble")


def interleaved_partitions(num_layers: int, stages: int, min_layers: int = 1
                           ) -> tuple[tuple[int, ...], ...]:
    """The interleaved-1f1b partitions the planner prices over ``stages`` chunks (the comment
    above; empty: the configuration is left out): the even split where the layers divide
    the chunks, and Megatron's account-for-embedding/loss split
    (:func:`meshplan.spec.embedding_loss_stage_layers`) where L + 2 does, its ends allowed
    one layer fewer than ``min_layers`` (they also run the embedding / loss)."""
    lo = max(1, min_layers)
    out = []
    if num_layers % stages == 0 and num_layers // stages >= lo:
        out.append(default_stage_layers(num_layers, stages))
    if (num_layers + 2) % stages == 0:
        ends = embedding_loss_stage_layers(num_layers, stages)
        if ends is not None and all(n >= m for n, m in
                                    zip(ends, stage_min_layers(stages, lo))):
            out.append(ends)
    return tuple(out)


class Config(NamedTuple):
    """One point of the discrete space (a Layout without its stage partition)."""

    dp: int
    pp: int
    tp: int
    micro_batch: int
    schedule: str
    vpp: int
    recompute: str
    zero: int
    sequence_parallel: bool
    compile: bool = False
    cp: int = 1
    cp_style: str = "ring"
    ep: int = 1
    etp: int = 1

    @property
    def num_gpus(self) -> int:
        return self.dp * self.pp * self.tp * self.cp

    @property
    def stages(self) -> int:
        return self.pp * self.vpp

    def layout(self, stage_layers: Sequence[int] | None = None) -> Layout:
        return Layout(dp=self.dp, pp=self.pp, tp=self.tp, micro_batch=self.micro_batch,
                      schedule=self.schedule, vpp=self.vpp, recompute=self.recompute,
                      zero=self.zero, sequence_parallel=self.sequence_parallel,
                      compile=self.compile, cp=self.cp, cp_style=self.cp_style,
                      ep=self.ep, etp=self.etp,
                      stage_layers=tuple(stage_layers) if stage_layers is not None else None)

    @classmethod
    def of(cls, layout: Layout) -> "Config":
        return cls(layout.dp, layout.pp, layout.tp, layout.micro_batch, layout.schedule,
                   layout.vpp, layout.recompute, layout.zero, layout.sequence_parallel,
                   layout.compile, layout.cp, layout.cp_style if layout.cp > 1 else "ring", layout.ep,
                   layout.etp)


def gpu_counts(cluster: Cluster, gpus: int | Iterable[int] | None, objective: str,
               constraints: Constraints) -> list[int]:
    """The GPU counts to search, validated against the cluster."""
    total = cluster.num_gpus
    if gpus is None:
        idle = constraints.allow_idle_gpus
        if idle is None:
            idle = objective == "time_to_train"
        if not idle:
            return [total]
        # Whole nodes, or a part of one node that divides it (a job never shares a node).
        g = cluster.gpus_per_node
        return sorted({d for d in divisors(g)} | {k * g for k in range(1, cluster.nodes + 1)})
    if isinstance(gpus, bool):
        raise ConfigError(f"gpus must be a GPU count, a range or a list of counts, got {gpus!r}")
    counts = [gpus] if isinstance(gpus, int) else list(gpus) if isinstance(
        gpus, (range, list, tuple, set, frozenset)) else None
    if counts is None:
        raise ConfigError(f"gpus must be an int, a range or a list of ints, got "
                          f"{type(gpus).__name__}")
    if not counts:
        raise ConfigError(f"gpus = {gpus!r} holds no GPU count")
    for n in counts:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"gpus: {n!r} is not a positive GPU count")
        if n > total:
            raise ConfigError(f"gpus: {n} GPUs asked for, but cluster {cluster.name!r} has "
                              f"{total} ({cluster.shape}); "
                              f"use at most {total} or a cluster with more nodes")
    return sorted(set(counts))


def tp_options(model: ModelSpec, cluster: Cluster, constraints: Constraints) -> list[int]:
    out = []
    g = cluster.gpus_per_node
    for t in divisors(model.num_heads):
        if model.num_kv_heads % t or model.ffn_hidden_size % t:
            continue
        if constraints.max_tp is not None and t > constraints.max_tp:
            continue
        if constraints.tp_within_node and g % t:
            continue
        out.append(t)
    return out


def cp_runs(model: ModelSpec, job: Job, tp: int = 1, cp: int = 2) -> bool:
    """Whether ``job``'s runtime runs ``model`` at ``tp`` and ``cp`` (by default some
    cp > 1): under runtime "torch" not where the executor refuses a capacity there
    (:func:`~meshplan.spec.validate.capacity_cuts_cp_chunks`); multi-head latent attention
    and every other model run."""
    return not (job.runtime == "torch" and capacity_cuts_cp_chunks(model, tp, cp))


def cp_options(job: Job, constraints: Constraints) -> list[int]:
    """Context-parallel degrees to search: the constraint's, or automatically every power
    of two with 2·cp dividing ``seq_len`` from ``cp_min_seq_len`` tokens on (cp = 1 below);
    always those the sequence can be cut into (:func:`check_context_parallel`). What the
    runtime does not run at a tp (:func:`cp_runs`) is left out where tp and cp meet."""
    s = job.seq_len
    if constraints.cp is not None:
        cps = constraints.cp
    elif s < constraints.cp_min_seq_len:
        cps = (1,)
    else:
        cps = tuple(2 ** k for k in range(s.bit_length()) if 2 ** k <= s // 2)
    fixed = constraints.fixed.get("cp")
    return sorted(c for c in set(cps) if (c == 1 or s % (2 * c) == 0)
                  and (fixed is None or c == fixed))


def cp_styles(model: ModelSpec, constraints: Constraints, tp: int, cp: int) -> list[str]:
    """The cp styles valid for (tp, cp): the ring (except for a sliding-window model, whose
    ring the cost model does not price), all-to-all where tp·cp divides the heads and kv
    heads (one style stands for cp = 1)."""
    if cp == 1:
        return ["ring"]
    fixed = constraints.fixed.get("cp_style")
    return [st for st in constraints.cp_styles if (fixed is None or st == fixed) and (
        (st == "ring" and model.sliding_window is None)
        or (st == "all-to-all" and model.num_heads % (tp * cp) == 0
            and model.num_kv_heads % (tp * cp) == 0))]


def expert_options(model: ModelSpec, job: Job, constraints: Constraints, tp: int, cp: int,
                   dp: int) -> list[tuple[int, int]]:
    """(ep, etp) pairs for an MoE model (``[(1, 1)]`` for a dense one): ep dividing the
    routed experts, etp 1 or tp (Megatron-Core's usual settings; runtime "torch": 1 unless
    the constraints ask — the executor runs etp > 1, checked on CPU ranks, not yet timed on
    GPUs) dividing the expert widths, ep·etp dividing the stage's tp·cp·dp
    ranks (Layout's folding rule and :func:`meshplan.spec.validate.check_experts`); or the
    constraints' ``ep`` / ``etp`` lists."""
    if not model.is_moe:
        return [(1, 1)]
    fx = constraints.fixed
    ranks = tp * cp * dp
    eps = constraints.ep or [d for d in divisors(model.num_experts) if ranks % d == 0]
    etps = constraints.etp or ([fx["etp"]] if "etp" in fx else
                               sorted({1, tp} if job.runtime != "torch" else {1}))
    widths = [w for w in (model.moe_ffn_hidden_size, model.shared_expert_ffn_hidden_size)
              if w is not None]
    return [(ep, etp) for ep in eps for etp in etps
            if model.num_experts % ep == 0 and ranks % (ep * etp) == 0
            and all(w % etp == 0 for w in widths)
            and fx.get("ep", ep) == ep and fx.get("etp", etp) == etp]


def enumerate_configs(model: ModelSpec, cluster: Cluster, job: Job, counts: Sequence[int],
                      constraints: Constraints) -> Iterator[Config]:
    """Every :class:`Config` of the space (see the module docstring), in a fixed order."""
    fx = constraints.fixed
    min_layers = max(1, constraints.min_layers_per_stage)
    tps = tp_options(model, cluster, constraints)
    cps = cp_options(job, constraints)
    compiles = compile_options(cluster, fx, model, job.seq_len)
    compiled_at = None if "compile" in fx else compiled_settings(cluster, model, job.seq_len)
    tables = cluster.gpu.measured
    compiled_ep_at = (tables.compiled_ep_settings(model, job.seq_len) if tables
                      else frozenset())
    for n in counts:
        for tp in tps:
            if n % tp or fx.get("tp", tp) != tp:
                continue
            for cp in cps:
                if (n // tp) % cp or not cp_runs(model, job, tp, cp):
                    continue
                for style in cp_styles(model, constraints, tp, cp):
                    yield from _configs_at(model, job, constraints, n, tp, cp, style,
                                           min_layers, compiles, compiled_at, compiled_ep_at)


def _configs_at(model: ModelSpec, job: Job, constraints: Constraints, n: int, tp: int,
                cp: int, style: str, min_layers: int,
                compiles: Sequence[bool], compiled_at: frozenset | None = None,
                compiled_ep_at: frozenset = frozenset()) -> Iterator[Config]:
    """The configurations of ``n`` GPUs at one (tp, cp, cp style); ``compile = True`` only at
    the (tp, SP, recompute) settings in ``compiled_at`` (None: wherever ``compiles`` has it),
    and for an MoE model at ep > 1 only at the (tp, SP, recompute, ep) of ``compiled_ep_at``
    (compiled rows timed at that ep; elsewhere its compiled layout is priced as eager)."""
    fx = constraints.fixed
    L, B = model.num_layers, job.global_batch
    plain = [s for s in constraints.schedules if s != "interleaved-1f1b"]
    interleaved = "interleaved-1f1b" in constraints.schedules
    max_vpp = constraints.max_vpp or L
    zeros = sorted(constraints.zero)
    sps = sorted(constraints.sequence_parallel)
    for pp in divisors(n // (tp * cp)):
        if pp * min_layers > L or fx.get("pp", pp) != pp:
            continue
        dp = n // (tp * cp * pp)
        if B % dp or fx.get("dp", dp) != dp:
            continue
        experts = expert_options(model, job, constraints, tp, cp, dp)
        for mb in divisors(B // dp):
            if mb > constraints.max_micro_batch:
                break
            if fx.get("micro_batch", mb) != mb:
                continue
            m = B // (dp * mb)
            sched: list[tuple[str, int]] = [(s, 1) for s in plain]
            if interleaved and pp > 1 and m % pp == 0:
                # up to one layer a chunk; two more chunks where the ends may hold none
                # (the account-for-embedding/loss split, search.partition_candidates)
                sched += [("interleaved-1f1b", v)
                          for v in range(2, min(max_vpp, (L + 2) // (pp * min_layers)) + 1)]
            for s, v in sched:
                if fx.get("schedule", s) != s or fx.get("vpp", v) != v:
                    continue
                if s == "zero-bubble" and pp == 1 and "1f1b" in plain and \
                        fx.get("schedule") != s:
                    continue      # one stage: ZB-H1 is 1F1B (see the docstring)
                if s == "gpipe" and pp == 1 and "1f1b" in plain and \
                        fx.get("schedule") != s:
                    continue      # one stage: GPipe = 1F1B's time, m× its activations
                if s == "interleaved-1f1b" and not interleaved_partitions(L, pp * v,
                                                                         min_layers):
                    continue
                for rc in constraints.recompute:
                    if fx.get("recompute", rc) != rc:
                        continue
                    # ZeRO shards over the gradient group, dp·cp ranks (an MoE model's
                    # experts over edp, which can exceed 1 with dp·cp = 1)
                    zs = [fx["zero"]] if "zero" in fx else zeros if dp * cp > 1 or (
                        model.is_moe and tp > 1) else zeros[:1]
                    for z in zs:
                        if job.runtime == "torch" and zero_bubble_under_zero3(
                                s, z, dp, pp):
                            continue      # check_layout: ZB_ZERO3_UNSUPPORTED
                        for sp in sps:
                            if sp and tp == 1:
                                continue
                            if fx.get("sequence_parallel", sp) != sp:
                                continue
                            if sp and (job.seq_len // cp) % tp:
                                continue      # check_context_parallel
                            for c in compiles:
                                if c and compiled_at is not None and \
                                        (tp, sp, rc) not in compiled_at:
                                    continue      # priced as eager: its eager twin's time
                                for ep, etp in experts:
                                    if c and compiled_at is not None and \
                                            model.is_moe and ep * etp > 1 and \
                                            (etp > 1 or (tp, sp, rc, ep) not in compiled_ep_at):
                                        continue      # no compiled row at this ep: as eager
                                    yield Config(dp, pp, tp, mb, s, v, rc, z, sp, c, cp,
                                                 style, ep, etp)


def compile_options(cluster: Cluster, fixed, model: ModelSpec | None = None,
                    seq_len: int | None = None) -> list[bool]:
    """``Layout.compile`` values to search: both where the GPU profile has compiled layer rows
    (``meshplan calibrate --compile-rows``) — of ``model``'s layer shape at ``seq_len`` where
    they are given — else eager only: without them a compiled layout is priced as eager, so
    searching it would only duplicate every layout. Where they exist, layouts the compiled
    rows do not cover (another recompute mode; FSDP2 without the plain pair at its tp, SP and
    recompute: :mod:`meshplan.costmodel.compiled_rows`) would be priced as eager, and the
    search leaves them out (:func:`compiled_settings`). A fixed value is taken as given."""
    if "compile" in fixed:
        return [bool(fixed["compile"])]
    tables = cluster.gpu.measured
    if not tables:
        return [False]
    if model is not None and seq_len is not None:
        return [False, True] if compiled_settings(cluster, model, seq_len) else [False]
    return [False, True] if tables.has_compiled else [False]


def compiled_settings(cluster: Cluster, model: ModelSpec, seq_len: int) -> frozenset:
    """The (tp, sequence parallel, recompute) settings where a compiled layout of ``model`` is
    priced compiled, so where searching ``compile = True`` can find something eager does not:
    those with compiled rows in the GPU profile (their own rows, or FSDP2's derived from
    them), and the recompute modes with an eager row at a (tp, SP) whose compiled/eager pair
    at another mode carries compile to them
    (:func:`meshplan.costmodel.compiled_rows.compiled_from_pair`)."""
    tables = cluster.gpu.measured
    if not tables:
        return frozenset()
    timed = tables.compiled_settings(model, seq_len)
    eager = tables.eager_settings(model, seq_len)
    paired = {setting[:2] for setting in timed & eager}      # (tp, SP) with a pair
    return timed | frozenset(s for s in eager if s[:2] in paired)


def check_global(model: ModelSpec, cluster: Cluster, job: Job) -> None:
    """Errors no layout can avoid (seq_len beyond learned position embeddings, model parts
    the cost model does not price, an fp8 recipe the GPU or runtime cannot run), and the
    warning for a sequence past a RoPE model's maximum."""
    check_model_modelled(model)
    check_fp8_supported(job, cluster.gpu)
    check_seq_len(model, job)


def check_options(model: ModelSpec, job: Job, constraints: Constraints) -> None:
    """Constraint values no layout can take, named before the search (instead of an empty
    space explained by the wrong rule): ep / etp above 1 for a dense model, and ep, etp or cp
    lists none of whose degrees the model or the sequence allows."""
    fx = constraints.fixed
    experts = [f"{k} options {list(v)}" for k, v in (("ep", constraints.ep),
                                                       ("etp", constraints.etp))
               if v is not None and any(d > 1 for d in v)]
    experts += [f"fixed {k} = {fx[k]}" for k in ("ep", "etp") if fx.get(k, 1) > 1]
    if experts and not model.is_moe:
        raise ConfigError(f"{', '.join(experts)}: expert parallelism needs a "
                          f"mixture-of-experts model, and {model.name!r} is dense; leave ep "
                          f"and etp at 1")
    if model.is_moe and constraints.ep is not None \
            and not any(model.num_experts % e == 0 for e in constraints.ep):
        raise ConfigError(f"Constraints.ep {list(constraints.ep)}: none divides the "
                          f"{model.num_experts} routed experts of {model.name!r}; valid ep: "
                          f"{divisors(model.num_experts)}")
    widths = [w for w in (model.moe_ffn_hidden_size, model.shared_expert_ffn_hidden_size)
              if w is not None]
    if model.is_moe and constraints.etp is not None \
            and not any(all(w % e == 0 for w in widths) for e in constraints.etp):
        valid = [d for d in divisors(widths[0]) if all(w % d == 0 for w in widths)]
        raise ConfigError(f"Constraints.etp {list(constraints.etp)}: none divides the expert "
                          f"widths {widths} of {model.name!r}; valid etp: {valid}")
    s = job.seq_len
    if constraints.cp is not None \
            and not any(c == 1 or s % (2 * c) == 0 for c in constraints.cp):
        valid = [c for c in divisors(s // 2) if c & (c - 1) == 0] if s % 2 == 0 else [1]
        raise ConfigError(f"Constraints.cp {list(constraints.cp)}: seq_len = {s} is not "
                          f"divisible by 2·cp for any of them (each sequence is cut into "
                          f"2·cp chunks); cp that would do: {valid}")
