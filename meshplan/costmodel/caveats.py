"""What an estimate rests on that measurements have shown to be weak: ``Estimate.caveats``.

Plain sentences, each with the measurement behind it (docs/benchmarks/accuracy.md). The
host-bound thresholds are numbers of the GPU profile (``host_bound_caveat_share``,
``host_near_load``, ``host_balanced_load``: :mod:`meshplan.hardware_profiles.corrections`);
they move no prediction, only which caution a layout carries.

No formula and no measured error of its own: the thresholds come from the host-bound
layouts' spread (−24 % to +36 % over 29 runs of 21 layouts, accuracy rounds 8-11:
:mod:`meshplan.costmodel.host`).
"""

from __future__ import annotations

from meshplan.hardware_profiles.corrections import CorrectionNumbers, builtin_corrections

# the built-in thresholds, for callers without a profile (reports of measured runs)
HOST_NEAR_LOAD = builtin_corrections().host_near_load
HOST_BOUND_CAVEAT_SHARE = builtin_corrections().host_bound_caveat_share
HOST_BALANCED_LOAD = builtin_corrections().host_balanced_load
HOST_NEAR_LOAD_TEXT = f"{HOST_NEAR_LOAD * 100:g} %"     # as reports and caveats print it

FSDP_OVER_TP_CAVEAT = (
    "ZeRO-2/3 over tensor-parallel layers is priced from rows composed out of tp = 1 FSDP2 "
    "measurements (this profile has no FSDP2 rows at this tp): such layouts ran 22-48 % "
    "slower than predicted on 4 x H200 (docs/benchmarks/accuracy.md, holdout8); re-run "
    "`meshplan calibrate`, which now measures them")

FSDP_UNMEASURED_CAVEAT = (
    "ZeRO-2/3 priced without FSDP2 rows: the profile times this layer plainly but not under "
    "FSDP2 at this dp, tp and recompute mode (`meshplan calibrate --model` times FSDP2 rows "
    "after the plain, compiled and fp8 ones, so a --time-budget can stop before them), so "
    "FSDP2's per-micro-batch gathers are priced analytically and its hooks' CPU time not at "
    "all; measured layouts priced so on 2 x H200 ran 29-37 % slower than predicted where the "
    "host set the pace (fp8h4), within 3.2 % where the GPU did (fp8h7; "
    "docs/benchmarks/fp8_checks.md): calibrate with a budget that reaches the FSDP2 rows")


FSDP_DP_ONLY_CAVEAT = (
    "FSDP2 over data parallelism alone: on the executor before its explicit forward prefetch "
    "such layouts ran about 20 ms a step slower than their layers and tail predict "
    "(GPT-0.54B 4-10 %, Llama-1.64B 0-4 %), for a reason not found; this profile adds its "
    "fsdp2_dp_only_step_s a step as an empirical term (docs/benchmarks/accuracy.md, rounds "
    "20-22), so compare it with the best ZeRO-0/1 or pipelined layout on a measured run")


# Measured, not priced (docs/benchmarks/accuracy.md, round 22): the eight zero-bubble
# layouts with FSDP2's ZeRO-2 (dp 2, pp 2, runtime "torch") in the measured sets, on their
# own profiles, missed by -26 % to +17 %: GPT-0.54B's five by +3.7 (v07), +17.0 (b04),
# -4.9 (c02), -1.9 (c04) and -26.4 % (o05; -20.9 % in its repeat), Llama-1.64B's three by
# -2.0, +0.8 and +8.1 % (host-bound). In o05 (micro-batch 8, no recomputation) the last
# stage's passes took 416-456 ms against the first's 352-367 ms and its ZeRO-0 twin's
# (o04) 365-371 ms, and its steps ran 379-485 ms within one run; its gradients match
# 1F1B's and its kernels are the same ones (CPU, gloo, bf16 FSDP2). Not found, so not priced.
ZB_FSDP2_CAVEAT = (
    "zero-bubble with FSDP2 (ZeRO-2): the 8 such layouts measured on 4 x H100/H200 missed "
    "their predictions by -26 % to +17 % (GPT-0.54B dp 2 pp 2 micro-batch 8: -26 % and -21 % in "
    "two runs, its last stage 80 ms a step slower than its first; -5 % on a host with a "
    "faster CPU, round 23), which the model does not price: it dispatches more CPU work than "
    "the model counts and binds on slower hosts (docs/benchmarks/accuracy.md, rounds 22-23); "
    "compare it with the same layout at ZeRO-0/1 or 1F1B on a measured run")

COMPILE_AS_EAGER_CAVEAT = (
    "compile = True priced as eager: the GPU profile has no compiled layer rows for this "
    "layer's shape, tp, sequence parallelism, recompute mode and micro-batch (`meshplan "
    "calibrate --model M --compile-rows` times them; FSDP2 layers, timed eager only, are "
    "derived from the plain compiled/eager pair at their settings where the profile has it), "
    "so no speed-up from torch.compile is in this prediction")

COMPILE_ANALYTICAL_CAVEAT = (
    "compile = True priced from the analytical layer (the GPU profile has no layer rows for "
    "this layout): its element-wise work at the fused count, one read and one write per "
    "tensor, as Inductor's generated kernels move it, and no CPU dispatch; `meshplan "
    "calibrate --model M --compile-rows` times the compiled block")

COMPILE_ANALYTICAL_FP8_CAVEAT = (
    "compiled fp8 without layer rows: a compiled fp8 block dispatches the amax, scale and "
    "cast kernels around each GEMM beside its bf16 twin's (+1.3 ms a layer per micro-batch on "
    "average over the fp8h1-fp8h15 rows, one H200 host), which this price leaves out with "
    "the rest of the CPU's dispatch: where the host paces the step fp8 gains less than "
    "priced, or loses (one H200, micro-batch 1-2 of 1.65-2.3 B models: 15-49 % faster "
    "priced than run, fp8 up to 1.37x slower than bf16; docs/benchmarks/fp8_checks.md, "
    "\"The H200 datasheet's compiled casts\"); `meshplan calibrate --model M --compile-rows "
    "--fp8-rows` times it")

COMPILE_MOE_CAVEAT = (
    "compile = True on an MoE model: the executor's whole MoE block compiles as one graph at "
    "ep = 1 and ran 1.38-1.47x faster than eager on one H200 (moe-1.9b, micro-batch 2-4; "
    "docs/benchmarks/moe_checks.md), a speed-up this eager price does not hold "
    "(`meshplan calibrate --model M --compile-rows` times the compiled MoE layer: "
    "costmodel/moe_rows.py)")

MLA_TORCH_CAVEAT = (
    "multi-head latent attention under runtime \"torch\" without a measured layer row: its "
    "memory-bound work (RoPE, the key / value split, the latents' norms) is priced as "
    "Megatron-Core's fused kernels run it, but the executor runs it eagerly — the eager RoPE "
    "alone about 10x the fused price, the splits and concatenations 6-15 % of the attention "
    "part (one H200, plain torch: docs/benchmarks/moe_checks.md \"MLA on one H200\") — so "
    "expect the layer slower than priced (moeh20, a never-run MLA MoE model on one H200: "
    "steps 9-24 % slower than this datasheet price); `meshplan calibrate --model M` times "
    "the executor's own MLA layer (moeh20 calibrated: within 1.1 %)")

MTP_TORCH_CAVEAT = (
    "multi-token prediction under runtime \"torch\": priced (DeepSeek-V3 §2.2: a layer like "
    "the last, its 2h → h projection and its own logits on the last stage), but meshplan's "
    "executor does not run it — `meshplan run` refuses the plan; set mtp_layers = 0 to run "
    "the model without it, or plan it for runtime \"megatron\"")


#: the executor's newest MoE layouts, checked for correctness on CPU ranks only
MOE_UNTIMED_TORCH_CAVEAT = (
    "MoE with {what} under runtime \"torch\": the executor runs it (since 2026-12-01; it "
    "trains like one process on CPU gloo ranks) but no GPU run has timed it yet, so this "
    "price of its extra collectives and host syncs ({how}) is unchecked "
    "(docs/moe.md)")


def moe_untimed_torch_caveats(model, job, layout) -> tuple[str, ...]:
    """:data:`MOE_UNTIMED_TORCH_CAVEAT` for an MoE layout under runtime "torch" at etp > 1 or
    cp > 1."""
    if not model.is_moe or job.runtime != "torch":
        return ()
    out = []
    if layout.etp > 1:
        out.append(MOE_UNTIMED_TORCH_CAVEAT.format(
            what=f"etp = {layout.etp}", how="the routed rows gathered over etp and their partial "
            "outputs returned, one more sync a layer"))
    if layout.cp > 1:
        out.append(MOE_UNTIMED_TORCH_CAVEAT.format(
            what=f"cp = {layout.cp}", how="the routing counts' all-gather over cp"))
    return tuple(out)


UNCLOCKED_ROWS_CAVEAT = (
    "the layer's measured rows carry no sustained-clock ratio although the profile measured "
    "others: their module's back-to-back loop was skipped (host-paced at the timed "
    "micro-batches, or out of memory), so they read at the burst clock. Where the step keeps "
    "the GPU busy it runs at the power-capped clock: fp8h56h100 (1 x H100) calibrated at "
    "micro-batches 1-4 and ran GPU-bound at 16, its bf16 arms 6.4-6.8 % slower than priced "
    "(docs/benchmarks/fp8_checks.md); `meshplan calibrate --for-plan` times the plan's own "
    "micro-batches")


def extended_rows_caveat(timed: tuple[int, ...], micro_batch: int) -> str:
    """The caution for a layer priced from measured rows carried beyond the micro-batches
    they were timed at (linear in the micro-batch from the two nearest: a fixed part of the
    row stays fixed, the kernels' efficiency at the new size is not measured). On 1 × H200
    (docs/benchmarks/fp8_checks.md, fp8h2 and fp8h3): rows of micro-batch 1-2 extended to 4 and 8
    put the step 1.3-4.0 % off and the fp8/bf16 speed-up −5.8 / −5.3 %; rows timed at 4 and 8 gave
    −4.4 / −3.7 % on the same runs, and a never-run model calibrated at its layouts'
    micro-batches 1.1 % / 2.5 % (step) and 1.2 % / 2.4 % (speed-up)."""
    timed_s = ", ".join(str(m) for m in sorted(timed))
    return (f"the layer's measured rows were timed at micro-batch {timed_s} and are extended "
            f"to {micro_batch}: where fp8h2's were (1 x H200), the steps were 1.3-4 % off and the "
            f"fp8/bf16 speed-up about 2 points against rows timed at the micro-batch; "
            f"`meshplan calibrate --micro-batches ...,{micro_batch}` times it "
            f"(docs/benchmarks/fp8_checks.md, fp8h3)")


P2P_ORDER_CAVEAT = (
    "pipeline bubble: set by the order in which torch.distributed.pipelining posts its sends "
    "and receives (one NCCL stream per rank; an early receive holds back later sends), "
    "not by the schedule alone; more micro-batches per step amortise it "
    "(meshplan/costmodel/torch_p2p.py)")


def is_host_bound(host_wait_s: float, step_s: float,
                  numbers: CorrectionNumbers | None = None) -> bool:
    """Whether the CPU's dispatch sets the step: its wait is at least the profile's
    ``host_bound_caveat_share`` of it (the layouts :func:`host_bound_caveat` warns about;
    below it the two sides are within calibration noise of each other, rounds 8-11)."""
    share = (numbers or builtin_corrections()).host_bound_caveat_share
    return host_wait_s > 0 and host_wait_s >= share * step_s


def near_host_bound_caveat(host_load: float, near_load: float = HOST_NEAR_LOAD,
                           balanced_load: float = HOST_BALANCED_LOAD) -> str:
    """The caution for a layout whose CPU dispatch takes ``host_load`` (≥ the profile's
    ``host_near_load``, < 1 or within the host-bound share) of its GPU time: predicted
    GPU-bound, but with little CPU headroom. Over the 16 measured sets of round 16 (190
    layouts the model has GPU-bound, each with its own profile) the error grew with this
    load: below 0.8, 146 layouts missed by 2.3 % mean; at 0.8 or more, 44 missed by 4.3 %
    and spread more within a run. Post hoc: chosen on these sets, not held out. Between
    machines: fp8h61h100's `mb4-compiled` pair (1 × H100, priced at 0.77-0.96, run at the
    GPU's pace) ran 33 and 38 % slower on a freshly started H100 of the same kind, whose
    host then set the step (docs/benchmarks/fp8_checks.md, "fp8h61h100's arms again").

    From the profile's ``host_balanced_load`` (0.95 built in) on, the two sides need about
    the same time. The two arms measured there ran well above the longer of the two
    (2 × H200, compiled tp 2 + SP fp8: fp8h8 r04 at 1.00, −8.2 %; fp8h10 t04 at 1.01,
    −14.1 % and −14.8 % on a re-run, slower than bf16 where 1.10× faster was predicted;
    docs/benchmarks/fp8_checks.md). One reading: where the
    CPU falls behind the GPU waits and where the GPU falls behind the CPU's queue waits, so
    the step is the sum over its stretches of the longer side, not the longer of the two
    sums — but at the pass level t04's rows are CPU-bound in both forward and backward
    (3.65 / 2.20 ms of CPU against 3.38 / 1.95 of GPU a layer), which that reading does not
    price either. Past the balance point the CPU's priced dispatch did set the step: fp8h11's
    compiled tp 2 + SP pair, predicted host-bound at 1.09 and 1.31, ran within 0.4 and 2.5 %
    (2 x H200, docs/benchmarks/fp8_checks.md "fp8h11"). Cause not settled, not priced; the caution
    gives the two misses."""
    text = f"{near_load * 100:g} %"
    balanced = ""
    if host_load >= balanced_load:
        balanced = (f"; at {balanced_load:.0%} or more, where the CPU and the GPU "
                    "need about the same time, the two arms measured (2 x H200, fp8h8 r04, "
                    "fp8h10 t04, the latter twice) ran 8-15 % slower than predicted, a cost "
                    "not priced")
    return (f"near host-bound: the CPU needs {host_load:.0%} of the GPU's time to dispatch "
            f"the step; measured layouts with {text} or more missed their "
            f"predictions by 4.3 % mean (2.3 % below {text}) and varied more "
            "from step to step, because the CPU's dispatch time varies between runs "
            f"(docs/benchmarks/accuracy.md, round 16), and one pair at 84-96 % ran "
            "33-38 % slower on a fresh start of the same H100 kind, its host then setting "
            f"the step (fp8_checks.md){balanced}; where a layout with more CPU headroom is "
            "within a few percent, prefer it")


def host_bound_caveat(host_wait_s: float, step_s: float) -> str:
    """The caution for a layout whose step the CPU's dispatch sets (``host_wait_s`` > 0).

    Such layouts are the least repeatable we have measured (docs/benchmarks/accuracy.md,
    rounds 8-11, 4 × H100 and 4 × H200 VMs): one ran 0.385-0.575 s over six runs on one
    machine (t05), and the 29 runs of 21 host-bound layouts missed their predictions by
    −24 % to +36 %, while GPU-bound layouts repeated within 1.6 %; on one lent H200
    (docs/benchmarks/host.md, 2026-11-29) compiled host-bound arms missed by −22 % to +30 %
    as run and the same plan ran 32 % apart on two leases (+58 % against the repeat); host23's
    six arms (host.md, section 8) ran −25 % to +9 % against their predictions. fp8h59h100's
    arms (1 × H100, 2026-12-06) ran twice, on the held machine and on a fresh start of the
    same kind: the most GPU-bound arm (host load 0.40) repeated to 0.1 %, two between (0.48,
    0.64) ran 1.11 and 1.16× slower, the three host-loaded ones (1.05-1.59) 1.58-1.99×, and
    these missed their own profile's price by −34 % to −47 % (docs/benchmarks/fp8_checks.md,
    "fp8h59h100"). Read after the runs (post hoc, 2026-12-06, docs/benchmarks/fp8_checks.md
    "Where host-loaded prices miss"): over the 20 arm and own-profile pairs of five 1 × H100
    sets priced at host load 0.8 or more, the calibrated CPU dispatch per step read a median
    1.16× the CPU's own pace in the runs (quartiles 1.08-1.26), and 15 of the 20 ran at the
    GPU's pace; held out on fp8h61h100, fp8h62h100, moeh76h100 and fp8h63h100 (medians 1.13,
    1.14, 1.22, 1.14 over 11, 7, 4 and 4 pairs), the 46 pairs of nine sets read a median 1.15
    (quartiles 1.09-1.26; bf16 1.23, fp8 1.13), 27 of them GPU-paced.
    The planner still ranks them by the prediction; this says how far to trust it."""
    share = host_wait_s / step_s if step_s > 0 else 0.0
    return (f"host-bound: the GPUs wait {host_wait_s * 1e3:.0f} ms ({share:.0%} of the step) "
            "for the CPU's kernel launches; measured host-bound layouts missed their "
            "predictions by -47 % to +58 % and ran up to 2x apart between runs "
            "(docs/benchmarks/accuracy.md, host.md, fp8_checks.md; GPU-bound ones repeated "
            "within 2 %; on one H100 the calibrated CPU dispatch read a median 15 % above "
            "the runs' own, so a step priced host-bound by less than that may run at the "
            "GPU's pace). "
            "Calibrate on the training host, and where a GPU-bound layout is within a few "
            "percent, prefer it")


def nearest_shape_caveat(source: str) -> str:
    """The caution for a layout whose layer rows were transferred from another timed shape
    (:mod:`meshplan.costmodel.nearest_rows`): the profile did not time this model."""
    return (f"this model's layer shape was not timed by the profile's calibration: its "
            f"layer, embedding and output rows are the profile's rows of {source}, scaled "
            "by the analytical model's ratio (GPU time by FLOPs and bytes, memory by "
            "activation bytes, CPU dispatch by operator count); run `meshplan calibrate "
            "--model` with this model for its own rows (docs/benchmarks/transfer.md)")


def compiled_pair_caveat(source: str) -> str:
    """The caution for a compiled layer whose own compiled row the profile lacks, priced from
    its eager row and another recompute mode's compiled/eager pair
    (:func:`meshplan.costmodel.compiled_rows.compiled_from_pair`)."""
    return (f"compile = True priced from {source}: the profile has no compiled layer row at "
            "this recompute mode that is read (compiled selective rows of the executor before "
            "2026-12-01 are not: meshplan/hardware_profiles/stale_rows.py), so compile's "
            "change is carried from another mode's (`meshplan calibrate --model M "
            "--compile-rows` times this one; meshplan/costmodel/compiled_rows.py)")


def stretched_rows_caveat(source: str, timed: tuple[int, ...], equivalent_mb: float,
                          micro_batch: int) -> str:
    """The caution for transferred rows read beyond the micro-batches their source timed
    (:meth:`meshplan.costmodel.nearest_rows.TransferredTables.stretch_for`). Evidence
    (docs/benchmarks/moe_checks.md, fp8_checks.md, 1 x H200): read past the largest timed
    size as the largest row times the analytical ratio, rows priced never-run MoE models
    7-21 % slow (moeh40, moeh43) and dense ones 9-11 % fast (fp8h24, fp8h31-33); extended
    linearly from the two largest rows instead (since 2026-12-04, post hoc over the 76 such
    arms: 7.0 -> 2.7 % dense, 6.1 -> 4.6 % MoE; held out on fp8h36-38 and moeh53, 1.15-30
    times past: 3.3 % mean, 8.8 % max over 23 arms). Below the smallest, the smallest row and
    the ratio: 6-7 % fast (moeh42), 17 % slow (fp8h24). Timed nearer the work: within 7.1 %.
    It does not predict the error's size (moeh42's unflagged arm missed by 6.7-7.9 %)."""
    timed_s = ", ".join(str(m) for m in timed)
    if equivalent_mb > max(timed):
        # measured_interp's extension: linear from the two largest rows, in proportion to
        # the micro-batch from a single one
        how = (f"its rows are extended linearly from micro-batch "
               f"{', '.join(str(m) for m in sorted(timed)[-2:])}" if len(timed) > 1 else
               f"its row at {max(timed)} is extended in proportion to the micro-batch")
        how += f", {equivalent_mb / max(timed):.1f} times past the largest"
    else:
        how = (f"the row at {min(timed)} is carried {min(timed) / equivalent_mb:.1f} times "
               "further by the analytical ratio, without the efficiency its kernels lose "
               "with their size")
    return (f"micro-batch {micro_batch} does the work of micro-batch {equivalent_mb:.1f} of "
            f"{source}, whose rows were timed at micro-batch {timed_s}: {how} (1 x H200: "
            "extended past their largest, rows priced never-run models within 2.7 % (dense) "
            "and 4.6 % (MoE) on average, post hoc, and 3.3 % (max 8.8 %) held out "
            "(fp8h36-38, moeh53); "
            "carried below their smallest 6-7 % fast, "
            "17 % slow; timed nearer the work, within 7.1 %); calibrate with micro-batches "
            "nearer this work, or this model itself (docs/benchmarks/moe_checks.md, "
            "moeh40-moeh43; fp8_checks.md, fp8h24 and \"Rows carried past their largest "
            "size\")")


def host_caveats(host_wait_s: float, step_s: float, host_s: float, pipe_s: float,
                 numbers: CorrectionNumbers) -> tuple[str, ...]:
    if is_host_bound(host_wait_s, step_s, numbers):
        return (host_bound_caveat(host_wait_s, step_s),)
    if pipe_s > 0 and host_s >= numbers.host_near_load * pipe_s:
        return (near_host_bound_caveat(host_s / pipe_s, numbers.host_near_load,
                                       numbers.host_balanced_load),)
    return ()


__all__ = ["FSDP_OVER_TP_CAVEAT", "FSDP_DP_ONLY_CAVEAT", "FSDP_UNMEASURED_CAVEAT",
           "ZB_FSDP2_CAVEAT", "P2P_ORDER_CAVEAT", "COMPILE_AS_EAGER_CAVEAT",
           "COMPILE_ANALYTICAL_CAVEAT", "COMPILE_ANALYTICAL_FP8_CAVEAT", "COMPILE_MOE_CAVEAT",
           "MLA_TORCH_CAVEAT", "MTP_TORCH_CAVEAT", "MOE_UNTIMED_TORCH_CAVEAT",
           "moe_untimed_torch_caveats",
           "HOST_NEAR_LOAD", "HOST_NEAR_LOAD_TEXT", "HOST_BOUND_CAVEAT_SHARE",
           "HOST_BALANCED_LOAD", "is_host_bound",
           "near_host_bound_caveat", "host_bound_caveat", "host_caveats",
           "nearest_shape_caveat", "stretched_rows_caveat", "compiled_pair_caveat",
           "UNCLOCKED_ROWS_CAVEAT", "extended_rows_caveat"]
