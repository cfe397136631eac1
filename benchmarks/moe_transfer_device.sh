#!/bin/bash
# A never-run MoE model priced from another model's calibration made on the device by today's
# `calibrate.moe_only` (the grouped GEMMs timed in the MoE layer), then run:
#   PYTHONPATH=. CHECK=moeh35 SOURCE=moeh31 BASE=docs/.../profile.toml MBS=4,8,16,32 \
#       bash benchmarks/moe_transfer_device.sh
# 1. moe_only on benchmarks/sets/$SOURCE/m01.json over $BASE -> $OUT/profile_source.toml;
# 2. the committed plans' layouts (benchmarks/plans/${CHECK}_{bf16,fp8}_h200x1) priced from
#    it, before any run, into $OUT/predictions_device.tgz;
# 3. the pairs: moe1gpu_device.sh PART=2.
set -u
: "${CHECK:?CHECK=moehNN}" "${SOURCE:?SOURCE=moehNN}" "${BASE:?BASE=a profile}" "${MBS:=4,8,16,32}"
M=benchmarks/sets/$CHECK/m01.json
S=benchmarks/sets/$SOURCE/m01.json
for f in "$M" "$S" "$BASE"; do [ -f "$f" ] || { echo "no $f" >&2; exit 2; }; done
W=/tmp/$CHECK
mkdir -p "$W/plans"
LOG=$OUT/log_transfer.txt
nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv,noheader > "$LOG"
python -c "import torch; print(torch.__version__)" >> "$LOG"
P=$OUT/profile_source.toml
SEQ=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['max_seq_len'])" "$S")
timeout 200 python -m meshplan.calibrate.moe_only --model "$S" --seq-len "$SEQ" --world 1 \
    --base-profile "$BASE" --micro-batches "$MBS" --out "$P" > "$W/moe_only.log" 2>&1
echo "moe_only rc $? ($(date +%T))" >> "$LOG"
tail -5 "$W/moe_only.log" >> "$LOG"
KEPT=$(python -c "import json, sys; print(' '.join(json.load(open(sys.argv[1]))['layouts']))" \
    "benchmarks/plans/${CHECK}_bf16_h200x1/predictions.json")
SET=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['set'])" \
    "benchmarks/plans/${CHECK}_bf16_h200x1/predictions.json")
if [ -f "$P" ]; then
    python benchmarks/moe_sync_gpu.py plans --set "$SET" --model "$M" --global-batch 16 \
        --only $KEPT --profile "$P" --out "$W/plans/bf16" >> "$LOG" 2>&1
    python benchmarks/moe_sync_gpu.py plans --set "$SET" --model "$M" --global-batch 16 \
        --fp8-recipe rowwise --only $KEPT --profile "$P" --out "$W/plans/fp8" >> "$LOG" 2>&1
    tar czf "$OUT/predictions_device.tgz" -C "$W" plans moe_only.log
fi
CHECK=$CHECK PART=2 bash benchmarks/moe1gpu_device.sh     # the pairs: log_2.txt, LAYOUT.tgz
