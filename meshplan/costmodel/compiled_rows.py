"""Compiled layer rows the calibration did not time, derived from the layer's eager row and
the plain rows' compiled/eager pair.

``meshplan calibrate --compile-rows`` times the executor's blocks ``torch.compile``'d on the
plain (ZeRO-0) rows and, since 2026-11-30, on a dense model's FSDP2 rows over the widest dp
(read as timed: ``build.layer_times``); MoE FSDP2 rows, FSDP2 rows at other dp, older
profiles' FSDP2 rows and FSDP2's compute alone (the 1-rank ZeRO-2 row a pipelined ZeRO-2
stage runs at) are timed eager only, and their compiled layouts priced as below
(docs/calibrate.md, "Compiled rows"). A plain layer at a recompute mode the calibration did not
compile takes its eager row moved by another mode's compiled/eager pair
(:func:`compiled_from_pair`).

**Mechanism.** ``torch.compile`` changes a block's own compute: Inductor fuses its
element-wise kernels (norms, activations, residual adds, autocast's casts) into fewer
kernels, and one compiled graph replaces many Python-dispatched operators. It does not
change FSDP2's collectives: the all-gather before a block and the reduce-scatter after its
backward are issued by FSDP2's hooks outside the compiled block. So a compiled FSDP2 layer is
the eager FSDP2 row with its compute part moved by what compile moved in the plain pair at
the same tp, sequence parallelism, recompute mode and micro-batch (every row interpolated
at the layout's micro-batch, as lookups are):

    r_x = plain_compiled_x / plain_eager_x
    t_x = eager_x − min(plain_eager_x, eager_x) · (1 − r_x)

for x = forward and backward GPU seconds, and forward and backward CPU dispatch. The eager
row's compute part is the plain eager row (the layer's operators; what an FSDP2 row holds
beyond it is its gathers, reduce-scatters and hooks, as :meth:`~meshplan.hardware_profiles.
measured.MeasuredTables.fsdp_layer` composes rows), at most the whole row. The CPU ratio is
taken on the call the rows were timed on (per layer of the 2-block stack: per-layer rest +
per-call part / 2), since compiled rows carry no per-call split; the derived row's per-layer
rest and per-call part move by the same ratio.

Kept activations and a backward's working memory:

    act  = min(eager_act, plain_compiled_act − w),   w = 2 B × layer params / tp

(an MoE layer's params: at ep 1 with its E routed experts; at ep > 1 act = eager_act,
below; its plain pair at the layout's ep, where an FSDP2 row at ep > 1 is derived;
w = 0 under full recomputation, below)
    peak = eager_peak · plain_compiled_peak / plain_eager_peak

``w``: under autocast a compiled block casts its fp32 weights inside the graph and saves the
16-bit copies for its backward, once per call (eager autocast caches one cast per step
instead, counted with the weights: :func:`~meshplan.costmodel.torch_memory.
compute_copy_bytes`). The compiled rows show it as an intercept of the kept bytes in the
micro-batch equal to the layer's 16-bit weights (4 × H200, 2026-11-28, recompute none:
gpt3-1.3b tp 1 224 / 352 / 609 MiB at micro-batch 1 / 2 / 4 = 96 + 128·mb, its layer's
weights 96 MiB; Llama-1.64B 121 + 160·mb against 120 MiB; tp 2: 48 and 61 against 48 and
60). Under full recomputation the checkpointed block keeps only its input and casts again
when it recomputes: every profile's tp 1 compiled full row keeps what its eager row keeps
(14-112 MiB, the eleven profiles of 2026-11-29/30), so there w = 0 (with w the kept bytes
came out 0: fp8h9's compiled ZeRO-3 full layout, 56 MiB a layer short, docs/benchmarks/fp8_checks.md
"fp8h9"). An MoE layer's compiled row keeps its experts' copies at ep 1 only (the executor
casts them per call; moeh2's and moeh3's ep 1 rows: intercepts 163 / 425 MiB against
161 / 424 MiB of 16-bit weights). At ep > 1 the compiled plain row is no guide, and the
eager FSDP2 row's kept bytes stand: on 2 x H200 (torch 2.11, Inductor) the compiled MoE layer
at ep 2 saves its rank's experts' copies but *none of its routed rows' activations* (the
expert input, fc1's output, the activation's; ``benchmarks/moe_saved_copies.py`` on moeh14's
layer: 367 MiB saved against eager's 767, the allocator agreeing), while the compiled FSDP2
layouts at ep 2 peaked as if they kept them: priced from the compiled row less the dense
weights' copies, moeh14's compiled ZeRO-2 and moeh15's ZeRO-3 came out 4.8 % and 10.8 %
under their measured peaks; from the eager FSDP2 row, +2.8 % and −4.8 % (post hoc, fitted on
those two; the compiled rows' copies rule before it gave −12.3 % on moeh14). Why the plain
compiled layer dropped them, found 2026-11-30: under torch 2.11 its experts' all-to-all
compiled to a zero gradient, so nothing needed them (the probe's compiled gradients 1.0
away from eager's; fixed in the executor, docs/benchmarks/compiled_grads.md). A correct
compiled step keeps them, as the eager FSDP2 row does; this rule's evidence, those runs, is
of the defective step and is to be re-measured.
FSDP2 runs its layers in bf16 without autocast, with no cast to save. The rest is what
the compiled graph keeps, the same 16-bit tensors whatever the precision policy; what it
no longer keeps under autocast is partly autocast's fp32 copies, which FSDP2's eager layers
do not keep either (gpt3-1.3b: the plain eager row keeps 148 MiB per micro-batch, the FSDP2
rows 128, the compiled row 128 + w), so the eager FSDP2 row is the bound, not a ratio: a
ratio would take compile's saving off the FSDP2 row a second time (post hoc, 2026-11-28's
gpt3-1.3b dp 4 ZeRO-2 run peaked at the same byte eager and compiled; with the ratio the
compiled prediction was 7.1 % under it, with the bound 0.0 %).

A derived row has no zero-bubble split (AOTAutograd compiles one backward; compiled rows
have none either). The estimate names the rows in a caveat (:func:`derived_caveat`).

Measured error (as run, never-run models, 2 × H200): fp8h8's ZeRO-3 selective bf16 arm
+7.4 % (host-paced), fp8h9's ZeRO-3 full bf16 arm −11.5 % (post hoc with its compiled
module's sustained clock −7.2 %: compile saved 7-8 % of the step, the derivation 12 %);
re-run post hoc on profiles that also timed the compiled FSDP2 rows (2026-11-30,
docs/benchmarks/fp8_checks.md "Compiled FSDP2 rows on a GPU"): from the timed rows +1.5 % (s03
bf16), −0.9 % (s03 fp8), +1.4 % (r03 bf16); derived on the same profiles −5.7, −10.0 and −21.2 %;
the 2026-11-28 runs, post hoc, in ``benchmarks/compile_repredict.py`` (docs/costmodel.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.costmodel.measured import Interpolated
from meshplan.costmodel.memory import stage_params
from meshplan.costmodel.moe import moe_params_per_rank
from meshplan.hardware_profiles.calibrated import LAYER_ROW_BLOCKS
from meshplan.spec import Job, Layout, ModelSpec

ROW_COPY_BYTES = 2    # the rows' 16-bit (bf16 autocast) weight copies, per parameter

_GPU = ("forward_s", "backward_s")
_CPU = (("forward_cpu_s", "forward_cpu_fixed_s"), ("backward_cpu_s", "backward_cpu_fixed_s"))
_SPLIT_ZERO = dict(backward_input_s=0.0, backward_weight_s=0.0, backward_input_cpu_s=0.0,
                   backward_weight_cpu_s=0.0, split_layers=0.0, backward_input_depth_s=0.0,
                   backward_weight_depth_s=0.0)


def _r(a: float, b: float) -> float:
    return a / b if b > 0 else 1.0


@dataclass(frozen=True)
class CompileRatios:
    """What compile moved in the plain pair (compiled / eager), per quantity."""

    forward_s: float
    backward_s: float
    forward_cpu_s: float
    backward_cpu_s: float
    activation_bytes: float | None      # None: the eager row's kept bytes stand (MoE, ep > 1)
    peak_bytes: float

    @classmethod
    def of(cls, eager: Interpolated, compiled: Interpolated,
           weight_copy_bytes: float | None) -> "CompileRatios":
        def cpu(r: Interpolated, per_layer: str, fixed: str) -> float:
            return getattr(r, per_layer) + getattr(r, fixed) / LAYER_ROW_BLOCKS
        cpu_known = eager.cpu_measured and compiled.cpu_measured
        return cls(_r(compiled.forward_s, eager.forward_s),
                   _r(compiled.backward_s, eager.backward_s),
                   *(_r(cpu(compiled, *n), cpu(eager, *n)) if cpu_known else 1.0
                     for n in _CPU),
                   (None if weight_copy_bytes is None else
                    _r(max(0.0, compiled.activation_bytes - weight_copy_bytes),
                       eager.activation_bytes)),
                   _r(compiled.peak_bytes, eager.peak_bytes))

    def text(self) -> str:
        kept = ("the eager FSDP2 row's (compiled MoE rows at ep > 1 timed before 2026-11-30 "
                "ran without their experts' backward: docs/benchmarks/compiled_grads.md)"
                if self.activation_bytes is None else
                f"the compiled row's less its weight copies (x{self.activation_bytes:.2f} the "
                "eager row's), at most the eager FSDP2 row's")
        return (f"GPU forward x{self.forward_s:.2f}, backward x{self.backward_s:.2f}; CPU "
                f"x{self.forward_cpu_s:.2f} / x{self.backward_cpu_s:.2f}; kept activations: "
                f"{kept}")


def derive_compiled(eager: Interpolated, plain_eager: Interpolated,
                    plain_compiled: Interpolated, weight_copy_bytes: float | None
                    ) -> Interpolated:
    """``eager`` (a layer row timed eager) as compiled: the module docstring's formulas;
    ``weight_copy_bytes`` None keeps the eager row's activations (an MoE row at ep > 1)."""
    k = CompileRatios.of(plain_eager, plain_compiled, weight_copy_bytes)

    def moved(name: str, ratio: float) -> float:
        own = getattr(eager, name)
        return max(0.0, own - min(getattr(plain_eager, name), own) * (1.0 - ratio))
    out = {n: moved(n, getattr(k, n)) for n in _GPU}
    if eager.cpu_measured:
        for (per_layer, fixed), ratio in zip(_CPU, (k.forward_cpu_s, k.backward_cpu_s)):
            out[per_layer], out[fixed] = moved(per_layer, ratio), moved(fixed, ratio)
    kept = (eager.activation_bytes if weight_copy_bytes is None else
            min(eager.activation_bytes, max(0.0, plain_compiled.activation_bytes
                                                - weight_copy_bytes)))
    return replace(eager, **out, activation_bytes=kept,
                   peak_bytes=eager.peak_bytes * k.peak_bytes, **_SPLIT_ZERO)


@dataclass(frozen=True)
class CompiledRows:
    """A layout's FSDP2 row and pipelined ZeRO-2 stage row as compiled where derivable, and
    which were (``sources``: one sentence per derived row)."""

    fsdp_row: Interpolated | None
    stage_row: Interpolated | None
    fsdp_derived: bool = False
    stage_derived: bool = False
    sources: tuple[str, ...] = ()


def plain_pair(tables, model: ModelSpec, job: Job, layout: Layout
               ) -> tuple[Interpolated, Interpolated] | None:
    """The plain (ZeRO-0) eager and compiled rows at the layout's tp, SP, recompute and
    micro-batch, or None where either is missing."""
    kw = dict(seq_len=job.seq_len, tp=layout.tp, sequence_parallel=layout.sequence_parallel,
              recompute=layout.recompute, micro_batch=layout.micro_batch, ep=layout.ep)
    eager = tables.layer(model, **kw)
    compiled = tables.layer(model, compile=True, **kw)
    return None if eager is None or compiled is None else (eager, compiled)


def compiled_layout_rows(tables, model: ModelSpec, job: Job, layout: Layout,
                         fsdp_row: Interpolated | None,
                         stage_row: Interpolated | None) -> CompiledRows:
    """``fsdp_row`` (the FSDP2 row of ZeRO-2/3 over dp) and ``stage_row`` (FSDP2's compute
    alone, a pipelined ZeRO-2 stage's) as compiled, each derived from the plain pair; both
    unchanged (and not derived) where the pair is missing or ``layout.compile`` is off."""
    if not layout.compile or (fsdp_row is None and stage_row is None):
        return CompiledRows(fsdp_row, stage_row)
    pair = plain_pair(tables, model, job, layout)
    if pair is None:
        return CompiledRows(fsdp_row, stage_row)
    w = compiled_row_copies(model, layout)
    ratios = CompileRatios.of(*pair, w).text()
    at = (f"tp {layout.tp}{' with SP' if layout.sequence_parallel and layout.tp > 1 else ''}, "
          f"recompute {layout.recompute}, micro-batch {layout.micro_batch}")
    sources = []
    if fsdp_row is not None:
        fsdp_row = derive_compiled(fsdp_row, *pair, w)
        sources.append(f"the eager FSDP2 row (ZeRO-{layout.zero}, dp {layout.dp}, {at})")
    if stage_row is not None:
        stage_row = derive_compiled(stage_row, *pair, w)
        sources.append(f"the eager 1-rank FSDP2 compute row ({at})")
    return CompiledRows(fsdp_row, stage_row, fsdp_row is not None, stage_row is not None,
                        tuple(f"{s} with its compute moved by the plain compiled/eager rows "
                              f"at {at} ({ratios})" for s in sources))


#: for a recompute mode without a compiled row, the modes whose compiled/eager pair carries
#: compile's change to its eager row, nearest first (selective is none with the attention
#: core recomputed; full re-runs the whole forward)
PAIR_MODES = {"none": ("selective", "full"), "selective": ("none", "full"),
              "full": ("selective", "none")}


def compiled_from_pair(tables, model: ModelSpec, eager: Interpolated, *, recompute: str,
                       tp: int, ep: int = 1, **kw) -> tuple[Interpolated, str] | None:
    """``eager`` (the layer's eager row at ``recompute``, where the profile has no compiled
    one) as compiled, moved by the compiled/eager pair at the nearest other recompute mode
    (:data:`PAIR_MODES`) at the same tp, SP, micro-batch and ep; with a sentence naming the
    pair, or None where no mode has both rows.

    Compile moves a block's element-wise work by a ratio that depends on the block's kernels,
    not on which of them recomputation re-runs, so the GPU forward and backward are the eager
    row's times the pair's compiled / eager ratio. The CPU dispatch stays the eager row's: a
    compiled block's moves with how its recomputation is staged — compiled / eager CPU per
    layer (forward; backward) over the committed dense one-H200 profiles fp8h1-fp8h22: 0.59-2.1
    (0.64-1.25) at recompute none, 0.97-2.18 (0.80-1.43) at selective, 0.43-1.01 (0.38-0.79)
    at full (``benchmarks/compiled_cpu_ratios.py``) — so no mode's ratio carries another's;
    ratio 1 lies inside recompute none's range.
    Kept bytes: the eager row's times the pair's ratio of what the compiled block
    keeps beside its weight copies, plus this mode's copies (:func:`row_weight_copies`: 0
    under full recomputation); an MoE row at ep > 1 keeps the eager row's (its compiled
    rows do not say: module docstring). Peak: the eager row's times the pair's ratio.

    Measured (1 × H200, docs/benchmarks/fp8_checks.md "Compiled rows from another recompute
    mode's pair" and "fp8h29"): POST HOC on fp8h26's compiled recompute-none arm, priced from
    fp8h18's eager row +29.3 % (bf16) and +19.3 % (fp8) as eager, −3.8 / +3.6 % so; held out
    as run on fp8h29 (a never-run 1.87 B Llama from fp8h18's rows), the four derived arms
    −0.8 to −5.8 % (3.6 % mean) where as eager +23.7 to +29.8 %, memory within 3.3 % where
    +12.8 to +37.4 %."""
    for other in PAIR_MODES[recompute]:
        at = dict(kw, tp=tp, ep=ep, recompute=other)
        e, c = tables.layer(model, **at), tables.layer(model, compile=True, **at)
        if e is None or c is None:
            continue
        w_pair, w_here = copies_at(model, tp, ep, other), copies_at(model, tp, ep, recompute)
        k = CompileRatios.of(e, c, w_pair)
        out = {"forward_s": eager.forward_s * k.forward_s,
               "backward_s": eager.backward_s * k.backward_s}
        kept = (eager.activation_bytes if k.activation_bytes is None or w_here is None else
                eager.activation_bytes * k.activation_bytes + w_here)
        if recompute == "selective":
            kept = max(0.0, kept - core_output_bytes(model, tp=tp, **kw))
        row = replace(eager, **out, activation_bytes=kept,
                      peak_bytes=eager.peak_bytes * k.peak_bytes, **_SPLIT_ZERO)
        return row, (f"the eager row at recompute {recompute} moved by the compiled/eager "
                     f"rows at recompute {other} (GPU forward x{k.forward_s:.2f}, backward "
                     f"x{k.backward_s:.2f}; CPU dispatch the eager row's)")
    return None


def core_output_bytes(model: ModelSpec, *, tp: int, seq_len: int, micro_batch: float,
                      **_) -> float:
    """The attention core's output on one tp rank, per layer and micro-batch (16-bit): what an
    eager block under selective recomputation keeps for the output projection and a compiled
    one does not. Inside the compiled block the core is checkpointed in the block's one graph
    (``executor.attention_core.recomputed_core``), and the partitioner re-runs it in the
    backward ahead of the projection's weight gradient instead of saving its output. Rows of
    today's executor, compiled selective against compiled none, per micro-batch, beside the
    eager pair's difference: fp8h21 (MHA) 22.3 MiB more saved where the eager pair differs by
    0.3 and this is 22.0; fp8h20b (GQA) and host22 (MQA) 30.3 and 26.5 where eager 20.3 and
    17.8 and this 10.0 and 8.8; fp8h22 (MQA) 43 where eager 28.8 and this 28.5 (half of it).
    Found on fp8h39's selective arms (+2.4..+6.0 % peak memory without it, within 0.8 % with
    it: POST HOC, docs/benchmarks/fp8_checks.md "fp8h39"); held out on fp8h40 and fp8h41, the
    selective arms' mean peak error from fp8h1's / fp8h2's rows 5.1 / 6.3 → 0.3 / 1.5 % and
    2.3 / 3.0 → 1.5 / 0.9 %."""
    return 2.0 * micro_batch * seq_len * model.num_heads * model.value_head_dim / tp


def copies_at(model: ModelSpec, tp: int, ep: int, recompute: str) -> float | None:
    """:func:`compiled_row_copies` at tp, ep and a recompute mode."""
    if model.is_moe and ep > 1:
        return None
    return compiled_row_copies(model, Layout(tp=tp, recompute=recompute))


def row_weight_copies(model: ModelSpec, tp: int, recompute: str,
                      experts: float = 0.0) -> float:
    """The 16-bit weight copies a compiled block under autocast keeps for its backward, per
    layer and micro-batch (``w`` in the module docstring): 2 B × the layer's parameters on a
    rank (``experts``: an MoE layer's routed-expert parameters there), 0 under full
    recomputation."""
    if recompute == "full":
        return 0.0
    return ROW_COPY_BYTES * (stage_params(model, 1, tp, first=False, last=False, pp=1)
                             + experts)


def compiled_row_copies(model: ModelSpec, layout: Layout) -> float | None:
    """``w`` for the layout's plain compiled row: the 16-bit copies of the layer's weights,
    an MoE layer's with all its experts at ep 1 (the executor casts them per call as it
    casts the layer's other weights; ``stage_params`` counts an MoE layer without them);
    None for an MoE layer at ep > 1, whose compiled row does not say what a compiled FSDP2
    layer keeps (the module docstring)."""
    if not model.is_moe:
        return row_weight_copies(model, layout.tp, layout.recompute)
    if layout.ep > 1:
        return None
    return row_weight_copies(model, layout.tp, layout.recompute,
                             moe_params_per_rank(model, layout).experts)


def derived_caveat(sources: tuple[str, ...]) -> str:
    """The caution for a compiled layout priced from derived rows (module docstring)."""
    return ("compile = True priced from " + "; and ".join(sources) + ": the profile has no "
            "FSDP2 row timed compiled here (calibrations since 2026-11-30 time a dense "
            "model's over the widest dp), so compile's change is carried over from the plain "
            "layers on the assumption that it moves the layer's compute and not FSDP2's "
            "collectives; as run on 2 x H200 this put a compiled ZeRO-3 layout 7-12 % fast "
            "and a host-paced one 7 % slow (fp8h9, fp8h8), a compiled ZeRO-3 MoE layout at "
            "ep 2 5 % fast (moeh12), and on recalibrations 6-21 % fast where the timed "
            "compiled FSDP2 rows came within 1.5 % (and a never-run model's, fp8h10, within "
            "2 %) "
            "(meshplan/costmodel/compiled_rows.py)")


__all__ = ["CompileRatios", "CompiledRows", "PAIR_MODES", "ROW_COPY_BYTES", "compiled_from_pair",
           "compiled_layout_rows", "copies_at", "derive_compiled", "derived_caveat", "plain_pair",
           "row_weight_copies"]
