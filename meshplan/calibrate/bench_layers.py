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
same time; times are the mean over ranks of each rank's median, memory the largest over
ranks; the whole grid is measured :data:`ROUNDS_CUDA` times (``--rounds``; fewer where
``--time-budget`` stops them, :mod:`meshplan.calibrate.budget`), spread over the run, and
each time is the median over rounds):

* layers (``L`` = :data:`LAYERS_CUDA` blocks on GPU, :data:`LAYERS_CPU` on CPU):
  ``forward_s`` / ``backward_s`` = GPU-busy time of the L-block forward / backward over L,
  timed *queued*: a spin kernel holds the stream while the CPU dispatches the whole
  forward and backward, so the CUDA events see the GPU alone (checked per iteration; see
  :class:`_Queue`). Backward includes recomputation and, for FSDP rows, the gradient
  reduce-scatter and ZeRO-3 re-gathers. ``forward_cpu_s`` / ``backward_cpu_s`` = the CPU's
  dispatch time of the same calls over L (pooled over the micro-batch sizes of a setting,
  :func:`pooled_cpu`). A step costs about max(Σ CPU, Σ GPU) because the CPU runs ahead of
  the GPU; the cost model takes both (:mod:`meshplan.costmodel.estimate`).
  ``activation_bytes`` = (what a *second* forward of a fresh input keeps alive, that input
  included, − its output) / L: what one more micro-batch in flight costs, *including the
  layer's own input once* (the last block's output is nobody's saved tensor — a pipeline
  stage keeps it apart, ``costmodel.estimate.pipeline_kept_outputs``; this matches the
  per-layer convention of Korthikanti et al. 2022, arXiv 2205.05198, Table 2, whose
  2sbh-per-layer "full recompute" term is the layer's input). Profile version 1 added the
  input a second time (``hardware_profiles.calibrated._v1_layer_row`` corrects it). The
  first forward of a step also fills one-time caches (autocast's 16-bit weight copies),
  which the cost model counts once per step; FSDP rows keep the timed iterations'
  allocator difference, with ZeRO-2's unsharded bf16 parameters subtracted (held once per
  stage, not per micro-batch in flight).
  ``backward_peak_bytes`` = peak allocated during forward + backward − allocated after
  forward (not divided by L: the working memory of the one layer whose backward is
  running — recomputed activations, gradients in flight, FSDP2 unsharded gradients).
  ``backward_input_s`` / ``backward_weight_s`` (ZeRO-0 rows and FSDP2's 1-rank rows, whose
  timed passes do not communicate; 0 = not measured): the
  zero-bubble schedule's split backward of the same L blocks over L, run by
  torch.distributed.pipelining's own functions (:mod:`meshplan.calibrate.bench_split`),
  synchronized timings (``--split-timing queued``: GPU-busy, with their CPU dispatch in
  ``backward_input_cpu_s`` / ``backward_weight_cpu_s``; run on 2 and 4 × H200 in rounds 5-7).
  ``split_layers`` = that L, and ``backward_input_depth_s`` / ``backward_weight_depth_s`` =
  how much B and W per layer grow per extra layer in the stack, from the split timed
  synchronized on L (the row itself, or again right before when the row was queued) and on
  :data:`SPLIT_DEEP_LAYERS` blocks (first round only, so that it is there however many
  rounds run). W grows because ``stage_backward_weight`` makes one ``torch.autograd.grad``
  call per parameter group, and each call's engine walks the whole graph reachable from
  its roots — the rest of the stage — first (``compute_dependencies``): the CPU cost of a
  stage's W is quadratic in its layers (tiny Llama blocks on one CPU thread, torch 2.13:
  W per layer 0.47 ms on 2 blocks, 0.70 on 6, 1.03 on 12 — linear in the depth).
* ends: ``embedding`` = the token embedding (+ learned positions) of the first stage;
  ``output`` = final norm, logits and the loss (vocabulary-parallel cross-entropy for
  tp > 1, as ``ParallelTrainer.loss_fn``) of the last stage. ``activation_bytes`` = allocated
  after forward − before − the output (embedding: the hidden state, which the first layer
  counts; output: the loss scalar) + the input for the output part (its input is the last
  layer's output, which no layer counts), from a second forward as for layers.
  ``peak_bytes`` = peak − allocated after forward. Times and CPU fields as for layers.

On CPU (tests, gloo) the times are synchronized wall-clock medians, one round, and the
memory and CPU fields are 0.
"""

from __future__ import annotations

import gc
import statistics
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from meshplan.calibrate.budget import RoundBudget, next_round
from meshplan.calibrate.shapes import valid_tps
from meshplan.calibrate.stats import two_depth_fit
from meshplan.costmodel.measured import MeasuredEnd, MeasuredLayer, ends_shape_key, layer_shape_key
from meshplan.spec import ModelSpec
from meshplan.errors import ConfigError, require_positive_int

LAYERS_CUDA = 2       # queued behind one spin kernel: few enough for the launch queue
LAYERS_CPU = 2
RECOMPUTE = ("none", "selective", "full")
FSDP_ZERO = (2, 3)
WARMUP = 2            # the first iteration allocates the parameter gradients
ITERS, ITERS_QUICK = 4, 3
ROUNDS_CUDA = 3       # the grid is measured this many times, spread over the calibration
# A longer spin cannot help: when thousands of kernels are queued, CUDA's launch queue fills
# and the CPU waits for the GPU whatever the spin (seen with zero-bubble's weight pass of a
# fully recomputed 6-block stack queued, 2026-11-26: tripling without a bound ran for minutes)
SPIN_MAX_S = 2.0
SPLIT_DEEP_LAYERS = 6  # zero-bubble's split backward is timed again on this many blocks
NO_SPLIT_MEMORY = (0.0, 0.0, 0, 0.0, 0.0)  # split_memory_stage where nothing was measured
CPU_DEEP_LAYERS = 4    # queued rows' CPU dispatch is timed again on this many blocks (8 Llama
#                        blocks overfill CUDA's launch queue: 2026-11-26, 2 x H200)
MEMORY_FIELDS = (2, 3)  # indices of the byte fields in a row's values (the rest: seconds)
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
    compile: bool = False      # every block torch.compile'd, as Layout.compile runs them

    @property
    def communicates(self) -> bool:
        """FSDP2 over dp > 1: gathers and reduce-scatters inside the timed passes (the
        split backward of zero-bubble is timed only on rows that do not)."""
        return self.zero >= 2 and self.dp > 1

    @property
    def build_key(self) -> tuple:
        """Configurations with the same key share one built module (recompute flags and
        the micro-batch change nothing in the parameters)."""
        return (self.model.name, self.model, self.seq_len, self.part, self.tp,
                self.sequence_parallel, self.zero, self.dp, self.compile)

    def label(self) -> str:
        what = self.part or "layer"
        par = f"tp{self.tp}{' sp' if self.sequence_parallel else ''}"
        if self.zero:
            par = f"zero{self.zero} dp{self.dp}" + (f" {par}" if self.tp > 1 else "")
        rc = f" rc={self.recompute}" if not self.part else ""
        return (f"{what} {self.model.name} s{self.seq_len} {par}{rc} mb{self.micro_batch}"
                + (" compiled" if self.compile else ""))


def _tp_sp(model: ModelSpec, seq: int, world: int, max_tp: int) -> list[tuple[int, bool]]:
    out = []
    for tp in valid_tps(model, min(world, max_tp)):
        if world % tp:
            continue
        out.append((tp, False))
        if tp > 1 and seq % tp == 0:
            out.append((tp, True))
    return out


def micro_batch_sizes(quick: bool, micro_batches: Sequence[int] | None = None
                      ) -> tuple[int, ...]:
    """The micro-batch sizes the layer tables are timed at, ascending and distinct
    (default 1, 2, 4; quick 1, 2). Choose them around the micro-batches you will plan with:
    between measured sizes the cost model interpolates, beyond them it extrapolates."""
    if micro_batches is None:
        return (1, 2) if quick else (1, 2, 4)
    bad = [m for m in micro_batches if not isinstance(m, int) or m < 1]
    if bad or not micro_batches:
        raise ConfigError(f"micro-batch sizes must be integers >= 1, got {list(micro_batches)}")
    return tuple(sorted(set(micro_batches)))


def plan_grid(models: Sequence[ModelSpec], seq_len: int | None, world: int, *, quick: bool,
              max_tp: int = 8, micro_batches: Sequence[int] | None = None,
              compile_rows: Sequence[str] = ()) -> list[Config]:
    """Every configuration, in run order (grouped by :attr:`Config.build_key`). FSDP2 rows
    (ZeRO-2/3 over dp) are timed at the two smallest micro-batch sizes only. ``compile_rows``:
    the recompute modes whose plain rows (every tp, SP and micro-batch) are also timed with
    their blocks compiled (timed in the first round only: :func:`bench_layer_rows`).

    The order puts what a model's estimates need most first, for every model before the
    next kind: each model's plain rows and its ends, then each model's compiled rows, its
    FSDP2 rows, then FSDP2's compute alone. A calibration that its ``--time-budget`` stops
    inside a round (:func:`bench_layer_rows`) then holds the basic rows of every model rather
    than every row of the first."""
    phases: list[list[Config]] = [[], [], [], [], []]
    mbs = micro_batch_sizes(quick, micro_batches)
    for model in models:
        seq = seq_len or model.max_seq_len
        if seq > model.max_seq_len:
            raise ConfigError(f"--seq-len {seq} exceeds {model.name}'s max_seq_len "
                              f"{model.max_seq_len}; the executor cannot run it")
        tpsp = _tp_sp(model, seq, world, max_tp)
        for tp, sp in tpsp:
            for rc in RECOMPUTE:
                for mb in mbs:
                    phases[0].append(Config(model=model, seq_len=seq, tp=tp,
                                            sequence_parallel=sp, recompute=rc,
                                            micro_batch=mb))
        for part in ("embedding", "output"):
            for tp, sp in tpsp:
                if model.vocab_size % tp:
                    continue   # apply_tensor_parallel splits the vocabulary over tp
                for mb in mbs:
                    phases[1].append(Config(model=model, seq_len=seq, tp=tp,
                                            sequence_parallel=sp, micro_batch=mb, part=part))
        for tp, sp in tpsp:
            for rc in (r for r in RECOMPUTE if r in compile_rows):
                for mb in mbs:
                    phases[2].append(Config(model=model, seq_len=seq, tp=tp,
                                            sequence_parallel=sp, recompute=rc,
                                            micro_batch=mb, compile=True))
        # FSDP2 over dp, of plain (tp 1) and of tensor-parallel layers (a (dp, tp) mesh as
        # the executor's: holdout8's FSDP-over-tp layouts ran 22-48 % slower than rows
        # composed from tp 1's FSDP increment predicted)
        for zero in FSDP_ZERO if world > 1 else ():
            for tp, sp in [(1, False)] + [x for x in tpsp if x[0] > 1]:
                for dp in (d for d in range(2, world // tp + 1) if world % (d * tp) == 0):
                    for rc in RECOMPUTE:
                        for mb in mbs[:2]:
                            phases[3].append(Config(model=model, seq_len=seq, tp=tp,
                                                    sequence_parallel=sp, recompute=rc,
                                                    micro_batch=mb, zero=zero, dp=dp))
        # FSDP2's compute alone: ZeRO-2 on a 1-rank mesh runs the executor's bf16 parameters
        # without autocast and without gather or reduce-scatter. A pipeline's ZeRO-2 stage
        # gathers once per step, so its layers run at this speed: not the plain rows'
        # (autocast: GPT-0.54B's LayerNorms in fp32, 6-12 % slower) nor the FSDP rows'
        # (their per-micro-batch communication included; round 18 of
        # docs/benchmarks/accuracy.md)
        for rc in RECOMPUTE if world > 1 else ():
            for mb in mbs:
                phases[4].append(Config(model=model, seq_len=seq, tp=1, sequence_parallel=False,
                                        recompute=rc, micro_batch=mb, zero=2, dp=1))
    return [c for phase in phases for c in phase]


# ---- per-row arithmetic (pure; unit-tested) --------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """One timed iteration: seconds and allocator readings in bytes (0 on CPU)."""

    forward_s: float
    backward_s: float
    mem_before: float = 0.0
    mem_after_forward: float = 0.0
    mem_peak: float = 0.0
    forward_cpu_s: float = 0.0      # CPU dispatch (queued timing only; 0: not measured)
    backward_cpu_s: float = 0.0
    queued_ok: bool = True          # False: the CPU could not queue it all behind the spin


def layer_values(samples: Sequence[Sample], *, layers: int, input_bytes: float,
                 output_bytes: float, held_bytes: float = 0.0, memory: bool = True,
                 kept_bytes: float | None = None) -> tuple[float, float, float, float]:
    """(forward_s, backward_s, activation_bytes, backward_peak_bytes) per layer of an
    ``layers``-block part; see the module docstring for the definitions. ``held_bytes``:
    memory kept from forward to backward that is not per micro-batch (ZeRO-2's unsharded
    parameters). ``kept_bytes``: what a second forward keeps (:func:`_kept_bytes`), used
    instead of the timed iterations' allocator difference when given."""
    fwd = statistics.median(s.forward_s for s in samples) / layers
    bwd = statistics.median(s.backward_s for s in samples) / layers
    if not memory:
        return fwd, bwd, 0.0, 0.0
    kept = (kept_bytes if kept_bytes is not None
            else max(s.mem_after_forward - s.mem_before for s in samples))
    act = max(0.0, kept - output_bytes + input_bytes - held_bytes) / layers
    peak = max(0.0, max(s.mem_peak - s.mem_after_forward for s in samples))
    return fwd, bwd, act, peak


def end_values(samples: Sequence[Sample], *, input_bytes: float, output_bytes: float,
               memory: bool = True, kept_bytes: float | None = None
               ) -> tuple[float, float, float, float]:
    """(forward_s, backward_s, activation_bytes, peak_bytes) of an embedding / output part.
    ``input_bytes``: the hidden state entering the output part (0 for the embedding);
    ``kept_bytes`` as in :func:`layer_values`."""
    fwd = statistics.median(s.forward_s for s in samples)
    bwd = statistics.median(s.backward_s for s in samples)
    if not memory:
        return fwd, bwd, 0.0, 0.0
    kept = (kept_bytes if kept_bytes is not None
            else max(s.mem_after_forward - s.mem_before for s in samples))
    act = max(0.0, kept - output_bytes + input_bytes)
    peak = max(0.0, max(s.mem_peak - s.mem_after_forward for s in samples))
    return fwd, bwd, act, peak


def cpu_values(samples: Sequence[Sample], *, layers: int = 1) -> tuple[float, float]:
    """Median CPU dispatch seconds (forward, backward) per layer; 0 where not measured."""
    return (statistics.median(s.forward_cpu_s for s in samples) / layers,
            statistics.median(s.backward_cpu_s for s in samples) / layers)


def cpu_fixed(samples: Sequence[Sequence[float]], pooled: Sequence[float], shallow_layers: int,
              deep_layers: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """Split a setting's CPU dispatch into a per-layer and a per-call part.

    ``samples``: (forward, backward) CPU per layer timed on ``shallow_layers`` blocks, then
    on ``deep_layers`` blocks, back to back; ``pooled``: the setting's (forward, backward)
    per layer on ``shallow_layers`` blocks (:func:`pooled_cpu`). If a call costs
    ``fixed + n * per_layer`` on n blocks, per layer it is ``per_layer + fixed / n``, so
    ``fixed = (s - d) * S * D / (D - S)`` for per-layer times s on S blocks and d on D
    (:func:`~meshplan.calibrate.stats.two_depth_fit` of the call totals S·s and D·d);
    the median over samples, kept within [0, S * pooled]. Returns ((forward, backward) per
    layer, (forward, backward) per call). Measured on 2 x H200 (2026-11-26, GPT-0.54B tp2
    selective, on 2, 4 and 8 blocks): 2.8 ms per forward+backward call, then 1.24 / 1.25 ms
    per layer, against 1.62 / 2.40 ms per layer with the call's part spread over 2 blocks."""
    per_layer, per_call = [], []
    for j, p in enumerate(pooled):
        fixed = statistics.median(
            two_depth_fit(shallow_layers, shallow_layers * row[j],
                          deep_layers, deep_layers * row[2 + j])[0] for row in samples)
        fixed = min(max(0.0, fixed), shallow_layers * p)
        per_layer.append(p - fixed / shallow_layers)
        per_call.append(fixed)
    return (per_layer[0], per_layer[1]), (per_call[0], per_call[1])


def combine_rounds(rounds: Sequence[Sequence[float]], memory_fields: Iterable[int]
                   ) -> list[float]:
    """One row from the same configuration measured in several rounds spread over the
    calibration: the median of each time (a round that hit a slow moment does not move
    it), the largest of each memory field."""
    mem = set(memory_fields)
    return [max(col) if j in mem else statistics.median(col)
            for j, col in enumerate(zip(*rounds))]


def split_depth(shallow: Sequence[float], deep: Sequence[float], shallow_layers: int,
                deep_layers: int) -> tuple[float, float]:
    """(B, W) growth per layer per extra layer in the stack, from the per-layer split
    backward timed on ``shallow_layers`` and ``deep_layers`` blocks (0 where either is 0)."""
    if deep_layers <= shallow_layers:
        raise ValueError(f"deep_layers {deep_layers} must exceed shallow_layers {shallow_layers}")
    return tuple(((d - s) / (deep_layers - shallow_layers) if s > 0 and d > 0 else 0.0)
                 for s, d in zip(shallow, deep))  # type: ignore[return-value]


def layer_row(cfg: Config, values: Sequence[float], *, split_layers: int = 0,
              depth: tuple[float, float] = (0.0, 0.0),
              split_sync: tuple[float, float] = (0.0, 0.0),
              cpu_fixed: tuple[float, float] = (0.0, 0.0),
              split_memory: Sequence[float] = NO_SPLIT_MEMORY) -> dict[str, Any]:
    """``values``: forward_s, backward_s, activation_bytes, backward_peak_bytes and
    optionally the split backward's input- and weight-gradient seconds, the forward /
    backward CPU dispatch seconds and the split's B / W CPU seconds (0: not measured);
    ``split_layers`` / ``depth``: the stack the split was timed on and :func:`split_depth`
    (of the CPU times where they were measured); ``split_sync``: the split's synchronized
    B / W per layer on that stack where the split itself was timed queued (kept for
    comparison); ``cpu_fixed``: the forward / backward CPU dispatch per call (the CPU fields
    then hold the per-layer rest; :func:`cpu_fixed`); ``split_memory``: what a micro-batch
    waiting for its W keeps and what W needs while it runs, bytes per layer (full
    recomputation; :mod:`meshplan.calibrate.split_memory`), the stack measured and their
    stage parts (:func:`split_memory_stage`)."""
    fwd, bwd, act, peak, b_in, b_w, f_cpu, b_cpu, bi_cpu, bw_cpu = (*values, *(0.0,) * 6)[:10]
    return asdict(MeasuredLayer(
        shape=layer_shape_key(cfg.model), seq_len=cfg.seq_len, tp=cfg.tp,
        sequence_parallel=cfg.sequence_parallel, recompute=cfg.recompute,
        micro_batch=cfg.micro_batch, zero=cfg.zero, dp=cfg.dp, forward_s=float(fwd),
        backward_s=float(bwd), activation_bytes=float(act), backward_peak_bytes=float(peak),
        model=cfg.model.name, backward_input_s=float(b_in), backward_weight_s=float(b_w),
        forward_cpu_s=float(f_cpu), backward_cpu_s=float(b_cpu),
        backward_input_cpu_s=float(bi_cpu), backward_weight_cpu_s=float(bw_cpu),
        split_layers=split_layers if b_in > 0 and b_w > 0 else 0,
        backward_input_depth_s=float(depth[0]), backward_weight_depth_s=float(depth[1]),
        backward_input_sync_s=float(split_sync[0]), backward_weight_sync_s=float(split_sync[1]),
        forward_cpu_fixed_s=float(cpu_fixed[0]), backward_cpu_fixed_s=float(cpu_fixed[1]),
        wgrad_pending_bytes=float(split_memory[0]),
        wgrad_transient_bytes=float(split_memory[1]),
        wgrad_memory_layers=int(split_memory[2]),
        wgrad_pending_stage_bytes=float(split_memory[3]),
        wgrad_transient_stage_bytes=float(split_memory[4]), compile=cfg.compile))


def end_row(cfg: Config, values: Sequence[float]) -> dict[str, Any]:
    """``values``: forward_s, backward_s, activation_bytes, peak_bytes and optionally the
    forward / backward CPU dispatch seconds."""
    fwd, bwd, act, peak, f_cpu, b_cpu = (*values, 0.0, 0.0)[:6]
    return asdict(MeasuredEnd(
        shape=ends_shape_key(cfg.model), part=cfg.part, seq_len=cfg.seq_len, tp=cfg.tp,
        sequence_parallel=cfg.sequence_parallel, micro_batch=cfg.micro_batch,
        forward_s=float(fwd), backward_s=float(bwd), activation_bytes=float(act),
        peak_bytes=float(peak), model=cfg.model.name, forward_cpu_s=float(f_cpu),
        backward_cpu_s=float(b_cpu)))


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

    def dp_mesh(self, size: int, tp: int = 1):
        """The FSDP2 mesh of ``size`` ranks: ranks ``tp`` apart, like the executor's
        (pp, dp, tp) mesh (:func:`dp_mesh_shape`), so that a layer's tp group (consecutive
        ranks, :meth:`tp`) and its dp group cross."""
        if (size, tp) not in self._dp:
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh(self.device_type, dp_mesh_shape(self.world, size, tp),
                                    mesh_dim_names=("rep", "dp", "tp"))
            self._dp[size, tp] = mesh["dp"]
        return self._dp[size, tp]


def dp_mesh_shape(world: int, dp: int, tp: int) -> tuple[int, int, int]:
    """(replicas, dp, tp) of the calibration's FSDP2 mesh.

    Example: world 4, dp 2, tp 2 → (1, 2, 2): the dp groups are ranks {0, 2} and {1, 3},
    the tp groups {0, 1} and {2, 3} (Megatron's tp-dp-pp order); world 4, dp 2, tp 1 →
    (2, 2, 1): dp groups {0, 1} and {2, 3}."""
    if dp < 1 or tp < 1 or world % (dp * tp):
        raise ConfigError(f"an FSDP2 row of dp {dp} × tp {tp} does not tile a world of {world}")
    return (world // (dp * tp), dp, tp)


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
    if cfg.compile:
        for block in m.layers.values():
            block.compile()        # as ParallelTrainer does for Layout.compile
    if cfg.zero >= 2:
        m = wrap_data_parallel(m, zero=cfg.zero,
                               groups=_DPGroups(groups.dp_mesh(cfg.dp, cfg.tp), cfg.dp),
                               device=device, bf16=cuda, pipelined=False)
        if not cfg.communicates:
            _hold_unsharded(m)
    return m, tp_group


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


def _nbytes(t) -> float:
    return float(t.numel() * t.element_size())


class _Queue:
    """GPU-busy timing: a spin kernel (``torch.cuda._sleep``) holds the stream while the CPU
    queues the measured work, so CUDA events time the GPU alone and ``perf_counter`` the
    CPU's dispatch alone. In a training step the CPU runs ahead of the GPU across many
    layers and micro-batches, so a step costs about max(Σ CPU, Σ GPU) rather than the sum of
    synchronized per-layer timings, each of which is max(CPU, GPU) of its own layer; the cost
    model needs the two separately (:mod:`meshplan.costmodel.estimate`)."""

    def __init__(self, device, agree: Callable[[list[float]], list[float]]):
        import torch
        self.agree = agree     # element-wise max over ranks (every rank must queue alike)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        cycles = 20_000_000
        e0.record()
        torch.cuda._sleep(cycles)
        e1.record()
        e1.synchronize()
        rate = cycles / max(1e-6, e0.elapsed_time(e1) / 1e3)   # spin cycles per second
        self.cycles_per_s = agree([-rate])[0] * -1.0           # the slowest rank's rate

    def sleep(self, seconds: float) -> None:
        import torch
        torch.cuda._sleep(int(seconds * self.cycles_per_s))


def _measure(forward: Callable[[], Any], backward: Callable[[Any], None],
             reset: Callable[[], None], *, device, warmup: int, iters: int, barrier,
             queue: _Queue | None = None) -> tuple[list[Sample], float]:
    """Warm-up, then ``iters`` timed iterations; returns the samples and the output's bytes.

    With ``queue`` (CUDA) the timed iterations are queued behind a spin kernel longer than
    the CPU's dispatch (checked: the GPU must still be spinning when the CPU has queued the
    whole backward, else the spin is tripled and the iteration repeated), giving GPU-busy
    forward/backward seconds and CPU dispatch seconds; the warm-up iterations are
    synchronized timings, which size the spin. Without it (CPU, or synchronized timing on
    purpose) every iteration is synchronized and the CPU fields are 0.
    """
    import torch
    cuda = device.type == "cuda"
    samples: list[Sample] = []
    out_bytes = 0.0
    spin_s = 0.0
    attempts = 0
    i = 0
    while i < warmup + iters:
        queued = queue is not None and i >= warmup
        reset()
        barrier()
        if cuda:
            torch.cuda.synchronize(device)
            mem0 = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            if queued:
                queue.sleep(spin_s)
            e0.record()
            t0 = time.perf_counter()
            y = forward()
            t1 = time.perf_counter()
            e1.record()
            mem1 = torch.cuda.memory_allocated(device)   # allocations are made at dispatch
            backward(y)
            t2 = time.perf_counter()
            e2.record()
            # the GPU must not have reached e0 before the CPU queued everything
            valid = not queued or not e0.query()
            e2.synchronize()
            peak = torch.cuda.max_memory_allocated(device)
            s = Sample(e0.elapsed_time(e1) / 1e3, e1.elapsed_time(e2) / 1e3,
                       float(mem0), float(mem1), float(peak),
                       (t1 - t0) if queued else 0.0, (t2 - t1) if queued else 0.0)
        else:
            t0 = time.perf_counter()
            y = forward()
            t1 = time.perf_counter()
            backward(y)
            t2 = time.perf_counter()
            s, valid = Sample(t1 - t0, t2 - t1), True
        out_bytes = _nbytes(y)
        del y
        if queue is not None and cuda:
            # every rank takes the same decisions from agreed values (collectives follow)
            if queued:
                valid = queue.agree([0.0 if valid else 1.0])[0] == 0.0
            if i == warmup - 1 or (queued and not valid):
                # size the spin from the synchronized time (>= the CPU's dispatch); after a
                # failed check, triple it
                base = s.forward_s + s.backward_s if i < warmup else 2 * spin_s
                spin_s = min(SPIN_MAX_S, queue.agree([1.5 * base + 2e-3])[0])
            if queued:
                attempts += 1
                if not valid and attempts < iters + 4:
                    continue
                if not valid:   # gave up: a synchronized-like sample, flagged
                    s = replace(s, queued_ok=False)
        if i >= warmup:
            samples.append(s)
        i += 1
    return samples, out_bytes


def _bad(samples: Sequence[Sample]) -> float:
    """Samples whose queued timing failed its check (reported, not used to choose)."""
    return float(sum(not s.queued_ok for s in samples))


def _kept_bytes(forward_fresh: Callable[[], Any], device) -> float:
    """Bytes a *second* forward pass keeps alive (its saved tensors and its output): what
    one more micro-batch in flight costs. The first pass of a step also fills one-time
    caches (autocast's 16-bit weight copies), which the cost model counts once per step."""
    import torch
    torch.cuda.synchronize(device)
    y1 = forward_fresh()
    m1 = torch.cuda.memory_allocated(device)
    y2 = forward_fresh()
    m2 = torch.cuda.memory_allocated(device)
    del y1, y2
    return float(m2 - m1)


def _run_layer(cfg: Config, m, layers: int, device, *, iters: int, barrier,
               queue: _Queue | None = None, split_queued: bool = False) -> tuple[float, ...]:
    """(forward_s, backward_s, activation_bytes, backward_peak_bytes, backward_input_s,
    backward_weight_s, forward_cpu_s, backward_cpu_s, backward_input_cpu_s,
    backward_weight_cpu_s, samples failing the queue check) per layer; the split backward
    (zero-bubble) is measured for rows without communication (ZeRO-0, FSDP2 on 1 rank) and
    is 0 where torch's split backward is
    unavailable: synchronized, or queued like the row with ``split_queued`` (then its CPU
    fields are set); the CPU fields are 0 without ``queue``."""
    import torch

    cuda = device.type == "cuda"
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
        if cfg.compile:
            pass       # AOTAutograd compiles one backward: no input/weight split to time
        elif cfg.zero == 0:
            split = _split_per_layer(m, x, grad[0], layers, device, iters=iters,
                                     barrier=barrier, queue=queue if split_queued else None,
                                     forward=samples)
        elif not cfg.communicates:
            split = _fsdp_split_per_layer(m, x, grad[0], layers, device, iters=iters,
                                          barrier=barrier,
                                          queue=queue if split_queued else None,
                                          forward=samples)
    held = 0.0
    if cfg.zero == 2 and cuda:
        # FSDP2 with reshard_after_forward=False keeps every block's unsharded bf16
        # parameters from forward to the end of its backward (DTensor numel is global).
        held = float(sum(p.numel() for p in m.parameters()) * 2)
    return (*layer_values(samples, layers=layers, input_bytes=_nbytes(x),
                          output_bytes=out_bytes, held_bytes=held, memory=cuda,
                          kept_bytes=kept), *split[:2], *cpu_values(samples, layers=layers),
            *split[2:], _bad(samples))


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


def _cpu_deep(cfg: Config, key, module, device, groups, queue: _Queue | None, *, iters: int,
              barrier, world: int):
    """The row's forward / backward CPU dispatch per layer, queued, on
    :data:`CPU_DEEP_LAYERS` blocks (built once per build key), averaged over ranks: (build
    key, deep module to reuse, (forward CPU, backward CPU, forward GPU, backward GPU) per
    layer or None where any rank ran out of memory or a sample failed the queue check).
    With the row's own 2-block timing the CPU times split a call into a per-call and a
    per-layer part (:func:`cpu_fixed`); the GPU times are logged only: for FSDP2 rows they
    say how a layer's cost beside its neighbours' gathers and reduce-scatters changes with
    the stack (round 18 of docs/benchmarks/accuracy.md), for the cost model to use once
    measured sets show it helps."""
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
        oom, module = 1.0, None
        _free(device)
    lo = _reduce([*values, oom], [4, 5], device, world)
    if lo[4] or lo[5] or min(lo[:2]) <= 0:
        return cfg.build_key, module, None
    return cfg.build_key, module, tuple(lo[:4])


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
    ``grad``: the output gradient (None: a random one)."""
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
    # out-of-memory propagates to the row's handling (every rank must agree on skipping)
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


def _run_end(cfg: Config, m, tp_group, device, *, iters: int, barrier,
             queue: _Queue | None = None) -> tuple[float, ...]:
    """(forward_s, backward_s, activation_bytes, peak_bytes, forward_cpu_s, backward_cpu_s)."""
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
                                      iters=iters, barrier=barrier, queue=queue)
        kept = _kept_bytes(forward, device) if cuda else None
    return (*end_values(samples, input_bytes=input_bytes, output_bytes=out_bytes, memory=cuda,
                        kept_bytes=kept), *cpu_values(samples), _bad(samples))


def _free(device) -> None:
    import torch
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _oom_types() -> tuple[type, ...]:
    import torch
    return (torch.cuda.OutOfMemoryError,)


def rounds_for(device, quick: bool) -> int:
    """How many times the whole grid is measured by default (rows are the median over
    rounds); ``--rounds`` sets it, ``--time-budget`` may stop earlier."""
    return ROUNDS_CUDA if device.type == "cuda" and not quick else 1


@dataclass(frozen=True, kw_only=True)
class LayerTables:
    """What :func:`bench_layer_rows` measured: rows with exactly the fields of
    ``MeasuredLayer`` / ``MeasuredEnd``, and how many rounds each row's median is over."""

    layers: list[dict[str, Any]]
    ends: list[dict[str, Any]]
    rounds: int          # rounds measured (fewer than asked for where the budget stopped them)


def bench_layer_rows(models: Sequence[ModelSpec], seq_len: int | None, device, world: int,
                     rank: int, *, quick: bool, progress=None, max_tp: int = 8,
                     micro_batches: Sequence[int] | None = None, split_queued: bool = False,
                     rounds: int | None = None, budget: RoundBudget | None = None,
                     compile_rows: Sequence[str] = ()) -> LayerTables:
    """Measure every configuration of :func:`plan_grid` in ``rounds`` rounds (default
    :func:`rounds_for`); with ``budget``, a round after the first runs only if
    :func:`~meshplan.calibrate.budget.next_round` projects the calibration to end within it.

    Collective over the world: every rank must call it with the same arguments. A
    configuration that runs out of GPU memory on any rank is skipped on all of them. Times
    are averaged over ranks (replicated ranks are independent samples of the same work;
    tensor-parallel ranks wait for each other anyway), memory is the largest over ranks.
    The budget's decision is taken from the largest elapsed and round times over ranks, so
    every rank takes the same.
    """
    import torch.distributed as dist
    grid = plan_grid(models, seq_len, world, quick=quick, max_tp=max_tp,
                     micro_batches=micro_batches, compile_rows=compile_rows)
    layers = LAYERS_CUDA if device.type == "cuda" and not quick else LAYERS_CPU
    iters = ITERS_QUICK if quick else ITERS
    groups = _Groups(world, rank, device.type)
    barrier = dist.barrier if world > 1 and dist.is_initialized() else (lambda: None)
    queue = None
    if device.type == "cuda":
        import torch
        if hasattr(torch.cuda, "_sleep"):
            queue = _Queue(device, lambda v: _reduce(v, range(len(v)), device, world))
        elif progress is not None:   # private API gone: synchronized timings, no CPU fields
            progress.note("torch.cuda._sleep is missing in this torch: layer rows are "
                          "synchronized timings without CPU dispatch times")
    measured: dict[int, list[list[float]]] = {}
    deep: dict[int, tuple[float, float]] = {}      # split backward on SPLIT_DEEP_LAYERS blocks
    deep_mem: dict[int, tuple] = {}  # its split memory (split_memory_stage)
    # CPU per layer on 2 and CPU_DEEP_LAYERS blocks, per setting (its smallest micro-batch)
    cpu_deep: dict[tuple, list[tuple[float, float, float, float]]] = {}
    smallest: dict[tuple, int] = {}
    for cfg in grid:
        if not cfg.part:
            k = (cfg.build_key, cfg.recompute)
            smallest[k] = min(smallest.get(k, cfg.micro_batch), cfg.micro_batch)
    cpu_key, cpu_module = None, None
    skipped: set[int] = set()
    rounds = rounds_for(device, quick) if rounds is None else rounds
    require_positive_int("bench_layer_rows", "rounds", rounds)
    spent_s = budget.elapsed_s() if budget is not None else 0.0
    if budget is not None and spent_s + budget.allowance_s > budget.budget_s:
        # a note only (rank 0's view): nothing is decided from it
        _note(progress, f"--time-budget {budget.budget_s:g} s is spent before the layer "
                        f"tables ({spent_s:.0f} s elapsed): no layer row fits; the profile "
                        f"is written without them")
    deep_key, deep_module = None, None
    ran = 0
    for rnd in range(rounds):
        t_round = time.perf_counter()
        first_only_s = 0.0   # the deep split, which later rounds do not repeat
        built_key, module, tp_group = None, None, None
        oom_at: set[tuple] = set()   # (build key, recompute) whose smaller micro-batch ran out
        t_row, stopped_at = None, None
        for idx, cfg in enumerate(grid):
            tag = f"round {rnd + 1}: {cfg.label()}"
            if budget is not None and _row_budget_stops(
                    budget, time.perf_counter() - t_row if t_row is not None else 0.0,
                    device, world, progress, tag):
                stopped_at = idx
                break
            t_row = time.perf_counter()
            if cfg.build_key != built_key:
                module = tp_group = None
                _free(device)
                built_key = cfg.build_key
            if idx in skipped:
                _step(progress, f"{tag}: skipped (out of memory or failed in an earlier round)")
                continue
            if cfg.compile and rnd > 0:
                # compiling each row again costs more than the rounds' median gains (GPU
                # times repeat within 1 %, docs/calibrate.md): first round only
                _step(progress, f"{tag}: compiled rows are timed in the first round only")
                continue
            if (cfg.build_key, cfg.recompute) in oom_at:   # every rank agreed on that OOM
                skipped.add(idx)
                _step(progress,
                      f"{tag}: skipped (a smaller micro-batch ran out of memory or failed)")
                continue
            n_values = 7 if cfg.part else 11     # the last: samples failing the queue check
            values, oom, failed = [0.0] * n_values, 0.0, ""
            t_row = time.perf_counter()
            try:
                if module is None:
                    module, tp_group = _build(cfg, layers, device, groups)
                if cfg.part:
                    values = list(_run_end(cfg, module, tp_group, device, iters=iters,
                                           barrier=barrier, queue=queue))
                else:
                    values = list(_run_layer(cfg, module, layers, device, iters=iters,
                                             barrier=barrier, queue=queue,
                                             split_queued=split_queued))
            except _oom_types():
                oom = 1.0
            except Exception as exc:  # noqa: BLE001 — only the rows below, see there
                if cfg.part or cfg.zero < 2 or cfg.communicates:
                    raise
                # FSDP2's 1-rank rows (round 18; not yet run on GPUs when written): a failure
                # costs the row, not the calibration. Every rank runs the same 1-rank work
                # and fails alike; the row is then skipped like one that ran out of memory
                oom, failed = 1.0, f"{type(exc).__name__}: {exc}"
            if oom:
                module = tp_group = None    # FSDP/autograd state of a failed step: rebuild
                _free(device)
            values = _reduce([*values, oom], [*MEMORY_FIELDS, n_values - 1, n_values], device,
                             world)
            if values.pop():
                oom_at.add((cfg.build_key, cfg.recompute))
                skipped.add(idx)
                measured.pop(idx, None)
                module = None
                _free(device)
                _step(progress, f"{tag}: "
                                + (f"failed ({failed})" if failed else "out of memory on some rank")
                                + ", skipped")
                continue
            measured.setdefault(idx, []).append(values)
            if cfg.compile:   # first round only: not part of a later round's projection
                first_only_s += time.perf_counter() - t_row
            fc, bc = _cpu_fields(cfg)
            if rnd == 0 and not cfg.part and cfg.zero == 0 and values[5] > 0:
                # once per row, in the first round: that is the only round sure to run.
                # Synchronized rows already hold the shallow split (combined over rounds
                # below); queued ones need it again, right before the deep one
                t_deep = time.perf_counter()
                deep_key, deep_module, split, wmem = _deep_split(
                    cfg, deep_key, deep_module, module if split_queued else None, layers,
                    device, groups, iters=iters, barrier=barrier, world=world,
                    row_module=module)
                first_only_s += time.perf_counter() - t_deep
                if split is not None:
                    deep[idx] = split
                    deep_mem[idx] = wmem
            cpu_note = ""
            # CPU fields are > 0 only where the row was timed queued (CUDA)
            if not cfg.part and values[bc] > 0 and not cfg.compile \
                    and cfg.micro_batch == smallest[(cfg.build_key, cfg.recompute)]:
                cpu_key, cpu_module, d = _cpu_deep(cfg, cpu_key, cpu_module, device, groups,
                                                   queue, iters=iters, barrier=barrier,
                                                   world=world)
                if d is not None:
                    cpu_deep.setdefault((cfg.build_key, cfg.recompute), []).append(
                        (values[fc], values[bc], d[0], d[1]))
                    cpu_note = (f", cpu on {CPU_DEEP_LAYERS} blocks {d[0] * 1e3:.3f} / "
                                f"{d[1] * 1e3:.3f} ms, gpu {d[2] * 1e3:.3f} / "
                                f"{d[3] * 1e3:.3f} ms")
            _step(progress, f"{tag}: fwd {values[0] * 1e3:.3f} ms, bwd {values[1] * 1e3:.3f}"
                            f" ms{' per layer' if not cfg.part else ''}"
                            + (f", act {values[2] / 2**20:.1f} MiB" if device.type == "cuda"
                               else "")
                            + (f", cpu {values[fc] * 1e3:.3f} / {values[bc] * 1e3:.3f} ms"
                               if values[bc] > 0 else "")
                            + cpu_note
                            + (f", {values[-1]:.0f} samples not queued" if values[-1] else ""))
        module = tp_group = deep_module = cpu_module = None
        cpu_key = None
        _free(device)
        ran = rnd + 1 if stopped_at != 0 else rnd   # a round stopped before its first row
        if stopped_at is not None:
            if progress is not None:   # keep [done/total] honest
                progress.drop(len(grid) - stopped_at + len(grid) * (rounds - ran))
            break
        if budget is not None and _budget_stops(
                ran, rounds, budget, time.perf_counter() - t_round - first_only_s, device,
                world, progress):
            if progress is not None:
                progress.drop(len(grid) * (rounds - ran))   # keep [done/total] honest
            break
    cpu = pooled_cpu(grid, {i: v for i, v in measured.items() if i not in skipped})
    layer_rows: list[dict[str, Any]] = []
    end_rows: list[dict[str, Any]] = []
    for idx, cfg in enumerate(grid):
        if idx in skipped or idx not in measured:
            continue
        values = combine_rounds(measured[idx], MEMORY_FIELDS)
        fixed = (0.0, 0.0)
        if idx in cpu:
            f, b = _cpu_fields(cfg)
            values[f], values[b] = cpu[idx]
            samples = cpu_deep.get((cfg.build_key, cfg.recompute))
            if samples and not cfg.part:
                (values[f], values[b]), fixed = cpu_fixed(samples, cpu[idx], layers,
                                                          CPU_DEEP_LAYERS)
        if cfg.part:
            end_rows.append(end_row(cfg, values))
        elif idx in deep:
            shallow = deep[idx][:2] if split_queued else values[4:6]
            layer_rows.append(layer_row(cfg, values, split_layers=layers, depth=split_depth(
                shallow, deep[idx][2:], layers, SPLIT_DEEP_LAYERS),
                split_sync=shallow if split_queued else (0.0, 0.0), cpu_fixed=fixed,
                split_memory=deep_mem.get(idx, NO_SPLIT_MEMORY)))
        else:
            layer_rows.append(layer_row(cfg, values, split_layers=layers, cpu_fixed=fixed))
    return LayerTables(layers=layer_rows, ends=end_rows, rounds=ran)


def _agreed(budget: RoundBudget, last_s: float, device, world: int):
    """(the budget's decision on one more piece taking ``last_s``, elapsed, last) from the
    largest elapsed and last times over ranks, so that every rank decides alike."""
    elapsed_s, last_s = _reduce([budget.elapsed_s(), last_s], [0, 1], device, world)
    return (next_round(elapsed_s=elapsed_s, last_round_s=last_s, budget_s=budget.budget_s,
                       allowance_s=budget.allowance_s), elapsed_s, last_s)


def _row_budget_stops(budget: RoundBudget, row_s: float, device, world: int, progress,
                      tag: str) -> bool:
    """Before the next row of a round: whether it, taking as long as the row just measured
    (``row_s``, with what that row measured beside it), would end past ``budget`` with what
    still follows the layer tables. Then the round stops there, the first one too: its rows
    so far are kept and the profile is written within the budget (round 36's calibration
    of two 2.3-2.7 B models ran its first round 40 s past ``--time-budget 463`` and was
    killed, writing nothing; docs/benchmarks/transfer.md). Collective, like
    :func:`_budget_stops`: all ranks decide from the largest elapsed and row times."""
    decision, _, last_s = _agreed(budget, row_s, device, world)
    if decision.run:
        return False
    _note(progress, f"{tag} and the rows after it skipped: projected "
                    f"{decision.projected_end_s:.0f} s > --time-budget {budget.budget_s:g} s "
                    f"(the last row took {last_s:.1f} s, ~{budget.allowance_s:.0f} s to come "
                    f"after the layer tables); the rows measured so far are kept")
    return True


def _budget_stops(done: int, rounds: int, budget: RoundBudget, round_s: float, device,
                  world: int, progress) -> bool:
    """After ``done`` of at most ``rounds`` layer rounds, the last of which took ``round_s``
    (without what only the first round measures): whether ``budget`` stops them here.
    Collective: every rank must call it; all decide from the largest elapsed and round
    times over ranks, so they agree (ranks that disagreed would deadlock in the next
    round's collectives)."""
    decision, elapsed_s, last_s = _agreed(budget, round_s, device, world)
    if done == 1 and elapsed_s + budget.allowance_s > budget.budget_s:
        _note(progress, f"round 1 ended {elapsed_s:.0f} s into the calibration: with "
                        f"~{budget.allowance_s:.0f} s still to come it overruns --time-budget "
                        f"{budget.budget_s:g} s (kept: a profile from one round is better "
                        f"than none)")
    if done >= rounds or decision.run:
        return False
    _note(progress, f"round {done + 1} skipped: projected {decision.projected_end_s:.0f} s > "
                    f"--time-budget {budget.budget_s:g} s (round {done} took {last_s:.0f} s,"
                    f" ~{budget.allowance_s:.0f} s to come after the layer tables): layer "
                    f"tables from {done} of {rounds} rounds")
    return True


def _deep_split(cfg: Config, key, module, shallow, layers: int, device, groups, *,
                iters: int, barrier, world: int, row_module=None):
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
    CUDA's launch queue holds (see :data:`SPIN_MAX_S`)."""
    from meshplan.calibrate.split_memory import split_memory_per_layer
    values, oom, mem = [0.0] * 4, 0.0, [0.0] * 4
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
        oom, module = 1.0, None
        _free(device)
    measured = values if shallow is not None else values[2:]
    lo = _reduce([*values, oom, -min(measured), *mem], range(4, 10), device, world)
    if lo[4] or lo[5] >= 0:          # out of memory, or some rank measured nothing
        return cfg.build_key, module, None, NO_SPLIT_MEMORY
    return cfg.build_key, module, tuple(lo[:4]), split_memory_stage(
        (lo[6], lo[7]), (lo[8], lo[9]), layers, SPLIT_DEEP_LAYERS)


def split_memory_stage(shallow: Sequence[float], deep: Sequence[float], shallow_layers: int,
                       deep_layers: int) -> tuple[float, float, int, float, float]:
    """(pending, transient) bytes per layer on ``deep_layers`` blocks, ``deep_layers`` and
    the part of a stage's total that does not grow with its layers, c in ``c + d·L``
    (:func:`meshplan.costmodel.measured.wgrad_bytes_at`), from the per-layer values on two
    stacks: c = (x_s − x_d) / (1/s − 1/d). Only the deep values where the shallow stack was
    not measured (c = 0: the per-layer value at every depth); all zeros where the deep one
    was not."""
    if deep[1] <= 0:
        return NO_SPLIT_MEMORY
    if shallow[1] <= 0 or not 0 < shallow_layers < deep_layers:
        return float(deep[0]), float(deep[1]), deep_layers, 0.0, 0.0
    k = 1.0 / shallow_layers - 1.0 / deep_layers
    return (float(deep[0]), float(deep[1]), deep_layers, (shallow[0] - deep[0]) / k,
            (shallow[1] - deep[1]) / k)


def _cpu_fields(cfg: Config) -> tuple[int, int]:
    """Indices of the forward / backward CPU seconds in a row's values."""
    return (4, 5) if cfg.part else (6, 7)


def pooled_cpu(grid: Sequence[Config], measured: dict[int, list[list[float]]]
               ) -> dict[int, tuple[float, float]]:
    """CPU dispatch per row, pooled over the micro-batch sizes of the same setting.

    The CPU issues the same kernels whatever the micro-batch, and its timings are far
    noisier than the GPU's (measured on 4 × H200, 2026-11-26: the three rounds of a row
    differ by 13% median in CPU time, 0.8% in GPU time), so the median over every round of
    every micro-batch of a setting is the better estimate for each of them."""
    groups: dict[tuple, list[int]] = {}
    for idx in measured:
        cfg = grid[idx]
        groups.setdefault((cfg.build_key, cfg.recompute), []).append(idx)
    out: dict[int, tuple[float, float]] = {}
    for members in groups.values():
        f, b = _cpu_fields(grid[members[0]])
        fs = [v[f] for i in members for v in measured[i]]
        bs = [v[b] for i in members for v in measured[i]]
        if min(fs + bs, default=0.0) <= 0:
            continue                      # not measured (CPU device): leave the rows as they are
        pooled = (statistics.median(fs), statistics.median(bs))
        for i in members:
            out[i] = pooled
    return out


def _reduce(values: Iterable[float], max_fields: Iterable[int], device, world: int
            ) -> list[float]:
    """Across ranks: the mean of each value, the max of those at ``max_fields``."""
    import torch
    import torch.distributed as dist
    vals = list(values)
    if world == 1 or not dist.is_initialized():
        return vals
    hi = set(max_fields)
    t = torch.tensor(vals, dtype=torch.float64, device=device)
    mx = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    return [float(mx[j]) if j in hi else float(t[j]) / world for j in range(len(vals))]


def _step(progress, message: str) -> None:
    if progress is not None:
        progress.step(message)


def _note(progress, message: str) -> None:
    if progress is not None:
        progress.note(message)


__all__ = ["Config", "Sample", "plan_grid", "micro_batch_sizes", "layer_values", "end_values",
           "cpu_values", "split_depth", "split_memory_stage", "combine_rounds", "pooled_cpu",
           "layer_row", "end_row", "bench_layer_rows", "LayerTables", "rounds_for",
           "LAYERS_CUDA", "LAYERS_CPU", "dp_mesh_shape"]
