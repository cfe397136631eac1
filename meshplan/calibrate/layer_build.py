"""A layer row's module, built as the executor builds it, and what runs it: input, autocast.

:func:`_build` makes a row's blocks or end exactly as
:class:`meshplan.executor.parallelize.ParallelTrainer` does (meta device, ``keep_part``,
``init_weights``, tensor parallelism, fp8 linears, FSDP2 for ZeRO-2/3, ``torch.compile``); the rest sets
a module's recompute mode, makes a row's input and autocast context, keeps a deeper stack
per build key, and frees memory between builds.
"""

from __future__ import annotations

import gc
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

from meshplan.calibrate.layer_grid import Config
from meshplan.calibrate.layer_ranks import _Groups
from meshplan.hardware_profiles.measured_rows import ran_cached_expert_weights
from meshplan.spec import ModelSpec

SEED = 0


@dataclass(frozen=True)
class _DPGroups:
    """The two attributes of MeshGroups that wrap_data_parallel reads for ZeRO-2/3."""

    dp_mesh: Any
    dp: int


def _layer_spec(model: ModelSpec, layers: int, tp: int) -> ModelSpec:
    # The vocabulary does not reach a layers-only part, but apply_tensor_parallel checks
    # that tp divides it: round it up so every valid layer tp can be measured.
    vocab = -(-model.vocab_size // tp) * tp
    if model.is_moe:    # MoE layers only: the rows' key names the MoE layer (measured_rows)
        return replace(model, num_layers=layers, vocab_size=vocab, dense_layers=(),
                       mtp_layers=0)
    return replace(model, num_layers=layers, vocab_size=vocab)


def _build(cfg: Config, layers: int, device, groups: _Groups):
    import torch

    from meshplan.executor.data_parallel import wrap_data_parallel
    from meshplan.executor.model import Transformer
    from meshplan.executor.tensor_parallel import apply_tensor_parallel
    cuda = device.type == "cuda"
    if cfg.part:
        spec = replace(cfg.model, num_layers=1)     # the one block is dropped by keep_part
    else:
        spec = _layer_spec(cfg.model, layers, cfg.tp)
    with torch.device("meta"):
        m = Transformer(spec)
    if cfg.part == "embedding":
        m.keep_part(0, 0, embeds_input=True, computes_logits=False)
    elif cfg.part == "output":
        m.keep_part(0, 0, embeds_input=False, computes_logits=True)
    else:
        m.keep_part(0, layers, embeds_input=False, computes_logits=False)
    experts = groups.experts(cfg.ep, cfg.tp, cfg.dp if cfg.zero >= 2 else None) \
        if cfg.ep > 1 else None
    if experts is not None:     # this rank's share of the experts, as ParallelTrainer keeps
        from meshplan.executor.expert_parallel import place_experts
        place_experts(m, experts)
    m.to_empty(device=device)
    m.init_weights(SEED)
    tp_group = groups.tp(cfg.tp)
    if cfg.tp > 1:
        # an MoE block's MLP splits as ParallelTrainer splits it (shared experts as a dense
        # MLP, the routed part on this rank's tokens)
        from meshplan.executor.expert_parallel import apply_tensor_parallel_moe
        apply_tensor_parallel(m, tp_group, sequence_parallel=cfg.sequence_parallel,
                              moe=apply_tensor_parallel_moe if cfg.model.is_moe else None)
    if cfg.precision == "fp8":     # as ParallelTrainer: after tp, before compile
        from meshplan.executor.fp8 import convert_to_fp8
        convert_to_fp8(m, cfg.fp8_recipe, device=device,
                       tp_group=tp_group if cfg.tp > 1 else None,
                       tokens=cfg.micro_batch * cfg.seq_len)
    m.activation_dtype = torch.bfloat16 if cuda else None
    if experts is not None:     # the ep group on every MoE layer (after tp, before compile)
        from meshplan.executor.expert_parallel import configure_moe
        configure_moe(m, experts, aux_divisor=1)
    from meshplan.executor.parallelize import compile_backend
    backend = compile_backend() if cfg.compile else None
    if ran_cached_expert_weights(cfg.model, cfg.precision, cfg.fp8_recipe, cfg.zero):
        _cache_expert_weights(m, backend)
    if cfg.compile:
        for block in m.layers.values():
            block.compile(backend=backend)   # as ParallelTrainer does for Layout.compile
    if cfg.zero >= 2:
        if cfg.model.is_moe:    # the experts sharded over edp first, as ParallelTrainer does
            # (at ep > 1 over the edp of the row's ep groups: one rank where ep = dp·tp)
            from meshplan.executor.expert_parallel import prepare_data_parallel
            prepare_data_parallel(m, experts or groups.experts(1, cfg.tp, cfg.dp),
                                  zero=cfg.zero, bf16=cuda)
        m = wrap_data_parallel(m, zero=cfg.zero,
                               groups=_DPGroups(groups.dp_mesh(cfg.dp, cfg.tp), cfg.dp),
                               device=device, bf16=cuda, pipelined=False)
        if not cfg.communicates:
            _hold_unsharded(m)
    return m, tp_group


def _cache_expert_weights(m, backend: str | None) -> None:
    """The fp8 routed experts' weights cast once, before any timed pass (the weights do not
    change while a row is timed): the row holds what a step of several micro-batches runs
    (:attr:`meshplan.costmodel.measured.MeasuredLayer.fp8_weights_cached`)."""
    from meshplan.executor.expert_parallel import moe_layers
    for moe in moe_layers(m):
        if moe.experts.fp8 is not None:     # fp8 on this device (Hopper or later, or CPU)
            for cast in moe.experts.cache_fp8_weights(backend=backend):
                cast.refresh()


def _hold_unsharded(m) -> None:
    """Run FSDP2 module ``m`` as a pipeline stage runs its micro-batches: no resharding
    and no gradient reduction after a backward (``PipelineStage.backward_maybe_with_nosync``
    sets exactly these three), so the timed passes are the layers' compute and the split
    backward's W finds the unsharded weights its B used."""
    m.set_is_last_backward(False)
    m.set_reshard_after_backward(False)
    m.set_requires_gradient_sync(False)


def _set_recompute(m, recompute: str) -> None:
    for block in m.layers.values():
        block.recompute_block = recompute == "full"
        block.attn.recompute_core = recompute == "selective"


def _deep_module(cfg: Config, key, module, layers: int, device, groups):
    """``module`` (``layers`` blocks, built for build key ``key``) if it was built for
    ``cfg``'s build key, else a new one: deep stacks are built once per build key."""
    if key != cfg.build_key:
        module = None
        _free(device)
    if module is None:
        module, _ = _build(cfg, layers, device, groups)
    return module


def _layer_input(cfg: Config, device):
    """A random input of one layer: (mb, s or s/tp, h), requiring grad."""
    import torch
    act = torch.bfloat16 if device.type == "cuda" else torch.float32
    s = cfg.seq_len // cfg.tp if cfg.sequence_parallel else cfg.seq_len
    return torch.randn(cfg.micro_batch, s, cfg.model.hidden_size, device=device, dtype=act,
                       requires_grad=True)


def _layer_amp(cfg: Config, device):
    """ZeRO-0/1 run the whole step under one autocast, so the bf16 weight copies are cast
    once per step and cached: one context over warm-up and timed iterations does the same."""
    import torch
    if device.type == "cuda" and cfg.zero < 2:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def _end_amp(device):
    """The embedding and output parts run under the step's autocast on GPU (no ZeRO-2/3
    variant: the ends are never FSDP2 rows)."""
    import torch
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def _free(device) -> None:
    import torch
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def allocatable_bytes(device) -> float:
    """What this process can still allocate on ``device``: the GPU's free memory and what
    the caching allocator holds unused; unbounded off CUDA (nothing is checked there)."""
    import torch
    if device.type != "cuda":
        return float("inf")
    free_bytes, _ = torch.cuda.mem_get_info(device)
    return float(free_bytes + torch.cuda.memory_reserved(device)
                 - torch.cuda.memory_allocated(device))


def _allocated_note(device) -> str:
    """On CUDA, what this process still holds after a failed row was freed (its weights
    and little else; more is memory a failed pass left alive), for the log."""
    import torch
    if device.type != "cuda":
        return ""
    return f" ({torch.cuda.memory_allocated(device) / 2**30:.1f} GiB still allocated)"


def _oom_types() -> tuple[type, ...]:
    import torch
    return (torch.cuda.OutOfMemoryError,)
