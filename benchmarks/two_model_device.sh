#!/bin/bash
# Two drawn dense models' 1-GPU checks (bf16, compiled arms) from one calibration, on the device:
#   PYTHONPATH=. CHECKS="fp8h48 fp8h49" PART=1 bash benchmarks/two_model_device.sh
#     one calibration of both models (benchmarks/sets/<check>/m01.json) at micro-batches
#     ${MBS:-2,8}, sequence ${SEQ:-2048}, compiled rows none / selective / full, no fp8,
#     --time-budget ${BUDGET:-420}; the profile and its log come back under $OUT. Split it
#     into one profile a model (benchmarks/split_profile.py), commit, price each check's arms
#     on the CPU from the other model's profile, commit the plans, then:
#   PYTHONPATH=. CHECKS="fp8h48 fp8h49" PART=2 bash benchmarks/two_model_device.sh
#     each check's committed plans (benchmarks/plans/<check>_bf16_h200x1) in drawn order,
#     each arm tarred into $OUT as soon as it ran (ARM_TIMEOUT seconds, default 150)
# The device's copy of the tree carries no .git or another commit's: prefix
#   MESHPLAN_SOURCE_COMMIT=<commit> so the profile's provenance names the code it ran (docs/calibrate.md).
set -u
: "${CHECKS:?CHECKS=\"<check> <check>\"}" "${PART:?PART=1 or 2}"
case "$PART" in 1|2) ;; *) echo "PART=$PART: use 1 or 2" >&2; exit 2;; esac
case "${ARM_TIMEOUT:-150}" in ''|*[!0-9]*|0)
    echo "ARM_TIMEOUT=$ARM_TIMEOUT: whole seconds > 0, e.g. 200" >&2; exit 2;; esac
CAL=()
for c in $CHECKS; do
    [ -f "benchmarks/sets/$c/m01.json" ] || { echo "no benchmarks/sets/$c/m01.json" >&2; exit 2; }
    CAL+=(--model "benchmarks/sets/$c/m01.json")
done
W=/tmp/two_model
mkdir -p "$W"
LOG=$OUT/log_$PART.txt
nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv,noheader > "$LOG"
python -c "import torch; print(torch.__version__)" >> "$LOG"
if [ "$PART" = 1 ]; then
    budget=${BUDGET:-420}
    P=$W/profile_h200x1_$(echo $CHECKS | tr ' ' '_')_$(date +%Y%m%d).toml
    timeout $((budget + 90)) python -m meshplan.cli calibrate "${CAL[@]}" \
        --seq-len "${SEQ:-2048}" --nproc 1 --micro-batches "${MBS:-2,8}" --max-tp 1 \
        --rounds 1 --compile-rows none,selective,full --no-fp8 --time-budget "$budget" \
        --out "$P" > "$W/calibrate.log" 2>&1
    echo "calibrate rc $?" >> "$LOG"
    tail -3 "$W/calibrate.log" >> "$LOG"
    cp "$P" "$W/calibrate.log" "$OUT/" 2>/dev/null
    exit 0
fi
for c in $CHECKS; do
    D=benchmarks/plans/${c}_bf16_h200x1
    [ -f "$D/predictions.json" ] || { echo "no $D/predictions.json: skipped" >> "$LOG"; continue; }
    KEPT=$(python -c "import json, sys; print(' '.join(json.load(open(sys.argv[1]))['layouts']))" \
        "$D/predictions.json")
    for n in $KEPT; do
        echo "== $c $n $(date +%T)" >> "$LOG"
        timeout $((${ARM_TIMEOUT:-150} + 10)) python benchmarks/moe_sync_gpu.py run \
            --plans "$D" --out "$W/${c}_bf16_$n" --only "$n" --budget 300 \
            --timeout "${ARM_TIMEOUT:-150}" >> "$LOG" 2>&1
        echo "rc $?" >> "$LOG"
        tar czf "$OUT/${c}_$n.tgz" -C "$W" "${c}_bf16_$n"
    done
done
