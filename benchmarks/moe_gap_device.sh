#!/usr/bin/env bash
# One call on one GPU (issue 38): why moeh1's compiled layouts ran 6-8 % slower than their
# rows predict while the eager one matched (docs/benchmarks/moe_checks.md, "A never-run MoE model"). About
# 5 minutes:
#
#   bash benchmarks/moe_gap_device.sh        # writes $OUT (<= 8 files)
#
# (a) benchmarks/moe_forward_gap_gpu.py: the compiled block's forward kernels in the row's
#     regime and in a step's, name by name -> moe_forward_gap.json / gap.log;
# (b) the executor on moeh1's `mb2 compiled` plan with --block-marks, three times: as run
#     (the baseline), with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (does the
#     caching allocator's churn over per-step token-count shapes cost the forward?), and
#     the eager `mb2` twin of the plan (do eager blocks match their rows inside a step?)
#     -> marks.json;
# (c) the executor's --profile on `mb2 compiled` (3 steps), summarised by
#     moe_trace_summary.py, trace_cpu.py and trace_ops.py -> trace_summary.txt; the raw trace
#     in trace.json.gz when under 15 MiB.
source "$(dirname "$0")/device_env.sh"
PLANS=benchmarks/plans/moeh1_h200x1
WORK=$(mktemp -d)
record_gpu name,driver_version,clocks.max.sm

echo "== (a) forward gap probe" | tee -a "$OUT/run.log"
timeout 200 $PY benchmarks/moe_forward_gap_gpu.py --model benchmarks/sets/moeh1/m01.json \
    --micro-batch 2 --out "$OUT/moe_forward_gap.json" > "$OUT/gap.log" 2>&1
echo "rc $?" >> "$OUT/gap.log"

run_plan() {   # name plan extra-args... ; env from the caller
    local name=$1 plan=$2; shift 2
    echo "== $name" | tee -a "$OUT/run.log"
    timeout 150 $PY -m torch.distributed.run --standalone --nproc-per-node=1 \
        -m meshplan.executor.run --plan "$plan" --out "$WORK/$name.json" --steps 6 --warmup 3 \
        --force --device cuda "$@" >> "$OUT/run.log" 2>&1
    echo "rc $? for $name" | tee -a "$OUT/run.log"
}

echo "== (b) block marks" | tee -a "$OUT/run.log"
run_plan marks-compiled $PLANS/mb2-compiled.json --block-marks
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    run_plan marks-compiled-expandable $PLANS/mb2-compiled.json --block-marks
$PY - "$PLANS/mb2-compiled.json" "$WORK/mb2-eager.json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["layout"]["compile"] = False
json.dump(doc, open(sys.argv[2], "w"), indent=1)
EOF
run_plan marks-eager "$WORK/mb2-eager.json" --block-marks
$PY - "$WORK" "$OUT/marks.json" <<'EOF'
import json, sys
from pathlib import Path
from meshplan.calibrate.validate_records import read_measurement
out = {}
for p in sorted(Path(sys.argv[1]).glob("marks-*.json")):
    doc = json.loads(p.read_text())
    try:
        m = read_measurement(doc, 1)
    except ValueError as e:
        out[p.stem] = {"status": doc.get("status"), "error": str(e)}
        continue
    out[p.stem] = {"status": doc.get("status"), "step_time_s": m.get("step_time_s"),
                   "memory_peak_bytes": m.get("memory_peak_bytes"),
                   "phases": (m.get("phase_median_ms_per_rank") or [None])[0]}
json.dump(out, open(sys.argv[2], "w"), indent=1)
for k, v in out.items():
    print(k, v.get("status"), v.get("step_time_s"))
EOF

echo "== (c) trace" | tee -a "$OUT/run.log"
run_plan trace-compiled $PLANS/mb2-compiled.json --profile "$WORK/prof"
{
    $PY benchmarks/moe_trace_summary.py "$WORK/prof" 2>&1
    $PY benchmarks/trace_cpu.py "$WORK"/prof/trace_rank*.json --top 15 2>&1
    $PY benchmarks/trace_ops.py "$WORK"/prof/trace_rank*.json --top 30 2>&1
} > "$OUT/trace_summary.txt"
gzip -c "$WORK"/prof/trace_rank0.json > "$WORK/trace.json.gz" 2>/dev/null
[ "$(stat -c %s "$WORK/trace.json.gz" 2>/dev/null || echo 99999999)" -lt 15000000 ] && \
    cp "$WORK/trace.json.gz" "$OUT/"
ls -la "$OUT"
