#!/usr/bin/env bash
# One two-GPU call for issue 39's cp44 check (docs/context_parallel.md "cp44"): the host's
# communication-call cost measured first, then the drawn set's eight layouts, each predicted
# (datasheet H200 profile + that host number) before it runs.
#
#   bash benchmarks/cp44_device.sh    # ~8 minutes
#
# Files under $OUT: gpu.txt, host.json, cp_gpu.json, cp_gpu.md, cp_gpu_logs.tar.gz.
source "$(dirname "$0")/device_env.sh"
record_gpu
timeout 90 torchrun --standalone --nproc-per-node 2 benchmarks/cp_host_gpu.py --out "$OUT/host.json" \
    2>&1 | tail -3
$PY benchmarks/context_parallel_gpu.py --set benchmarks/sets/cp44/set.json --out "$OUT" \
    --budget "${BUDGET:-430}" --host-json "$OUT/host.json"
echo "rc $? cp44 after ${SECONDS}s" | tee -a "$OUT/gpu.txt"
cat "$OUT/cp_gpu.md"
