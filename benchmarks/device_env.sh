# Sourced by the one-GPU device scripts (moe_rows_device.sh, fp8_rows_device.sh): the
# repository root as working directory, this tree first on the path, NCCL without NVLink
# multicast, $OUT (required) created, $PY the interpreter.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:?set OUT}
PY=${PY:-python3}
mkdir -p "$OUT"
