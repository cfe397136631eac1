#!/usr/bin/env bash
# The two device calls of a drawn MoE check (issue 38), moeh7 on; each check's README says
# what runs between them on the CPU (commit the profile; make and commit the plans):
#
#   CHECK=moeh7 PART=1 bash benchmarks/moe_check_device.sh  # calibrate the check's model on
#                                                           # its GPUs as a user would
#   CHECK=moeh7 PART=2 bash benchmarks/moe_check_device.sh  # run its committed plans
#
# A check: its set (benchmarks/sets/CHECK/m01.json) and, below, the calibration's GPUs,
# sequence length, micro-batches and compiled recompute modes, and its plans' folder.
# Files under $OUT: gpu.txt, profile_CHECK.toml, calibrate_CHECK.log, CHECK/moe_sync.json,
# CHECK/logs.tgz.
source "$(dirname "$0")/device_env.sh"
record_gpu

case "${CHECK:?set CHECK, e.g. moeh7}" in
    moeh7) calibration=(2 1024 8 none,selective,full) plans=benchmarks/plans/moeh7_h200x2 ;;
    moeh8) calibration=(2 4096 2 none,selective,full) plans=benchmarks/plans/moeh8_h200x2 ;;
    moeh9) calibration=(2 1024 8 none,selective,full) plans=benchmarks/plans/moeh9_h200x2 ;;
    moeh10) calibration=(2 1024 8 selective,full --sp-only) plans=benchmarks/plans/moeh10_h200x2 ;;
    moeh11) calibration=(2 1024 8 none,selective,full --sp-only) plans=benchmarks/plans/moeh11_h200x2 ;;
    moeh12) calibration=(2 4096 2 none,full --sp-only) plans=benchmarks/plans/moeh12_h200x2 ;;
    moeh13) calibration=(2 2048 4 full --sp-only) plans=benchmarks/plans/moeh13_h200x2 ;;
    moeh14) calibration=(2 2048 4 none,selective --sp-only) plans=benchmarks/plans/moeh14_h200x2 ;;
    moeh15) calibration=(2 2048 4 none,full --sp-only) plans=benchmarks/plans/moeh15_h200x2 ;;
    moeh16) calibration=(2 4096 2 none,selective,full --sp-only) plans=benchmarks/plans/moeh16_h200x2 ;;
    moeh17) calibration=(2 4096 2 none,selective,full --sp-only) plans=benchmarks/plans/moeh17_h200x2 ;;
    # the executor's new MoE paths (etp 2, MoE at cp 2): every drawn layout eager
    moeh21) calibration=(2 2048 4 none "--sp-only --ep 2") plans=benchmarks/plans/moeh21_h200x2 ;;
    # issue 42's ep at 8 ranks (an 8-GPU kind, H100 or H200): ep rows at 4 and 8 only
    gpu8moe42) calibration=(8 2048 4 none,selective,full "--sp-only --ep 4,8")
               plans=benchmarks/plans/gpu8moe42 ;;
    *) echo "CHECK=$CHECK: not a check of this script (moeh7-moeh17, moeh21, gpu8moe42)" >&2; exit 2 ;;
esac
if [ "${PART:?set PART=1 or 2}" = 1 ]; then
    calibrate_moe "$CHECK" "benchmarks/sets/$CHECK/m01.json" "${calibration[@]}"
else
    run_moe_plans "$CHECK" "$plans"
fi
ls -la "$OUT" "$OUT"/*/
