"""Checks that need model, cluster, job and layout together. Each names the values at fault."""

from __future__ import annotations

import math
import os
import sys
import warnings
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Iterator

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


_SEQ_LEN_WARNED: ContextVar[bool] = ContextVar("meshplan_seq_len_warned", default=False)


@contextmanager
def seq_len_warned() -> Iterator[None]:
    """Inside: :func:`check_seq_len` does not warn (errors still raise). For a function that
    ran the check itself and then estimates layouts of the same job (``mp.plan``): one user
    call, one warning, whatever filters the imports on the way reset."""
    token = _SEQ_LEN_WARNED.set(True)
    try:
        yield
    finally:
        _SEQ_LEN_WARNED.reset(token)


def check_seq_len(model: ModelSpec, job: Job) -> None:
    """A sequence past the model's maximum: an error with learned position embeddings (no
    row exists for those positions), a :class:`MeshplanWarning` otherwise (RoPE runs, but the
    model was not trained for it; the CLI's ``--strict`` makes it an error)."""
    if job.seq_len <= model.max_seq_len:
        return
    if model.position_embedding == "learned":
        raise ConfigError(f"seq_len = {job.seq_len} exceeds the learned position embeddings of "
                          f"{model.name!r} (max_seq_len = {model.max_seq_len}); no layout can run "
                          f"it: use seq_len <= {model.max_seq_len}")
    if _SEQ_LEN_WARNED.get():
        return
    warnings.warn(
        f"seq_len = {job.seq_len} exceeds the maximum sequence length of {model.name!r} "
        f"(max_seq_len = {model.max_seq_len}, a config's max_position_embeddings): memory and "
        f"time are predicted, but the model was not trained on such sequences (RoPE scaling "
        f"needed); use seq_len <= {model.max_seq_len}, or --strict / "
        f"warnings.simplefilter('error', MeshplanWarning) to refuse", MeshplanWarning,
        stacklevel=_user_stacklevel())


# meshplan's own files, spelt as their code objects spell them (both from the import path)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside meshplan for a ``warnings.warn`` in the
    function that calls this: the user's ``mp.estimate`` / ``mp.plan`` / ... line, however
    deep inside meshplan the check ran (estimate -> check_layout, plan -> check_global, a
    report's plans ...)."""
    frame, level = sys._getframe(2), 2        # 1: the warning function's own frame
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def check_modelled(layout: Layout, model: ModelSpec | None = None) -> None:
    """Refuse the layout dimensions (and, given ``model``, the model features) the cost model
    does not price yet, rather than predict them as if absent. Every Job setting is priced
    (fp8: meshplan.costmodel.fp8_cost; a GPU or runtime that cannot run its recipe is refused
    at estimate time by fp8_cost.check_fp8_supported), and so is Layout.compile (from the
    profile's compiled layer rows, else as eager with a caveat); context and expert
    parallelism are priced since issues 39 and 38 (meshplan.costmodel.inputs). Not priced:
    ring context parallelism of a sliding-window model (its ring would skip the steps
    outside the window); the all-to-all style runs each head's whole sequence on one rank,
    window and all."""
    if model is not None:
        check_model_modelled(model)
        if layout.cp > 1 and model.sliding_window is not None and layout.cp_style == "ring":
            raise ConfigError(f"Layout.cp = {layout.cp} with cp_style 'ring' and the "
                              f"sliding-window attention of {model.name!r} (window "
                              f"{model.sliding_window}) is not priced by the cost model; use "
                              f"cp_style = 'all-to-all' or cp = 1")


def check_model_modelled(model: ModelSpec) -> None:
    """Refuse models whose parts the cost model does not price yet (the planner calls this
    once per search; :func:`check_modelled` for each layout). Every part of a ModelSpec is
    priced now — MoE layers, multi-head latent attention and multi-token prediction since
    issue 38 (meshplan.costmodel.moe_tables) — so this refuses nothing; it stays as the
    one place a new, unpriced model feature is refused."""
    return None


def check_recompute_modules(model: ModelSpec, job: Job) -> None:
    """Selective recompute modules the model has (Megatron-Core refuses ``mla_up_proj``
    without multi-head latent attention: ``TransformerConfig.__post_init__``)."""
    if "mla_up_proj" in job.selective_modules and not model.is_mla:
        raise ConfigError(f"Job.recompute_modules {list(job.selective_modules)} names "
                          f"'mla_up_proj', but {model.name!r} has no multi-head latent "
                          f"attention; leave it out (valid here: 'core_attn', 'layernorm', "
                          f"'moe_act')")
    if "moe_act" in job.selective_modules and not model.is_moe:
        raise ConfigError(f"Job.recompute_modules {list(job.selective_modules)} names "
                          f"'moe_act', but {model.name!r} has no MoE layers; leave it out "
                          f"(valid here: 'core_attn', 'layernorm'"
                          + (", 'mla_up_proj')" if model.is_mla else ")"))


def check_experts(model: ModelSpec, layout: Layout) -> None:
    """Expert-parallel degrees that fit the model (DESIGN: ep divides the routed experts)."""
    if not model.is_moe:
        if layout.ep > 1 or layout.etp > 1:
            raise ConfigError(f"Layout.ep = {layout.ep}, etp = {layout.etp} need a mixture-of-"
                              f"experts model; {model.name!r} is dense (use ep = etp = 1)")
        return
    if model.num_experts % layout.ep:
        valid = [d for d in range(1, model.num_experts + 1) if model.num_experts % d == 0]
        raise ConfigError(f"Layout.ep = {layout.ep} must divide the {model.num_experts} routed "
                          f"experts of {model.name!r}; valid ep: {valid}")
    for name in ("moe_ffn_hidden_size", "shared_expert_ffn_hidden_size"):
        width = getattr(model, name)
        if width is not None and width % layout.etp:
            raise ConfigError(f"Layout.etp = {layout.etp} must divide ModelSpec.{name} = "
                              f"{width} of {model.name!r}")


def capacity_cuts_cp_chunks(model: ModelSpec, tp: int, cp: int) -> bool:
    """Whether meshplan's executor refuses MoE layers with a capacity at this tp and cp: it
    counts the copies a rank keeps per piece of the sequence, a cp chunk or a tp slice of
    one (``executor/moe.py`` ``sequence_pieces``), which an odd tp > 1 does not give at
    cp > 1 (its slices straddle the chunks). The executor refuses it, the planner leaves it
    out under runtime "torch"."""
    return (model.is_moe and model.capacity_factor is not None and cp > 1 and tp > 1
            and tp % 2 == 1)


def check_context_parallel(model: ModelSpec, job: Job, layout: Layout) -> None:
    """Raise :class:`ConfigError` if the sequence or the heads cannot be cut ``cp`` ways.

    Both styles shard the sequence as Megatron-Core does for causal load balancing (its
    context-parallel docs; TransformerEngine's ``get_batch_on_this_cp_rank``): it is cut into
    2·cp chunks and cp rank r holds chunks r and 2·cp−1−r, so every rank computes the same
    share of the causal attention matrix. With sequence parallelism each cp rank's
    seq_len/cp tokens are cut again over tp. The all-to-all style (DeepSpeed-Ulysses,
    Jacobs et al. 2023, arXiv 2309.14509) gives each rank whole heads of the full sequence:
    the query and key/value heads a tp rank holds must divide by cp.
    """
    cp, tp = layout.cp, layout.tp
    if cp == 1:
        return
    if job.seq_len % (2 * cp):
        ok = [c for c in range(2, job.seq_len // 2 + 1) if job.seq_len % (2 * c) == 0][:8]
        raise ConfigError(
            f"Job.seq_len = {job.seq_len} must be divisible by 2·cp = {2 * cp}: context "
            f"parallelism cuts each sequence into 2·cp chunks, cp rank r holding chunks r and "
            f"2·cp−1−r (causal load balancing); cp that divide it: {ok or 'none'}")
    if layout.sequence_parallel and (job.seq_len // cp) % tp:
        raise ConfigError(
            f"with sequence_parallel, each cp rank's seq_len/cp = {job.seq_len}/{cp} = "
            f"{job.seq_len // cp} tokens are split over tp = {tp}, which must divide them "
            f"(seq_len divisible by cp·tp = {cp * tp})")
    if layout.cp_style == "all-to-all":
        for field in ("num_heads", "num_kv_heads"):
            heads = getattr(model, field)
            if heads % (tp * cp):
                valid = [c for c in range(1, heads // tp + 1) if heads % (tp * c) == 0] \
                    if heads % tp == 0 else []
                raise ConfigError(
                    f"cp_style 'all-to-all' scatters attention heads over cp: tp·cp = "
                    f"{tp}·{cp} = {tp * cp} must divide ModelSpec.{field} = {heads} of "
                    f"{model.name!r}; cp valid with tp = {tp}: {valid or 'none'} (or use "
                    f"cp_style='ring', which has no head constraint)")


def check_layout(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout, *,
                 exact_gpus: bool = False) -> tuple[int, ...]:
    """Raise :class:`ConfigError` if the layout cannot run; return layers per virtual stage.

    ``exact_gpus``: require dp·pp·tp to equal the cluster's GPUs (the planner's default);
    otherwise a layout may use a subset of the cluster.
    """
    check_types(model, cluster, job, layout)
    dp, pp, tp = layout.dp, layout.pp, layout.tp
    check_context_parallel(model, job, layout)
    check_modelled(layout, model)
    check_experts(model, layout)
    check_recompute_modules(model, job)
    n = layout.num_gpus
    if n > cluster.num_gpus or (exact_gpus and n != cluster.num_gpus):
        rel = "≠" if exact_gpus else ">"
        dims = "dp·pp·tp" + ("·cp" if layout.cp > 1 else "")
        sizes = "·".join(str(d) for d in (dp, pp, tp) + ((layout.cp,) if layout.cp > 1 else ()))
        raise ConfigError(f"{dims} = {sizes} = {n} {rel} {cluster.num_gpus} GPUs of cluster "
                          f"{cluster.name!r} ({cluster.shape})")
    if model.num_heads % tp or model.num_kv_heads % tp:
        raise ConfigError(
            f"tp = {tp} must divide the attention heads ({model.num_heads}) and the key/value "
            f"heads ({model.num_kv_heads}) of {model.name!r}; valid tp: "
            f"{_divisors_of_both(model.num_heads, model.num_kv_heads)}")
    if model.ffn_hidden_size % tp:
        raise ConfigError(f"tp = {tp} must divide ffn_hidden_size = {model.ffn_hidden_size} "
                          f"of {model.name!r}")
    if job.global_batch % (dp * layout.micro_batch):
        raise ConfigError(_batch_not_divisible(job.global_batch, dp, layout.micro_batch))
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
            f"vpp = {layout.vpp} does not divide the {model.num_layers} layers of {model.name!r} "
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


def _batch_not_divisible(global_batch: int, dp: int, micro_batch: int) -> str:
    """The error for a global batch that dp·micro_batch does not divide, with the multiples
    of dp·micro_batch nearest it and the micro-batches that would divide it at this dp."""
    per = dp * micro_batch
    below = [k * per for k in range(max(1, global_batch // per - 1), global_batch // per + 1)]
    above = [k * per for k in range(global_batch // per + 1, global_batch // per + 3)]
    near = ", ".join(str(b) for b in below + above)
    if global_batch % dp:
        other = f"no micro_batch fits at dp = {dp}, which does not divide {global_batch}"
    else:
        mbs = divisors(global_batch // dp)
        shown = ", ".join(map(str, mbs[:8])) + (", ..." if len(mbs) > 8 else "")
        other = f"or keep {global_batch} with micro_batch ∈ {{{shown}}} at dp = {dp}"
    return (f"global_batch = {global_batch} is not divisible by dp·micro_batch = "
            f"{dp}·{micro_batch} = {per}; valid global batches near {global_batch} (multiples "
            f"of {per}): {near}; {other}")


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def _divisors_of_both(a: int, b: int) -> list[int]:
    return divisors(math.gcd(a, b))
