"""Layer-level benchmarks: the executor's own transformer blocks and ends, timed per layer.

For every model, sequence length and parallel setting that the cost model looks up
(:mod:`meshplan.costmodel.measured`), the executor's modules are built exactly as
:class:`meshplan.executor.parallelize.ParallelTrainer` builds them — ``Transformer`` on the
meta device, :meth:`~meshplan.executor.model.Transformer.keep_part`, ``init_weights``,
:func:`~meshplan.executor.tensor_parallel.apply_tensor_parallel`, the recomputation flags
and, for ZeRO-2/3, :func:`~meshplan.executor.data_parallel.wrap_data_parallel` (FSDP2) — and
one micro-batch's forward and backward is timed. Every unfused element-wise kernel, every
tensor-parallel collective issued from Python and FSDP2's per-block hooks are in the time;
that is what the isolated GEMM/attention curves miss.

Row semantics (one GPU, one micro-batch; every rank runs the same configuration at the
same time, the slowest rank's median is kept, memory is the largest over ranks):

* layers (``L`` = :data:`LAYERS_CUDA` blocks on GPU, :data:`LAYERS_CPU` on CPU):
  ``forward_s`` / ``backward_s`` = median time of the L-block forward / backward over L
  (backward includes recomputation and, for FSDP rows, the gradient reduce-scatter and
  ZeRO-3 re-gathers); ``activation_bytes`` = (allocated after forward − before − the
  output + the input) / L: what one layer keeps for its backward *including its own input*
  (the part's input was allocated before the forward and the last block's output is
  nobody's saved tensor, so a part of L layers would otherwise count L − 1 inputs; this
  matches the per-layer convention of Korthikanti et al. 2022, arXiv 2205.05198, Table 2,
  whose 2sbh-per-layer "full recompute" term is the layer's input). For ZeRO-2 rows the
  unsharded bf16 parameters FSDP2 keeps from forward to backward are subtracted too: they
  are held once per stage, not per micro-batch in flight.
  ``backward_peak_bytes`` = peak allocated during forward + backward − allocated after
  forward (not divided by L: the working memory of the one layer whose backward is
  running — recomputed activations, gradients in flight, FSDP2 unsharded gradients).
  ``backward_input_s`` / ``backward_weight_s`` (ZeRO-0 rows only; 0 = not measured): the
  zero-bubble schedule's split backward of the same L blocks over L, run by
  torch.distributed.pipelining's own functions (:mod:`meshplan.calibrate.bench_split`).
* ends: ``embedding`` = the token embedding (+ learned positions) of the first stage;
  ``output`` = final norm, logits and the loss (vocabulary-parallel cross-entropy for
  tp > 1, as ``ParallelTrainer.loss_fn``) of the last stage. ``activation_bytes`` = allocated
  after forward − before − the output (embedding: the hidden state, which the first layer
  counts; output: the loss scalar) + the input for the output part (its input is the last
  layer's output, which no layer counts). ``peak_bytes`` = peak − allocated after forward.

On CPU (tests, gloo) the times are wall-clock medians and the memory fields are 0.
"""

from __future__ import annotations

import gc
import statistics
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from meshplan.calibrate.shapes import valid_tps
from meshplan.costmodel.measured import MeasuredEnd, MeasuredLayer, ends_shape_key, layer_shape_key
from meshplan.costmodel.specs import ModelSpec
from meshplan.errors import ConfigError

LAYERS_CUDA = 4
LAYERS_CPU = 2
RECOMPUTE = ("none", "selective", "full")
FSDP_ZERO = (2, 3)
WARMUP = 2            # the first iteration allocates the parameter gradients
ITERS, ITERS_QUICK = 5, 3
SEED = 0


@dataclass(frozen=True, kw_only=True)
class Config:
    """One row to measure. ``part`` "" = transformer layers, else an end."""

    model: ModelSpec
    seq_len: int
    tp: int
    sequence_parallel: bool
    micro_batch: int
    recompute: str = "none"
    zero: int = 0
    dp: int = 1
    part: str = ""

    @property
    def build_key(self) -> tuple:
        """Configurations with the same key share one built module (recompute flags and
        the micro-batch change nothing in the parameters)."""
        return (self.model.name, self.model, self.seq_len, self.part, self.tp,
                self.sequence_parallel, self.zero, self.dp)

    def label(self) -> str:
        what = self.part or "layer"
        par = f"tp{self.tp}{' sp' if self.sequence_parallel else ''}"
        if self.zero:
            par = f"zero{self.zero} dp{self.dp}"
        rc = f" rc={self.recompute}" if not self.part else ""
        return f"{what} {self.model.name} s{self.seq_len} {par}{rc} mb{self.micro_batch}"


def _tp_sp(model: ModelSpec, seq: int, world: int, max_tp: int) -> list[tuple[int, bool]]:
    out = []
    for tp in valid_tps(model, min(world, max_tp)):
        if world % tp:
            continue
        out.append((tp, False))
        if tp > 1 and seq % tp == 0:
            out.append((tp, True))
    return out


def plan_grid(models: Sequence[ModelSpec], seq_len: int | None, world: int, *, quick: bool,
              max_tp: int = 8) -> list[Config]:
    """Every configuration, in run order (grouped by :attr:`Config.build_key`)."""
    out: list[Config] = []
    mbs = (1, 2) if quick else (1, 2, 4)
    for model in models:
        seq = seq_len or model.max_seq_len
        if seq > model.max_seq_len:
            raise ConfigError(f"--seq-len {seq} exceeds {model.name}'s max_seq_len "
                              f"{model.max_seq_len}; the executor cannot run it")
        tpsp = _tp_sp(model, seq, world, max_tp)
        for tp, sp in tpsp:
            for rc in RECOMPUTE:
                for mb in mbs:
                    out.append(Config(model=model, seq_len=seq, tp=tp, sequence_parallel=sp,
                                      recompute=rc, micro_batch=mb))
        for zero in FSDP_ZERO if world > 1 else ():
            for dp in (d for d in range(2, world + 1) if world % d == 0):
                for rc in RECOMPUTE:
                    for mb in (1, 2):
                        out.append(Config(model=model, seq_len=seq, tp=1,
                                          sequence_parallel=False, recompute=rc,
                                          micro_batch=mb, zero=zero, dp=dp))
        for part in ("embedding", "output"):
            for tp, sp in tpsp:
                if model.vocab_size % tp:
                    continue   # apply_tensor_parallel splits the vocabulary over tp
                for mb in mbs:
                    out.append(Config(model=model, seq_len=seq, tp=tp, sequence_parallel=sp,
                                      micro_batch=mb, part=part))
    return out


# ---- per-row arithmetic (pure; unit-tested) --------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """One timed iteration: seconds and allocator readings in bytes (0 on CPU)."""

    forward_s: float
    backward_s: float
    mem_before: float = 0.0
    mem_after_forward: float = 0.0
    mem_peak: float = 0.0


def layer_values(samples: Sequence[Sample], *, layers: int, input_bytes: float,
                 output_bytes: float, held_bytes: float = 0.0, memory: bool = True
                 ) -> tuple[float, float, float, float]:
    """(forward_s, backward_s, activation_bytes, backward_peak_bytes) per layer of an
    ``layers``-block part; see the module docstring for the definitions. ``held_bytes``:
    memory kept from forward to backward that is not per micro-batch (ZeRO-2's unsharded
    parameters)."""
    fwd = statistics.median(s.forward_s for s in samples) / layers
    bwd = statistics.median(s.backward_s for s in samples) / layers
    if not memory:
        return fwd, bwd, 0.0, 0.0
    kept = max(s.mem_after_forward - s.mem_before for s in samples)
    act = max(0.0, kept - output_bytes + input_bytes - held_bytes) / layers
    peak = max(0.0, max(s.mem_peak - s.mem_after_forward for s in samples))
    return fwd, bwd, act, peak


def end_values(samples: Sequence[Sample], *, input_bytes: float, output_bytes: float,
               memory: bool = True) -> tuple[float, float, float, float]:
    """(forward_s, backward_s, activation_bytes, peak_bytes) of an embedding / output part.
    ``input_bytes``: the hidden state entering the output part (0 for the embedding)."""
    fwd = statistics.median(s.forward_s for s in samples)
    bwd = statistics.median(s.backward_s for s in samples)
    if not memory:
        return fwd, bwd, 0.0, 0.0
    kept = max(s.mem_after_forward - s.mem_before for s in samples)
    act = max(0.0, kept - output_bytes + input_bytes)
    peak = max(0.0, max(s.mem_peak - s.mem_after_forward for s in samples))
    return fwd, bwd, act, peak


def layer_row(cfg: Config, values: Sequence[float]) -> dict[str, Any]:
    """``values``: forward_s, backward_s, activation_bytes, backward_peak_bytes and
    optionally the split backward's input- and weight-gradient seconds (0: not measured)."""
    fwd, bwd, act, peak, b_in, b_w = (*values, 0.0, 0.0)[:6]
    return asdict(MeasuredLayer(
        shape=layer_shape_key(cfg.model), seq_len=cfg.seq_len, tp=cfg.tp,
        sequence_parallel=cfg.sequence_parallel, recompute=cfg.recompute,
        micro_batch=cfg.micro_batch, zero=cfg.zero, dp=cfg.dp, forward_s=float(fwd),
        backward_s=float(bwd), activation_bytes=float(act), backward_peak_bytes=float(peak),
        model=cfg.model.name, backward_input_s=float(b_in), backward_weight_s=float(b_w)))


def end_row(cfg: Config, values: Sequence[float]) -> dict[str, Any]:
    fwd, bwd, act, peak = values
    return asdict(MeasuredEnd(
        shape=ends_shape_key(cfg.model), part=cfg.part, seq_len=cfg.seq_len, tp=cfg.tp,
        sequence_parallel=cfg.sequence_parallel, micro_batch=cfg.micro_batch,
        forward_s=float(fwd), backward_s=float(bwd), activation_bytes=float(act),
        peak_bytes=float(peak), model=cfg.model.name))


# ---- torch side --------------------------------------------------------------------------
class _Groups:
    """Process groups, created on first use. Every rank walks the same grid, so every rank
    creates every group in the same order (``new_group`` is collective)."""

    def __init__(self, world: int, rank: int, device_type: str):
        self.world, self.rank, self.device_type = world, rank, device_type
        self._tp: dict[int, Any] = {}
        self._dp: dict[int, Any] = {}

    def tp(self, size: int):
        import torch.distributed as dist
        if size == 1:
            return None
        if size not in self._tp:
            mine = None
            for start in range(0, self.world, size):   # consecutive ranks, as the mesh's tp
                g = dist.new_group(list(range(start, start + size)))
                if start <= self.rank < start + size:
                    mine = g
            self._tp[size] = mine
        return self._tp[size]

    def dp_mesh(self, size: int):
        if size not in self._dp:
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh(self.device_type, (self.world // size, size),
                                    mesh_dim_names=("rep", "dp"))
            self._dp[size] = mesh["dp"]
        return self._dp[size]


@dataclass(frozen=True)
class _DPGroups:
    """The two attributes of MeshGroups that wrap_data_parallel reads for ZeRO-2/3."""

    dp_mesh: Any
    dp: int


def _layer_spec(model: ModelSpec, layers: int, tp: int) -> ModelSpec:
    # The vocabulary does not reach a layers-only part, but apply_tensor_parallel checks
    # that tp divides it: round it up so every valid layer tp can be measured.
    vocab = -(-model.vocab_size // tp) * tp
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
    m.to_empty(device=device)
    m.init_weights(SEED)
    tp_group = groups.tp(cfg.tp)
    if cfg.tp > 1:
        apply_tensor_parallel(m, tp_group, sequence_parallel=cfg.sequence_parallel)
    m.activation_dtype = torch.bfloat16 if cuda else None
    if cfg.zero >= 2:
        m = wrap_data_parallel(m, zero=cfg.zero, groups=_DPGroups(groups.dp_mesh(cfg.dp), cfg.dp),
                               device=device, bf16=cuda, pipelined=False)
    return m, tp_group


def _set_recompute(m, recompute: str) -> None:
    for block in m.layers.values():
        block.recompute_block = recompute == "full"
        block.attn.recompute_core = recompute == "selective"


def _nbytes(t) -> float:
    return float(t.numel() * t.element_size())


def _measure(forward: Callable[[], Any], backward: Callable[[Any], None],
             reset: Callable[[], None], *, device, warmup: int, iters: int, barrier
             ) -> tuple[list[Sample], float]:
    """Warm-up, then ``iters`` timed iterations; returns the samples and the output's bytes."""
    import torch
    cuda = device.type == "cuda"
    samples: list[Sample] = []
    out_bytes = 0.0
    for i in range(warmup + iters):
        reset()
        barrier()
        if cuda:
            torch.cuda.synchronize(device)
            mem0 = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            e0.record()
            y = forward()
            e1.record()
            mem1 = torch.cuda.memory_allocated(device)   # allocations are made at dispatch
            backward(y)
            e2.record()
            e2.synchronize()
            peak = torch.cuda.max_memory_allocated(device)
            s = Sample(e0.elapsed_time(e1) / 1e3, e1.elapsed_time(e2) / 1e3,
                       float(mem0), float(mem1), float(peak))
        else:
            t0 = time.perf_counter()
            y = forward()
            t1 = time.perf_counter()
            backward(y)
            t2 = time.perf_counter()
            s = Sample(t1 - t0, t2 - t1)
        out_bytes = _nbytes(y)
        del y
        if i >= warmup:
            samples.append(s)
    return samples, out_bytes


def _run_layer(cfg: Config, m, layers: int, device, *, iters: int, barrier
               ) -> tuple[float, ...]:
    """(forward_s, backward_s, activation_bytes, backward_peak_bytes, backward_input_s,
    backward_weight_s) per layer; the last two (zero-bubble's split backward) are measured
    for ZeRO-0 rows only and are 0 where torch's split backward is unavailable."""
    import torch

    from meshplan.calibrate.bench_split import split_backward_s
    cuda = device.type == "cuda"
    act = torch.bfloat16 if cuda else torch.float32
    h = cfg.model.hidden_size
    s = cfg.seq_len // cfg.tp if cfg.sequence_parallel else cfg.seq_len
    x = torch.randn(cfg.micro_batch, s, h, device=device, dtype=act, requires_grad=True)
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

    # ZeRO-0/1 run the whole step under one autocast, so the bf16 weight copies are cast
    # once per step and cached: one context over warm-up and timed iterations does the same.
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda and cfg.zero < 2 else nullcontext()
    split = None
    with amp:
        samples, out_bytes = _measure(forward, backward, reset, device=device, warmup=WARMUP,
                                      iters=iters, barrier=barrier)
        if cfg.zero == 0:
            def fresh():
                xi = torch.randn_like(x).requires_grad_()
                return m(xi), grad[0], xi                # (mb, s, h) output, its grad, input
            barrier()
            split = split_backward_s(fresh, list(m.parameters()), device=device, iters=iters)
    b_in, b_w = (t / layers for t in split) if split else (0.0, 0.0)
    held = 0.0
    if cfg.zero == 2 and cuda:
        # FSDP2 with reshard_after_forward=False keeps every block's unsharded bf16
        # parameters from forward to the end of its backward (DTensor numel is global).
        held = float(sum(p.numel() for p in m.parameters()) * 2)
    return (*layer_values(samples, layers=layers, input_bytes=_nbytes(x),
                          output_bytes=out_bytes, held_bytes=held, memory=cuda), b_in, b_w)


def _run_end(cfg: Config, m, tp_group, device, *, iters: int, barrier
             ) -> tuple[float, float, float, float]:
    import torch
    import torch.distributed as dist

    from meshplan.executor import tensor_parallel as tpm
    from meshplan.executor.model import cross_entropy
    cuda = device.type == "cuda"
    act = torch.bfloat16 if cuda else torch.float32
    mb, seq, h, vocab = cfg.micro_batch, cfg.seq_len, cfg.model.hidden_size, cfg.model.vocab_size
    gen = torch.Generator().manual_seed(SEED)
    targets = torch.randint(0, vocab, (mb, seq), generator=gen).to(device)
    grad: list = []
    input_bytes = 0.0
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
    else:
        s = seq // cfg.tp if cfg.sequence_parallel else seq
        x = torch.randn(mb, s, h, device=device, dtype=act, requires_grad=True)
        input_bytes = _nbytes(x)
        # as ParallelTrainer.vocab_start: this tp rank's first vocabulary row
        vocab_start = dist.get_rank(tp_group) * (vocab // cfg.tp) if cfg.tp > 1 else 0

        def reset():
            x.grad = None

        def forward():
            logits = m(x)                            # (mb, s, V/tp)
            if cfg.tp > 1:
                return tpm.vocab_parallel_cross_entropy(logits, targets, vocab_start, tp_group)
            return cross_entropy(logits, targets)

        def backward(loss):
            loss.backward()

    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()
    with amp:
        samples, out_bytes = _measure(forward, backward, reset, device=device, warmup=WARMUP,
                                      iters=iters, barrier=barrier)
    return end_values(samples, input_bytes=input_bytes, output_bytes=out_bytes, memory=cuda)


def _reduce_max(values: Iterable[float], device, world: int) -> list[float]:
    import torch
    import torch.distributed as dist
    vals = list(values)
    if world == 1 or not dist.is_initialized():
        return vals
    t = torch.tensor(vals, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _free(device) -> None:
    import torch
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _oom_types() -> tuple[type, ...]:
    import torch
    return (torch.cuda.OutOfMemoryError,)


def bench_layer_rows(models: Sequence[ModelSpec], seq_len: int | None, device, world: int,
                     rank: int, *, quick: bool, progress=None, max_tp: int = 8
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Measure every configuration of :func:`plan_grid`; returns (layer rows, end rows),
    dicts with exactly the fields of ``MeasuredLayer`` / ``MeasuredEnd``.

    Collective over the world: every rank must call it with the same arguments. A
    configuration that runs out of GPU memory on any rank is skipped on all of them.
    """
    import torch.distributed as dist
    grid = plan_grid(models, seq_len, world, quick=quick, max_tp=max_tp)
    layers = LAYERS_CUDA if device.type == "cuda" and not quick else LAYERS_CPU
    iters = ITERS_QUICK if quick else ITERS
    groups = _Groups(world, rank, device.type)
    barrier = dist.barrier if world > 1 and dist.is_initialized() else (lambda: None)
    layer_rows: list[dict[str, Any]] = []
    end_rows: list[dict[str, Any]] = []
    built_key, module, tp_group = None, None, None
    oom_at: set[tuple] = set()     # (build key, recompute) whose smaller micro-batch ran out
    for cfg in grid:
        if cfg.build_key != built_key:
            module = tp_group = None
            _free(device)
            built_key = cfg.build_key
        if (cfg.build_key, cfg.recompute) in oom_at:   # every rank agreed on that OOM
            _step(progress, f"{cfg.label()}: skipped (a smaller micro-batch ran out of memory)")
            continue
        values, oom = [0.0] * (4 if cfg.part else 6), 0.0
        try:
            if module is None:
                module, tp_group = _build(cfg, layers, device, groups)
            if cfg.part:
                values = list(_run_end(cfg, module, tp_group, device, iters=iters,
                                       barrier=barrier))
            else:
                values = list(_run_layer(cfg, module, layers, device, iters=iters,
                                         barrier=barrier))
        except _oom_types():
            oom = 1.0
        if oom:
            module = tp_group = None    # FSDP/autograd state of a failed step: rebuild
            _free(device)
        *values, oom = _reduce_max([*values, oom], device, world)
        if oom:
            oom_at.add((cfg.build_key, cfg.recompute))
            module = None
            _free(device)
            _step(progress, f"{cfg.label()}: out of memory on some rank, skipped")
            continue
        if cfg.part:
            end_rows.append(end_row(cfg, values))
        else:
            layer_rows.append(layer_row(cfg, values))
        _step(progress, f"{cfg.label()}: fwd {values[0] * 1e3:.3f} ms, bwd {values[1] * 1e3:.3f}"
                        f" ms{' per layer' if not cfg.part else ''}"
                        + (f", act {values[2] / 2**20:.1f} MiB" if device.type == "cuda" else "")
                        + (f", split B {values[4] * 1e3:.3f} / W {values[5] * 1e3:.3f} ms"
                           if not cfg.part and values[4] > 0 else ""))
    module = tp_group = None
    _free(device)
    return layer_rows, end_rows


def _step(progress, message: str) -> None:
    if progress is not None:
        progress.step(message)


__all__ = ["Config", "Sample", "plan_grid", "layer_values", "end_values", "layer_row",
           "end_row", "bench_layer_rows", "LAYERS_CUDA", "LAYERS_CPU"]
