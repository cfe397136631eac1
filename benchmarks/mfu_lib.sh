# Sourced by benchmarks/mfu_device.sh (4 GPUs) and benchmarks/gpu8_mfu.sh (8 GPUs).
# mfu_setup WORKDIR PLAN_PREFIX PLAN_SUFFIX: a fresh $W, $OUT, NVLink multicast off, this
# tree on PYTHONPATH, $PLAN = PREFIX + the cluster preset of the GPUs found + SUFFIX, and
# $W/env.txt (GPUs, torch, CUDA, NCCL, the plan).
# run NAME LIMIT_S COMMAND...: COMMAND under `timeout LIMIT_S` (at most what is left of
# $DEADLINE seconds of the script, if set; skipped under 60 s), its output in $W/NAME.log,
# "NAME rc=RC WALL s" in $W/runs.txt; returns its exit status.
# titan_install CARRY SITE: pip-installs the wheels carried in CARRY/wheels (torchtitan and what
# it needs that the device lacks) into SITE, which only the torchtitan runs put on PYTHONPATH.
# titan_cmd SITE LAUNCHER [TOML]: sets $TT, the torchtitan benchmark (benchmarks/torchtitan_bench.py
# on TOML, default the 1.3 B config) under LAUNCHER (a torchrun command line) with SITE's
# packages; add options.
mfu_setup() {
  W=$1; rm -rf "$W"; mkdir -p "$W" "$OUT"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  local gpu c
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  case "$gpu" in *H200*) c=dgx-h200 ;; *) c=dgx-h100 ;; esac
  PLAN=$2$c$3
  { nvidia-smi -L
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
    echo "plan $PLAN"; } > "$W/env.txt" 2>&1
}

run() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS left=$(( ${DEADLINE:-1000000} - SECONDS ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 60 ]; then
    echo "$name skipped: ${left} s left" | tee -a "$W/runs.txt"; return 125
  fi
  timeout -k 10 "$limit" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s" | tee -a "$W/runs.txt"
  return $rc
}

titan_install() {
  local carry=$1 site=$2
  rm -rf "$site"
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
       "$carry"/wheels/*.whl > "$W/pip.log" 2>&1; then
    echo "carried wheels installed: $(cd "$carry/wheels" && ls | tr '\n' ' ')" >> "$W/env.txt"
  else
    echo "pip install of the carried wheels failed (see pip.log)" | tee -a "$W/runs.txt"
  fi
}

titan_cmd() {
  TT="env PYTHONPATH=$1:$PYTHONPATH HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $2 \
  benchmarks/torchtitan_bench.py --warmup 5 \
  --job.config_file ${3:-benchmarks/torchtitan_gpt3_1.3b.toml}"
}
