#!/usr/bin/env bash
# The four-GPU checks' whole protocol on the CPU before a lease (issues 38 and 41): each call
# of the device script under DRY_RUN=cpu (4 gloo ranks, the set's model shrunk by
# benchmarks/shrink_model.py, 64-token sequences), and the CPU steps between the calls as the
# set's README gives them, into $OUT. It checks that the scripts, flags and plans run end to
# end; its times are not measurements. The fp8 arms are predicted from a saved 4-GPU H200
# profile (a CPU profile has no fp8 peak; DRY_PROFILE=PATH for another).
#
#   CHECK=moeh5 OUT=/tmp/dry bash benchmarks/dry_run_4gpu.sh   # ~18 min on 2 cores
#   CHECK=fp8h5 OUT=/tmp/dry bash benchmarks/dry_run_4gpu.sh   # ~13 min on 2 cores (RUN_BUDGET)
set -eu
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}
PY=${PY:-python3}
export DRY_RUN=cpu PY PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
case "${CHECK:?CHECK=moeh5 or fp8h5}" in
moeh5)
    D=$OUT
    OUT=$D/moeh5_call1 PART=1 bash benchmarks/moeh5_device.sh
    $PY benchmarks/moe_sync_gpu.py plans --set drawn4-3805 \
        --model "$D/moeh5_call1/dry/m01.json" --global-batch 32 --gpu-bound 8 \
        --max-host-load 1e9 --load-imbalance rows --profile "$D/moeh5_call1/profile_moeh5.toml" \
        --profile-override --out "$D/moeh5_plans"
    OUT=$D/moeh5_call2 PART=2 PLANS=$D/moeh5_plans bash benchmarks/moeh5_device.sh
    # the device script lists what it wrote whatever ran: fail here unless every layout did
    $PY - "$D/moeh5_call2/moeh5/moe_sync.json" <<'PYEOF'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
bad = {k: v.get("status") for k, v in runs.items()
       if v.get("status") != "ok" and not str(v.get("status")).startswith("skipped")}
ok = sum(v.get("status") == "ok" for v in runs.values())
print(f"dry run: {ok} runs ok, failed: {bad or 'none'}")
sys.exit(1 if bad or not runs else 0)
PYEOF
    ;;
fp8h5)
    SET=benchmarks/sets/fp8h5 SEQ=1024 GB=64
    PROFILE=${DRY_PROFILE:-docs/benchmarks/data/profiles/profile_h200x4_round26.toml}
    OUT=$OUT/fp8h5_call1 PART=cal NPROC=4 MAXTP=2 SET=$SET SEQ=$SEQ GB=$GB MB=8 SP_ONLY=1 \
        COMPILE_ROWS=none,selective CAL_BUDGET=560 bash benchmarks/fp8_rows_device.sh
    $PY benchmarks/fp8_device.py --predict-only "NVIDIA H200" --profile "$PROFILE" \
        --model "$OUT/fp8h5_call1/dry/m01.json" --seq-len 64 --global-batch $GB \
        --only q01,q02,q03,q04,q05,q06 --out "$OUT/fp8h5_predictions"
    OUT=$OUT/fp8h5_call2 PART=run SET=$SET SEQ=$SEQ GB=$GB ONLY=q01,q02,q03,q04,q05,q06 \
        PROFILE=$PROFILE RUN_BUDGET=${RUN_BUDGET:-540} bash benchmarks/fp8_rows_device.sh ;;
*)  echo "CHECK=$CHECK: moeh5 or fp8h5" >&2; exit 2 ;;
esac
