#!/usr/bin/env bash
# The first thing a lease runs since the compiled-gradient fix (docs/benchmarks/compiled_grads.md):
# every communicating autograd function compiled against eager on two GPUs (gloo/aot_eager and
# NCCL/inductor), then the saved-copies probe that found the defect (moeh14's model, ep 1 and 2).
# Exits 1 when any gap is above 1e-5, so that `&&` stops the device work behind it.
# Files under $OUT: gpu.txt, checks.log, grads_cpu.json, grads_cuda.json, saved_copies.json.
source "$(dirname "$0")/device_env.sh"
record_gpu
run2() { timeout "$1" torchrun --standalone --nproc-per-node 2 "${@:2}" >> "$OUT/checks.log" 2>&1
         echo "rc $? ${2##*/} after ${SECONDS}s" | tee -a "$OUT/checks.log"; }
run2 150 benchmarks/compiled_grads_check.py --out "$OUT/grads_cpu.json"
run2 240 benchmarks/compiled_grads_check.py --device cuda --backend inductor \
    --out "$OUT/grads_cuda.json"
$PY - "$OUT" <<'PY' || exit 1
import json, sys
from pathlib import Path
worst = {}
for name in ("grads_cpu.json", "grads_cuda.json"):
    p = Path(sys.argv[1]) / name
    if not p.exists():
        sys.exit(f"{name}: not written (see checks.log)")
    worst[name] = max((c["gap"], k) for k, c in json.loads(p.read_text())["cases"].items())
print("largest gap:", worst)
sys.exit(1 if any(g > 1e-5 for g, _ in worst.values()) else 0)
PY
run2 150 benchmarks/moe_saved_copies.py --model benchmarks/sets/moeh14/m01.json --seq-len 2048 \
    --micro-batch 4 --out "$OUT/saved_copies.json"
