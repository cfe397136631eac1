"""Checks that need model, cluster, job and layout together. Each names the values at fault."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.errors import ConfigError
from meshplan.spec.job import Job
from meshplan.spec.layout import Layout, default_stage_layers
from meshplan.spec.model import ModelSpec

if TYPE_CHECKING:  # the cluster is read, never built, here: spec stays below hardware_profiles
    from meshplan.hardware_profiles import Cluster

#: runtime "torch" (the executor refuses it too, meshplan.executor.pipeline.check_schedule)
ZB_ZERO3_UNSUPPORTED = (
    "schedule 'zero-bubble' with zero = 3 (dp > 1) is not supported by the executor: torch's "
    "split weight-gradient pass runs after FSDP2 has resharded the layer's weights, and on "
    "CPU it trained to wrong losses (Llama) or hung (GPT with tied embeddings). Use zero "
    "<= 2 with zero-bubble, or ZeRO-3 with gpipe, 1f1b or interleaved-1f1b")


def zero_bubble_under_zero3(schedule: str, zero: int, dp: int, pp: int) -> bool:
    """The combination ZB_ZERO3_UNSUPPORTED refuses: zero-bubble over pp > 1 with ZeRO-3
    over dp > 1 (the one predicate for check_layout, the executor and the search space)."""
    return schedule == "zero-bubble" and zero == 3 and dp > 1 and pp > 1


def check_job_modelled(job: Job) -> None:
    """Refuse the job settings the cost model does not price yet (any layout)."""
    if job.precision == "fp8":
        raise ConfigError(
            f"Job.precision = 'fp8' (fp8_recipe {job.fp8_recipe!r}) is not priced by the cost "
            f"model yet; estimate with precision='bf16'. The executor runs fp8 "
            f"(python -m meshplan.executor.run --precision fp8, docs/fp8.md) and "
            f"meshplan.costmodel.fp8 holds the fp8 formulas")


def check_modelled(layout: Layout, job: Job | None = None) -> None:
    """Refuse the layout dimensions (and job settings) the cost model and executor do not
    implement yet, rather than predict them as if they were absent."""
    if job is not None:
        check_job_modelled(job)
    if layout.cp > 1:
        raise ConfigError(f"Layout.cp = {layout.cp}: context parallelism is not modelled yet; "
                          f"use cp = 1")
    if layout.ep > 1 or layout.etp > 1:
        raise ConfigError(f"Layout.ep = {layout.ep}, etp = {layout.etp}: expert parallelism is "
                          f"not modelled yet; use ep = etp = 1")
    if layout.compile:
        raise ConfigError("Layout.compile = True is not modelled yet; use compile = False "
                          "(the executor's --compile flag compiles without a prediction)")


def check_layout(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout, *,
                 exact_gpus: bool = False) -> tuple[int, ...]:
    """Raise :class:`ConfigError` if the layout cannot run; return layers per virtual stage.

    ``exact_gpus``: require dp·pp·tp to equal the cluster's GPUs (the planner's default);
    otherwise a layout may use a subset of the cluster.
    """
    dp, pp, tp = layout.dp, layout.pp, layout.tp
    check_modelled(layout, job)
    n = layout.num_gpus
    if n > cluster.num_gpus or (exact_gpus and n != cluster.num_gpus):
        rel = "≠" if exact_gpus else ">"
        dims = "dp·pp·tp" + ("·cp" if layout.cp > 1 else "")
        sizes = "·".join(str(d) for d in (dp, pp, tp) + ((layout.cp,) if layout.cp > 1 else ()))
        raise ConfigError(f"{dims} = {sizes} = {n} {rel} {cluster.num_gpus} GPUs of cluster "
                          f"{cluster.name!r} ({cluster.nodes} nodes × {cluster.gpus_per_node})")
    if model.num_heads % tp or model.num_kv_heads % tp:
        raise ConfigError(
            f"tp = {tp} must divide the attention heads ({model.num_heads}) and the key/value "
            f"heads ({model.num_kv_heads}) of {model.name!r}; valid tp: "
            f"{_divisors_of_both(model.num_heads, model.num_kv_heads)}")
    if model.ffn_hidden_size % tp:
        raise ConfigError(f"tp = {tp} must divide ffn_hidden_size = {model.ffn_hidden_size} "
                          f"of {model.name!r}")
    if job.global_batch % (dp * layout.micro_batch):
        raise ConfigError(
            f"global_batch = {job.global_batch} is not divisible by dp·micro_batch = "
            f"{dp}·{layout.micro_batch} = {dp * layout.micro_batch}")
    if model.position_embedding == "learned" and job.seq_len > model.max_seq_len:
        raise ConfigError(f"seq_len = {job.seq_len} exceeds {model.name!r}'s learned position "
                          f"embeddings (max_seq_len = {model.max_seq_len})")
    if job.runtime == "torch" and zero_bubble_under_zero3(layout.schedule, layout.zero, dp, pp):
        raise ConfigError(ZB_ZERO3_UNSUPPORTED)
    m = layout.num_microbatches(job.global_batch)
    stages = pp * layout.vpp
    if layout.schedule == "interleaved-1f1b" and pp > 1 and m % pp:
        raise ConfigError(
            f"interleaved-1f1b needs the number of micro-batches ({m} = {job.global_batch} / "
            f"({dp}·{layout.micro_batch})) to be a multiple of pp = {pp}")
    if layout.stage_layers is not None:
        total = sum(layout.stage_layers)
        if total != model.num_layers:
            raise ConfigError(f"Layout.stage_layers {list(layout.stage_layers)} sum to {total}; "
                              f"{model.name!r} has {model.num_layers} layers")
        return layout.stage_layers
    if model.num_layers < stages:
        raise ConfigError(f"{model.name!r} has {model.num_layers} layers, fewer than pp·vpp = "
                          f"{pp}·{layout.vpp} = {stages} pipeline stages")
    return default_stage_layers(model.num_layers, stages)


def _divisors_of_both(a: int, b: int) -> list[int]:
    return [d for d in range(1, min(a, b) + 1) if a % d == 0 and b % d == 0]
