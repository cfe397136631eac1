"""One layer-table row timed: a row's blocks or end, one micro-batch, its values per layer.

:func:`_run_layer` times a row's blocks (with zero-bubble's split backward where it applies,
:mod:`meshplan.calibrate.layer_split`), :func:`_run_end` the embedding or the output part,
:func:`_cpu_deep` a row's CPU dispatch again on a deeper stack (steady, or queued on
:data:`CPU_DEEP_LAYERS` blocks),
:func:`_sync_deep` a synchronized (host-syncing) row again on as many; the values
they return become rows in :mod:`meshplan.calibrate.layer_rows`.
"""

from __future__ import annotations

import statistics

from meshplan.calibrate.layer_build import (SEED, _build, _deep_module, _end_amp, _free,
                                            _layer_amp, _layer_input, _oom_types,
                                            _set_recompute, allocatable_bytes)
from meshplan.calibrate.layer_grid import Config
from meshplan.calibrate.layer_ranks import _any_rank, _reduce
from meshplan.calibrate.layer_rows import cpu_values, end_values, layer_values
from meshplan.calibrate.layer_split import _fsdp_split_per_layer, _split_per_layer
from meshplan.calibrate.layer_timing import (WARMUP, _bad, _kept_bytes, _measure, _nbytes, _Queue,
                                             steady_cpu)
from meshplan.calibrate.sustained import sustained_ratio

CPU_DEEP_LAYERS = 4    # queued rows' CPU dispatch is timed again on this many blocks (8 Llama
#                        blocks overfill CUDA's launch queue: 2026-11-26, 2 x H200)
CPU_STEADY_LAYERS = 16  # or, host-bound rows, steady on up to this many (steady_cpu_layers)
STEADY_HOST_MARGIN = 1.1      # a row's CPU over its GPU time to be read steady
STEADY_PACED_MAX = 1.05       # the GPU's span over the CPU's for a steady reading to count
# the steady reading's windows and the idle seconds between them: spread over a few seconds,
# as a step's passes are, where one window reads the host's speed of that tenth of a second
STEADY_WINDOWS = 5
STEADY_GAP_S = 0.5
# a stack's state per parameter: fp32 weight and gradient, autocast's bf16 copy, fp8's copy
STACK_STATE_BYTES_PER_PARAM = 12


def _run_layer(cfg: Config, m, layers: int, device, *, iters: int, barrier,
               queue: _Queue | None = None, split_queued: bool = False, world: int = 1
               ) -> tuple[float, ...]:
    """(forward_s, backward_s, activation_bytes, backward_peak_bytes, backward_input_s,
    backward_weight_s, forward_cpu_s, backward_cpu_s, backward_input_cpu_s,
    backward_weight_cpu_s, samples failing the queue check) per layer; the split backward
    (zero-bubble) is measured for rows without communication (ZeRO-0, FSDP2 on 1 rank) and
    is 0 where torch's split backward is unavailable or ran out of memory
    (:func:`_row_split`): synchronized, or queued like the row with ``split_queued`` (then
    its CPU fields are set); the CPU fields are 0 without ``queue``, and for a layer that
    reads device values on the host (:attr:`Config.syncs_on_host`: timed synchronized)."""
    import torch

    cuda = device.type == "cuda"
    if cfg.syncs_on_host:
        queue = None       # a host read inside the pass would wait out the spin kernel
    x, grad, reset, forward, backward = _layer_step(cfg, m, device)
    if cfg.compile:
        # a fresh compilation per row, static shapes like the executor's one-setting run,
        # and no recompile limit reached over the grid (dynamo would fall back to eager);
        # the compilation happens in _measure's warm-up, outside the timed iterations
        import torch._dynamo
        torch._dynamo.reset()
    with _layer_amp(cfg, device):
        samples, out_bytes = _measure(forward, backward, reset, device=device, warmup=WARMUP,
                                      iters=iters, barrier=barrier, queue=queue)
        kept = None
        if cfg.zero == 0 and cuda:
            # FSDP2 rows keep the timed iterations' reading: their hooks expect a backward
            # the fresh input is allocated inside the reading (layer_values adds the input
            # once, as it must for the timed iterations' reading, where x lives outside)
            kept = _kept_bytes(lambda: m(torch.randn_like(x).requires_grad_()),
                               device) - _nbytes(x)
        split = (0.0, 0.0, 0.0, 0.0)
        if cfg.compile or cfg.precision == "fp8":
            # AOTAutograd compiles one backward; the fp8 linear computes both gradients in
            # one node (the executor refuses fp8 with zero-bubble): no split to time
            pass
        elif not cfg.communicates:
            split = _row_split(cfg, m, x, grad[0], layers, device, iters=iters,
                               barrier=barrier, queue=queue if split_queued else None,
                               forward=samples, world=world)
    held = 0.0
    if cfg.zero == 2 and cuda:
        # FSDP2 with reshard_after_forward=False keeps every block's unsharded bf16
        # parameters from forward to the end of its backward (DTensor numel is global).
        held = float(sum(p.numel() for p in m.parameters()) * 2)
    return (*layer_values(samples, layers=layers, input_bytes=_nbytes(x),
                          output_bytes=out_bytes, held_bytes=held, memory=cuda,
                          kept_bytes=kept), *split[:2], *cpu_values(samples, layers=layers),
            *split[2:], _bad(samples))


def _row_split(cfg: Config, m, x, grad, layers: int, device, *, iters: int, barrier,
               queue: _Queue | None, forward, world: int) -> tuple[float, ...]:
    """The row's split backward (:func:`_split_per_layer`, FSDP2's through
    :func:`_fsdp_split_per_layer`), or zeros — not measured — where it ran out of memory on
    some rank: B keeps the graph for W, so it can fail where the row's own passes fit, and
    the row is kept for the schedules that do not split (the ranks agree, as on a row)."""
    split, oom = (0.0, 0.0, 0.0, 0.0), 0.0
    fn = _split_per_layer if cfg.zero == 0 else _fsdp_split_per_layer
    try:
        split = fn(m, x, grad, layers, device, iters=iters, barrier=barrier, queue=queue,
                   forward=forward)
    except _oom_types():
        oom = 1.0
    if oom:
        _free(device)   # here, not in the handler: the failed pass's frames are gone
    return (0.0, 0.0, 0.0, 0.0) if _any_rank(bool(oom), device, world) else split


def _layer_step(cfg: Config, m, device):
    """(input, output-gradient holder, reset, forward, backward) timing ``m`` as ``cfg``."""
    import torch
    x = _layer_input(cfg, device)
    grad: list = []
    _set_recompute(m, cfg.recompute)

    def reset():
        x.grad = None        # the input gradient is the backward's product, not kept state

    def forward():
        return m(x)          # (mb, s, h)

    def backward(y):
        if not grad:
            grad.append(torch.randn_like(y))
        y.backward(grad[0])

    return x, grad, reset, forward, backward


def _sync_deep(cfg: Config, key, module, device, groups, *, iters: int, barrier,
               world: int):
    """A layer that syncs on the host (:attr:`Config.syncs_on_host`), timed synchronized
    again on :data:`CPU_DEEP_LAYERS` blocks: (build key, deep module to reuse, (forward,
    backward) GPU seconds per layer, the slowest rank's, or None where a rank ran out of
    memory). On request (``bench_layer_rows(sync_deep=True)``: ``benchmarks/
    moe_ep_rows_gpu.py --sync-deep``), logged beside the row, not stored: a synchronized row
    carries the host's dispatch up to each sync and the GPU's work after it in sequence,
    where a step overlaps one layer's tail with the next one's dispatch; how much of that a
    2-block row holds is what the deeper stack shows. moeh9's rows timed alone (2 × H200,
    post hoc): 4-block within 4 % of 2-block, so that overlap is small there; its
    calibration's compiled ep rows were inflated by something else (docs/benchmarks/moe_checks.md
    "moeh9")."""
    values, oom = [0.0, 0.0], 0.0
    try:
        module = _deep_module(cfg, key, module, CPU_DEEP_LAYERS, device, groups)
        if cfg.compile:
            import torch._dynamo
            torch._dynamo.reset()
        _, _, reset, forward, backward = _layer_step(cfg, module, device)
        with _layer_amp(cfg, device):
            samples, _ = _measure(forward, backward, reset, device=device, warmup=WARMUP,
                                  iters=iters, barrier=barrier)
        values = [statistics.median(x.forward_s for x in samples) / CPU_DEEP_LAYERS,
                  statistics.median(x.backward_s for x in samples) / CPU_DEEP_LAYERS]
    except _oom_types():
        oom = 1.0
    if oom:
        module = None
        _free(device)   # here, not in the handler: the failed pass's frames are gone
    lo = _reduce([*values, oom], [0, 1, 2], device, world)
    return cfg.build_key, module, (None if lo[2] else (lo[0], lo[1]))


def steady_cpu_layers(cfg: Config, *, row_cpu_s: float, row_gpu_s: float) -> int:
    """Blocks to read ``cfg``'s CPU dispatch on steady (:func:`_cpu_steady`), 0 for the
    queued :data:`CPU_DEEP_LAYERS`-block reading: steady where the row (``row_cpu_s`` /
    ``row_gpu_s``: its 2-block queued CPU and GPU seconds a layer) is host-bound by
    :data:`STEADY_HOST_MARGIN` — else the CPU runs ahead of the GPU, fills CUDA's launch
    queue and waits on it, and the reading is the GPU's — with more layers than
    :data:`CPU_DEEP_LAYERS` and no ZeRO-2/3 (FSDP2's hooks, not read so yet)."""
    depth = min(cfg.model.num_layers, CPU_STEADY_LAYERS)
    if depth <= CPU_DEEP_LAYERS or cfg.zero >= 2 or cfg.part:
        return 0
    return depth if row_cpu_s > STEADY_HOST_MARGIN * row_gpu_s > 0 else 0


def rank_layer_params(cfg: Config) -> float:
    """One rank's parameters of the layer ``cfg``'s row builds. An MoE model's rows build its
    MoE layer: the MoE MLP (routed and shared experts) counted over ``ep`` only — at etp 1
    tp does not cut the experts, and counting the shared one whole errs on the safe side —
    the rest over tp."""
    model = cfg.model
    if not model.is_moe:
        return model.layer_params() / cfg.tp
    layer = next(i for i in range(model.num_layers) if model.is_moe_layer(i))
    moe = model.moe_mlp_params()
    return (model.layer_params(layer) - moe) / cfg.tp + moe / cfg.ep


def steady_stack_fits(cfg: Config, layers: int, activation_bytes: float,
                      free_bytes: float) -> bool:
    """Whether ``layers`` blocks of ``cfg`` (their parameters' state,
    :data:`STACK_STATE_BYTES_PER_PARAM` a parameter of this tp rank's share, and
    ``activation_bytes`` a layer, the row's measured) fit in ``free_bytes``."""
    params = rank_layer_params(cfg)
    return layers * (STACK_STATE_BYTES_PER_PARAM * params + activation_bytes) <= free_bytes


def _cpu_steady(cfg: Config, key, module, layers: int, device, groups, *, iters: int,
                barrier, world: int, activation_bytes: float):
    """``cfg``'s forward / backward CPU dispatch per layer read steady on ``layers``
    blocks (:func:`~meshplan.calibrate.layer_timing.steady_cpu`, ``iters`` passes counted in
    each of :data:`STEADY_WINDOWS` windows :data:`STEADY_GAP_S` apart),
    averaged over ranks: (stack key, stack to reuse, (forward, backward) or None where
    any rank lacked the memory, ran out of it, or found the GPU pacing the passes)."""
    want = (cfg.build_key, layers)
    if key != want:
        module, key = None, None
        _free(device)
    fits = module is not None or steady_stack_fits(cfg, layers, activation_bytes,
                                                   allocatable_bytes(device))
    if _any_rank(not fits, device, world):
        return key, module, None
    values, bad = [0.0, 0.0], 0.0
    try:
        if module is None:
            module, _ = _build(cfg, layers, device, groups)
            key = want
        if cfg.compile:
            import torch._dynamo
            torch._dynamo.reset()
        _, _, reset, forward, backward = _layer_step(cfg, module, device)
        with _layer_amp(cfg, device):
            f, b, ratio = steady_cpu(forward, backward, reset, device=device, barrier=barrier,
                                     warmup=WARMUP, micro_batches=iters + 1,
                                     windows=STEADY_WINDOWS, gap_s=STEADY_GAP_S)
        values = [f / layers, b / layers]
        bad = float(ratio > STEADY_PACED_MAX)
    except _oom_types():
        bad = 1.0
        module, key = None, None
    if module is None:
        _free(device)   # here, not in the handler: the failed pass's frames are gone
    lo = _reduce([*values, bad], [2], device, world)
    return key, module, (None if lo[2] else (lo[0], lo[1]))


def _cpu_deep(cfg: Config, key, module, device, groups, queue: _Queue | None, *, iters: int,
              barrier, world: int, steady_layers: int = 0, activation_bytes: float = 0.0):
    """The row's forward / backward CPU dispatch per layer on a deeper stack, averaged over
    ranks: read steady on ``steady_layers`` blocks where given (:func:`steady_cpu_layers`)
    and it counts (:func:`_cpu_steady`), else queued on :data:`CPU_DEEP_LAYERS` blocks
    (built once per build key): (stack key, stack to reuse, (forward CPU, backward CPU,
    forward GPU, backward GPU, blocks) per layer — the GPU seconds 0 when read steady — or
    None where any rank ran out of memory or a sample failed the queue check).
    With the row's own 2-block timing the CPU times split a call into a per-call and a
    per-layer part (:func:`~meshplan.calibrate.layer_rows.cpu_fixed`); the GPU times are
    logged only: for FSDP2 rows they say how a layer's cost beside its neighbours' gathers
    and reduce-scatters changes with the stack (round 18 of docs/benchmarks/accuracy.md),
    for the cost model to use once measured sets show it helps."""
    if steady_layers:
        key, module, got = _cpu_steady(cfg, key, module, steady_layers, device, groups,
                                       iters=iters, barrier=barrier, world=world,
                                       activation_bytes=activation_bytes)
        if got is not None:
            return key, module, (*got, 0.0, 0.0, steady_layers)
    values, oom = [0.0] * 5, 0.0
    try:
        module = _deep_module(cfg, key, module, CPU_DEEP_LAYERS, device, groups)
        _, _, reset, forward, backward = _layer_step(cfg, module, device)
        with _layer_amp(cfg, device):
            samples, _ = _measure(forward, backward, reset, device=device, warmup=WARMUP,
                                  iters=iters, barrier=barrier, queue=queue)
        values = [*cpu_values(samples, layers=CPU_DEEP_LAYERS),
                  statistics.median(x.forward_s for x in samples) / CPU_DEEP_LAYERS,
                  statistics.median(x.backward_s for x in samples) / CPU_DEEP_LAYERS,
                  _bad(samples)]
    except _oom_types():
        oom = 1.0
    if oom:
        module = None
        _free(device)   # here, not in the handler: the failed pass's frames are gone
    lo = _reduce([*values, oom], [4, 5], device, world)
    if lo[4] or lo[5] or min(lo[:2]) <= 0:
        return cfg.build_key, module, None
    return cfg.build_key, module, (*lo[:4], CPU_DEEP_LAYERS)


def _end_step(cfg: Config, m, tp_group, device):
    """(input bytes, reset, forward, backward) timing the end ``m`` as ``cfg``."""
    import torch
    import torch.distributed as dist

    from meshplan.executor import tensor_parallel as tpm
    from meshplan.executor.model import cross_entropy as eager_cross_entropy
    cuda = device.type == "cuda"
    act = torch.bfloat16 if cuda else torch.float32
    mb, seq, h, vocab = cfg.micro_batch, cfg.seq_len, cfg.model.hidden_size, cfg.model.vocab_size
    gen = torch.Generator().manual_seed(SEED)
    targets = torch.randint(0, vocab, (mb, seq), generator=gen).to(device)
    grad: list = []
    if cfg.part == "embedding":
        ids = torch.randint(0, vocab, (mb, seq), generator=gen).to(device)

        def reset():
            pass

        def forward():
            return m(ids)                            # (mb, s or s/tp, h)

        def backward(y):
            if not grad:
                grad.append(torch.randn_like(y))
            y.backward(grad[0])
        return 0.0, reset, forward, backward
    if cfg.compile and cfg.tp == 1:    # as ParallelTrainer with Layout.compile
        from meshplan.executor.parallelize import compiled_cross_entropy
        cross_entropy = compiled_cross_entropy()
    else:
        cross_entropy = eager_cross_entropy
    s = seq // cfg.tp if cfg.sequence_parallel else seq
    x = torch.randn(mb, s, h, device=device, dtype=act, requires_grad=True)
    # as ParallelTrainer.vocab_start: this tp rank's first vocabulary row
    vocab_start = dist.get_rank(tp_group) * (vocab // cfg.tp) if cfg.tp > 1 else 0

    def reset():
        x.grad = None

    def forward():
        logits = m(x)                                # (mb, s, V/tp)
        if cfg.tp > 1:
            return tpm.vocab_parallel_cross_entropy(logits, targets, vocab_start, tp_group)
        return cross_entropy(logits, targets)

    def backward(loss):
        loss.backward()
    return _nbytes(x), reset, forward, backward


def _run_end(cfg: Config, m, tp_group, device, *, iters: int, barrier,
             queue: _Queue | None = None) -> tuple[float, ...]:
    """(forward_s, backward_s, activation_bytes, peak_bytes, forward_cpu_s, backward_cpu_s)."""
    cuda = device.type == "cuda"
    input_bytes, reset, forward, backward = _end_step(cfg, m, tp_group, device)
    with _end_amp(device):
        samples, out_bytes = _measure(forward, backward, reset, device=device, warmup=WARMUP,
                                      iters=iters, barrier=barrier, queue=queue)
        kept = _kept_bytes(forward, device) if cuda else None
    return (*end_values(samples, input_bytes=input_bytes, output_bytes=out_bytes, memory=cuda,
                        kept_bytes=kept), *cpu_values(samples), _bad(samples))


def _run_sustained(cfg: Config, m, tp_group, layers: int, device, *, burst_pass_s: float,
                   burst_cpu_s: float, world: int, heat_s: float, time_s: float
                   ) -> tuple[float, dict] | None:
    """:func:`meshplan.calibrate.sustained.sustained_ratio` of a built row's module at
    ``cfg`` (``burst_pass_s`` / ``burst_cpu_s``: the row's forward + backward GPU seconds and
    CPU dispatch per layer, or per end), averaged over ranks as the rows' times are; None
    where the loop ran out of memory on some rank (the ranks agree, as on a row)."""
    def loop() -> tuple[float, dict]:
        if cfg.part:
            _, reset, forward, backward = _end_step(cfg, m, tp_group, device)
            amp, stack = _end_amp(device), 1
        else:
            _, _, reset, forward, backward = _layer_step(cfg, m, device)
            amp, stack = _layer_amp(cfg, device), layers
        with amp:
            return sustained_ratio(
                forward, backward, reset, device=device, burst_pass_s=burst_pass_s * stack,
                burst_cpu_s=burst_cpu_s * stack, heat_s=heat_s, time_s=time_s,
                agree_max=lambda v: _reduce(v, range(len(v)), device, world))

    (ratio, info), oom = (1.0, {}), 0.0
    try:
        ratio, info = loop()
    except _oom_types():
        oom = 1.0
    if oom:
        _free(device)   # here, not in the handler: the loop's frame and tensors are gone
    ratio, oom = _reduce([ratio, oom], [1], device, world)
    return None if oom else (ratio, info)
