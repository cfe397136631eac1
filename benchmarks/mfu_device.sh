#!/usr/bin/env bash
# Issue 40 item 4, one device call on 4 GPUs (<= 560 s): the planner's best layout for a
# 1.3B GPT (eager and compiled), FSDP2 dp 4 (the earlier pick, eager and compiled), and a
# plain DDP (+ torch.compile) script on the same model and job, in the same call.
#   bash benchmarks/mfu_device.sh            # results: $OUT/mfu.tar.gz and $OUT/summary.md
# Plans: benchmarks/plans/gpt3-1.3b_dgx-h{100,200}x4_gb16.json (made on a CPU machine with
# the calibrated profiles docs/benchmarks/profile_h100x4_round18.toml / _h200x4_round26.toml;
# the device has no ortools). Each run has its own time limit; a run that fails or times out
# is recorded and the rest go on.
set -u
OUT=${OUT:-/tmp/mfu_out}
. benchmarks/mfu_lib.sh
mfu_setup /tmp/mfu benchmarks/plans/gpt3-1.3b_ x4_gb16.json
python3 - "$PLAN" "$W/dp4z2.json" <<'PY'
import sys
from meshplan.executor.planfiles import write_plan_for_layout
from meshplan.planner.planfile import load_plan_file
from meshplan.spec import Layout
rec = load_plan_file(sys.argv[1])
write_plan_for_layout(sys.argv[2], rec.model, rec.job, Layout(dp=4, micro_batch=4, zero=2),
                      rec.cluster)
PY
TR="python3 -m torch.distributed.run --standalone --nproc-per-node=4"
EX="-m meshplan.executor.run --steps 15 --warmup 5 --force"
run best_eager     70  $TR $EX --plan "$PLAN" --out "$W/best_eager.json"
run best_compiled 120  $TR $EX --plan "$PLAN" --out "$W/best_compiled.json" --compile
run dp4z2_eager    70  $TR $EX --plan "$W/dp4z2.json" --out "$W/dp4z2_eager.json"
run dp4z2_compiled 110 $TR $EX --plan "$W/dp4z2.json" --out "$W/dp4z2_compiled.json" --compile
run ddp_eager      60  $TR benchmarks/baseline_ddp.py --out "$W/ddp_eager.json"
run ddp_compiled  100  $TR benchmarks/baseline_ddp.py --compile --out "$W/ddp_compiled.json"
python3 benchmarks/mfu_summary.py "$W" > "$W/summary.md" 2>&1
cp "$W/summary.md" "$OUT/summary.md"
tar czf "$OUT/mfu.tar.gz" -C /tmp mfu
cat "$OUT/summary.md"
