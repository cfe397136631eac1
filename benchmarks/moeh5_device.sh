#!/usr/bin/env bash
# Four-GPU calls for issue 38's moeh5 check (benchmarks/sets/moeh5/README.md): a never-run,
# GPU-bound-sized MoE model at layouts drawn over dp / tp + SP / pp with ep 2 and 4.
#
#   PART=1 bash benchmarks/moeh5_device.sh  # calibrate moeh5 on 4 GPUs as a user would (~10 min)
#   PART=2 bash benchmarks/moeh5_device.sh  # run the committed plans (~9 min)
#
# Between them, on the CPU: commit the profile, then
#   python benchmarks/moe_sync_gpu.py plans --set drawn4-3805 \
#       --model benchmarks/sets/moeh5/m01.json --global-batch 32 --gpu-bound 8 \
#       --load-imbalance rows \
#       --profile docs/benchmarks/data/profiles/<it> --out benchmarks/plans/moeh5_h200x4
# and commit the plans.
#
# Files under $OUT: gpu.txt, profile_moeh5.toml, calibrate_moeh5.log, moeh5/moe_sync.json,
# moeh5/logs.tgz. PLANS=DIR runs other plans than the committed ones; DRY_RUN=cpu runs either
# part on the CPU with the model shrunk (benchmarks/dry_run_4gpu.sh chains the whole protocol).
source "$(dirname "$0")/device_env.sh"
record_gpu

case "${PART:?set PART=1 or 2}" in
    1)  calibrate_moe moeh5 benchmarks/sets/moeh5/m01.json 4 4096 2 none,selective,full --sp-only ;;
    2)  run_moe_plans moeh5 "${PLANS:-benchmarks/plans/moeh5_h200x4}" ;;
esac
ls -la "$OUT" "$OUT"/*/
