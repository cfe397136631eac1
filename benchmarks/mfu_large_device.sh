#!/usr/bin/env bash
# Issue 40 on a model plain DDP does not fit without recompute, one device call on 4 GPUs
# (<= 540 s): Llama 3 8B (8.03 B parameters, 6.98 B outside the embedding and output
# layers), 16 sequences x 2048 tokens a step, bf16.
#   (a) best_compiled      the planner's pick, run by the executor with --compile
#   (b) ddp_none_compiled  benchmarks/baseline_ddp.py --compile, micro-batch 1, no recompute
#                          (plain DDP: fp32 weights, grads and Adam state on every GPU,
#                          16 B a parameter, 120 GiB, plus the 16-bit weight copies and
#                          activations: expected out of memory; recorded either way)
#   (c) ddp_full_compiled  if (b) failed: the same with every block recomputed
#   (d) fsdp2_compiled     if time is left: baseline_ddp.py --fsdp --compile (ZeRO-3,
#                          torchtitan's recipe), FSDP_MB sequences a micro-batch [4: a rank's
#                          whole share, which fits without recompute]
# then benchmarks/mfu_summary.py's table: step, tokens/s, MFU (meshplan's FLOP count and the
# causal one), peak memory and the speed-up over the DDP run that finished ((b), else (c)).
#   bash benchmarks/mfu_large_device.sh      # results: $OUT/summary.md, $OUT/mfu_large.json,
#                                            # $OUT/mfu_large.tar.gz (logs and results files)
#   PICK_COMPILE=0 ...                       # the pick as its plan says (eager)
#   SKIP_NONE=1 ...                          # skip (b) (about 110 s), go to (c)
# Plan: benchmarks/plans/llama3-8b_dgx-h200x4_gb16_compile.json, made on a CPU machine (the
# device has no ortools): `meshplan plan --model llama3-8b --cluster dgx-h200 --gpus 4
# --global-batch 16 --seq-len 2048 --runtime torch --memory-headroom 0.15 --profile
# docs/benchmarks/data/profiles/profile_h200x4_compile_20261128_loss_20261129.toml`. The
# profile's compiled rows are of gpt3-1.3b only, so the planner searched eager layouts (and
# priced this shape from its Llama-1.64B rows scaled analytically); the pick is run compiled
# because the baselines are. Every run has PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# (as torchtitan's launcher sets it), 5 warm-up and 10 timed steps, its own time limit and
# at most what is left of DEADLINE s; a run that fails or times out is recorded (an
# out-of-memory error's message in runs.txt) and the rest go on. H200 only (the plan's GPU).
set -u
OUT=${OUT:-/tmp/mfu_large_out}
DEADLINE=${DEADLINE:-530}
. benchmarks/mfu_lib.sh
mfu_setup /tmp/mfu_large benchmarks/plans/llama3-8b_ x4_gb16_compile.json
[ -n "${PLAN_FILE:-}" ] && PLAN=$PLAN_FILE
if [ ! -f "$PLAN" ]; then
  echo "no plan file $PLAN (H200 only)" | tee -a "$W/runs.txt"; exit 1
fi
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
echo "PYTORCH_CUDA_ALLOC_CONF=$PYTORCH_CUDA_ALLOC_CONF" >> "$W/env.txt"
TR="python3 -m torch.distributed.run --standalone --nproc-per-node=4"
STEPS="--steps 10 --warmup 5"
EX="-m meshplan.executor.run $STEPS --force"
BASE="benchmarks/baseline_ddp.py --compile --model llama3-8b --global-batch 16 --seq-len 2048
  $STEPS"
COMPILE=--compile
[ "${PICK_COMPILE:-1}" = 0 ] && COMPILE=
# the out-of-memory message of a failed run, into runs.txt
oom() { grep -m 1 -o "CUDA out of memory.\{0,400\}" "$W/$1.log" | sed "s/^/$1: /" \
          | tee -a "$W/runs.txt"; }
BEST=best_compiled
[ -z "$COMPILE" ] && BEST=best_eager
run $BEST 150 $TR $EX --plan "$PLAN" --out "$W/$BEST.json" $COMPILE || oom $BEST
DDP=ddp_full_compiled
if [ "${SKIP_NONE:-0}" != 1 ]; then
  if run ddp_none_compiled 150 $TR $BASE --micro-batch 1 --out "$W/ddp_none_compiled.json"
  then DDP=ddp_none_compiled
  else oom ddp_none_compiled
  fi
fi
if [ "$DDP" = ddp_full_compiled ]; then
  run ddp_full_compiled 200 $TR $BASE --micro-batch 1 --recompute full \
    --out "$W/ddp_full_compiled.json" || oom ddp_full_compiled
fi
run fsdp2_compiled 150 $TR $BASE --fsdp --micro-batch "${FSDP_MB:-4}" \
  --out "$W/fsdp2_compiled.json" || oom fsdp2_compiled
{ python3 - "$PLAN" <<'PY'
import sys
sys.path.insert(0, "benchmarks")
from baseline_ddp import causal_flops_per_step
from meshplan.costmodel.flops import model_flops_per_step
from meshplan.planner.planfile import load_plan_file
r = load_plan_file(sys.argv[1])
m, j = r.model, r.job
full = model_flops_per_step(m, j.global_batch, j.seq_len)
causal = causal_flops_per_step(m, j.global_batch, j.seq_len)
print(f"model {m.name} ({m.num_params() / 1e9:.3f} B parameters), {j.global_batch} x "
      f"{j.seq_len} tokens a step, plan {sys.argv[1]}: {r.layout.short()}\n"
      f"FLOPs a step {full:.4e} (meshplan.costmodel.flops.model_flops_per_step, Narayanan "
      f"et al. 2021 eq. 3), causal {causal:.4e} (attention core halved); "
      f"MFU = FLOPs / step / 4 GPUs / 989e12\n")
PY
  python3 benchmarks/mfu_summary.py "$W" "$BEST" ddp_none_compiled ddp_full_compiled \
    fsdp2_compiled --base "$DDP" --json "$OUT/mfu_large.json"
} > "$W/summary.md" 2>&1
cp "$W/summary.md" "$OUT/summary.md"
tar czf "$OUT/mfu_large.tar.gz" -C /tmp mfu_large
cat "$OUT/summary.md"
