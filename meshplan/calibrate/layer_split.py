"""Zero-bubble's split backward of a layer row: B and W per layer, again on a deeper stack.

:func:`_split_per_layer` times torch.distributed.pipelining's own input- and weight-gradient
passes (:mod:`meshplan.calibrate.bench_split`) on a row's blocks, queued or synchronized;
:func:`_deep_split` times them again on :data:`SPLIT_DEEP_LAYERS` blocks, with their memory
under full recomputation (:mod:`meshplan.calibrate.split_memory`): how B, W and that memory
grow with a stage's depth.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from meshplan.calibrate.layer_build import (_deep_module, _free, _layer_amp, _layer_input,
                                            _oom_types, _set_recompute, allocatable_bytes)
from meshplan.calibrate.layer_grid import Config
from meshplan.calibrate.layer_ranks import _any_rank, _reduce
from meshplan.calibrate.layer_rows import NO_SPLIT_MEMORY, Sample, split_memory_stage
from meshplan.calibrate.layer_timing import WARMUP, _measure, _Queue

SPLIT_DEEP_LAYERS = 6  # zero-bubble's split backward is timed again on this many blocks


def _split_per_layer(m, x, grad, layers: int, device, *, iters: int, barrier,
                     queue: _Queue | None = None, forward: Sequence[Sample] = ()
                     ) -> tuple[float, float, float, float]:
    """Zero-bubble's split backward of the ``layers`` blocks of ``m``, per layer: (B, W,
    B's CPU, W's CPU) seconds; zeros where torch has no split backward.

    With ``queue`` (CUDA) it is timed like the rows: queued, GPU-busy and CPU dispatch apart.
    The untimed part cannot be left out of a queued iteration, so each iteration runs the
    stage forward and B together and W alone; B is that minus the row's own ``forward``
    samples (the same forward, timed the same way). Without ``queue``: synchronized B and W
    (:func:`meshplan.calibrate.bench_split.split_backward_s`) and no CPU fields.
    ``grad``: the output gradient (None: a random one). Out of memory propagates, either
    way: the row keeps no split, the deep split drops its stack (every rank must agree)."""
    import torch

    from meshplan.calibrate.bench_split import split_backward_s, split_functions
    g: list = [grad] if grad is not None else []

    def fresh():
        """(output, its gradient, input) of a forward on a fresh input."""
        xi = torch.randn_like(x).requires_grad_()
        y = m(xi)                                        # (mb, s, h)
        if not g:
            g.append(torch.randn_like(y))
        return y, g[0], xi

    if queue is None or not forward:
        barrier()
        split = split_backward_s(fresh, _LiveParams(m), device=device, iters=iters)
        return (split[0] / layers, split[1] / layers, 0.0, 0.0) if split else (0.0,) * 4
    fns = split_functions()
    if fns is None:
        return (0.0,) * 4
    backward_input, backward_weight = fns
    params = _LiveParams(m)
    groups: list = []

    def forward_and_b():
        y, gy, xi = fresh()
        groups[:] = [backward_input([y], [gy], [xi], iter(params))[1]]
        return y

    def w(_y):
        backward_weight(iter(params), groups.pop())
    samples, _ = _measure(forward_and_b, w, lambda: None, device=device, warmup=WARMUP,
                          iters=iters, barrier=barrier, queue=queue)
    med = statistics.median
    f_gpu, f_cpu = med(s.forward_s for s in forward), med(s.forward_cpu_s for s in forward)
    return (max(0.0, med(s.forward_s for s in samples) - f_gpu) / layers,
            med(s.backward_s for s in samples) / layers,
            max(0.0, med(s.forward_cpu_s for s in samples) - f_cpu) / layers,
            med(s.backward_cpu_s for s in samples) / layers)


class _LiveParams:
    """``m``'s parameters as they are when iterated, as ``PipelineStage`` passes
    ``self.submod.parameters()`` to each B and W: FSDP2 swaps a module's registered
    parameters between the sharded ones and the unsharded ones the forward used, so a list
    taken before the forward names parameters the graph never touched (then B finds no
    parameter group and W does nothing: 2-block CPU check, 2026-11-27)."""

    def __init__(self, m) -> None:
        self.m = m

    def __iter__(self):
        return iter(list(self.m.parameters()))


def _fsdp_split_per_layer(m, x, grad, layers: int, device, *, iters: int, barrier,
                          queue: _Queue | None = None, forward: Sequence[Sample] = ()
                          ) -> tuple[float, float, float, float]:
    """:func:`_split_per_layer` of an FSDP2 module on a 1-rank mesh, or zeros where torch's
    split backward fails on it: FSDP2's backward hooks are not what
    ``stage_backward_input``/``_weight`` were written against, and a failed measurement must
    cost the row its split, not the calibration. Every rank runs the same 1-rank work, so
    they fail alike and their collectives (the barriers) stay matched. Out of memory
    propagates as for the row."""
    try:
        return _split_per_layer(m, x, grad, layers, device, iters=iters, barrier=barrier,
                                queue=queue, forward=forward)
    except _oom_types():
        raise
    except Exception:   # noqa: BLE001 — see the docstring
        if device.type == "cuda":
            import torch
            torch.cuda.synchronize(device)
        return (0.0, 0.0, 0.0, 0.0)


def _sync_split(cfg: Config, m, layers: int, device, *, iters: int, barrier
                ) -> tuple[float, float]:
    """Synchronized :func:`_split_per_layer` (B, W) of the ``layers`` blocks of ``m``."""
    _set_recompute(m, cfg.recompute)
    with _layer_amp(cfg, device):
        return _split_per_layer(m, _layer_input(cfg, device), None, layers, device,
                                iters=iters, barrier=barrier)[:2]


def deep_split_fits(activation_bytes: float, device) -> bool:
    """Whether :data:`SPLIT_DEEP_LAYERS` blocks of a row whose layers keep
    ``activation_bytes`` each (its measured activations) can run the split backward here:
    B keeps the forward's activations for W and each intermediate's gradient beside them,
    up to as much again, so twice the stack's activations must fit in the memory this
    process can still allocate. A split that runs out of memory inside B is not only lost
    time: under torch 2.11 its forward's activations stayed allocated (GPT 2.82 B at seq
    8192, micro-batch 16, 1 x H200, 2026-12-01: 110 GiB, and the calibration's next rows
    ran out of memory), the hooks B left on the graph holding it
    (:func:`~meshplan.calibrate.bench_split._drop_hooks` now removes them), and out of
    memory inside a backward can leak so elsewhere too (torch's open issue
    pytorch/pytorch#82218): a stack that cannot fit is not run. True off CUDA."""
    return activation_bytes <= 0 or \
        2 * SPLIT_DEEP_LAYERS * activation_bytes <= allocatable_bytes(device)


def _deep_split(cfg: Config, key, module, shallow, layers: int, device, groups, *,
                iters: int, barrier, world: int, row_module=None,
                activation_bytes: float = 0.0):
    """Zero-bubble's split backward of ``cfg``, synchronized, on :data:`SPLIT_DEEP_LAYERS`
    blocks (built once per build key) and, if given, right before it on the row's
    ``layers``-block module ``shallow``, averaged over ranks: (build key, deep module to
    reuse, (B, W) per layer shallow (0, 0 without ``shallow``) + (B, W) deep, or None where
    any rank ran out of memory or measured nothing, the split's memory with full
    recomputation: :func:`split_memory_stage` of the (pending, transient) bytes per layer
    on ``row_module`` (the row's ``layers`` blocks) and on the deep stack, each the
    largest rank's (:func:`meshplan.calibrate.split_memory.split_memory_per_layer`;
    zeros for other recompute modes or where not measured)).

    Always synchronized: queued, a deep stack's weight pass can queue more kernels than
    CUDA's launch queue holds (see :data:`~meshplan.calibrate.timing.SPIN_MAX_S`). Not run
    (None, as out of memory) where :func:`deep_split_fits` says the stack cannot fit on
    some rank (``activation_bytes``: the row's per layer; 0: not checked)."""
    from meshplan.calibrate.split_memory import split_memory_per_layer
    values, oom, mem = [0.0] * 4, 0.0, [0.0] * 4
    if _any_rank(not deep_split_fits(activation_bytes, device), device, world):
        return cfg.build_key, module if key == cfg.build_key else None, None, NO_SPLIT_MEMORY
    try:
        module = _deep_module(cfg, key, module, SPLIT_DEEP_LAYERS, device, groups)
        values = [*(_sync_split(cfg, shallow, layers, device, iters=iters, barrier=barrier)
                    if shallow is not None else (0.0, 0.0)),
                  *_sync_split(cfg, module, SPLIT_DEEP_LAYERS, device, iters=iters,
                               barrier=barrier)]
        if cfg.recompute == "full":     # _sync_split left the module recomputing
            with _layer_amp(cfg, device):
                mem[2:] = split_memory_per_layer(module, lambda: _layer_input(cfg, device),
                                                 SPLIT_DEEP_LAYERS, device)
                if row_module is not None:
                    _set_recompute(row_module, cfg.recompute)
                    mem[:2] = split_memory_per_layer(
                        row_module, lambda: _layer_input(cfg, device), layers, device)
    except _oom_types():
        oom = 1.0
    if oom:
        # the stack goes with what the failed pass left on it; freed here, not in the
        # handler, whose traceback still holds that pass's frames and tensors
        module = None
        _free(device)
    measured = values if shallow is not None else values[2:]
    lo = _reduce([*values, oom, -min(measured), *mem], range(4, 10), device, world)
    if lo[4] or lo[5] >= 0:          # out of memory, or some rank measured nothing
        return cfg.build_key, module, None, NO_SPLIT_MEMORY
    return cfg.build_key, module, tuple(lo[:4]), split_memory_stage(
        (lo[6], lo[7]), (lo[8], lo[9]), layers, SPLIT_DEEP_LAYERS)
