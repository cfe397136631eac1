#!/usr/bin/env bash
# One-GPU calls for issue 38's moeh3 check (benchmarks/sets/moeh3/README.md), moeh1's padding
# memory (two of its committed plans on the current executor) and the duty-cycle probe at
# more chunk lengths (issue 36).
#
#   PART=1 bash benchmarks/moeh3_device.sh  # calibrate moeh3 as a user would (~8 minutes)
#   PART=2 bash benchmarks/moeh3_device.sh  # run moeh3's committed plans; moeh1 mb4, mb2 full
#   PART=3 bash benchmarks/moeh3_device.sh  # duty-cycle probe, chunks of 30-300 ms
#
# Files under $OUT: gpu.txt, profile_moeh3.toml, calibrate_moeh3.log, moeh3/moe_sync.json,
# moeh3/logs.tgz, moeh1/moe_sync.json, duty/*.json.
source "$(dirname "$0")/device_env.sh"
record_gpu

case "${PART:?set PART=1, 2 or 3}" in
    1)  timeout 560 $PY -m meshplan.cli calibrate --model benchmarks/sets/moeh3/m01.json \
            --nproc 1 --seq-len 2048 --micro-batches 2,4,8,16 --max-tp 1 --rounds 1 \
            --compile-rows none,selective,full --no-fp8 --time-budget 500 \
            --out "$OUT/profile_moeh3.toml" > "$OUT/calibrate_moeh3.log" 2>&1
        echo "rc $? calibrate moeh3 after ${SECONDS}s" | tee -a "$OUT/gpu.txt" ;;
    2)  mkdir -p "$OUT/moeh3" "$OUT/moeh1"
        $PY benchmarks/moe_sync_gpu.py run --plans benchmarks/plans/moeh3_h200x1 \
            --out "$OUT/moeh3" --work /tmp/moeh3/runs --budget 360 --timeout 120
        echo "rc $? run moeh3 after ${SECONDS}s" | tee -a "$OUT/gpu.txt"
        $PY benchmarks/moe_sync_gpu.py run --plans benchmarks/plans/moeh1_h200x1 \
            --out "$OUT/moeh1" --work /tmp/moeh1/runs --budget 150 --timeout 100 \
            --only mb4 mb2-full-compiled
        echo "rc $? run moeh1 after ${SECONDS}s" | tee -a "$OUT/gpu.txt" ;;
    3)  mkdir -p "$OUT/duty"
        timeout 400 $PY benchmarks/duty_cycle_clock_gpu.py --out "$OUT/duty" \
            --set benchmarks/sets/transfer43 --chunk-ms 30 60 100 150 300 --seconds 3
        echo "rc $? duty after ${SECONDS}s" | tee -a "$OUT/gpu.txt" ;;
esac
ls -la "$OUT" "$OUT"/*/
