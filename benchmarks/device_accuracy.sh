#!/usr/bin/env bash
# Issue 5 on a lent 4-GPU (or, with NPROC=2 and SET=holdout5, 2-GPU) machine: calibrate
# once, then validate the held-out layouts.
#
#   bash benchmarks/device_accuracy.sh calibrate   # ≈ 4 min: $OUT/profile.toml (+ a copy in $KEEP)
#   bash benchmarks/device_accuracy.sh validate    # ≈ 8 min: $OUT/accuracy.{json,md,png}
#   ONLY=u10,g08 bash benchmarks/device_accuracy.sh probe   # calibrate + a few layouts
#   MBS=2,4,8 ... calibrate / SET=holdout3 ... validate       # round 4 (docs/benchmarks/accuracy.md)
#   MBS=2,4,8 SPLIT=queued ... calibrate / SET=holdout4 ...   # next: the queued split, new layouts
#   NPROC=2 MBS=2,4,8 SPLIT=queued ... calibrate / SET=holdout5 ...   # round 5, on 2 GPUs
#   ONLY=n06,n12 SET=holdout4 PROFILE=docs/benchmarks/... bash ... trace   # profiler traces
#   SET=holdout4 PROFILE=docs/benchmarks/profile_h200_round4.toml ... validate  # round 6
#   ONLY=n09,n05 SET=holdout4 bash ... memory     # memory per pipeline action / step phase
#   SNAPSHOT=1 ONLY=p04,p07 SET=holdout7 ... memory  # + what is alive at each rank's peak
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout7 ... validate  # round 7
#   SET=holdout8 PROFILE=docs/benchmarks/profile_h200x4_round7.toml ... validate    # round 7
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout9 ... validate  # round 8
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout10 ... validate # round 9
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout11 ... validate # round 10
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout12 ... validate # round 11
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout13 ... validate # round 15
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout16 BUDGET=545 ... validate
#     # round 16: validated twice (one call each), then validate_device.py --merge A,B --median
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout17 BUDGET=545 ... validate
#     # round 17: the same protocol
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout18 BUDGET=545 ... validate
#     # round 18: the same protocol
#   SET=fsdp18 ONLY=f01,f03 BUDGET=200 ... trace   # round 18: DDP vs FSDP2 at the same work
#   SNAPSHOT=1 ONLY=b04 SET=holdout18 ... memory     # round 18: zero-bubble full, last stage
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout19 BUDGET=545 ... validate
#     # round 19: the same protocol; SNAPSHOT=1 ONLY=b14 SET=holdout18 ... memory after it
#   ONLY=c01 SET=holdout19 BUDGET=150 ... trace   # round 19: a pipelined ZeRO-2 stage's kernels
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout20 BUDGET=545 ... validate
#     # round 20: the same protocol; SNAPSHOT=1 ONLY=d03 SET=holdout20 ... memory and
#     # ONLY=d07 / ONLY=d02 SET=holdout20 BUDGET=100 ... trace after it
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout21 BUDGET=545 ... validate
#     # round 21: the same protocol; ONLY=e03 / ONLY=e02 SET=holdout21 BUDGET=100 ... trace and
#     # SNAPSHOT=1 ONLY=e07,e08 / ONLY=e11 SET=holdout21 ... memory after it
#   MBS=4,8 SPLIT=queued CAL_TIMEOUT=560 ... calibrate / SET=holdout22 BUDGET=545 ... validate
#     # next: the same protocol on the drawn set (benchmarks/draw_holdout.py, seed 22)
#   NPROC=2 MBS=2,4,8 SPLIT=queued CAL_TIMEOUT=460 ... calibrate / SET=pair12 ... validate
#                                                      # round 12, on 2 GPUs
#   SET=ddp13 PROFILE=docs/benchmarks/profile_h100x2_round12.toml ... validate  # round 13
#   NPROC=2 MBS=2,4,8 SPLIT=queued CAL_TIMEOUT=460 ... calibrate / SET=pair14 ... validate
#                                                      # round 14, on 2 GPUs
#   NPROC=2 MBS=2,4,8 SPLIT=queued CAL_TIMEOUT=460 ... calibrate / SET=pair16 ... validate
#                                                      # next if only 2 GPUs: validate twice
#   AFFINITY=split ... validate / probe / trace   # each rank pinned to its own physical cores
#   ONLY=s02,s05,s15 SET=holdout10 PROFILE=... bash ... ab   # repeatability, pinned or not
#   ARMS="none/auto none/manual split/manual" ONLY=... bash ... ab   # and with Python's GC on/off
#   GC=auto ... validate    # CPython's collector left on in the timed steps (executor --gc)
#   BLOCK_MARKS=1 ONLY=e03,e06 SET=holdout21 BUDGET=120 ... validate   # each block timed
#     # (executor --block-marks, pp = 1 only; then step_phases.py accuracy.json --blocks)
#   ONLY=w01,w02 SET=casts2 ... validate   # only these layouts of the set
#   REPEATS=2 ... validate   # every layout twice, in rounds; each measured by its runs' median
#
# The two steps are separate `device` calls (10 minutes per command at most); the second
# reuses the profile the first left in $KEEP on the same (still warm) machine, and
# calibrates again first if the machine is a fresh one.
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
    # SET=...; PROFILE=file for the predictions): benchmarks/diag_stage_memory.py
    timeout "${BUDGET:-300}" python benchmarks/diag_stage_memory.py --set "${SET:-holdout4}" \
      --only "$ONLY" --out "$KEEP/memory" ${PROFILE:+--profile "$PROFILE"} ${SNAPSHOT:+--snapshot} \
      >"$OUT/memory.log" 2>&1 || true
    (cd "$KEEP" && tar czf "$OUT/memory.tgz" memory) || true
    ;;
  *) echo "usage: $0 calibrate|validate|probe|trace|ab|memory" >&2; exit 2 ;;
esac
