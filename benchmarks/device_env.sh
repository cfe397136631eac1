# Sourced by the device scripts (moe_rows_device.sh, fp8_rows_device.sh, moeh*_device.sh):
# the repository root as working directory, this tree first on the path, NCCL, symmetric
# memory and NVSHMEM without NVLink multicast, $OUT (required) created, $PY the interpreter,
# and record_gpu: the GPUs (nvidia-smi fields, default name, driver, power limit) and torch's
# version into $OUT/gpu.txt.
#
# DRY_RUN=cpu: the same steps on the CPU (gloo, `--device cpu`) with each model shrunk
# (benchmarks/shrink_model.py) and 64-token sequences, to check a script before a lease
# (benchmarks/dry_run_4gpu.sh); its numbers are not measurements.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:?set OUT}
PY=${PY:-python3}
mkdir -p "$OUT"
case "${DRY_RUN:-}" in
    "")  DEVICE=cuda ;;
    cpu) DEVICE=cpu ;;
    *)   echo "DRY_RUN=$DRY_RUN: unset (the GPUs) or cpu" >&2; exit 2 ;;
esac

# dry_model MODEL: MODEL, or under DRY_RUN its shrunk copy in $OUT/dry/
dry_model() {
    if [ "$DEVICE" = cpu ]; then
        $PY benchmarks/shrink_model.py "$1" "$OUT/dry/$(basename "$1")" || exit 1
    else
        echo "$1"
    fi
}

# dry_seq SEQ: SEQ, or under DRY_RUN the shrunk models' 64 tokens
dry_seq() { [ "$DEVICE" = cpu ] && echo 64 || echo "$1"; }

record_gpu() {
    if [ "$DEVICE" = cpu ]; then
        echo "DRY_RUN=cpu: $(nproc) CPU cores, no GPU; not a measurement" > "$OUT/gpu.txt"
        $PY -c "import torch; print(torch.__version__)" >> "$OUT/gpu.txt"
        return
    fi
    nvidia-smi --query-gpu="${1:-name,driver_version,power.limit}" --format=csv > "$OUT/gpu.txt" 2>&1
    $PY -c "import torch; print(torch.__version__)" >> "$OUT/gpu.txt"
}

# calibrate_moe NAME MODEL NPROC SEQ MICRO_BATCHES COMPILE_ROWS [--sp-only]: `meshplan calibrate` of an
# MoE check's model as a user would (tp up to 2, no fp8 benchmarks, a 560 s budget: the
# whole grid once, and in the rounds a whole one no longer fits, the ep rows alone again —
# moeh14 on — where moeh7-moeh13 ran --rounds 1) -> $OUT/profile_NAME.toml,
# $OUT/calibrate_NAME.log; what the budget left untimed goes to gpu.txt
calibrate_moe() {
    local model
    model=$(dry_model "$2") || return 1
    timeout 585 $PY -m meshplan.cli calibrate --model "$model" --nproc "$3" \
        --seq-len "$(dry_seq "$4")" --device "$DEVICE" --micro-batches "$5" --max-tp 2 \
        --rounds ${ROUNDS:-3} --compile-rows "$6" --no-fp8 ${7:-} --time-budget 560 \
        --out "$OUT/profile_$1.toml" > "$OUT/calibrate_$1.log" 2>&1
    echo "rc $? calibrate $1 after ${SECONDS}s" | tee -a "$OUT/gpu.txt"
    grep -E "not timed|re-time only|synchronized read|layer tables|wrote" "$OUT/calibrate_$1.log" | tee -a "$OUT/gpu.txt"
}

# run_moe_plans NAME PLANS: an MoE check's committed plans, 3 warm-up + 6 timed steps each,
# then each once more in a fresh process in the budget left (moeh15 on: moeh14's layouts
# moved 3-10 % run to run) -> $OUT/NAME/moe_sync.json, $OUT/NAME/logs.tgz. NCCL's flight
# recorder keeps each rank's last collectives and dumps them into the logs when a collective
# times out (moeh16's compiled ZeRO-3 ep 2 layout hung at step 7 of 9 on 2026-11-30; its
# likely cause, a communicator shared with FSDP2, is fixed but not confirmed on a GPU;
# torchtitan records so by default)
run_moe_plans() {
    mkdir -p "$OUT/$1" "/tmp/$1/runs"
    TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 \
    TORCH_FR_DUMP_TEMP_FILE="/tmp/$1/runs/nccl_trace_rank_" \
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE="/tmp/$1/runs/nccl_trace_rank_" \
    $PY benchmarks/moe_sync_gpu.py run --plans "$2" --out "$OUT/$1" --work "/tmp/$1/runs" \
        --budget 540 --timeout 150 --second-pass --device "$DEVICE"
    echo "rc $? run $1 after ${SECONDS}s" | tee -a "$OUT/gpu.txt"
}
