#!/usr/bin/env bash
# Measured MoE layer rows on one GPU (issue 38; costmodel/moe_rows.py), two device calls so
# that the predictions are committed before the layouts run:
#
#   PART=cal bash benchmarks/moe_rows_device.sh   # call 1: meshplan calibrate of moe-1.9b
#       # (eager rows at recompute none/selective/full, compiled rows at none, micro-batch
#       # 1/2/4, its MoE keys) and the plans of moe_sync_gpu.py's "rows" set with their
#       # predictions -> $OUT/profile.toml, $OUT/plans.tar.gz, $OUT/calibrate.log
#   PART=run bash benchmarks/moe_rows_device.sh   # call 2: the committed plans
#       # (benchmarks/plans/moe_rows_h200x1) run by the executor -> $OUT/moe_sync.json ...
#   DRY=1 PART=cal OUT=/tmp/x bash benchmarks/moe_rows_device.sh   # CPU: tiny model, no plans
set -u
. "$(dirname "$0")/device_env.sh"
PLANS=${PLANS:-benchmarks/plans/moe_rows_h200x1}
W=$(mktemp -d)
case "${PART:?PART=cal or PART=run}" in
cal)
    MV=MODEL; [ "${DRY:-0}" = 1 ] && MV=TINY
    $PY -c "import sys, json; sys.path.insert(0, 'benchmarks'); import moe_gpu_check as c; \
json.dump(c.$MV.to_dict(), open('$W/model.json', 'w'))"
    { nvidia-smi --query-gpu=name,driver_version --format=csv 2>&1 || true; } > "$OUT/calibrate.log"
    if [ "${DRY:-0}" = 1 ]; then
        CAL=(--device cpu --quick --seq-len 64 --micro-batches 1,2)
    else
        CAL=(--nproc 1 --seq-len 2048 --micro-batches 1,2,4 --max-tp 1 --rounds 2
             --compile-rows none --no-fp8 --time-budget "${CAL_BUDGET:-420}")
    fi
    $PY -c "from meshplan.cli import main; raise SystemExit(main())" calibrate --model "$W/model.json" "${CAL[@]}" --out "$OUT/profile.toml" \
        >> "$OUT/calibrate.log" 2>&1
    echo "calibrate rc $?" | tee -a "$OUT/calibrate.log"
    if [ "${DRY:-0}" != 1 ]; then    # (a CPU profile cannot price the H200 plans)
        $PY benchmarks/moe_sync_gpu.py plans --set rows --profile "$OUT/profile.toml" \
            --out "$W/plans" >> "$OUT/calibrate.log" 2>&1
        echo "plans rc $?" | tee -a "$OUT/calibrate.log"
        tar czf "$OUT/plans.tar.gz" -C "$W" plans
    fi
    tail -25 "$OUT/calibrate.log" ;;
run)
    $PY benchmarks/moe_sync_gpu.py run --plans "$PLANS" --out "$OUT" \
        --budget "${RUN_BUDGET:-450}" --timeout 150 --trace mb2-compiled ;;
esac
