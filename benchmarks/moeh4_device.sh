#!/usr/bin/env bash
# Two-GPU calls for issue 38's moeh4 check (benchmarks/sets/moeh4/README.md): a never-run MoE
# model at layouts drawn over dp / tp + SP / pp / ep on two ranks.
#
#   PART=1 bash benchmarks/moeh4_device.sh  # calibrate moeh4 on 2 GPUs as a user would (~9 min)
#   PART=2 bash benchmarks/moeh4_device.sh  # run the committed plans (~9 min)
#   PART=3 bash benchmarks/moeh4_device.sh  # recalibrate with the ep and FSDP2 MoE rows the
#       # calibration has timed since (compiled rows at recompute none only, to fit a call),
#       # for `moe_sync_gpu.py repredict --profile` of the committed run (POST HOC)
#
# Files under $OUT: gpu.txt, profile_moeh4.toml, calibrate_moeh4.log, moeh4/moe_sync.json,
# moeh4/logs.tgz.
source "$(dirname "$0")/device_env.sh"
record_gpu

case "${PART:?set PART=1, 2 or 3}" in
    1)  timeout 585 $PY -m meshplan.cli calibrate --model benchmarks/sets/moeh4/m01.json \
            --nproc 2 --seq-len 4096 --micro-batches 1,2,4 --max-tp 2 --rounds 1 \
            --compile-rows none,selective --no-fp8 --time-budget 560 \
            --out "$OUT/profile_moeh4.toml" > "$OUT/calibrate_moeh4.log" 2>&1
        echo "rc $? calibrate moeh4 after ${SECONDS}s" | tee -a "$OUT/gpu.txt" ;;
    3)  timeout 585 $PY -m meshplan.cli calibrate --model benchmarks/sets/moeh4/m01.json \
            --nproc 2 --seq-len 4096 --micro-batches 1,2,4 --max-tp 2 --rounds 1 \
            --compile-rows none --no-fp8 --time-budget 560 \
            --out "$OUT/profile_moeh4_rows.toml" > "$OUT/calibrate_moeh4_rows.log" 2>&1
        echo "rc $? calibrate moeh4 with ep / FSDP2 rows after ${SECONDS}s" | tee -a "$OUT/gpu.txt" ;;
    2)  mkdir -p "$OUT/moeh4"
        $PY benchmarks/moe_sync_gpu.py run --plans benchmarks/plans/moeh4_h200x2 \
            --out "$OUT/moeh4" --work /tmp/moeh4/runs --budget 540 --timeout 150
        echo "rc $? run moeh4 after ${SECONDS}s" | tee -a "$OUT/gpu.txt" ;;
esac
ls -la "$OUT" "$OUT"/*/
