# Sourced by the device scripts (moe_rows_device.sh, fp8_rows_device.sh, moeh*_device.sh):
# the repository root as working directory, this tree first on the path, NCCL, symmetric
# memory and NVSHMEM without NVLink multicast, $OUT (required) created, $PY the interpreter,
# and record_gpu: the GPUs (nvidia-smi fields, default name, driver, power limit) and torch's
# version into $OUT/gpu.txt.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:?set OUT}
PY=${PY:-python3}
mkdir -p "$OUT"

record_gpu() {
    nvidia-smi --query-gpu="${1:-name,driver_version,power.limit}" --format=csv > "$OUT/gpu.txt" 2>&1
    $PY -c "import torch; print(torch.__version__)" >> "$OUT/gpu.txt"
}
