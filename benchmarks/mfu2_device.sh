#!/usr/bin/env bash
# Issue 40 on a 2-GPU machine (when no 4-GPU one is lent): gpt3-1.3b, 8 × 2048 tokens per step
# (4 sequences per GPU, as the 4-GPU check's 16), FSDP2 dp 2 ZeRO-2 mb 4 compiled (the 4-GPU
# check's best layout at half the width) against the plain DDP + torch.compile script, in one
# call (≈ 150 s). Predictions on the calibrated 4 × H200 profile with compiled rows.
#   bash benchmarks/mfu2_device.sh      # $OUT/summary.md, $OUT/mfu2.tar.gz
set -u
OUT=${OUT:-/tmp/mfu2_out}
W=/tmp/mfu2; rm -rf "$W"; mkdir -p "$W" "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$W/env.txt" 2>&1
python3 - "$W/dp2z2.json" <<'PY'
import sys
sys.path.insert(0, "benchmarks")
from baseline_ddp import GPT_1_3B
from meshplan.executor.planfiles import write_plan_for_layout
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.calibrated import apply_profile
from meshplan.spec import Job, Layout
cluster = apply_profile(Cluster.preset("dgx-h200", nodes=1, gpus_per_node=2),
                        "docs/benchmarks/data/profiles/profile_h200x4_compile_20261128.toml")
write_plan_for_layout(sys.argv[1], GPT_1_3B, Job(global_batch=8, seq_len=2048, runtime="torch"),
                      Layout(dp=2, micro_batch=4, zero=2, compile=True), cluster)
PY
TR="python3 -m torch.distributed.run --standalone --nproc-per-node=2"
timeout 150 $TR -m meshplan.executor.run --steps 15 --warmup 5 --force --plan "$W/dp2z2.json" \
  --out "$W/dp2z2_compiled.json" > "$W/dp2z2_compiled.log" 2>&1; echo "dp2z2_compiled rc=$?" >> "$W/runs.txt"
timeout 120 $TR benchmarks/baseline_ddp.py --compile --global-batch 8 \
  --out "$W/ddp_compiled.json" > "$W/ddp_compiled.log" 2>&1; echo "ddp_compiled rc=$?" >> "$W/runs.txt"
python3 benchmarks/mfu_summary.py "$W" dp2z2_compiled ddp_compiled --base ddp_compiled \
  > "$W/summary.md" 2>&1
cp "$W/summary.md" "$OUT/summary.md"
tar czf "$OUT/mfu2.tar.gz" -C /tmp mfu2
cat "$W/runs.txt" "$OUT/summary.md"
