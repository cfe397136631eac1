#!/bin/bash
# A drawn 1-GPU MoE check (bf16 and fp8 rowwise pairs), on the device:
#   PYTHONPATH=. CHECK=moeh28 SEED=3831 MBS=2,4 GPU_BOUND=3 PART=1 bash benchmarks/moe1gpu_device.sh
#     calibrate (--time-budget ${BUDGET:-540}) and the plans; commit what comes back
#   PYTHONPATH=. CHECK=moeh28 PART=2 bash benchmarks/moe1gpu_device.sh
#     the pairs in drawn order from the committed plans, bf16 then fp8, each layout's
#     pair tarred into $OUT as soon as it ran
#   PART=all: both in one call (BUDGET 270 so they fit: moeh27's way)
#   ALLOW_GPU_MISMATCH=1 with PART=2: run the h200x1 plans on another GPU (moeh61h100's H100)
#   GPU_TAG=h100x1: the plans' and the profile's name tag (default h200x1; moeh64h100's plans,
#     made for the H100, are benchmarks/plans/moeh64h100_{bf16,fp8}_h100x1)
#   GPU=H100-SXM5-80GB with PART=1 or all: plan for that built-in GPU (moe_sync_gpu.py plans
#     --gpu), the one the profile was measured on; default the H200
#   GPU_TAG=auto: read the GPU's name (nvidia-smi) and set GPU_TAG and GPU to match, an H100
#     h100x1 / H100-SXM5-80GB, an H200 h200x1 / H200-SXM-141GB (a run kind that may land on
#     either); any other GPU, or a GPU= that disagrees, is refused. A later call on a machine
#     of the other kind then finds no plans of its tag and stops.
#   FP8_RECIPE=tensorwise with PART=1 or all: the fp8 plans' recipe (default rowwise, the MoE
#     checks'; tensorwise: fp8h54h100's dense plans)
#   CAL_FP8_ROWS=tensorwise COMPILE_ROWS=none,selective,full SEQ=1024 with PART=1 or all: the
#     calibration's fp8 rows, compiled rows and sequence (defaults rowwise, none,full, 2048;
#     fp8h56h100's dense model)
#   ONLY="mb4-full-compiled" PRECISIONS=fp8 with PART=2: only those layouts / precisions (an
#     arm a call cut short; the pair's tarball then holds what ran: its other arm is absent)
#   FIRST=2 with PART=2 or all: only the first two kept layouts (what the device time left holds)
#   ARM_TIMEOUT=200 with PART=2: seconds an arm may take (default 130; a 5 B model's start-up
#     and compile take about a minute of it)
#   SOURCES="a.json b.json" with PART=1: calibrate those models instead of the check's own
#     (one profile of several other models; moeh40's way); the profile and its log come back
#     at once and the plans are priced on the CPU from it (commit both before PART=2)
#   FOR_PLAN=1 with PART=1 or all: the user's order instead — the plans first, on the GPU's
#     datasheet (GPU=...), then `meshplan calibrate --for-plan` on them (their model, sequence,
#     micro-batches, compiled modes and fp8 recipe; MBS, SEQ, COMPILE_ROWS, CAL_FP8_ROWS
#     unused), then the same layouts priced from that profile (fp8h57h100's way);
#     LAYOUTS="a b c": plan those layouts of the set instead of the first GPU_BOUND the
#     datasheet keeps (fp8h58h100: the first three predicted to fit in bf16 and fp8 both);
#     ROUNDS=3: calibrate's rounds (default 1, the checks' budget; 3 is calibrate's own)
#   AGAIN=1 with PART=1: the committed plans' `--for-plan` calibration once more, in a fresh
#     process, to profile_<tag>_<check>-2_<date>, and the plans priced from both profiles
#     (prices2.md); nothing else (fp8h59h100: how far two calibrations' prices lie apart);
#     AGAIN=3: the same to profile …-3_<date> (a third calibration; calibrate will not
#     overwrite a committed -2, as moeh76h100's first try found), prices3.md
# The model is benchmarks/sets/$CHECK/m01.json; the set moe_sync_gpu.py's drawn-${SEED}c.
# The device's copy of the tree carries no .git or another commit's: prefix
#   MESHPLAN_SOURCE_COMMIT=<commit> so the profile's provenance names the code it ran
#   (docs/calibrate.md).
set -u
: "${CHECK:?CHECK=moehNN}" "${PART:?PART=1, 2 or all}"
case "$PART" in 1|2|all) ;; *) echo "PART=$PART: use 1, 2 or all" >&2; exit 2;; esac
case "${FP8_RECIPE:-rowwise}" in rowwise|tensorwise) ;; *)
    echo "FP8_RECIPE=$FP8_RECIPE: use rowwise or tensorwise" >&2; exit 2;; esac
case "${FIRST:-1}" in ''|*[!0-9]*|0)
    echo "FIRST=$FIRST: a whole number of layouts > 0, e.g. 2" >&2; exit 2;; esac
case "${ROUNDS:-1}" in ''|*[!0-9]*|0)
    echo "ROUNDS=$ROUNDS: a whole number of rounds > 0, e.g. 3" >&2; exit 2;; esac
case "${ARM_TIMEOUT:-130}" in ''|*[!0-9]*|0)
    echo "ARM_TIMEOUT=$ARM_TIMEOUT: whole seconds > 0, e.g. 200" >&2; exit 2;; esac
[ -f "benchmarks/sets/$CHECK/m01.json" ] || {
    echo "CHECK=$CHECK: no benchmarks/sets/$CHECK/m01.json" >&2; exit 2; }
M=benchmarks/sets/$CHECK/m01.json
if [ "${GPU_TAG:-}" = auto ]; then
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    found=$(python -c 'import sys; from meshplan.calibrate.run import DEVICE_NAME_TO_GPU as M
print(next((gpu for frag, gpu in M if frag in sys.argv[1]), ""))' "$name")
    case "$found" in
        H100-*) GPU_TAG=h100x1;;
        H200-*) GPU_TAG=h200x1;;
        *) echo "GPU_TAG=auto: '$name' is neither an H100 nor an H200: give GPU_TAG and GPU" >&2
           exit 2;;
    esac
    [ -n "${GPU:-}" ] && [ "$GPU" != "$found" ] && {
        echo "GPU_TAG=auto: the GPU is '$name' ($found), not GPU=$GPU" >&2; exit 2; }
    GPU=$found
    echo "GPU_TAG=auto: $name -> GPU_TAG=$GPU_TAG GPU=$GPU" >&2
fi
T=${GPU_TAG:-h200x1}
P=docs/benchmarks/data/profiles/profile_${T}_${CHECK}_$(date +%Y%m%d).toml
case "${AGAIN:-1}" in 1|3) ;; *)
    echo "AGAIN=$AGAIN: use 1 (a second calibration, profile -2) or 3 (a third, -3)" >&2
    exit 2;; esac
N2=2; AGAIN_AS=second
[ "${AGAIN:-1}" = 3 ] && { N2=3; AGAIN_AS=third; }
P2=docs/benchmarks/data/profiles/profile_${T}_${CHECK}-${N2}_$(date +%Y%m%d).toml
W=/tmp/$CHECK
mkdir -p "$W"
LOG=$OUT/log_$PART.txt
nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv,noheader > "$LOG"
python -c "import torch; print(torch.__version__)" >> "$LOG"
plans() {   # plans() PROFILE OUT [moe_sync_gpu.py plans options...]
    local prof=$1 out=$2; shift 2
    python benchmarks/moe_sync_gpu.py plans --set "drawn-${SEED}c" --model "$M" \
        --global-batch 16 --profile "$prof" ${GPU:+--gpu "$GPU"} --out "$out" "$@" >> "$LOG" 2>&1
}
fp8_plans() {   # fp8_plans PROFILE OUT: the fp8 twins of the layouts in $KEPT
    plans "$1" "$2" --fp8-recipe "${FP8_RECIPE:-rowwise}" --only $KEPT || {
        echo "fp8 plans failed (log: $LOG)" >&2; exit 1; }
}
kept() {
    python -c "import json, sys; print(' '.join(json.load(open(sys.argv[1]))['layouts']))" \
        "$1/predictions.json"
}
for_plan_args() {   # for_plan_args DIR...: FP=(--for-plan FILE ...), the plan files in DIRs
    FP=(); local d f
    for d in "$@"; do for f in "$d"/*.json; do
        case "$f" in */predictions.json) ;; *) [ -f "$f" ] && FP+=(--for-plan "$f");; esac
    done; done
}
for_plan_calibrate() {   # for_plan_calibrate PROFILE LOGNAME, on the plans in FP
    timeout $((budget + 60)) python -m meshplan.cli calibrate "${FP[@]}" --nproc 1 \
        --rounds "${ROUNDS:-1}" --time-budget "$budget" --out "$1" > "$W/$2" 2>&1
    echo "calibrate ($2) rc $?" >> "$LOG"
    grep "for-plan\|for benchmarks\|for /tmp" "$W/$2" | head -2 >> "$LOG"
    tail -3 "$W/$2" >> "$LOG"
    cp "$1" "$W/$2" "$OUT/" 2>/dev/null
}
if [ -n "${AGAIN:-}" ]; then
    [ "$PART" = 1 ] || { echo "AGAIN=$AGAIN goes with PART=1 (PART=$PART)" >&2; exit 2; }
    budget=${BUDGET:-540}
    for_plan_args benchmarks/plans/"${CHECK}"_{bf16,fp8}_"$T"
    FIRST_P=$(ls docs/benchmarks/data/profiles/profile_"${T}_${CHECK}"_*.toml 2>/dev/null | head -1)
    [ ${#FP[@]} -gt 0 ] && [ -n "$FIRST_P" ] || {
        echo "AGAIN=$AGAIN: no committed plans or profile of $CHECK ($T) to calibrate again" >&2
        exit 2; }
    for_plan_calibrate "$P2" "calibrate$N2.log"
    python benchmarks/price_plans.py benchmarks/plans/"${CHECK}"_{bf16,fp8}_"$T" \
        ${GPU:+--gpu "$GPU"} --profile first="$FIRST_P" --profile "$AGAIN_AS=$P2" \
        > "$OUT/prices$N2.md" 2>&1
    echo "prices rc $?" >> "$LOG"
    exit 0
fi
if [ "$PART" != 2 ] && [ -n "${FOR_PLAN:-}" ]; then
    : "${SEED:?SEED=the draw_layouts seed}"
    budget=${BUDGET:-$([ "$PART" = all ] && echo 270 || echo 540)}
    if [ -n "${LAYOUTS:-}" ]; then SETPICK=(--only $LAYOUTS)
    else SETPICK=(--gpu-bound "${GPU_BOUND:-3}"); fi
    plans '' "$W/datasheet_bf16" "${SETPICK[@]}" || {
        echo "datasheet plans failed (log: $LOG)" >&2; exit 1; }
    KEPT=$(kept "$W/datasheet_bf16")
    echo "kept on the datasheet: $KEPT" >> "$LOG"
    fp8_plans '' "$W/datasheet_fp8"
    for_plan_args "$W"/datasheet_bf16 "$W"/datasheet_fp8
    for_plan_calibrate "$P" calibrate.log
    plans "$P" "benchmarks/plans/${CHECK}_bf16_$T" --only $KEPT || {
        echo "plans failed (log: $LOG)" >&2; exit 1; }
    fp8_plans "$P" "benchmarks/plans/${CHECK}_fp8_$T"
    tar czf "$OUT/predictions.tgz" "$P" "$W/calibrate.log" "$W/datasheet_bf16" \
        "$W/datasheet_fp8" "benchmarks/plans/${CHECK}_bf16_$T" "benchmarks/plans/${CHECK}_fp8_$T"
elif [ "$PART" != 2 ]; then
    : "${SEED:?SEED=the draw_layouts seed}" "${MBS:?MBS=2,4}"
    budget=${BUDGET:-$([ "$PART" = all ] && echo 270 || echo 540)}
    if [ -n "${SOURCES:-}" ]; then
        # each source at its own longest sequence (a shorter model refuses a longer one)
        CAL=(); for s in $SOURCES; do CAL+=(--model "$s"); done
    else
        CAL=(--model "$M" --seq-len "${SEQ:-2048}")
    fi
    timeout $((budget + 60)) python -m meshplan.cli calibrate "${CAL[@]}" --nproc 1 \
        --micro-batches "$MBS" --max-tp 1 --rounds 1 \
        --compile-rows "${COMPILE_ROWS:-none,full}" --fp8-rows "${CAL_FP8_ROWS:-rowwise}" \
        --time-budget "$budget" --out "$P" > "$W/calibrate.log" 2>&1
    echo "calibrate rc $?" >> "$LOG"
    tail -3 "$W/calibrate.log" >> "$LOG"
    cp "$P" "$W/calibrate.log" "$OUT/" 2>/dev/null
    [ -n "${SOURCES:-}" ] && exit 0
    plans "$P" "benchmarks/plans/${CHECK}_bf16_$T" --gpu-bound "${GPU_BOUND:-3}" || {
        echo "plans failed (log: $LOG)" >&2; exit 1; }
    KEPT=$(kept "benchmarks/plans/${CHECK}_bf16_$T")
    echo "kept: $KEPT" >> "$LOG"
    fp8_plans "$P" "benchmarks/plans/${CHECK}_fp8_$T"
    tar czf "$OUT/predictions.tgz" "$P" "$W/calibrate.log" \
        "benchmarks/plans/${CHECK}_bf16_$T" "benchmarks/plans/${CHECK}_fp8_$T"
fi
[ "$PART" = 1 ] && exit 0
[ -f "benchmarks/plans/${CHECK}_bf16_$T/predictions.json" ] || {
    echo "no benchmarks/plans/${CHECK}_bf16_$T/predictions.json (GPU_TAG=$T)" >&2; exit 2; }
KEPT=$(kept "benchmarks/plans/${CHECK}_bf16_$T")
SEL=${ONLY:-$KEPT}
[ -n "${FIRST:-}" ] && SEL=$(echo $SEL | tr ' ' '\n' | head -n "$FIRST" | tr '\n' ' ')
for n in $SEL; do
    case " $KEPT " in *" $n "*) ;;
        *) echo "ONLY: $n is not a layout of $CHECK ($KEPT)" >&2; exit 2;; esac
    for p in ${PRECISIONS:-bf16 fp8}; do
        case "$p" in bf16|fp8) ;; *) echo "PRECISIONS: $p is not bf16 or fp8" >&2; exit 2;; esac
        echo "== $p $n $(date +%T)" >> "$LOG"
        timeout $((${ARM_TIMEOUT:-130} + 10)) python benchmarks/moe_sync_gpu.py run \
            --plans "benchmarks/plans/${CHECK}_${p}_$T" --out "$W/${p}_$n" --only "$n" \
            --budget 300 --timeout "${ARM_TIMEOUT:-130}" \
            ${ALLOW_GPU_MISMATCH:+--allow-gpu-mismatch} >> "$LOG" 2>&1
        echo "rc $?" >> "$LOG"
    done
    ran=(); for p in bf16 fp8; do [ -d "$W/${p}_$n" ] && ran+=("${p}_$n"); done
    tar czf "$OUT/$n.tgz" -C "$W" "${ran[@]}"
done
