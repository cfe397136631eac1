#!/usr/bin/env bash
# Two-GPU calls for issue 38's moeh6 check (benchmarks/sets/moeh6/README.md): a never-run,
# GPU-bound-sized MoE model (hidden 2048) at drawn layouts over dp / tp + SP / pp with ep 2,
# calibrated with the ep and FSDP2 MoE rows.
#
#   PART=0 bash benchmarks/moeh6_device.sh  # moeh4's ep rows (the ep rows' first GPU run,
#                                           # ~2 min; POST HOC re-prediction of moeh4)
#   PART=1 bash benchmarks/moeh6_device.sh  # calibrate moeh6 on 2 GPUs as a user would (~9 min)
#   PART=2 bash benchmarks/moeh6_device.sh  # run the committed plans (~9 min)
#
# Between 1 and 2, on the CPU: commit the profile, then
#   python benchmarks/moe_sync_gpu.py plans --set drawn2-3806 \
#       --model benchmarks/sets/moeh6/m01.json --global-batch 32 --gpu-bound 8 \
#       --profile docs/benchmarks/data/profiles/<it> --out benchmarks/plans/moeh6_h200x2
# and commit the plans.
#
# Files under $OUT: gpu.txt, ep_rows.json, profile_moeh4_ep.toml, profile_moeh6.toml,
# calibrate_moeh6.log, moeh6/moe_sync.json, moeh6/logs.tgz.
source "$(dirname "$0")/device_env.sh"
record_gpu

case "${PART:?set PART=0, 1 or 2}" in
    0)  timeout 200 torchrun --standalone --nproc-per-node 2 benchmarks/moe_ep_rows_gpu.py \
            --model benchmarks/sets/moeh4/m01.json --seq-len 4096 --tp 2 --sp \
            --recompute none,selective,full --micro-batches 1,2,4 --out "$OUT/ep_rows.json" \
            --base-profile docs/benchmarks/data/profiles/profile_h200x2_moeh4_20261129.toml \
            --profile-out "$OUT/profile_moeh4_ep.toml" 2>&1 | tail -30
        echo "rc ${PIPESTATUS[0]} moeh4 ep rows after ${SECONDS}s" | tee -a "$OUT/gpu.txt" ;;
    1)  calibrate_moe moeh6 benchmarks/sets/moeh6/m01.json 2 2048 4 none,selective,full ;;
    2)  run_moe_plans moeh6 benchmarks/plans/moeh6_h200x2 ;;
esac
ls -la "$OUT" "$OUT"/*/
