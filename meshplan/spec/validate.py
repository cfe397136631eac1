"""Checks that need model, cluster, job and layout together. Each names the values at fault."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from meshplan.errors import ConfigError, MeshplanWarning
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


def check_seq_len(model: ModelSpec, job: Job) -> None:
    """A sequence past the model's maximum: an error with learned position embeddings (no
    row exists for those positions), a :class:`MeshplanWarning` otherwise (RoPE runs, but the
    model was not trained for it; the CLI's ``--strict`` makes it an error)."""
    if job.seq_len <= model.max_seq_len:
        return
    if model.position_embedding == "learned":
        raise ConfigError(f"seq_len = {job.seq_len} exceeds {model.name!r}'s learned position "
                          f"embeddings (max_seq_len = {model.max_seq_len}); no layout can run "
                          f"it: use seq_len <= {model.max_seq_len}")
    warnings.warn(
        f"seq_len = {job.seq_len} exceeds {model.name!r}'s maximum sequence length "
        f"(max_seq_len = {model.max_seq_len}, a config's max_position_embeddings): memory and "
        f"time are predicted, but the model was not trained on such sequences (RoPE scaling "
        f"needed); use seq_len <= {model.max_seq_len}, or --strict / "
        f"warnings.simplefilter('error', MeshplanWarning) to refuse", MeshplanWarning,
        stacklevel=3)


def check_modelled(layout: Layout) -> None:
    """Refuse the layout dimensions the cost model and executor do not implement yet, rather
    than predict them as if they were absent."""
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
    check_types(model, cluster, job, layout)
    dp, pp, tp = layout.dp, layout.pp, layout.tp
    check_modelled(layout)
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
    check_seq_len(model, job)
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
    if layout.vpp > 1 and model.num_layers % stages:
        # Megatron-LM's rule for interleaving (layers per rank divisible by vpp); the cost
        # model's interleaved closed form is exact only for equal chunks (costmodel/pipeline)
        per_rank = model.num_layers / pp
        valid = [v for v in range(2, model.num_layers // pp + 1)
                 if model.num_layers % (pp * v) == 0]
        raise ConfigError(
            f"vpp = {layout.vpp} does not divide {model.name!r}'s {model.num_layers} layers "
            f"into pp·vpp = {pp}·{layout.vpp} = {stages} equal chunks ({per_rank:g} layers per "
            f"pipeline rank); valid vpp for pp = {pp}: {valid or 'none (use 1f1b)'}, or give "
            f"stage_layers explicitly")
    return default_stage_layers(model.num_layers, stages)


def check_types(model: object, cluster: object, job: object, layout: object) -> None:
    """Raise :class:`ConfigError` naming the argument that is not a meshplan spec (a dict
    passed as a layout, say) instead of failing later on a missing attribute."""
    for arg, value, cls in (("model", model, ModelSpec), ("job", job, Job),
                            ("layout", layout, Layout)):
        if not isinstance(value, cls):
            hint = (f"; build one with mp.{cls.__name__}(**d) or "
                    f"mp.{cls.__name__}.from_dict(d)" if isinstance(value, dict) else "")
            raise ConfigError(f"{arg} must be a meshplan {cls.__name__}, got "
                              f"{type(value).__name__} {value!r}"[:300] + hint)
    # Cluster lives above spec in the import graph: recognised by its type's name
    if type(cluster).__name__ != "Cluster":
        hint = ("; build one with mp.Cluster.preset(name, nodes=N) or mp.Cluster.from_dict(d)"
                if isinstance(cluster, dict) else "")
        raise ConfigError(f"cluster must be a meshplan Cluster, got {type(cluster).__name__}"
                          + hint)


def _divisors_of_both(a: int, b: int) -> list[int]:
    return [d for d in range(1, min(a, b) + 1) if a % d == 0 and b % d == 0]
