#!/usr/bin/env bash
# Issue 40 item 4, one device call on 4 GPUs (<= 540 s): the planner's pick for a 1.3B GPT
# (its plan says whether to compile), FSDP2 dp 4 ZeRO-2 compiled (the best measured layout of
# 2026-11-28's first run; skipped where it is the pick itself), and plain DDP scripts, eager
# and torch.compile'd, on the same model and job, in the same call; then a torch.profiler
# trace of 3 steps of the faster compiled executor run (a top-ops table by self CUDA time),
# then benchmarks/compile_sp_probe.py on 2 GPUs if time is left.
#   bash benchmarks/mfu_device.sh            # results: $OUT/mfu.tar.gz and $OUT/summary.md
#   PLAN=path.json bash benchmarks/mfu_device.sh      # another plan file
#   EAGER=0 ...                              # without the eager DDP script (about 25 s less)
#   TITAN=1 ...    # + torchtitan in the same call (its wheels carried in $CARRY, default
#                  # .titan_carry: benchmarks/torchtitan_wheels.sh): titan_compiled (Llama 3
#                  # architecture at gpt3-1.3b's size, FSDP2 over the 4 GPUs, 4 sequences each:
#                  # the same 16 x 2048 tokens a step) and dp4z2_llama_compiled (the executor on
#                  # that Llama-shaped model); $OUT/titan_summary.md and .json compare them
# Plans: benchmarks/plans/gpt3-1.3b_dgx-h200x4_gb16_compile.json (made on a CPU machine with
# the calibrated profile docs/benchmarks/data/profiles/profile_h200x4_compile_20261128.toml,
# which has compiled layer rows, so the planner searched Layout.compile); on H100 the older
# _gb16.json (no compiled rows on that profile). The device has no ortools. Both executor
# layouts are written as plans on the plan file's cluster (its measured rows included), so
# both are compared with the cost model on the whole profile. Each run has its own time
# limit (and the whole script DEADLINE s); a run that fails or times out is recorded and
# the rest go on. $OUT gets 3 files (5 with TITAN=1).
set -u
OUT=${OUT:-/tmp/mfu_out}
DEADLINE=${DEADLINE:-540}
. benchmarks/mfu_lib.sh
GIVEN_PLAN=${PLAN:-}
mfu_setup /tmp/mfu benchmarks/plans/gpt3-1.3b_ x4_gb16.json
case "$PLAN" in *h200*) PLAN=${PLAN%.json}_compile.json
                        PROFILE=docs/benchmarks/data/profiles/profile_h200x4_compile_20261128.toml ;;
                *) PROFILE=docs/benchmarks/data/profiles/profile_h100x4_round18.toml ;; esac
[ -n "$GIVEN_PLAN" ] && PLAN=$GIVEN_PLAN
echo "plan used $PLAN" >> "$W/env.txt"
python3 - "$PLAN" "$PROFILE" "$W/best.json" "$W/dp4z2.json" "$W/same.txt" \
  "$W/dp4z2_llama.json" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from torchtitan_bench import llama_shape_spec
from meshplan.executor.planfiles import write_plan_for_layout
from meshplan.hardware_profiles.calibrated import apply_profile
from meshplan.planner.planfile import load_plan_file
from meshplan.spec import Layout
rec = load_plan_file(sys.argv[1])
cluster = rec.cluster if rec.cluster.gpu.measured else apply_profile(rec.cluster, sys.argv[2])
dp4z2 = Layout(dp=4, micro_batch=4, zero=2, compile=True)
for out, layout in ((sys.argv[3], rec.layout), (sys.argv[4], dp4z2)):
    write_plan_for_layout(out, rec.model, rec.job, layout, cluster)
same = (rec.layout.short(), rec.layout.compile) == (dp4z2.short(), dp4z2.compile)
write_plan_for_layout(sys.argv[6], llama_shape_spec(), rec.job, dp4z2, cluster)
Path(sys.argv[5]).write_text("same\n" if same else "")
PY
TR="python3 -m torch.distributed.run --standalone --nproc-per-node=4"
EX="-m meshplan.executor.run --steps 15 --warmup 5 --force"
# the plan's own compile choice runs as "best_compiled" when it compiles, "best_eager" if not
case "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["layout"].get("compile", False))' "$PLAN")" in
  True) BEST=best_compiled ;; *) BEST=best_eager ;; esac
run $BEST         130 $TR $EX --plan "$W/best.json" --out "$W/$BEST.json"
if [ -s "$W/same.txt" ]; then
  echo "dp4z2_compiled skipped: it is the plan's layout ($BEST)" | tee -a "$W/runs.txt"
else
  run dp4z2_compiled 110 $TR $EX --plan "$W/dp4z2.json" --out "$W/dp4z2_compiled.json"
fi
run ddp_compiled  100 $TR benchmarks/baseline_ddp.py --compile --out "$W/ddp_compiled.json"
if [ "${TITAN:-0}" = 1 ]; then
  titan_install "${CARRY:-.titan_carry}" /tmp/titan_site
  titan_cmd /tmp/titan_site "$TR"
  run titan_compiled 130 $TT --training.global_batch_size 16 --compile.enable \
    --out "$W/titan_compiled.json"
  run dp4z2_llama_compiled 100 $TR $EX --plan "$W/dp4z2_llama.json" \
    --out "$W/dp4z2_llama_compiled.json"
fi
if [ "${EAGER:-1}" != 0 ]; then
  run ddp_eager       60 $TR benchmarks/baseline_ddp.py --out "$W/ddp_eager.json"
fi
# the trace: the faster of the compiled executor runs (the plan's pick if neither finished)
TRACE_PLAN=$(python3 - "$W" "$BEST" <<'PY'
import json, sys
from pathlib import Path
w, best = Path(sys.argv[1]), sys.argv[2]
runs = {best: "best.json", "dp4z2_compiled": "dp4z2.json"}
if best != "best_compiled":
    runs.pop(best)
steps = {}
for name, plan in runs.items():
    f = w / f"{name}.json"
    if f.exists():
        doc = json.loads(f.read_text())
        if doc.get("status") == "ok":
            steps[plan] = doc["measured"]["step_time_s"]
print(w / (min(steps, key=steps.get) if steps else "best.json"))
PY
)
echo "trace of $TRACE_PLAN" | tee -a "$W/runs.txt"
run trace 110 $TR -m meshplan.executor.run --steps 6 --warmup 3 --force --plan "$TRACE_PLAN" \
  --out "$W/trace_run.json" --profile "$W/trace"
cp "$W/trace/top_ops_rank0.txt" "$OUT/trace_top_ops_rank0.txt" 2>/dev/null
# last, if time is left: the compiled tp 2 + SP timing question (2 GPUs; its JSON in the tar)
run compile_sp_probe 100 python3 -m torch.distributed.run --standalone --nproc-per-node=2 \
  benchmarks/compile_sp_probe.py --out "$W/compile_sp_probe.json"
python3 benchmarks/mfu_summary.py "$W" > "$W/summary.md" 2>&1
cp "$W/summary.md" "$OUT/summary.md"
if [ "${TITAN:-0}" = 1 ]; then
  python3 benchmarks/torchtitan_summary.py "$W" "$BEST" dp4z2_compiled ddp_compiled \
    titan_compiled dp4z2_llama_compiled --json "$OUT/titan_summary.json" \
    > "$OUT/titan_summary.md" 2>&1
fi
tar czf "$OUT/mfu.tar.gz" --exclude='trace_rank*.json' -C /tmp mfu
cat "$OUT/summary.md"
