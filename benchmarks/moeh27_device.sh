#!/bin/bash
# moeh27 in one call of a 1-GPU lease (benchmarks/sets/moeh27/README.md): calibrate, then the
# plans (every prediction written, and tarred into $OUT, before any arm runs), then the arms in
# drawn order, bf16 then fp8, each layout's pair tarred into $OUT as soon as it ran.
#   PYTHONPATH=. bash benchmarks/moeh27_device.sh          # on the device, ~8 minutes
set -u
M=benchmarks/sets/moeh27/m01.json
P=docs/benchmarks/data/profiles/profile_h200x1_moeh27_20261202.toml
W=/tmp/moeh27
mkdir -p "$W"
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv,noheader > "$LOG"
python -c "import torch; print(torch.__version__)" >> "$LOG"
timeout 330 python -m meshplan.cli calibrate --model $M --nproc 1 --seq-len 2048 \
    --micro-batches 2,4 --max-tp 1 --rounds 1 --compile-rows none,full --fp8-rows rowwise \
    --time-budget 270 --out $P > "$W/calibrate.log" 2>&1
echo "calibrate rc $?" >> "$LOG"
tail -3 "$W/calibrate.log" >> "$LOG"
python benchmarks/moe_sync_gpu.py plans --set drawn-3830c --model $M --global-batch 16 \
    --gpu-bound 2 --profile $P --out benchmarks/plans/moeh27_bf16_h200x1 >> "$LOG" 2>&1
KEPT=$(python -c "import json; print(' '.join(json.load(open(
    'benchmarks/plans/moeh27_bf16_h200x1/predictions.json'))['layouts']))")
echo "kept: $KEPT" >> "$LOG"
python benchmarks/moe_sync_gpu.py plans --set drawn-3830c --model $M --global-batch 16 \
    --fp8-recipe rowwise --only $KEPT --profile $P \
    --out benchmarks/plans/moeh27_fp8_h200x1 >> "$LOG" 2>&1
tar czf "$OUT/predictions.tgz" $P "$W/calibrate.log" benchmarks/plans/moeh27_bf16_h200x1 \
    benchmarks/plans/moeh27_fp8_h200x1
for n in $KEPT; do
    for p in bf16 fp8; do
        echo "== $p $n $(date +%T)" >> "$LOG"
        timeout 140 python benchmarks/moe_sync_gpu.py run \
            --plans benchmarks/plans/moeh27_${p}_h200x1 --out "$W/${p}_$n" --only "$n" \
            --budget 300 --timeout 130 >> "$LOG" 2>&1
        echo "rc $?" >> "$LOG"
    done
    tar czf "$OUT/$n.tgz" -C "$W" "bf16_$n" "fp8_$n"
done
