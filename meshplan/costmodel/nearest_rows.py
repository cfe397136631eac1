"""Measured rows for a layer shape the calibration did not time: the nearest timed shape's
rows, scaled by the analytical model's ratio.

A profile's layer and end rows (``meshplan calibrate --model``) hold what the analytical
layer (:mod:`.compute`, :mod:`.memory`) misses: the eager executor's unfused element-wise
kernels, autocast's casts, the kernels' real efficiency at these sizes, the CPU's
dispatch. For a model whose (layer shape, sequence length) has no row, the estimate used to
fall back to the analytical layer alone, which over- or under-predicted the transfer
round's untimed models by +11..+16 % (step) and −13..−22 % (memory), and lost the CPU's
dispatch altogether (docs/benchmarks/transfer.md, round 36). Here the rows of the
*nearest timed shape* stand in, each quantity scaled by what the analytical model says
changes between the two shapes:

    value(target) = measured(source) × analytical(target) / analytical(source)

- GPU seconds (forward, backward, zero-bubble's B and W): the ratio of the analytical pass
  times, i.e. of the GEMM and attention FLOPs at the profile's efficiency curves, the
  memory-bound bytes at its HBM efficiency and the tensor-parallel collectives
  (:func:`~meshplan.costmodel.compute.layer_cost`; ends: ``embedding_cost`` /
  ``logits_cost``);
- bytes (kept activations, a backward's working memory, zero-bubble's pending sets): the
  ratio of the analytical activation bytes (:func:`~meshplan.costmodel.memory.
  layer_activations`; the output layer by its logits, the embedding by its dense weight
  gradient plus its output);
- CPU dispatch: the ratio of the kernels a layer launches (:mod:`.dispatch`), which depends
  on the family and the layout's knobs, not on the widths (same family: 1).

The source is the timed shape nearest to the target among those with rows for the layout's
knobs (tp, sequence parallelism, recompute mode, ZeRO stage and dp), the same family first
(activation, norm, position embedding, bias, dropout: the same kernel sequence), then by
distance in log hidden size, ffn ratio, query/kv-head ratio, head dim and sequence length;
its micro-batch is the one doing the target's work (:meth:`TransferredTables._source_mb`):
below the sizes it was timed at, the smallest (the analytical ratio carries the rest); past
the largest, its rows extended linearly in the micro-batch. The estimate says so:
the ``nearest_shape_rows`` entry of ``Estimate.corrections`` (with how much it moved the
step and the memory against the analytical layer) and a caveat naming the source; where the
target's work lies more than :data:`STRETCH_MARGIN` outside the source's timed micro-batches
(:meth:`TransferredTables.stretch_for`), a second caveat says how far the row was carried.
Measured on 1 × H200 (moeh40-moeh43; the figures in
:func:`meshplan.costmodel.caveats.stretched_rows_caveat`): rows carried past their largest
timed size (as the largest row times the ratio, before 2026-12-04) price slow, below
their smallest fast, and timed nearer the work within 7.1 %;
the caveat says where a price comes from, not how far off it is.

**MoE layers** (since 2026-12-02) read another MoE model's rows the same way: the source
is the nearest MoE shape (an MoE layer never reads a dense shape's rows, nor a dense layer an
MoE one's), by its experts' count, top-k and widths beside the trunk's; the analytical layer
of the ratio is the layer with its shared experts as MLP plus the routed part at ep = 1
(:func:`meshplan.costmodel.row_scaling.moe_analytic`: router, permutation, grouped expert
GEMMs, activation, as :mod:`meshplan.costmodel.moe_layer` prices them). **Compiled rows**
stand for compiled layouts (the source's compiled row, its 16-bit weight copies kept out of
the scaling; the output row timed with the compiled loss), scaled by the analytical ratio
with both layers' memory-bound work at the share of its eager price the source's compiled
row shows beside its eager twin (:func:`~meshplan.costmodel.row_scaling.compiled_share`;
without a twin, the plain ratio); where the source has no compiled row, the eager row and the
compile-as-eager caveat, as before. A compiled row lends its CPU dispatch unscaled: a compiled
block dispatches one graph whose kernels (GEMMs, attention, a few fused element-wise ones)
differ little between families — the GPT and Llama profiles' compiled rows of fp8h16-fp8h23
timed 0.7-1.3 ms a forward alike where their eager rows differ 1.5-3 × — and another
family's compiled layer is the analytical one at the fused count (:func:`~meshplan.costmodel.
compute.layer_cost` ``compiled``), not its eager count. fp8 rows and rows at ep > 1 are not
carried (fp8 is composed on the carried bf16 row; ep > 1 priced on top of the carried ep = 1
row, :mod:`meshplan.costmodel.moe_rows`). Limitation:
a shape key does not say whether the attention is multi-head latent attention, so an MLA
model's rows can stand for a plain-attention layer of the same widths (an MLA target is not
transferred).

**The ratios read the profile's synchronized curves**, though the rows are GPU-alone times:
at the GPU-alone curves calibrate also records (``[measurements] gemm_alone`` /
``attention_alone``) the two held-out H100 sets read worse (moeh69h100 2.1 -> 3.7 %,
moeh70h100 5.75 -> 6.08 % mean step error; docs/benchmarks/moe_checks.md, moeh70h100).

Measured, compiled dense rows (post hoc, ``benchmarks/moe_profile_transfer.py`` on the 1-GPU
checks fp8h16-fp8h21, each run priced from every other check's profile): bf16 25.9 → 16.4 %
mean step-time error, fp8 33.9 → 24.0 %, peak memory within 5 % on 82 → 306 of 400 pairs.
With another family's compiled layer at the fused count and its CPU unscaled (2026-12-03,
post hoc, fp8h16-fp8h23, 254 / 290 pairs): bf16 16.7 → 8.0 % mean (median 8.1 → 6.9, max
126.5 → 35.1 %), fp8 23.5 → 12.6 % (median 8.2 → 8.3 %): the Llama targets priced from GPT
profiles had read +35 to +70 % (docs/benchmarks/fp8_checks.md "Compiled layers without their
rows"); the MoE pairs (moeh18-moeh43) bf16 12.7 → 12.1 %, fp8 16.5 → 16.0 %. Held out as
run (fp8h24 / fp8h25 / fp8h26, 1 × H200): two never-run Llamas priced from GPT profiles
62.6 → 22.0 % and 39.6 → 7.3 % (bf16), 83.2 → 38.5 % and 50.3 → 20.5 % (fp8), still slow
(+43 % where the GPT rows' CPU paces the step); a never-run GPT from a Llama profile 4.9 →
5.0 %.
Held out in size, as run (1 × H200, compiled layouts, docs/benchmarks/fp8_checks.md "fp8h22",
"fp8h23"): a 5.52 B GPT from fp8h21's 1.46 B rows, bf16 8.3 % mean (every arm fast: the
carried row 6-10 % below the model's own), fp8 3.4 %; a 72-layer 5.06 B Llama from fp8h18's
1.71 B rows, bf16 1.7 %, fp8 4.2 % (the datasheet 36 / 59 %); memory within 0.5 % on all ten
arms at 80-131 GiB.

Measured, MoE (post hoc, ``benchmarks/moe_profile_transfer.py``: the 34 bf16 and fp8 runs of
the 1-GPU checks moeh23-moeh28 on 1 × H200, each priced from each of the five *other*
checks' profiles, 85 pairs a precision): before, these layouts fell back to the profile's
curves, eager: bf16 91.0 % mean, 46.5 % median step-time error, fp8 96.0 / 60.6 %; with
MoE rows carried (and the permutation's host-timed efficiency no longer read,
``hardware_profiles.calibrated``), bf16 11.3 % mean, 6.4 % median, 58.0 % max, fp8 16.0 /
14.4 / 54.3 %; with a compiled row's weight copies kept out of the scaling and the compiled
output row (both found on moeh29), bf16 9.9 / 6.5 / 55.8 %, fp8 13.8 / 11.9 / 46.4 %, peak
memory within 5 % on 115 of 170. The datasheet profile: 12.0 / 30.6 % mean; the model's own
calibration: 1.9 / 2.9 %. Fine-grained targets (top-8) read from coarse sources (top-1 to
top-4) price 20-60 % slow: the ratio's analytical routed part grows faster than the
executor's. Held out, as run (moeh29, priced from moeh28's profile; before the last two
fixes): bf16 6.6 % mean, fp8 11.8 %, the datasheet 16.4 / 39.1 %
(docs/benchmarks/moe_checks.md). With the compiled share (2026-12-02, post hoc, moeh23-moeh33,
428 pairs a precision): bf16 9.9 → 6.3 % mean, 7.3 → 4.3 % median (fine-grained targets 14.6
→ 9.0 %), fp8 12.2 → 12.7 %; the dense compiled pairs of fp8h16-21 unchanged.

Measured error (post hoc, benchmarks/transfer_analysis.py: every measured layout
re-predicted with its own model's rows removed from its profile; docs/benchmarks/transfer.md,
2026-11-28): over the 342 measured layouts (rounds 7-26 and 36) 11.4 % mean / 63.0 % max
step-time error and 92 % of ranks within 5 % of measured memory, against 19.8 % and 21 %
with the analytical layer alone; round 36's seven layouts of models the calibration did not
time, 5.0 % / 8.1 % (16.9 % / 47.8 % as run before this module). Every mechanism here was
chosen looking at those records; round 37 measures it held out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

from meshplan.costmodel.compiled_rows import compiled_row_copies
from meshplan.costmodel.compute import logits_cost
from meshplan.costmodel.moe import shared_width
from meshplan.costmodel.clock import sustained_clock
from meshplan.costmodel.corrections import Correction
from meshplan.costmodel.dispatch import layer_dispatch_ratio
from meshplan.costmodel.moe_host import dense_ops, routed_ops
from meshplan.costmodel.row_scaling import (analytic, analytic_layer, end_groups,
                                            end_micro_batches, end_ratios, layer_groups,
                                            layer_micro_batches, layer_ratios, scaled_row)
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.measured import (Interpolated, MeasuredTables, layer_shape_key,
                                                 model_from_shape_key)
from meshplan.spec import Job, Layout, ModelSpec

NEAREST_SHAPE = "nearest_shape_rows"   # its name in Estimate.corrections (and ``without``)

def family(model: ModelSpec) -> tuple:
    """What fixes a layer's kernel sequence apart from its widths (an MoE layer's router and
    capacity rule too; its shared experts are an MLP's kernels, carried by the ratio)."""
    moe = (model.router, model.capacity_factor is None) if model.is_moe else ()
    return (model.activation, model.norm, model.position_embedding, model.bias,
            bool(model.dropout), *moe)


def shape_distance(a: ModelSpec, a_seq: int, b: ModelSpec, b_seq: int) -> float:
    """How far two layer shapes are apart: another family counts more than any width. Two
    MoE layers by their experts (count, top-k, width over hidden, shared width over hidden)
    instead of the dense MLP width, which an MoE layer does not run."""
    def lg(x, y):
        return abs(math.log(x / y))
    if a.is_moe and b.is_moe:
        def expert_ratio(m):
            return m.moe_ffn_hidden_size / m.hidden_size
        mlp = (lg(a.num_experts, b.num_experts) + lg(a.experts_per_token, b.experts_per_token)
               + lg(expert_ratio(a), expert_ratio(b))
               + lg(1 + shared_width(a) / a.hidden_size, 1 + shared_width(b) / b.hidden_size))
    else:
        mlp = lg(a.ffn_hidden_size / a.hidden_size, b.ffn_hidden_size / b.hidden_size)
    d = (lg(a.hidden_size, b.hidden_size) + mlp
         + lg(a.num_heads / a.num_kv_heads, b.num_heads / b.num_kv_heads)
         + lg(a.head_dim, b.head_dim) + lg(a_seq, b_seq))
    return d + (0.0 if family(a) == family(b) else 100.0)


class Stretch(NamedTuple):
    """A carried row read beyond its sizes (:meth:`TransferredTables.stretch_for`)."""

    source: str                    # the source's label
    timed: tuple[int, ...]         # the micro-batches its rows were timed at
    equivalent_mb: float           # the source micro-batch doing the target's work
    micro_batch: int               # the target's micro-batch that reads it


# how far outside its timed micro-batches a source row may be read before it counts as
# stretched: the equivalent micro-batch is a continuous estimate, not a size that ran
STRETCH_MARGIN = 1.1


@dataclass(frozen=True)
class Source:
    """The timed shape a target's rows come from."""

    model: ModelSpec      # a ModelSpec of the timed layer shape (widths from its key)
    seq_len: int
    same_family: bool

    @property
    def label(self) -> str:
        return f"{layer_shape_key(self.model)} at sequence {self.seq_len}"


def timed_shapes(tables: MeasuredTables) -> tuple[tuple[str, int], ...]:
    """Every (layer shape key, sequence length) with layer rows."""
    return tuple(sorted({(r.shape, r.seq_len) for r in tables.layers}))


def is_timed(tables: MeasuredTables, model: ModelSpec, seq_len: int) -> bool:
    return (layer_shape_key(model), seq_len) in timed_shapes(tables)


def transferable(model: ModelSpec) -> bool:
    """Not multi-head latent attention (whose rows' shape keys do not say so: an MLA
    profile's rows can stand for a plain-attention MoE layer, not the reverse). An MoE
    layer reads MoE rows only, a dense layer dense rows (:meth:`TransferredTables._source`)."""
    return getattr(model, "kv_lora_rank", None) is None


def dispatch_ratio(target: ModelSpec, source: ModelSpec, *, tp: int, sequence_parallel: bool,
                   recompute: str, autocast: bool = True) -> tuple[float, float]:
    """(forward, backward) operators ``target``'s layer dispatches over ``source``'s at the
    same knobs (:func:`meshplan.costmodel.dispatch.layer_dispatch_ratio`); two MoE layers
    by their norms, attention and shared experts plus their routed part
    (:mod:`meshplan.costmodel.moe_host`'s counts: a shared expert adds an MLP's operators)."""
    if not (target.is_moe and source.is_moe):
        return layer_dispatch_ratio(target, source, tp=tp, sequence_parallel=sequence_parallel,
                                    recompute=recompute, autocast=autocast)
    lay = Layout(tp=tp, sequence_parallel=sequence_parallel)

    def ops(m: ModelSpec) -> tuple[int, int]:
        (f, b), (rf, rb) = dense_ops(m, lay, autocast=autocast), routed_ops(m, lay,
                                                                           autocast=autocast)
        f, b = f + rf, b + rb
        return f, b + (f if recompute == "full" else 1 if recompute == "selective" else 0)
    (ft, bt), (fs, bs) = ops(target), ops(source)
    return ft / fs, bt / bs


def _knobs(tp: int, sequence_parallel: bool, recompute: str, zero: int, dp: int,
           compile: bool) -> tuple:
    """The knobs a layer's rows are grouped by: sequence parallelism only at tp > 1, the
    ZeRO stage and dp only for FSDP2 rows over dp > 1 (else the plain rows)."""
    fsdp = zero >= 2 and dp > 1
    return (tp, bool(sequence_parallel and tp > 1), recompute, zero if fsdp else 0,
            dp if fsdp else 1, compile)


class TransferredTables:
    """:class:`~meshplan.hardware_profiles.measured.MeasuredTables`' lookups for one model
    and job the profile did not time, answered from the nearest timed shape's rows scaled
    by the analytical ratio (module docstring). The ``model`` argument of each lookup is
    the target (the cost model passes the model it estimates)."""

    def __init__(self, tables: MeasuredTables, model: ModelSpec, cluster: Cluster, job: Job,
                 tp_link):
        self.tables = tables
        self.target = model
        self.cluster = cluster
        self.job = job
        self.tp_link = tp_link
        # one layout's parts ask for the same source and micro-batch several times (the
        # row, its compiled or eager twin, the caveats' source and stretch): each is
        # searched and priced once per instance
        self._memo: dict[tuple, object] = {}

    def __bool__(self) -> bool:
        return bool(self.tables)

    # ---- the source ----------------------------------------------------------------------
    def source_for(self, *, tp: int, sequence_parallel: bool, recompute: str, zero: int = 0,
                   dp: int = 1, compile: bool = False) -> Source | None:
        """The timed shape a layer at these knobs is read from (None: no row to read)."""
        return self._source(*_knobs(tp, sequence_parallel, recompute, zero, dp, compile))

    def _source(self, tp: int, sp: bool, recompute: str, zero: int, dp: int,
                compile: bool = False) -> Source | None:
        key = (tp, bool(sp and tp > 1), recompute, zero, dp if zero >= 2 else 1, compile)
        if ("source", key) not in self._memo:
            self._memo["source", key] = self._nearest(key)
        return self._memo["source", key]

    def _nearest(self, key: tuple) -> Source | None:
        best = None
        for shape, seq in layer_groups(self.tables).get(key, ()):
            src = model_from_shape_key(shape, num_layers=self.target.num_layers)
            if src is None or src.is_moe != self.target.is_moe:
                continue
            d = shape_distance(self.target, self.job.seq_len, src, seq)
            if best is None or d < best[0]:
                best = (d, Source(src, seq, family(src) == family(self.target)))
        return best[1] if best else None

    def _source_mb(self, src: Source, key: tuple, micro_batch: float) -> float:
        """The source's micro-batch at which its analytical work equals the target's: the
        efficiency curves' error depends on the kernels' size, so the source row whose
        kernels are the target's size carries the right ratio (a 0.5 B model's rows at 2 k
        tokens ran 2-3 x faster than the curves say, at 32 k tokens 0.9-1 x:
        docs/benchmarks/transfer.md).

        Below the smallest size timed it is that size (the analytical ratio carries the
        rest: the curves see the efficiency small kernels lose). Above the largest it is
        not clamped: the source's rows are extended linearly in the micro-batch from their
        two largest sizes, as a model's own rows are (:mod:`meshplan.hardware_profiles.
        measured_interp`), i.e. at the marginal cost the largest timed kernels showed,
        where the ratio from the largest row read the calibrated curves' further climb,
        which the layers' kernels did not make: post hoc over the 1-GPU checks'
        transferred arms (1 x H200, docs/benchmarks/fp8_checks.md "Rows carried past their
        largest size"), rows carried past their largest size 7.0 -> 2.7 % mean step-time
        error (dense, 20 arms, were 4.8 % fast on average) and 6.1 -> 4.6 % (MoE, 56 arms);
        extended linearly below the smallest too, the 14 MoE arms there went 5.8 -> 8.9 %.
        Held out as run (1 x H200, docs/benchmarks/fp8_checks.md): fp8h36 / fp8h37, a
        never-run GPT and Llama from fp8h1's and fp8h3's rows read 1.15-7.2 times past their
        largest, bf16 arms 3.1 -> 2.0 % mean, fp8 arms 1.6 -> 3.6 % (those profiles price
        fp8's gain 1.9-3.3 % short, which the clamped rows' fast reading hid), the set's rule
        met on fp8h37, not on fp8h36; fp8h38, a GPT read 1.45-30 times past, 7.3 -> 4.0 %
        (every clamped arm fast); moeh53, an MoE model from moeh40's rows read 1.3-10.7 times
        past, 14.3 -> 3.8 % (every clamped arm slow). Over the four, 23 arms: 6.8 -> 3.3 %,
        the set's rule met on three. Post hoc, the MoE checks priced from every other MoE
        profile went 10.7 -> 11.0 % (bf16) and 15.0 -> 15.9 % (fp8), a mean the checks and
        calibrations of earlier executors dominate: both from moeh28 on, 4.9 % and 5.1 %
        (docs/benchmarks/moe_checks.md, "The MoE cross-profile pairs by when ...")."""
        mbs = self._timed_mbs(src, key)
        m = self._equivalent_mb(src, key, micro_batch)
        return max(m, min(mbs)) if mbs else micro_batch

    def _equivalent_mb(self, src: Source, key: tuple, micro_batch: float) -> float:
        """The source's micro-batch whose analytical forward (at the knobs of ``key``)
        takes the target's at ``micro_batch``, unclamped."""
        memo = ("mb", src, key, micro_batch)
        if memo in self._memo:
            return self._memo[memo]
        tp, sp, recompute, zero = key[:4]

        def work(model, job, mb):
            return analytic(model, job, mb, self.cluster, tp, sp, recompute,
                            self.tp_link, zero < 2).forward_s
        job_s = replace(self.job, seq_len=src.seq_len)
        m = micro_batch * self.job.seq_len / src.seq_len
        at, a0 = work(self.target, self.job, micro_batch), work(src.model, job_s, m)
        if at > 0 and a0 > 0:
            m *= at / a0   # one step: a pass's time is close to linear in its tokens
        self._memo[memo] = m
        return m

    def stretch_for(self, *, tp: int, sequence_parallel: bool, recompute: str,
                    micro_batch: int, zero: int = 0, dp: int = 1, compile: bool = False
                    ) -> Stretch | None:
        """Where the source micro-batch doing the target's work lies more than
        :data:`STRETCH_MARGIN` outside the micro-batches the source was timed at: below
        them the smallest row and the analytical ratio, past them the rows extended
        linearly (:meth:`_source_mb`), neither of which times the kernels at this size
        (measured: the docstring of :func:`meshplan.costmodel.caveats.stretched_rows_caveat`).
        None inside, or with no source."""
        key = _knobs(tp, sequence_parallel, recompute, zero, dp, compile)
        src = self._source(*key)
        if src is None:
            return None
        mbs = self._timed_mbs(src, key)
        if not mbs:
            return None
        m = self._equivalent_mb(src, key, micro_batch)
        if min(mbs) / STRETCH_MARGIN <= m <= max(mbs) * STRETCH_MARGIN:
            return None
        return Stretch(src.label, tuple(sorted(mbs)), m, micro_batch)

    def _timed_mbs(self, src: Source, key: tuple) -> tuple[int, ...]:
        return layer_micro_batches(self.tables).get((layer_shape_key(src.model), src.seq_len) + key,
                                               ())

    # ---- layers --------------------------------------------------------------------------
    def layer(self, model: ModelSpec, *, seq_len: int, tp: int, sequence_parallel: bool,
              recompute: str, micro_batch: int, zero: int = 0, dp: int = 1,
              compile: bool = False, ep: int = 1) -> Interpolated | None:
        if ep > 1:    # not transferred: the ep = 1 row with ep's terms priced on top is
            return None
        tp, sp, recompute, zero, dp, compile = _knobs(tp, sequence_parallel, recompute, zero,
                                                      dp, compile)
        return self._layer(tp, sp, recompute, micro_batch, zero, dp, compile)

    def fsdp_compute_layer(self, model: ModelSpec, *, seq_len: int, tp: int,
                           sequence_parallel: bool, recompute: str, micro_batch: int
                           ) -> Interpolated | None:
        return self._layer(tp, sequence_parallel, recompute, micro_batch, 2, 1)

    def fp8_layer(self, model: ModelSpec, **_) -> Interpolated | None:
        return None     # fp8 rows are not transferred: fp8 is composed on the bf16 rows

    def fsdp_layer(self, model: ModelSpec, *, seq_len: int, tp: int, sequence_parallel: bool,
                   recompute: str, micro_batch: int, zero: int, dp: int, ep: int = 1,
                   compile: bool = False) -> tuple[Interpolated | None, bool]:
        return self.layer(model, seq_len=seq_len, tp=tp, sequence_parallel=sequence_parallel,
                          recompute=recompute, micro_batch=micro_batch, zero=zero,
                          dp=dp, ep=ep, compile=compile), False

    def _layer(self, tp, sp, recompute, micro_batch, zero, dp,
               compile: bool = False) -> Interpolated | None:
        sp = bool(sp and tp > 1)
        src = self._source(tp, sp, recompute, zero, dp, compile)
        if src is None:
            return None
        key = (tp, sp, recompute, zero, dp, compile)
        mb_s = self._source_mb(src, key, micro_batch)

        def timed(compiled: bool) -> Interpolated | None:
            return self.tables.layer(src.model, seq_len=src.seq_len, tp=tp,
                                     sequence_parallel=sp, recompute=recompute,
                                     micro_batch=mb_s, zero=zero, dp=dp, compile=compiled)
        row = timed(compile) if zero == 0 or dp > 1 else self.tables.fsdp_compute_layer(
            src.model, seq_len=src.seq_len, tp=tp, sequence_parallel=sp,
            recompute=recompute, micro_batch=mb_s)
        if row is None:
            return None
        eager = timed(False) if compile and zero == 0 else None
        k = layer_ratios(self.target, self.job, micro_batch, src.model, src.seq_len, mb_s,
                          self.cluster, tp, sp, recompute, self.tp_link, zero < 2,
                          compiled_twin=(eager, row) if eager is not None else None)
        # a compiled block dispatches one graph whose generated kernels (GEMMs, attention, a
        # few fused element-wise ones) differ little between families: no operator ratio
        cpu = (1.0, 1.0) if compile else dispatch_ratio(
            self.target, src.model, tp=tp, sequence_parallel=sp, recompute=recompute,
            autocast=zero < 2)
        out = scaled_row(row, k, cpu)
        if compile and zero < 2:
            # a compiled block under autocast keeps its 16-bit weight copies per micro-batch:
            # an intercept of the kept bytes, the layer's weights', not the tokens' (as
            # compiled_rows.row_weight_copies has it); the ratio scales the rest
            lay = Layout(tp=tp, sequence_parallel=sp, recompute=recompute)
            w_s = compiled_row_copies(src.model, lay) or 0.0
            w_t = compiled_row_copies(self.target, lay) or 0.0
            if row.activation_bytes > w_s:
                out = replace(out, activation_bytes=(row.activation_bytes - w_s)
                              * k.kept_bytes + w_t)
        if zero >= 2 and row.cpu_measured:
            out = self._fsdp_cpu(out, row, src, tp, sp, recompute, mb_s)
        if row.split_backward is not None and row.split_cpu is None:
            # a synchronized split timing is max(GPU, CPU) of B and W; at the source's size
            # it may be the CPU's (t36m03 at micro-batch 1: W 1.5 ms for 0.2 ms of GEMM),
            # which no GPU ratio carries: it stays the CPU's dispatch (an upper bound,
            # scaled by the operator ratio), and the GPU's B and W split the scaled fused
            # backward in the analytical weight-gradient share
            w = out.backward_s * k.wgrad_share
            out = replace(out, backward_input_s=out.backward_s - w, backward_weight_s=w,
                          backward_input_cpu_s=row.backward_input_s * cpu[1],
                          backward_weight_cpu_s=row.backward_weight_s * cpu[1])
        if not src.same_family:
            # another family's kernels miss the curves differently (GPT-0.54B's rows ran
            # 0.7-0.8 x the analytical time, Llama-1.64B's 1.0-1.1 x at the same sizes):
            # only the CPU's dispatch, which the operator count carries, is taken from it;
            # a compiled layout's analytical layer at the fused count (compute.layer_cost)
            out = analytic_layer(out, self.target, self.job, micro_batch, self.cluster, tp,
                                  sp, recompute, self.tp_link, zero < 2, compiled=compile)
        return out

    def _fsdp_cpu(self, out: Interpolated, row: Interpolated, src: Source, tp: int, sp: bool,
                  recompute: str, mb_s: float) -> Interpolated:
        """An FSDP2 row's CPU dispatch as the layer's operators (the source's plain row at
        the same knobs, by the operator ratio) plus FSDP2's own per-layer hooks (what the
        FSDP2 row adds to it), which cost per FSDP unit — one per layer — whatever the
        layer's operators: the pre-forward all-gather and post-backward reduce-scatter of
        one flat buffer (``FSDPParamGroup``). Measured (round 26 profile, 4 × H200): the
        increment of GPT-0.54B's ZeRO-2/3 rows over their plain rows is 0.6-1.2 × Llama-
        1.64B's, whose layers dispatch 2.1 × the operators; scaled by the parameter tensors
        (12 against 6) t19 came out at +47 % instead of −33 %. Without the source's plain
        row: the operator ratio for all of it."""
        plain = self.tables.layer(src.model, seq_len=src.seq_len, tp=tp, sequence_parallel=sp,
                                  recompute=recompute, micro_batch=mb_s)
        if plain is None or not plain.cpu_measured:
            return out
        ops = dispatch_ratio(self.target, src.model, tp=tp, sequence_parallel=sp,
                             recompute=recompute, autocast=True)

        def split(name: str, k: float) -> float:
            own, base = getattr(row, name), getattr(plain, name)
            return base * k + max(0.0, own - base)
        return replace(out, forward_cpu_s=split("forward_cpu_s", ops[0]),
                       backward_cpu_s=split("backward_cpu_s", ops[1]))

    # ---- ends ----------------------------------------------------------------------------
    def end(self, model: ModelSpec, part: str, *, seq_len: int, tp: int,
            sequence_parallel: bool, micro_batch: int,
            compile: bool = False) -> Interpolated | None:
        """The nearest timed shape's end, scaled: with ``compile``, its output row timed with
        the compiled loss where it has one (which keeps no fp32 logits), else the eager row."""
        sp = bool(sequence_parallel and tp > 1)
        best = None
        for shape, seq in end_groups(self.tables).get((part, tp, sp), ()):
            src = model_from_shape_key(shape, num_layers=self.target.num_layers)
            if src is None:
                continue
            d = shape_distance(self.target, self.job.seq_len, src, seq) \
                + abs(math.log(self.target.vocab_size / src.vocab_size))
            if best is None or d < best[0]:
                best = (d, src, seq, shape)
        if best is None:
            return None
        _, src, seq, shape = best
        mbs = end_micro_batches(self.tables).get((shape, part, seq, tp, sp))
        mb_s = micro_batch * self.job.seq_len / seq
        if part == "output":   # the logits GEMM's size, as _source_mb does for layers
            kw = dict(tp=tp, sequence_parallel=sp, tp_link=self.tp_link)
            at = logits_cost(self.target, self.cluster, self.job, micro_batch=micro_batch,
                             **kw)[0].total_s
            a0 = logits_cost(src, self.cluster, replace(self.job, seq_len=seq),
                             micro_batch=mb_s, **kw)[0].total_s
            mb_s *= at / a0 if at > 0 and a0 > 0 else 1.0
        # clamped both ways (unlike _source_mb: extended above, the 1-GPU checks went 4.78 ->
        # 4.89 % mean)
        mb_s = min(max(mb_s, min(mbs)), max(mbs)) if mbs else micro_batch
        row = self.tables.end(src, part, seq_len=seq, tp=tp, sequence_parallel=sp,
                              micro_batch=mb_s, compile=compile)
        if row is None:
            return None
        k = end_ratios(part, self.target, self.job, micro_batch, src, seq, mb_s,
                        self.cluster, tp, sp, self.tp_link)
        return scaled_row(row, k, (1.0, 1.0))


def tables_for(model: ModelSpec, cluster: Cluster, job: Job, tp_link):
    """Rows of the nearest timed shape, scaled by the analytical model's ratio, for a model
    whose layer shape (at its sequence length) the profile's calibration did not time
    (module docstring of :mod:`meshplan.costmodel.nearest_rows`); the profile's own rows
    where it timed it.

    The measured tables a layout of ``model`` reads: the profile's own where it timed
    this shape at this sequence length (or has no rows, or the correction is switched
    off), else :class:`TransferredTables` from the nearest timed shape."""
    tables = sustained_clock(cluster.gpu.corrections, cluster.gpu.measured)
    if (not tables or is_timed(tables, model, job.seq_len) or not transferable(model)
            or not cluster.gpu.corrections.enabled(NEAREST_SHAPE)):
        return tables
    return TransferredTables(tables, model, cluster, job, tp_link)


def _transferred(t) -> bool:
    return bool(t.parts.transferred_from)


NEAREST_SHAPE_CORRECTION = Correction(NEAREST_SHAPE, "step time and memory", (),
                                      _transferred, tables_for)

__all__ = ["NEAREST_SHAPE", "NEAREST_SHAPE_CORRECTION", "STRETCH_MARGIN", "Source", "Stretch",
           "TransferredTables",
           "dispatch_ratio", "family", "is_timed", "shape_distance", "tables_for",
           "timed_shapes", "transferable"]
