#!/usr/bin/env bash
# One call for a drawn context-parallel set on the node's GPUs (issue 39; sets from
# benchmarks/cp_draw.py): the host's communication-call cost measured first, then the set's
# eight layouts, each predicted (datasheet H200 profile + that host number) before it runs.
#
#   CPSET=cp45 bash benchmarks/cp_set_device.sh    # ~5-8 minutes
#
# Files under $OUT: gpu.txt, host.json, cp_gpu.json, cp_gpu.md, cp_gpu_logs.tar.gz.
source "$(dirname "$0")/device_env.sh"
record_gpu
SETFILE="benchmarks/sets/${CPSET:?set CPSET, e.g. cp45}/set.json"
[ -f "$SETFILE" ] || { echo "CPSET=$CPSET: no $SETFILE" >&2; exit 2; }
NPROC=$($PY -c "import json,sys; print(max(c['layout']['dp']*c['layout']['pp']*c['layout']['tp']*c['layout']['cp'] for c in json.load(open(sys.argv[1]))['cases']))" "$SETFILE")
timeout 90 torchrun --standalone --nproc-per-node "$NPROC" benchmarks/cp_host_gpu.py \
    --out "$OUT/host.json" 2>&1 | tail -3
$PY benchmarks/context_parallel_gpu.py --set "$SETFILE" --out "$OUT" \
    --budget "${BUDGET:-430}" --host-json "$OUT/host.json"
echo "rc $? $CPSET after ${SECONDS}s" | tee -a "$OUT/gpu.txt"
cat "$OUT/cp_gpu.md"
