#!/usr/bin/env bash
# Two-GPU calls for issue 38's moeh4 check (benchmarks/sets/moeh4/README.md): a never-run MoE
# model at layouts drawn over dp / tp + SP / pp / ep on two ranks.
#
#   PART=1 bash benchmarks/moeh4_device.sh  # calibrate moeh4 on 2 GPUs as a user would (~9 min)
#   PART=2 bash benchmarks/moeh4_device.sh  # run the committed plans (~9 min)
#   PART=3 bash benchmarks/moeh4_device.sh  # recalibrate with the ep and FSDP2 MoE rows the
#       # calibration has timed since (compiled rows at recompute none only, to fit a call),
#       # for `moe_sync_gpu.py repredict --profile` of the committed run (POST HOC)
#
# Files under $OUT: gpu.txt, profile_moeh4.toml, calibrate_moeh4.log, moeh4/moe_sync.json,
# moeh4/logs.tgz.
source "$(dirname "$0")/device_env.sh"
record_gpu

case "${PART:?set PART=1, 2 or 3}" in
    1)  calibrate_moe moeh4 benchmarks/sets/moeh4/m01.json 2 4096 1,2,4 none,selective ;;
    3)  calibrate_moe moeh4_rows benchmarks/sets/moeh4/m01.json 2 4096 1,2,4 none ;;
    2)  run_moe_plans moeh4 benchmarks/plans/moeh4_h200x2 ;;
esac
ls -la "$OUT" "$OUT"/*/
