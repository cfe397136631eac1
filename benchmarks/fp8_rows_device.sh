#!/usr/bin/env bash
# fp8 against bf16 on one GPU, predicted from a calibration of the model made the call before
# (issue 41; a 1-GPU machine was all that was lent). Two device calls, so that the profile
# the predictions come from is committed before the layouts run:
#
#   PART=cal bash benchmarks/fp8_rows_device.sh   # call 1: meshplan calibrate of the set's
#       # model: bf16 rows eager and compiled, fp8 (tensorwise) rows compiled, at recompute
#       # none/selective/full and micro-batch 1/2 (MB=2,4: others), the fp8 GEMM and cast
#       # benchmarks
#       # -> $OUT/profile.toml, $OUT/calibrate.log
#   PART=run PROFILE=docs/benchmarks/data/profiles/<it>.toml bash benchmarks/fp8_rows_device.sh
#       # call 2: fp8_device.py's 1-GPU layouts h01-h06, bf16 and fp8 each, compiled, every
#       # arm predicted on PROFILE -> $OUT/layouts.json, layouts.md, runs.tgz
#   PART=both bash benchmarks/fp8_rows_device.sh  # both in one call, the arms predicted on
#       # the profile just written (when one call is all the device time left holds)
#
# NPROC=2 MAXTP=2: calibrate on two GPUs (fp8h4); the layouts' own GPU counts run them.
# SP_ONLY=1: tp > 1 rows with sequence parallelism only (`calibrate --sp-only`; fp8h9).
# DRY_RUN=cpu: either part on the CPU, the model shrunk (device_env.sh; dry_run_4gpu.sh).
set -u
. "$(dirname "$0")/device_env.sh"
SET=${SET:-benchmarks/sets/fp8h1}
MODEL=$(dry_model "$SET/m01.json") || exit 1
SEQ=$(dry_seq "${SEQ:-4096}")
GB=${GB:-8}
calibrate() {
    { nvidia-smi --query-gpu=name,driver_version --format=csv 2>&1 || true; } > "$OUT/calibrate.log"
    $PY -c "from meshplan.cli import main; raise SystemExit(main())" calibrate \
        --model "$MODEL" --nproc "${NPROC:-1}" --seq-len "$SEQ" --micro-batches "${MB:-1,2}" \
        --device "$DEVICE" \
        --max-tp "${MAXTP:-1}" --rounds 1 --compile-rows "${COMPILE_ROWS:-none,selective,full}" \
        --fp8-rows tensorwise ${SP_ONLY:+--sp-only} \
        --time-budget "${CAL_BUDGET:-440}" --out "$OUT/profile.toml" >> "$OUT/calibrate.log" 2>&1
    echo "calibrate rc $?" | tee -a "$OUT/calibrate.log"
    grep -E "layer|fp8" "$OUT/calibrate.log" | tail -30
}
run() {
    $PY benchmarks/fp8_device.py --out "$OUT" --budget "${RUN_BUDGET:-470}" --micro none \
        --profile "${PROFILE:?the committed profile}" --model "$MODEL" --seq-len "$SEQ" \
        --global-batch "$GB" --only "${ONLY:-h01,h02,h03,h04,h05,h06}" --timeout 120 --min-run-s 40 \
        --device "$DEVICE" \
        --steps "${STEPS:-6}" --warmup "${WARMUP:-3}"
    cat "$OUT/layouts.md"
}
case "${PART:?PART=cal, run or both}" in
cal) calibrate ;;
run) run ;;
both) calibrate; [ -s "$OUT/profile.toml" ] && PROFILE=$OUT/profile.toml run ;;
*) echo "PART=$PART: cal, run or both" >&2; exit 2 ;;
esac
