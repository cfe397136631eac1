#!/usr/bin/env bash
# One device call on 4 GPUs (issue 38): a short MoE calibration, the GPU check with three
# predictions per layout, and profiler traces of ep 1 and ep 4 — about 5 minutes in all.
#
#   bash benchmarks/moe_device.sh                         # on 4 GPUs, writes $OUT (<= 8 files)
#   NPROC=2 bash benchmarks/moe_device.sh                 # on 2 GPUs: the 2-GPU layouts
#   DRY=1 OUT=/tmp/moe_dry bash benchmarks/moe_device.sh   # CPU dry run (gloo, tiny model)
#
# (a) python -m meshplan.calibrate.moe_only: grouped GEMMs at moe-1.9b's expert shapes,
#     the permutation kernels, host syncs and host dispatch, on GPU 0, written into a copy of
#     the saved profile of this GPU type (executor_gpu.SAVED_PROFILES) -> $OUT/profile.toml;
# (b) benchmarks/moe_gpu_check.py, the 8 layouts, predictions on the datasheet, the saved
#     profile and $OUT/profile.toml -> moe_gpu.md / moe_gpu.json (layouts that do not fit
#     the budget are recorded as skipped);
# (c) the executor's --profile (torch.profiler) on 3 steps of dp4-ep4-zero1, then
#     dp4-ep1-zero1 (each where time is left), summarised by benchmarks/moe_trace_summary.py
#     (rank 0: GPU busy/idle, kernels by self time, host operators by self and total CPU
#     time, CUDA runtime calls) -> trace_summary.txt; rank 0's raw traces in traces.tar.gz
#     when under 15 MiB.
# Each part has its own timeout inside DEADLINE (default 325 s after the script starts);
# (b) gets all but TRACE_RESERVE (75 s) of what (a) leaves.
# Files: profile.toml calibrate.log moe_gpu.md moe_gpu.json trace_summary.txt device.log
#        raw.tar.gz [traces.tar.gz]
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:?set OUT}
DEADLINE=${DEADLINE:-325}
TRACE_RESERVE=${TRACE_RESERVE:-75}
PY=${PY:-python3}
mkdir -p "$OUT"
LOG=$OUT/device.log
WORK=$(mktemp -d)
log() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE - SECONDS )); }

if [ "${DRY:-0}" = 1 ]; then
    DEV=(--device cpu); CHECK=(--device cpu --tiny --nproc 2); CAL=(--device cpu --quick)
    MODEL_VAR=TINY; WORLD=2; TRACED=dp2-ep2,dp2-ep1; RANKS=0
else
    DEV=(); CHECK=(); CAL=(); MODEL_VAR=MODEL; WORLD=4; TRACED=dp4-ep4-zero1,dp4-ep1-zero1; RANKS=0
    if [ "${NPROC:-4}" = 2 ]; then      # a 2-GPU machine: moe_gpu_check's 2-GPU layouts
        CHECK=(--nproc 2); WORLD=2; TRACED=dp2-ep2,dp2-ep1
    fi
fi
log "start: $(hostname), DRY=${DRY:-0}, deadline ${DEADLINE}s"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv 2>&1 || true
  $PY -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } >>"$LOG" 2>&1

# ---- (a) the MoE calibration -------------------------------------------------------------
$PY - "$WORK" "$MODEL_VAR" <<'EOF' >>"$LOG" 2>&1
import json, sys
sys.path.insert(0, "benchmarks")
import moe_gpu_check as c
from executor_gpu import SAVED_PROFILES
json.dump(getattr(c, sys.argv[2]).to_dict(), open(f"{sys.argv[1]}/model.json", "w"))
try:
    import torch
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "H200"
except Exception:
    name = "H200"
path = next((p for frag, p in SAVED_PROFILES.items() if frag in name), SAVED_PROFILES["H200"])
open(f"{sys.argv[1]}/base_profile", "w").write(str(path))
print("model", sys.argv[2], "base profile", path)
EOF
BASE=$(cat "$WORK/base_profile" 2>/dev/null)
SEQ=$($PY -c "import json; print(json.load(open('$WORK/model.json'))['max_seq_len'])")
log "(a) moe_only calibration (base profile $BASE, seq $SEQ)"
timeout 90 $PY -m meshplan.calibrate.moe_only --model "$WORK/model.json" --seq-len "$SEQ" \
    --world "$WORLD" --base-profile "$BASE" "${CAL[@]}" --out "$OUT/profile.toml" \
    >"$OUT/calibrate.log" 2>&1
log "(a) rc=$? ($(tail -c 600 "$OUT/calibrate.log" | tr '\n' ' '))"
PROFILE_ARGS=()
[ -s "$OUT/profile.toml" ] && PROFILE_ARGS=(--profile "$OUT/profile.toml")

# ---- (b) the GPU check, three predictions ---------------------------------------------------
BUDGET=$(( $(left) - TRACE_RESERVE ))
log "(b) moe_gpu_check: budget ${BUDGET}s"
timeout $(( BUDGET + 25 )) $PY benchmarks/moe_gpu_check.py --out "$WORK/check" \
    "${CHECK[@]}" "${PROFILE_ARGS[@]}" --no-grouped-check --timeout 75 --budget "$BUDGET" \
    >"$WORK/check.log" 2>&1
log "(b) rc=$?"
cp "$WORK/check/moe_gpu.md" "$WORK/check/moe_gpu.json" "$OUT/" 2>>"$LOG"

# ---- (c) profiler traces of ep 4, then ep 1 ---------------------------------------------------
for n in ${TRACED//,/ }; do
    TB=$(( $(left) - 12 ))
    if [ "$TB" -lt 35 ]; then log "(c) trace of $n skipped: ${TB}s left"; continue; fi
    log "(c) trace of $n: budget ${TB}s"
    timeout $(( TB + 5 )) $PY benchmarks/moe_gpu_check.py --out "$WORK/trace/$n" "${CHECK[@]}" \
        --trace --only "$n" --steps 3 --warmup 2 --no-grouped-check --timeout "$TB" \
        >"$WORK/trace_$n.log" 2>&1
    log "(c) $n rc=$?"
    timeout 40 $PY benchmarks/moe_trace_summary.py "$WORK/trace/$n/profiles/$n" --ranks "$RANKS" \
        >>"$OUT/trace_summary.txt" 2>>"$LOG"
    log "(c) $n summary rc=$?"
done
(cd "$WORK/trace" 2>/dev/null && tar czf "$OUT/traces.tar.gz" */profiles/*/trace_rank0.json) \
    2>>"$LOG"
if [ -f "$OUT/traces.tar.gz" ] && [ "$(stat -c %s "$OUT/traces.tar.gz")" -gt 15728640 ]; then
    log "traces.tar.gz $(stat -c %s "$OUT/traces.tar.gz") bytes: over 15 MiB, left out"
    rm -f "$OUT/traces.tar.gz"
fi
rm -f "$WORK"/trace/*/profiles/*/trace_rank*.json

# ---- the rest, packed ----------------------------------------------------------------------
(cd "$WORK" && tar czf "$OUT/raw.tar.gz" --exclude='*.json.gz' check trace check.log \
    trace_*.log model.json 2>/dev/null)
log "done: $(ls "$OUT" | tr '\n' ' ')"
rm -rf "$WORK"
