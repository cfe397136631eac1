#!/usr/bin/env bash
# Issue 40: torchtitan beside the planner's pick on Llama 3 8B, one device call on 4 GPUs
# (<= 200 s; DEADLINE 180 s by default), the job of benchmarks/mfu_large_device.sh: 16
# sequences x 2048 tokens a step, bf16, 5 warm-up and 10 timed steps (median). In order, each
# under its own time limit and what is left of DEADLINE s, a run that fails or times out
# recorded (an out-of-memory message in runs.txt) and the rest going on:
#   best_compiled       the planner's pick (benchmarks/plans/llama3-8b_dgx-h200x4_gb16_compile
#                       .json: dp2 tp2 SP ZeRO-2 mb8) run by the executor with --compile, as
#                       mfu_large_device.sh ran it (41 s on 2026-11-29); first, because its
#                       time is known, so that torchtitan gets what is left (>= 95 s)
#   titan_compiled      torchtitan 0.2.2's Trainer (benchmarks/torchtitan_bench.py) on its own
#                       llama3 flavor "8B" (benchmarks/torchtitan_llama3_8b.toml: FSDP2 over the
#                       4 GPUs, 4 sequences each, per-block torch.compile and compiled loss, no
#                       activation checkpointing); --preset llama3-8b checks, field by field,
#                       that torchtitan built meshplan's llama3-8b (its JSON's preset_check)
#   titan_sac_compiled  only if titan_compiled ran out of memory (not expected: about 32 GB of
#                       sharded fp32 weights, gradients and Adam states a GPU plus about 40 GB
#                       of activations, as the FSDP2 + compile mb4 script's 71.7 GiB): the same
#                       with torchtitan's per-op selective activation checkpointing
# Every run has PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (as mfu_large_device.sh and
# torchtitan's launcher). torchtitan and what it needs that the device lacks come as wheels in
# $CARRY/wheels (default .titan_carry, made by benchmarks/torchtitan_wheels.sh; the run call
# names it in `carry`), pip-installed into /tmp/titan_site, which only torchtitan sees.
#   bash benchmarks/titan8b_device.sh   # $OUT/titan8b_summary.md, $OUT/titan8b.json,
#                                       # $OUT/titan8b_logs.tar.gz (logs and results files)
#   TINY=1 bash benchmarks/titan8b_device.sh   # the plumbing on the CPU (gloo, 4 processes):
#                                       # the pick's layout and torchtitan on tiny Llama models
set -u
OUT=${OUT:-/tmp/titan8b_out}
DEADLINE=${DEADLINE:-180}
CARRY=${CARRY:-.titan_carry}
SITE=/tmp/titan_site
TOML=benchmarks/torchtitan_llama3_8b.toml
. benchmarks/mfu_lib.sh
mfu_setup /tmp/titan8b benchmarks/plans/llama3-8b_ x4_gb16_compile.json
[ -n "${PLAN_FILE:-}" ] && PLAN=$PLAN_FILE
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
echo "PYTORCH_CUDA_ALLOC_CONF=$PYTORCH_CUDA_ALLOC_CONF" >> "$W/env.txt"
titan_install "$CARRY" "$SITE"
TR="python3 -m torch.distributed.run --standalone --nproc-per-node=4"
EX="-m meshplan.executor.run --steps 10 --warmup 5 --force --compile"
titan_cmd "$SITE" "$TR" "$TOML"
TT="$TT --preset llama3-8b"
if [ -n "${TINY:-}" ]; then
  # the pick's layout on a tiny Llama (fp32, 64 tokens), torchtitan's "tiny" flavor on the CPU
  python3 - "$PLAN" "$W/tiny_plan.json" <<'PY'
import dataclasses
import sys
sys.path.insert(0, "benchmarks")
from torchtitan_bench import llama_shape_spec
from meshplan.executor.planfiles import write_plan_for_layout
from meshplan.planner.planfile import load_plan_file
from meshplan.spec import Job
rec = load_plan_file(sys.argv[1])
tiny = llama_shape_spec(num_layers=2, hidden_size=64, num_heads=4, vocab_size=256,
                        ffn_hidden_size=192, name="tiny-llama-shape")
job = Job(global_batch=16, seq_len=64, precision="fp32", runtime="torch")
layout = dataclasses.replace(rec.layout, compile=False, stage_layers=(tiny.num_layers,))
write_plan_for_layout(sys.argv[2], tiny, job, layout, rec.cluster)
PY
  PLAN=$W/tiny_plan.json
  EX="-m meshplan.executor.run --steps 3 --warmup 1 --force --device cpu"
  TT="$TT --cpu-check --model.flavor tiny --training.seq_len 64 --training.steps 4 \
    --optimizer.implementation foreach --compile.no-enable --warmup 1"
fi
# the out-of-memory message of a failed run, into runs.txt; true when there was one
oom() { grep -m 1 -o "CUDA out of memory.\{0,400\}" "$W/$1.log" | sed "s/^/$1: /" \
          | tee -a "$W/runs.txt" | grep -q .; }
RUNS="best_compiled titan_compiled"
if [ -f "$PLAN" ]; then
  run best_compiled 70 $TR $EX --plan "$PLAN" --out "$W/best_compiled.json" || oom best_compiled
else
  echo "best_compiled skipped: no plan file $PLAN (H200 only)" | tee -a "$W/runs.txt"
fi
if ! run titan_compiled 150 $TT --out "$W/titan_compiled.json" && oom titan_compiled; then
  RUNS="$RUNS titan_sac_compiled"
  run titan_sac_compiled 150 $TT --activation_checkpoint.mode selective \
    --activation_checkpoint.selective_ac_option op --out "$W/titan_sac_compiled.json" \
    || oom titan_sac_compiled
fi
{ python3 - "$W" <<'PY'
import json
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from baseline_ddp import causal_flops_per_step
from meshplan.costmodel.flops import model_flops_per_step
from meshplan.spec import ModelSpec
m = ModelSpec.preset("llama3-8b")
full, causal = model_flops_per_step(m, 16, 2048), causal_flops_per_step(m, 16, 2048)
print(f"model llama3-8b ({m.num_params() / 1e9:.3f} B parameters), 16 x 2048 tokens a step; "
      f"FLOPs a step {full:.4e} (meshplan.costmodel.flops.model_flops_per_step), causal "
      f"{causal:.4e}; MFU = FLOPs / step / 4 GPUs / 989e12, for every row\n")
for name in ("titan_compiled", "titan_sac_compiled"):
    f = Path(sys.argv[1]) / f"{name}.json"
    if f.exists():
        doc = json.loads(f.read_text())
        c = doc.get("preset_check") or {}
        print(f"{name}: torchtitan built {doc['model']['name']}, {c.get('params', 0):,} "
              f"parameters (llama3-8b: {c.get('preset_params', 0):,}); same shape as "
              f"llama3-8b: {c.get('same_shape')} {c.get('differences [built, preset]') or ''}; "
              f"FLOPs a step {doc['flops_per_step']:.4e}; torchtitan's own FLOPs a token "
              f"{doc['torchtitan_flops_per_token']:.4e}\n")
print("Earlier call (2026-11-29, mfu_large_device.sh, another lease): best_compiled 703.0 ms "
      "(56.8 %), plain DDP + compile with full recompute 1133.0 ms, the FSDP2 + compile "
      "script mb4 754.6 ms (53.0 %, 71.7 GiB).\n")
PY
  python3 benchmarks/torchtitan_summary.py "$W" $RUNS --json "$OUT/titan8b.json"
  for t in titan_compiled titan_sac_compiled; do
    [ -f "$W/$t.log" ] || continue
    echo; echo "$t: torchtitan's log (every rank; memory: reserved peak since the last log)"
    grep -m 1 "Model llama3_synthetic" "$W/$t.log"
    grep "step: *\(5\|10\|15\) " "$W/$t.log" | tail -n 12
  done
} > "$W/summary.md" 2>&1
cp "$W/summary.md" "$OUT/titan8b_summary.md"
tar czf "$OUT/titan8b_logs.tar.gz" -C /tmp titan8b
cat "$OUT/titan8b_summary.md"
