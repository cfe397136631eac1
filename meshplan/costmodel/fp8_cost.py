"""FP8 in an estimate: what ``Job(precision="fp8")`` changes in one layer's time and memory.

The layer is first priced as bf16 (analytical, or the profile's measured bf16 row:
:mod:`meshplan.costmodel.parts`), then :func:`fp8_layer` gives what fp8 changes, per
micro-batch, from the formulas of :mod:`meshplan.costmodel.fp8` and the GPU profile's fp8
keys:

* **GEMMs.** The four linears of a layer (QKV, attention output, MLP up/gate, MLP down) run
  their forward, data-gradient and weight-gradient GEMMs in fp8 under every recipe
  (:func:`~meshplan.costmodel.fp8.fp8_gemms`; DeepSeek-V3, arXiv 2412.19437 §3.3.1; TE and
  torchao likewise); attention, the norms, the embedding and the logits stay bf16. A GEMM of
  F = 2mkn FLOPs takes F / (fp8 peak × e₈(F)), e₈ the profile's ``fp8_gemm_efficiency``
  (its datasheet default, the bf16 curve × 0.86 measured on one H100, is derived in
  data/gpus.toml). The layer's bf16 GEMM time — analytical, or the measured row's GEMM
  share (:func:`~meshplan.costmodel.parts.layer_parts` splits a row over the analytical
  categories) — is multiplied by r = Σ fp8 time / Σ bf16 time over the four linears.
* **Casts** (:func:`~meshplan.costmodel.fp8.linear_cast_traffic`): per linear per
  micro-batch, the bytes of every amax, cast and transpose pass of the recipe; time =
  passes × fixed cost + bytes / bandwidth, the rate set by how the casts run
  (:func:`cast_rate`): the executor's eager casts (runtime "torch" without compile:
  ``fp8_cast_eager_pass_s`` + ``fp8_cast_eager_gbps``, H100 fit: 117 µs per pass and
  1089 GB/s, data/gpus.toml), Inductor-fused casts (compile: ``fp8_cast_compiled_gbps``
  where calibrated, else HBM × ``hbm_efficiency`` — an assumption, stated in the caveats;
  inside a compiled block × ``fp8_cast_compiled_block_share``, H200 0.332: fitted on 54
  compiled fp8 rows of 14 models against their bf16 twins composed, 24.1 → 4.7 % mean,
  ``benchmarks/fp8_composed_rows.py``),
  and TransformerEngine's fused cast-transpose kernels (runtime "megatron": HBM ×
  ``hbm_efficiency``, assumed, amax from history for ``delayed``). The casts are
  memory-bound time (``PassCost.memory_bound_s``).
* **Eager casts: GPU and host apart.** That eager fit comes from synchronized timings,
  which read max(GPU, CPU): on an H200 host the executor's fp8 linear read ~2 ms whatever
  its size, its CPU's dispatch. Timed queued (benchmarks/fp8_eager_cast_gpu.py, 1 × H200,
  2026-12-01), a pass costs the GPU 9.4 µs plus its bytes at 598 GB/s, and the host 133 µs
  more than a bf16 linear's dispatch. Where the profile has that split
  (``fp8_cast_eager_gpu_pass_s``, ``fp8_cast_eager_gpu_gbps``, ``fp8_cast_eager_host_pass_s``)
  and the estimate has the CPU's dispatch (a calibrated profile's layer rows), the GPU part
  goes on the GPU's timeline and the host part on the CPU's (:attr:`Fp8Layer.
  forward_cast_cpu_s`, added to the layer's dispatch by :func:`meshplan.costmodel.build.
  host_dispatch`), so a GPU-bound step hides it and a host-bound one pays it; without
  either, the synchronized pair on the GPU's timeline as before. Measured: every eager
  fp8 arm ran faster than the synchronized pricing (fp8h3 eager +11..+22 %, moeh18 +8 %,
  moeh19 +8 %, moeh20 +29 %, as run; docs/benchmarks/fp8_checks.md "Eager casts: GPU or
  host", with the errors after, post hoc).
* **Compiled fp8's host dispatch: not priced.** A compiled fp8 block launches the amax,
  scale and cast kernels around each fp8 GEMM, so the host dispatches more than for its bf16
  twin: over the committed compiled fp8 rows of fp8h1-fp8h15 (43 settings, 14 models, one
  H200 host) −0.1 to 3.5 ms a layer per micro-batch, 1.3 ms mean (0.48× the bf16 block's;
  ``benchmarks/fp8_composed_rows.py``). Too scattered across models for one datasheet
  number: at that mean, fp8h17's host-bound fp8 arms would have read about +10 to +49 % where
  unpriced they read −19 to +4 %. A composition keeps the bf16 row's dispatch and says so on
  a host-bound or near-host-bound layout (:mod:`meshplan.costmodel.fp8_caveats`); a measured
  fp8 row (``meshplan calibrate --fp8-rows``) carries its own dispatch — fp8h17 with its own
  fp8 rows, post hoc: fp8 9.9 % mean, speed-up 8.2 % (docs/benchmarks/fp8_checks.md
  "fp8h17").
* **Weight casts.** The executor re-casts W in every forward and backward (torchao does the
  same): per micro-batch, reading fp32 parameters under ZeRO-0/1 and FSDP2's bf16 gathered
  ones under ZeRO-2/3 (:func:`~meshplan.costmodel.runtime.fp8_weight_source_bytes`).
  TransformerEngine casts W on a step's first micro-batch and caches the fp8 weight and its
  transpose (``is_first_microbatch``), so its weight casts are per step
  (:attr:`Fp8Layer.weight_cast_step_s`, spread over the step's micro-batches by
  :func:`meshplan.costmodel.build.layer_times`).
* **No amax all-reduces** under tensor parallelism: the executor casts each shard with its
  own scales (:mod:`meshplan.costmodel.fp8`, "Tensor parallelism"), so fp8 adds no tp
  collective and no rank synchronisation to a micro-batch. Limitation: TransformerEngine's
  current scaling (runtime "megatron", recipe ``tensorwise``) all-reduces the amax of the
  inputs it all-gathers in fp8 under sequence parallelism; that fp8 gather is not modelled
  (below), so neither is its all-reduce — whose real cost on a host-bound layout is the
  wait for the slowest rank's host, not its latency, and needs a per-rank host-skew term
  no profile measures yet.
* **Memory, runtime "torch"** (what :mod:`meshplan.executor.fp8` keeps). Its autograd
  Function disables autocast and receives the stored weight itself: the fp32 parameter
  under ZeRO-0/1, FSDP2's gathered bf16 one under ZeRO-2/3. It saves (x, W, two fp32
  scales) and re-casts in backward; no fp8 tensor outlives the linear that runs (its fp8
  operands are transient working memory, :attr:`Fp8Layer.working_bytes`: the backward's
  dy and its transpose, W for the data gradient, xᵀ). What that changes against the bf16
  arm, whose ZeRO-0/1 linears run under autocast:

  - *weights* (:attr:`Fp8Layer.weight_copy_bytes`, per layer, counted with the weights):
    eager ZeRO-0/1 keeps no autocast copy of the four linears' weights for the step
    (−2 B per linear parameter; :func:`~meshplan.costmodel.torch_memory.
    compute_copy_bytes` counts them for bf16); ZeRO-2/3 holds FSDP2's bf16 weights either way;
  - *compiled rows* (:attr:`Fp8Layer.row_weight_copy_bytes`, per layer per micro-batch):
    a compiled bf16 block under autocast saves the 16-bit weight copies for its backward
    (:mod:`meshplan.costmodel.compiled_rows`: the rows' intercept); the fp8 block saves
    the fp32 parameter instead (−2 B per linear parameter per micro-batch);
  - *compiled activations* (:attr:`Fp8Layer.activation_delta_bytes`): where the backward
    only re-casts an input (x·scale, clamp, cast, transpose — element-wise), Inductor's
    partitioner recomputes the input from what the block keeps anyway instead of saving
    it: the two norm outputs (QKV and MLP-up inputs, from the residual input and the norms'
    rstd) and the MLP-down input (from the up/gate output the activation's backward keeps)
    are not kept (−2 B each element; the attention output stays, flash attention keeps it).
    An MoE layer without shared experts has no MLP-up input: its second norm's output feeds
    the router (an fp32 copy) and the dispatch, and neither arm keeps it, so only the QKV
    input comes off (found post hoc, 2026-12-05: the moeh checks' compiled arms without
    shared experts read 2·h B a token and layer fast, and a compiled CPU block of the
    executor's MoE layer under ``saved_tensors_hooks`` keeps norm1's output in bf16 alone,
    docs/benchmarks/moe_checks.md "Compiled fp8 MoE blocks keep less").
    Under sequence parallelism the norm outputs reach the linears through an all-gather,
    which is not recomputed: only the MLP-down input goes. Eager, the saved 16-bit inputs
    are bf16's. Under full recomputation a compiled fp8 block keeps, beside its input, the
    16-bit outputs of the fp8 GEMMs that feed other operators — QKV, the attention
    projection (whole width: after the tp all-reduce) and MLP up (gate and up for SwiGLU):
    ``tokens × ((q + 2·kv + up) / tp + h) × 2 B`` a layer, where a bf16 block keeps its input
    alone (Inductor's partitioner saves the fp8 GEMMs' outputs instead of recomputing
    them). Found post hoc in the compiled full-recompute fp8 rows of every fp8 profile
    (fp8h1-fp8h4, fp8h6, fp8h7, fp8h9, 2026-11-29/30: each row's bytes beyond its input,
    exactly, at tp 1 and at tp 2 without SP; fp8h9's 360 MiB against bf16's 56,
    docs/benchmarks/fp8_checks.md "fp8h9"). Not priced under sequence parallelism (those compiled
    rows, bf16 too, keep more than this accounts for; measured rows price them) and at tp > 1 the
    compiled bf16 row the term goes on keeps one more input copy than the fp8 block (fp8h4: 26 of
    100 MiB).

  Measured: one Llama block (h 256, ffn 1024, 256 tokens) ``torch.compile``'d on CPU
  (torch 2.13, ``torch._scaled_mm``) saved 69.1 B per token·h in bf16 under autocast and
  27.1 in fp8: 30.0 of it the weight copies and 12.0 the norm outputs and MLP-down input,
  each to < 0.01 % (``benchmarks/fp8_saved_bytes.py``); eager, fp8 saved exactly the
  weight copies less. On 4 × H200 (2026-11-28, compiled, tensorwise; post hoc,
  docs/benchmarks/fp8_checks.md) the predicted fp8 − bf16 peak is within 0.2 GiB of the
  measured on five of seven layouts (ZeRO-1/2/3, tp 1/2, pp 1/2); ZeRO-1 dp 4 at tp 1
  measured −3.75 GiB against −4.90 predicted (its blocks were split by DDP's graph cuts,
  which keep more in fp8 than in bf16; the executor has compiled them whole since:
  docs/benchmarks/fp8_checks.md, "f01"), and tp 4 (peak outside the backward) 0 against
  −0.66.
* **Memory, runtime "megatron"**: TE caches each fp8 linear's weight and its
  transpose through the step (2 bytes per linear parameter of every layer on the GPU, on
  top of the 16-bit weights that stay — the "FP8 uses more memory" of TE issues 257 and
  1429; :attr:`Fp8Layer.weight_copy_bytes`) and saves the quantized linear inputs for
  backward (TE PR 1865): the norm outputs feeding QKV and MLP up and the MLP down input
  are kept at 1 byte instead of 2, while the attention output, which flash attention keeps
  in bf16 anyway, gains an fp8 copy (:attr:`Fp8Layer.activation_delta_bytes`; no change
  under full recomputation, which keeps only the layer input).
* **ZeRO-3 / FSDP all-gathers** stay 16-bit in both runtimes as priced here: the executor
  gathers bf16 weights and casts after the gather (docs/fp8.md); torchao's
  ``enable_fsdp_float8_all_gather`` and Megatron's ``--fp8-param-gather``, which gather
  fp8 weights (:func:`~meshplan.costmodel.fp8.zero3_allgather_bytes`), are options neither
  runtime here turns on. Sequence-parallel all-gathers stay 16-bit too (TE can gather fp8
  inputs; not modelled).
* **Which recipes** (:func:`check_fp8_supported`, at estimate time): a GPU needs an fp8
  peak and curve; ``mxfp8`` needs Blackwell (:func:`~meshplan.costmodel.fp8.
  check_recipe_supported`); runtime "torch" runs only the recipes the profile lists in
  ``fp8_torch_recipes`` — those whose ``torch._scaled_mm`` kernel ran on that GPU with the
  executor's torch (H100, torch 2.11, 2026-11-28: tensorwise and rowwise; blockwise had no
  kernel), which also leaves out ``delayed`` and ``mxfp8``, which the executor refuses.

Measured error: on one H100 (2026-11-28, docs/benchmarks/data/fp8_micro_h100.json) the
eager cast term with its fitted keys gives the executor's fp8 linear (fwd + bwd) at 10 %
mean / 33 % max error over the 36 timed shapes (post hoc: the keys were fitted on them;
``meshplan calibrate`` measures them per GPU). The datasheet fp8 curve's factor is the
median of those shapes' ratios (quartiles 0.78-0.94). Training steps, as run on never-run
models with calibrated profiles (runtime "torch", tensorwise; docs/benchmarks/fp8_checks.md, per set
in docs/benchmarks/gpu_checks.md): fp8 / bf16 speed-up error on 2 × H200 10.9-14.6 % mean
for fp8h4, fp8h6 and fp8h7, then 1.6-4.9 % mean for fp8h8-fp8h12 (maxima 2.1-14.5 %, the
largest host-paced arms at the balance point); 4 × H200 31.6 % (2026-11-28, before every
fix; not re-run). On 1 × H200, fp8 composed from bf16 rows (no fp8 rows): moeh20 and fp8h16
as run 18.7 and 15.9 % mean speed-up error (the eager casts on the GPU's timeline, the compiled
casts priced as if cast alone); post hoc, the eager split and the compiled block share, the
eager arms of fp8h3, moeh18-20 1.3 / 2.5 % and the compiled arms of moeh18-20, fp8h16 3.6 /
5.7 % step error (mean / max; fp8h16's host-bound eager arm, +28 %, is not among them: its
casts' dispatch in the step read two thirds of the linear's alone). Published runs on
datasheet profiles (runtime "megatron", recipe ``delayed``; docs/benchmarks/published.md):
NeMo 24.07 on H100 3.3 % mean / 5.8 % max over 7 runs, MLPerf GPT-3 v3.1 4.3 / 7.8 %, v4.0
7.1 / 12.2 % (post hoc with ``Job.fp8_param_gather``, as its configs ran; 12.9 / 13.1 %
before).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.costmodel import fp8
from meshplan.costmodel.moe import shared_width
from meshplan.costmodel.compute import (LayerCost, PassCost, gemm_s, linear_params,
                                        linear_shapes, sixteen_bit_precision)
from meshplan.costmodel.memory import (activation_bytes_per_element,
                                       compute_weight_bytes_per_param)
from meshplan.costmodel.runtime import fp8_transformer_engine, fp8_weight_source_bytes
from meshplan.errors import ConfigError
from meshplan.hardware_profiles import Cluster, GPUSpec
from meshplan.hardware_profiles.measured_rows import cast_family
from meshplan.spec import Job, ModelSpec


@dataclass(frozen=True)
class CastRate:
    """How fast one layout's fp8 casts run: seconds per pass plus bytes at ``gbps``."""

    pass_s: float
    gbps: float
    fused: bool          # TE's cast-transpose: one pass writes both orientations
    how: str             # for caveats and reports
    assumed: bool        # not measured: stated in the estimate's caveats
    host_pass_s: float = 0.0   # the host's dispatch per pass, on the CPU's timeline
    compiled: bool = False     # the executor's casts under torch.compile
    block_share: float = 0.0   # compiled: the profile's fp8_cast_compiled_block_share (0: none)
    #: compiled: the layer family ``block_share`` was measured on, where that is not the
    #: layer's own and the datasheet holds no share for the layer's (a caveat says so)
    share_family: str = ""

    def seconds(self, passes: int, nbytes: float) -> float:
        """``passes`` cast passes moving ``nbytes`` in all (the GPU's timeline)."""
        return passes * self.pass_s + nbytes / (self.gbps * 1e9)


def compiled_block_share(gpu: GPUSpec, model: ModelSpec | None) -> tuple[float, str]:
    """(share, where it comes from) of the compiled casts' price, cast alone, that they cost
    inside ``model``'s compiled block: the profile's own ``fp8_cast_compiled_block_share``
    where it was measured on ``model``'s layer family
    (:func:`~meshplan.hardware_profiles.measured_rows.cast_family`), else the GPU's
    datasheet share for that family (``fp8_cast_compiled_block_share_by_family``), else the
    profile's share as it stands.

    Why per family: Inductor fuses the casts with the kernels around them, and how much it
    hides depends on those kernels. Fitted per family on the 54 compiled fp8 rows of
    fp8h1-fp8h15 (14 models, 1-2 × H200, the rows the pooled 0.332 was fitted on;
    ``benchmarks/fp8_composed_rows.py --by-family``): Llama layers (SwiGLU, RMSNorm, no
    bias; 5 models) 0.142, GPT layers (GeLU, LayerNorm, biased linears; 9 models) 0.419;
    each of the 19 H200 profiles' own shares lies in its family's range (Llama 0.07-0.21,
    GPT 0.32-0.74), none in the other's; the later sets' rows, not in the fit: Llama 7.1 →
    5.0 %, GPT 7.3 → 4.6 % mean (found on fp8h42, POST HOC). Held out on steps as run
    (docs/benchmarks/fp8_checks.md "fp8h43 / fp8h44", 1 × H200): a never-run Llama's fp8
    arms over the eight profiles the share moves 8.9 → 5.7 % mean (lower on 7 of 8); a
    never-run GPT's 4.2 → 6.2 % (lower on 1 of 8). So the datasheet keeps the Llama share
    only (POST HOC): a GPT layer reads the pooled share or a profile's own, as before."""
    share, source, _ = _block_share_reading(gpu, model)
    return share, source


def _block_share_reading(gpu: GPUSpec, model: ModelSpec | None) -> tuple[float, str, str]:
    """(share, where it comes from, the family it was measured on where that is another
    than ``model``'s and the datasheet holds no share for ``model``'s, else ""): the reading
    behind :func:`compiled_block_share` and :attr:`CastRate.share_family`. On one H100 a
    share measured on Llama layers (0.36) priced a never-run GPT's compiled fp8 arms 7-10 %
    fast; the GPT's own calibration measured 0.74 (docs/benchmarks/fp8_checks.md "Why
    fp8h55h100's fp8 arms priced fast")."""
    own = gpu.fp8_cast_compiled_block_share
    if model is None:
        return own, "fp8_cast_compiled_block_share", ""
    fam = cast_family(model)
    measured_on = gpu.fp8_cast_compiled_block_share_family
    if measured_on == fam:
        return own, f"fp8_cast_compiled_block_share, measured on {fam} layers", ""
    table = dict(gpu.fp8_cast_compiled_block_share_by_family)
    if fam in table:
        return table[fam], f"fp8_cast_compiled_block_share_by_family[{fam}]", ""
    return own, "fp8_cast_compiled_block_share", measured_on if own > 0 else ""


def cast_rate(gpu: GPUSpec, job: Job, compile: bool, host_measured: bool = False,
              model: ModelSpec | None = None) -> CastRate:
    """The cast rate of ``job`` on ``gpu`` (see the module docstring). ``host_measured``:
    the estimate has the CPU's dispatch, so eager casts split GPU and host where ``gpu``
    has the split. ``model``: the layer whose casts these are (their share inside a compiled
    block: :func:`compiled_block_share`)."""
    hbm = gpu.hbm_gbps * gpu.hbm_efficiency
    if fp8_transformer_engine(job):
        return CastRate(0.0, hbm, True, "TransformerEngine's fused cast-transpose kernels at "
                        "HBM bandwidth × hbm_efficiency", True)
    if compile:
        if gpu.fp8_cast_compiled_gbps > 0:
            share, source, other = _block_share_reading(gpu, model)
            inside = (f", {share:g} of them inside a block ({source})" if share > 0 else "")
            return CastRate(0.0, gpu.fp8_cast_compiled_gbps / (share or 1.0), False,
                            "compiled casts at the profile's fp8_cast_compiled_gbps" + inside,
                            False, compiled=True, block_share=share, share_family=other)
        return CastRate(0.0, hbm, False, "compiled casts at HBM bandwidth × hbm_efficiency",
                        True, compiled=True)
    if host_measured and gpu.fp8_cast_eager_gpu_gbps > 0:
        return CastRate(gpu.fp8_cast_eager_gpu_pass_s, gpu.fp8_cast_eager_gpu_gbps, False,
                        "eager casts: the GPU's part at the profile's fp8_cast_eager_gpu_pass_s "
                        "and fp8_cast_eager_gpu_gbps, the host's dispatch at "
                        "fp8_cast_eager_host_pass_s", False,
                        host_pass_s=(gpu.fp8_cast_eager_host_pass_s
                                     or gpu.fp8_cast_eager_pass_s))
    if gpu.fp8_cast_eager_gbps > 0:
        return CastRate(gpu.fp8_cast_eager_pass_s, gpu.fp8_cast_eager_gbps, False,
                        "eager casts at the profile's fp8_cast_eager_pass_s and "
                        "fp8_cast_eager_gbps", False)
    return CastRate(0.0, hbm, False, "eager casts at HBM bandwidth × hbm_efficiency (the "
                    "profile has no fp8_cast_eager_gbps)", True)


def check_fp8_supported(job: Job, gpu: GPUSpec) -> None:
    """Raise :class:`ConfigError` where ``gpu`` (or the runtime on it) cannot run the job's
    fp8 recipe, naming what would be valid. Nothing for other precisions."""
    if job.precision != "fp8":
        return
    gpu.peak_flops("fp8")                 # a GPU without fp8 tensor cores: ConfigError
    if gpu.fp8_gemm_efficiency is None:
        raise ConfigError(f"GPU {gpu.name!r} has an fp8 peak but no fp8_gemm_efficiency curve "
                          f"in its profile; add one (data/gpus.toml format) or run `meshplan "
                          f"calibrate` on it")
    fp8.check_recipe_supported(job.fp8_recipe, gpu.name)
    if job.runtime == "torch" and gpu.fp8_torch_recipes \
            and job.fp8_recipe not in gpu.fp8_torch_recipes:
        raise ConfigError(
            f"fp8_recipe {job.fp8_recipe!r} does not run under runtime 'torch' on "
            f"{gpu.name!r}: its profile lists the recipes whose torch._scaled_mm kernel ran "
            f"there with the executor ({', '.join(map(repr, gpu.fp8_torch_recipes))}; "
            f"fp8_torch_recipes, measured by `meshplan calibrate`). Use one of those, or "
            f"runtime 'megatron' (TransformerEngine)")


@dataclass(frozen=True)
class Fp8Layer:
    """What fp8 adds to one layer's bf16 cost, per micro-batch on one GPU."""

    gemm_ratio: float             # fp8 / bf16 time of the four linears' GEMMs
    forward_cast_s: float         # x's casts (and W's where cast per micro-batch)
    backward_cast_s: float        # dy's, x's re-casts, transposes (and W's, as above)
    weight_cast_step_s: float     # TE: W's casts once per step (0: per micro-batch)
    working_bytes: float          # transient fp8 operands of the linear running (torch)
    # per layer, with the weights: TE's fp8 weight + transpose cache (+), or the autocast
    # weight copies the executor's fp8 linears do not make (−, eager ZeRO-0/1)
    weight_copy_bytes: float
    # per layer per micro-batch, with the kept activations (this recompute mode): TE's saved
    # fp8 inputs, or the 16-bit inputs a compiled fp8 block recomputes instead of keeping
    # (−), or under full recomputation the GEMM outputs a compiled fp8 block keeps (+)
    activation_delta_bytes: float
    rate: CastRate
    # per layer per micro-batch: the 16-bit weight copies a compiled bf16 row keeps that the
    # fp8 block does not (−; only where the layer's kept bytes come from a compiled row)
    row_weight_copy_bytes: float = 0.0
    # per MoE layer, with the weights: TransformerEngine's fp8 weight + transpose cache of
    # the rank's routed experts (meshplan.costmodel.fp8_experts; dense layers have none)
    expert_weight_copy_bytes: float = 0.0
    # where the layer was priced from a measured fp8 row: which (meshplan.costmodel.fp8_rows)
    row: str = ""
    # where it was the bf16 row plus the fp8 difference timed at another recompute mode:
    # the row it lacks and that mode (meshplan.costmodel.fp8_rows.sibling_delta)
    sibling: tuple[str, str] = ()
    # that row (or the sibling's) timed the routed experts with their weights cast to fp8
    # beforehand (MeasuredLayer.fp8_weights_cached): its passes hold none of those casts
    # (meshplan.costmodel.moe_layer.with_cached_expert_weights)
    row_expert_weights_cached: bool = False
    # the host's dispatch the eager casts add per micro-batch (CPU's timeline; 0 where the
    # cast rate has no host part: CastRate.host_pass_s)
    forward_cast_cpu_s: float = 0.0
    backward_cast_cpu_s: float = 0.0
    # the executor's compiled block under full recomputation saves its fp8 GEMMs' outputs
    # (Inductor's partitioner), so the recomputed forward runs none of the linears' GEMMs
    # nor their casts (apply)
    recompute_keeps_gemm_outputs: bool = False

    def cast_cpu_s(self, recompute: str) -> tuple[float, float]:
        """(forward, backward) host dispatch the casts add to a layer's; full recomputation
        dispatches the forward's casts again in the backward."""
        again = self.forward_cast_cpu_s if recompute == "full" else 0.0
        return self.forward_cast_cpu_s, self.backward_cast_cpu_s + again

    def apply(self, layer: LayerCost, recompute: str) -> LayerCost:
        """``layer`` (bf16, analytical or measured) with its linears in fp8: GEMM shares × r,
        casts as memory-bound time; the recomputed forward of full recomputation pays the
        forward's changes again.

        That recomputed forward is the one ``layer``'s backward holds (its ``recompute``
        part), moved like the forward — not the forward pass itself: a measured row's
        backward carries its own recomputation, and its forward/backward split can be off
        where its total is not (compiled rows with sequence parallelism put most of the
        backward's GPU time in the forward: fp8h7's tp 2 + SP row, 7.2 / 2.8 ms at recompute
        full, against 3.0 / 7.4 ms without SP), so replacing the held pass by the forward
        priced fp8h7's p01 fp8 arm at 1.24 s where it ran 0.67 s (docs/benchmarks/fp8_checks.md
        "fp8h7"). For an analytical layer the two are the same pass.

        The executor's compiled fp8 block under full recomputation keeps its fp8 GEMMs'
        16-bit outputs instead of recomputing them (the memory term of :func:`torch_memory`,
        found in every compiled full-recompute fp8 row's bytes), so its recomputed forward
        runs no linear GEMM and no cast (:attr:`recompute_keeps_gemm_outputs`). Post hoc on
        the 30 compiled full-recompute fp8 rows of fp8h1-fp8h15 (the bf16 row composed to
        fp8 against the measured fp8 row): 46.9 → 25.3 % mean error, the rest the casts'
        price shared with the rows without recomputation (docs/benchmarks/fp8_checks.md,
        "Compiled fp8 composed from bf16 rows")."""
        k = self.gemm_ratio

        def moved(p: PassCost, cast_s: float) -> PassCost:
            return replace(p, gemm_s=p.gemm_s * k, memory_bound_s=p.memory_bound_s + cast_s)
        forward = moved(layer.forward, self.forward_cast_s)
        # selective recomputation's GEMMs (MLA's up-projections) run in fp8 as well
        # (Megatron-Core's CheckpointWithoutOutput(fp8=...)); their inputs' casts are not
        # counted again
        if recompute == "full" and self.recompute_keeps_gemm_outputs:
            rc = replace(layer.recompute, gemm_s=0.0)
        else:
            rc = moved(layer.recompute, self.forward_cast_s if recompute == "full" else 0.0)
        backward = moved(layer.backward - layer.recompute, self.backward_cast_s) + rc
        return LayerCost(forward, backward, rc, layer.wgrad_s * k, layer.tp_wire_bytes,
                         layer.wgrad_gather_s, layer.wgrad_gather_wire_bytes)


def fp8_layer(model: ModelSpec, cluster: Cluster, job: Job, *, micro_batch: int, tp: int,
              sequence_parallel: bool, recompute: str, compile: bool, fsdp: bool,
              mlp_width: int | None = None, compiled_row: bool = False,
              host_measured: bool = False) -> Fp8Layer:
    """fp8's terms for one layer (module docstring). ``fsdp``: ZeRO-2/3 over dp > 1 (the
    weight the casts read is FSDP2's bf16 one). ``compiled_row``: the bf16 layer's kept
    bytes come from a compiled measured row (its 16-bit weight copies included).
    ``host_measured``: the estimate has the CPU's dispatch (:func:`cast_rate`)."""
    gpu = cluster.gpu
    check_fp8_supported(job, gpu)
    rate = cast_rate(gpu, job, compile, host_measured, model)
    te = fp8_transformer_engine(job)
    wbytes = fp8_weight_source_bytes(job, 2 if fsdp else 0, 2 if fsdp else 1)
    peak16, peak8 = gpu.peak_flops(sixteen_bit_precision(job)), gpu.peak_flops("fp8")
    bf16_s = fp8_s = 0.0
    cast = {"f": 0.0, "b": 0.0, "w": 0.0}
    host = {"f": 0.0, "b": 0.0}
    working = 0.0
    t = rate.seconds
    for (m, k, n), _ in linear_shapes(model, job, micro_batch, tp, mlp_width):
        flops = 2.0 * m * k * n
        bf16_s += gemm_s(gpu, peak16, flops)
        fp8_s += fp8.fp8_gemm_time_s(flops, peak8, gpu.fp8_gemm_efficiency)
        c = fp8.linear_cast_traffic(int(m), int(k), int(n), job.fp8_recipe, act_bytes=2,
                                    weight_bytes=wbytes, fused_cast_transpose=rate.fused)
        w_f = t(c.weight_forward_passes, c.weight_forward_bytes)
        w_b = t(c.weight_passes - c.weight_forward_passes,
                c.weight_bytes - c.weight_forward_bytes)
        cast["f"] += t(c.forward_passes, c.forward_bytes) + (0.0 if te else w_f)
        cast["b"] += t(c.backward_passes, c.backward_bytes) + (0.0 if te else w_b)
        cast["w"] += (w_f + w_b) if te else 0.0
        host["f"] += rate.host_pass_s * (c.forward_passes + c.weight_forward_passes)
        host["b"] += rate.host_pass_s * (c.kernels - c.forward_passes
                                         - c.weight_forward_passes)
        working = max(working, 2.0 * m * n + n * k + m * k)
    lp = linear_params(model, job, tp, mlp_width)
    mem = (te_memory(model, job, micro_batch, tp, sequence_parallel, recompute, lp)
           if te else torch_memory(model, job, micro_batch, tp, sequence_parallel, recompute,
                                   lp, compile=compile, fsdp=fsdp,
                                   compiled_row=compiled_row, mlp_width=mlp_width))
    return Fp8Layer(
        gemm_ratio=fp8_s / bf16_s if bf16_s > 0 else 1.0,
        forward_cast_s=cast["f"], backward_cast_s=cast["b"], weight_cast_step_s=cast["w"],
        working_bytes=0.0 if te else working, rate=rate,
        forward_cast_cpu_s=host["f"], backward_cast_cpu_s=host["b"],
        recompute_keeps_gemm_outputs=compile and not te and recompute == "full", **mem)


def fp8_gathered_params(model: ModelSpec, job: Job, tp: int) -> float:
    """Parameters of one transformer layer's tp shard (an MoE layer without its routed
    experts) that ``Job.fp8_param_gather`` keeps and all-gathers in fp8: its linears'
    weights; 0 without the option."""
    if not job.fp8_param_gather:
        return 0.0
    return linear_params(model, job, tp, shared_width(model) if model.is_moe else None)


def te_memory(model: ModelSpec, job: Job, micro_batch: int, tp: int,
              sequence_parallel: bool, recompute: str, linear_params: float) -> dict:
    """TransformerEngine's memory terms (module docstring): the fp8 weight + transpose
    cache and the saved fp8 linear inputs. With ``Job.fp8_param_gather`` the fp8 weight and
    its transpose (1 + 1 bytes) take the place of the 16-bit weight (2 bytes, counted with
    the model states) and no cache is added."""
    return dict(weight_copy_bytes=0.0 if job.fp8_param_gather else 2.0 * linear_params,
                activation_delta_bytes=(te_activation_delta_bytes(
                    model, job, micro_batch, tp, sequence_parallel)
                    if recompute != "full" else 0.0))


def torch_memory(model: ModelSpec, job: Job, micro_batch: int, tp: int,
                 sequence_parallel: bool, recompute: str, linear_params: float, *,
                 compile: bool, fsdp: bool, compiled_row: bool,
                 mlp_width: int | None = None) -> dict:
    """The executor's memory terms against the bf16 arm (module docstring): the autocast
    weight copies its fp8 linears do not make (ZeRO-0/1: once per step eager, per
    micro-batch in a compiled row) and, compiled, the 16-bit linear inputs the partitioner
    recomputes instead of keeping, or under full recomputation the GEMM outputs it keeps."""
    copy = 0.0 if fsdp else compute_weight_bytes_per_param(job) * linear_params
    kept = recompute != "full"
    tokens = job.seq_len * micro_batch
    width = model.ffn_hidden_size if mlp_width is None else mlp_width
    e = activation_bytes_per_element(job)
    delta = 0.0
    if compile and kept:
        # the QKV input, and the MLP-up input where the layer has a dense MLP: an MoE layer
        # without shared experts feeds its second norm's output to the router and the
        # dispatch only, and its bf16 twin does not keep it either
        inputs = 2.0 if width > 0 else 1.0
        norms = 0.0 if sequence_parallel and tp > 1 else inputs * tokens * model.hidden_size
        delta = -(norms + tokens * width / tp) * e
    elif compile and not (sequence_parallel and tp > 1):
        # full recomputation: the fp8 GEMMs' outputs that feed other operators are kept
        up = (2 if model.activation == "swiglu" else 1) * width
        delta = tokens * ((model.q_dim + 2 * model.kv_dim + up) / tp + model.hidden_size) * e
    return dict(weight_copy_bytes=0.0 if compiled_row else -copy,
                row_weight_copy_bytes=-copy if compiled_row and kept else 0.0,
                activation_delta_bytes=delta)


def te_activation_delta_bytes(model: ModelSpec, job: Job, micro_batch: int, tp: int,
                              sequence_parallel: bool) -> float:
    """What TransformerEngine's saved fp8 linear inputs change in one layer's kept bytes
    (16-bit activations; module docstring): the two norm outputs (QKV and MLP-up inputs,
    replicated unless sequence parallel, Korthikanti et al. 2022 Table 2's 4sbh) and the
    MLP-down input at 1 byte instead of 2, plus an fp8 copy of the attention output."""
    sb = job.seq_len * micro_batch
    norm_out = 2 * sb * model.hidden_size / (tp if sequence_parallel else 1)
    down_in = sb * model.ffn_hidden_size / tp
    attn_out = sb * model.q_dim / tp
    return -(norm_out + down_in) + attn_out


__all__ = ["CastRate", "cast_rate", "check_fp8_supported", "Fp8Layer", "fp8_layer",
           "fp8_gathered_params", "te_memory", "torch_memory", "te_activation_delta_bytes"]
