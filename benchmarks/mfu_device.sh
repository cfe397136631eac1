#!/usr/bin/env bash
# Issue 40 item 4, one device call on 4 GPUs (<= 560 s): the planner's best layout for a
# 1.3B GPT (eager and compiled), FSDP2 dp 4 (the earlier pick, eager and compiled), and a
# plain DDP (+ torch.compile) script on the same model and job, in the same call.
#   bash benchmarks/mfu_device.sh            # results: $OUT/mfu.tar.gz and $OUT/summary.md
# Plans: benchmarks/plans/gpt3-1.3b_dgx-h{100,200}x4_gb16.json (made on a CPU machine with
# the calibrated profiles docs/benchmarks/data/profiles/profile_h100x4_round18.toml /
# _h200x4_round26.toml; the device has no ortools). Both executor layouts (the plan's and
# FSDP2 dp 4) are written as plans on the cluster with that profile applied, so both runs
# are compared with the cost model on the whole profile, its measured layer rows included
# (a plan file made before plan files kept them holds the curves only: 2026-11-28's dp 4
# run was compared with 229 ms where the whole profile says 164 ms). Each run has its own
# time limit; a run that fails or times out is recorded and the rest go on.
set -u
OUT=${OUT:-/tmp/mfu_out}
. benchmarks/mfu_lib.sh
mfu_setup /tmp/mfu benchmarks/plans/gpt3-1.3b_ x4_gb16.json
case "$PLAN" in *h200*) PROFILE=docs/benchmarks/data/profiles/profile_h200x4_round26.toml ;;
                *) PROFILE=docs/benchmarks/data/profiles/profile_h100x4_round18.toml ;; esac
python3 - "$PLAN" "$PROFILE" "$W/best.json" "$W/dp4z2.json" <<'PY'
import sys
from meshplan.executor.planfiles import write_plan_for_layout
from meshplan.hardware_profiles.calibrated import apply_profile
from meshplan.planner.planfile import load_plan_file
from meshplan.spec import Layout
rec = load_plan_file(sys.argv[1])
cluster = rec.cluster if rec.cluster.gpu.measured else apply_profile(rec.cluster, sys.argv[2])
for out, layout in ((sys.argv[3], rec.layout), (sys.argv[4], Layout(dp=4, micro_batch=4, zero=2))):
    write_plan_for_layout(out, rec.model, rec.job, layout, cluster)
PY
TR="python3 -m torch.distributed.run --standalone --nproc-per-node=4"
EX="-m meshplan.executor.run --steps 15 --warmup 5 --force"
run best_eager     70  $TR $EX --plan "$W/best.json" --out "$W/best_eager.json"
run best_compiled 120  $TR $EX --plan "$W/best.json" --out "$W/best_compiled.json" --compile
run dp4z2_eager    70  $TR $EX --plan "$W/dp4z2.json" --out "$W/dp4z2_eager.json"
run dp4z2_compiled 110 $TR $EX --plan "$W/dp4z2.json" --out "$W/dp4z2_compiled.json" --compile
run ddp_eager      60  $TR benchmarks/baseline_ddp.py --out "$W/ddp_eager.json"
run ddp_compiled  100  $TR benchmarks/baseline_ddp.py --compile --out "$W/ddp_compiled.json"
python3 benchmarks/mfu_summary.py "$W" > "$W/summary.md" 2>&1
cp "$W/summary.md" "$OUT/summary.md"
tar czf "$OUT/mfu.tar.gz" -C /tmp mfu
cat "$OUT/summary.md"
