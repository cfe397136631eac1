#!/usr/bin/env bash
# Issue 40 item 4, one device call on 4 GPUs (<= 300 s): the planner's pick for a 1.3B GPT
# (its plan says whether to compile), FSDP2 dp 4 ZeRO-2 compiled (the best measured layout of
# 2026-11-28's first run), and a plain DDP + torch.compile script on the same model and job,
# in the same call; then a torch.profiler trace of 3 steps of the pick (a top-ops table).
#   bash benchmarks/mfu_device.sh            # results: $OUT/mfu.tar.gz and $OUT/summary.md
#   PLAN=path.json bash benchmarks/mfu_device.sh      # another plan file
#   EAGER=1 ...                              # also the eager DDP script (about 50 s more)
# Plans: benchmarks/plans/gpt3-1.3b_dgx-h200x4_gb16_compile.json (made on a CPU machine with
# the calibrated profile docs/benchmarks/data/profiles/profile_h200x4_compile_20261128.toml,
# which has compiled layer rows, so the planner searched Layout.compile); on H100 the older
# _gb16.json (no compiled rows on that profile). The device has no ortools. Both executor
# layouts are written as plans on the plan file's cluster (its measured rows included), so
# both are compared with the cost model on the whole profile. Each run has its own time
# limit; a run that fails or times out is recorded and the rest go on.
set -u
OUT=${OUT:-/tmp/mfu_out}
. benchmarks/mfu_lib.sh
GIVEN_PLAN=${PLAN:-}
mfu_setup /tmp/mfu benchmarks/plans/gpt3-1.3b_ x4_gb16.json
case "$PLAN" in *h200*) PLAN=${PLAN%.json}_compile.json
                        PROFILE=docs/benchmarks/data/profiles/profile_h200x4_compile_20261128.toml ;;
                *) PROFILE=docs/benchmarks/data/profiles/profile_h100x4_round18.toml ;; esac
[ -n "$GIVEN_PLAN" ] && PLAN=$GIVEN_PLAN
echo "plan used $PLAN" >> "$W/env.txt"
python3 - "$PLAN" "$PROFILE" "$W/best.json" "$W/dp4z2.json" <<'PY'
import sys
from meshplan.executor.planfiles import write_plan_for_layout
from meshplan.hardware_profiles.calibrated import apply_profile
from meshplan.planner.planfile import load_plan_file
from meshplan.spec import Layout
rec = load_plan_file(sys.argv[1])
cluster = rec.cluster if rec.cluster.gpu.measured else apply_profile(rec.cluster, sys.argv[2])
for out, layout in ((sys.argv[3], rec.layout),
                    (sys.argv[4], Layout(dp=4, micro_batch=4, zero=2, compile=True))):
    write_plan_for_layout(out, rec.model, rec.job, layout, cluster)
PY
TR="python3 -m torch.distributed.run --standalone --nproc-per-node=4"
EX="-m meshplan.executor.run --steps 15 --warmup 5 --force"
# the plan's own compile choice runs as "best_compiled" when it compiles, "best_eager" if not
case "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["layout"].get("compile", False))' "$PLAN")" in
  True) BEST=best_compiled ;; *) BEST=best_eager ;; esac
run $BEST         130 $TR $EX --plan "$W/best.json" --out "$W/$BEST.json"
run dp4z2_compiled 110 $TR $EX --plan "$W/dp4z2.json" --out "$W/dp4z2_compiled.json"
run ddp_compiled  100 $TR benchmarks/baseline_ddp.py --compile --out "$W/ddp_compiled.json"
if [ -n "${EAGER:-}" ]; then
  run ddp_eager       60 $TR benchmarks/baseline_ddp.py --out "$W/ddp_eager.json"
fi
run trace 110 $TR -m meshplan.executor.run --steps 6 --warmup 3 --force --plan "$W/best.json" \
  --out "$W/trace_run.json" --profile "$W/trace"
cp "$W/trace/top_ops_rank0.txt" "$OUT/trace_top_ops_rank0.txt" 2>/dev/null
python3 benchmarks/mfu_summary.py "$W" > "$W/summary.md" 2>&1
cp "$W/summary.md" "$OUT/summary.md"
tar czf "$OUT/mfu.tar.gz" --exclude='trace_rank*.json' -C /tmp mfu
cat "$OUT/summary.md"
