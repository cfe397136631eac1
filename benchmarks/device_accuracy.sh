#!/usr/bin/env bash
# The GPU accuracy protocol on a lent 4-GPU (or, with NPROC=2, 2-GPU) machine: calibrate once,
# then validate a layout set of benchmarks/sets/layout_sets.toml on the same machine. Each
# step is one device call (10 minutes at most); results go to $OUT, the profile also to $KEEP
# so the next call on the same warm machine reuses it (a fresh machine calibrates first).
#
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 bash benchmarks/device_accuracy.sh calibrate
#       # ≈ 7 min: $OUT/profile.toml, calibrate.log, gpus.csv, host_calibrate.txt
#   SET=holdout25 BUDGET=545 bash benchmarks/device_accuracy.sh validate
#       # ≈ 7 min: $OUT/accuracy.{json,md,png}, validate.log, logs.tgz; run twice, then
#       # validate_device.py --merge A,B --median for the median beside call 2's result
#   NPROC=2 MBS=2,4,8 SPLIT=queued CAL_TIMEOUT=460 ... calibrate / SET=pair16 ... validate
#       # the same on 2 GPUs
#
# Diagnostics of a few layouts (ONLY=name,name; SET=...; PROFILE=file to use a profile
# calibrated earlier on this GPU type instead of $KEEP/profile.toml):
#   ONLY=m07,m14 ... probe          # calibrate, then only these layouts
#   ONLY=m07 ... trace              # torch.profiler traces; GPU compute vs NCCL overlap per rank
#                                   # (benchmarks/trace_overlap.py)
#   ONLY=m07 [SNAPSHOT=1] ... memory  # memory after every pipeline action and step phase
#                                   # (benchmarks/memory_walk.py; SNAPSHOT: what is alive at the peak)
#   ONLY=... [ARMS="none/manual split/manual"] ... ab   # repeatability under executor settings
#                                   # (AFFINITY/GC per arm; benchmarks/compare_runs.py)
#   BLOCK_MARKS=1 ONLY=... ... validate   # each block timed (then step_phases.py --blocks)
#   AFFINITY=split / GC=auto / REPEATS=2 ... validate   # executor settings; every layout twice
#
# docs/benchmarks/accuracy.md has the protocol and the results of every round.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/meshplan-out}
KEEP=${KEEP:-/tmp/meshplan-keep}
mkdir -p "$OUT" "$KEEP"
# GPU clocks, temperature and power every 2 s while this script runs (drift diagnosis)
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu \
  --format=csv -l 2 >"$OUT/gpu_clocks_${1:-x}.csv" 2>/dev/null &
CLOCKS=$!
trap 'kill $CLOCKS 2>/dev/null || true' EXIT
# the host's CPU (host-bound layouts depend on it; profiles from other hosts may not fit)
{ lscpu; nvidia-smi topo -m; } >"$OUT/host_${1:-x}.txt" 2>&1 || true

calibrate() {
  python benchmarks/validate_device.py --write-models "$KEEP/models" >/dev/null
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpus.csv" || true
  # --time-budget drops layer rounds that would not fit (40 s for torchrun's start-up, the
  # imports and the model files, which the budget does not see); timeout stays as a backstop
  local limit=${CAL_TIMEOUT:-560}
  timeout "$limit" python -m meshplan.cli calibrate --nproc "${NPROC:-4}" --seq-len 2048 --micro-batches "${MBS:-1,2,4}" \
    --split-timing "${SPLIT:-synchronized}" --time-budget $((limit - 40)) \
    --model "$KEEP/models/gpt-0.54b.json" --model "$KEEP/models/llama-1.64b.json" \
    --out "$KEEP/profile.toml" >"$OUT/calibrate.raw" 2>&1 || status=$?
  # written as it runs (a command killed at the time limit still leaves its log)
  tr '\r' '\n' <"$OUT/calibrate.raw" | grep -v '^\s*$' | tail -n 2000 >"$OUT/calibrate.log"
  rm -f "$OUT/calibrate.raw"
  [ "${status:-0}" = 0 ] || return "$status"
  cp "$KEEP/profile.toml" "$OUT/profile.toml"
}

# run_layouts DIR LOG TGZ [validate_device.py args...]: layouts into $KEEP/DIR, the last
# lines of their output into $OUT/LOG, their executor logs and results into $OUT/TGZ
run_layouts() {
  local dir=$1 log=$2 tgz=$3
  shift 3
  python benchmarks/validate_device.py --out "$KEEP/$dir" --cpu-affinity "${AFFINITY:-none}" \
    --gc "${GC:-manual}" ${BLOCK_MARKS:+--block-marks} "$@" \
    2>&1 | tail -n 60 >"$OUT/$log"
  (cd "$KEEP/$dir" && tar czf "$OUT/$tgz" */log.txt */results.json \
    $(ls -d */trace/top_ops* run*/*/log.txt run*/*/results.json 2>/dev/null)) || true
}

case "${1:-}" in
  calibrate) calibrate ;;
  validate)
    # PROFILE=file: a profile calibrated earlier on this GPU type (validate_device.py refuses
    # one of another GPU); otherwise this machine's, calibrated first if there is none
    budget=${BUDGET:-500}
    prof=${PROFILE:-$KEEP/profile.toml}
    if [ ! -f "$prof" ]; then
      [ -z "${PROFILE:-}" ] || { echo "PROFILE=$PROFILE: no such file" >&2; exit 2; }
      echo "no profile on this machine: calibrating first" >&2
      t0=$(date +%s); calibrate; budget=$((budget - $(date +%s) + t0))
    fi
    run_layouts val validate.log logs.tgz --profile "$prof" --set "${SET:-test}" \
      ${ONLY:+--only "$ONLY"} ${REPEATS:+--repeats "$REPEATS"} --budget "$budget" --timeout 90
    cp "$KEEP/val/accuracy.json" "$KEEP/val/accuracy.md" "$KEEP/val/accuracy.png" "$OUT/"
    ;;
  probe)
    # calibrate, then run a few layouts (ONLY=name,name SET=dev|test|all) on the same machine
    t0=$(date +%s); calibrate
    run_layouts probe probe.log probe_logs.tgz --profile "$KEEP/profile.toml" \
      --set "${SET:-all}" --only "$ONLY" --budget "$((${BUDGET:-500} - $(date +%s) + t0))" \
      --timeout 90
    cp "$KEEP/probe/accuracy.json" "$OUT/probe_accuracy.json" || true
    ;;
  trace)
    # profiler traces of a few layouts (ONLY=name,name SET=...) with the profile calibrated
    # on this machine (or PROFILE=file): GPU compute vs NCCL overlap per rank
    prof=${PROFILE:-$KEEP/profile.toml}
    run_layouts trace trace.log trace_logs.tgz --profile "$prof" --set "${SET:-all}" \
      --only "$ONLY" --budget "${BUDGET:-300}" --timeout 120 --trace
    for d in "$KEEP"/trace/*/trace; do
      python benchmarks/trace_overlap.py "$d"/trace_rank*.json --steps 3 \
        --json "$OUT/overlap_$(basename "$(dirname "$d")").json" >>"$OUT/trace.log" 2>&1 || true
    done
    ;;
  ab)
    # repeatability under executor settings (ONLY=name,name SET=... PROFILE=...): the layouts
    # run once per arm of ARMS, in order, BUDGET s each; an arm is AFFINITY/GC (default
    # "none/manual split/manual none/manual split/manual"); $OUT/ab.log compares them
    # (benchmarks/compare_runs.py), $OUT/ab_runs.tgz keeps the runs
    prof=${PROFILE:-$KEEP/profile.toml}
    mkdir -p "$KEEP/ab_out"
    runs=()
    i=0
    for arm in ${ARMS:-none/manual split/manual none/manual split/manual}; do
      i=$((i + 1))
      a=${arm%/*} g=${arm#*/}
      AFFINITY=$a GC=$g OUT="$KEEP/ab_out" run_layouts "ab_${a}_${g}_$i" "ab_${a}_${g}_$i.log" \
        "ab_${a}_${g}_$i.tgz" --profile "$prof" --set "${SET:-holdout10}" --only "$ONLY" \
        --budget "${BUDGET:-130}" --timeout 90
      runs+=("$a/$g=$KEEP/ab_${a}_${g}_$i/accuracy.json")
    done
    python benchmarks/compare_runs.py "${runs[@]}" --json "$OUT/ab.json" >"$OUT/ab.log" 2>&1 || true
    (cd "$KEEP" && tar czf "$OUT/ab_runs.tgz" ab_out ab_*/accuracy.json) || true
    ;;
  memory)
    # GPU memory after every pipeline action and step phase of a few layouts (ONLY=name,name
    # SET=...; PROFILE=file for the predictions): benchmarks/memory_walk.py
    timeout "${BUDGET:-300}" python benchmarks/memory_walk.py --set "${SET:-holdout25}" \
      --only "$ONLY" --out "$KEEP/memory" ${PROFILE:+--profile "$PROFILE"} ${SNAPSHOT:+--snapshot} \
      >"$OUT/memory.log" 2>&1 || true
    (cd "$KEEP" && tar czf "$OUT/memory.tgz" memory) || true
    ;;
  *) echo "usage: $0 calibrate|validate|probe|trace|ab|memory" >&2; exit 2 ;;
esac
