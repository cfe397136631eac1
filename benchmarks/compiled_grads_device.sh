#!/usr/bin/env bash
# The first thing a lease runs since the compiled-gradient fix (docs/benchmarks/compiled_grads.md):
# every communicating autograd function compiled against eager on two GPUs (gloo/aot_eager and
# NCCL/inductor), then the saved-copies probe that found the defect (moeh14's model, ep 1 and 2).
# Exits 1 when any gap is above 1e-5 (or a check fails), so that `&&` stops the device
# work behind it.
# Files under $OUT: gpu.txt, checks.log, grads_cpu.json, grads_cuda.json, saved_copies.json.
source "$(dirname "$0")/device_env.sh"
record_gpu
run2() { timeout "$1" torchrun --standalone --nproc-per-node 2 "${@:2}" >> "$OUT/checks.log" 2>&1
         local rc=$?; echo "rc $rc ${2##*/} after ${SECONDS}s" | tee -a "$OUT/checks.log"
         return $rc; }
# compiled_grads_check.py exits 1 on a gap above its MAX_GAP (1e-5)
run2 150 benchmarks/compiled_grads_check.py --out "$OUT/grads_cpu.json" || exit 1
run2 240 benchmarks/compiled_grads_check.py --device cuda --backend inductor \
    --out "$OUT/grads_cuda.json" || exit 1
run2 150 benchmarks/moe_saved_copies.py --model benchmarks/sets/moeh14/m01.json --seq-len 2048 \
    --micro-batch 4 --out "$OUT/saved_copies.json"
