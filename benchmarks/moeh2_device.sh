#!/usr/bin/env bash
# Two one-GPU calls for issue 38's moeh2 check (benchmarks/sets/moeh2/README.md) and the
# moeh1 layouts on the executor without atomics in its permutation (POST HOC for moeh1).
#
#   PART=1 bash benchmarks/moeh2_device.sh  # calibrate moeh2 as a user would; rerun moeh1's plans
#   PART=2 bash benchmarks/moeh2_device.sh  # run moeh2's committed plans; recalibrate moeh1
#
# Files under $OUT: gpu.txt, profile_<set>.toml, calibrate_<set>.log, <set>/moe_sync.json,
# <set>/logs.tgz.
source "$(dirname "$0")/device_env.sh"
record_gpu name,driver_version

calibrate() {   # set seq-len micro-batches
    echo "== calibrate $1" | tee -a "$OUT/gpu.txt"
    timeout 290 $PY -m meshplan.cli calibrate --model "benchmarks/sets/$1/m01.json" --nproc 1 \
        --seq-len "$2" --micro-batches "$3" --max-tp 1 --rounds 1 \
        --compile-rows none,selective,full --no-fp8 --time-budget 270 \
        --out "$OUT/profile_$1.toml" > "$OUT/calibrate_$1.log" 2>&1
    echo "rc $? calibrate $1 after ${SECONDS}s" | tee -a "$OUT/gpu.txt"
}
run_plans() {   # set
    echo "== run $1" | tee -a "$OUT/gpu.txt"
    mkdir -p "$OUT/$1"
    $PY benchmarks/moe_sync_gpu.py run --plans "benchmarks/plans/$1_h200x1" --out "$OUT/$1" \
        --budget 250 --timeout 120
    echo "rc $? run $1 after ${SECONDS}s" | tee -a "$OUT/gpu.txt"
}

case "${PART:?set PART=1 or 2}" in
    1) calibrate moeh2 2048 2,4,8; run_plans moeh1 ;;
    2) run_plans moeh2; calibrate moeh1 4096 1,2,4 ;;
esac
ls -la "$OUT" "$OUT"/*/
