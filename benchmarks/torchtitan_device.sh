#!/usr/bin/env bash
# Issue 40 item 4, one device call on 2 GPUs (<= 290 s): torchtitan beside the executor and the
# plain DDP + torch.compile script, on the 1.3 B comparison (8 × 2048 tokens a step, 4
# sequences per GPU). In order, each under its own time limit and the script's DEADLINE, a run
# that fails or times out recorded and the rest going on:
#   dp2z2_compiled        the executor, gpt3-1.3b, FSDP2 dp 2 ZeRO-2 mb 4 compiled (mfu2_device.sh)
#   ddp_compiled          benchmarks/baseline_ddp.py --compile, gpt3-1.3b (mfu2_device.sh)
#   titan_compiled        torchtitan 0.2.2's Trainer (benchmarks/torchtitan_bench.py), Llama 3
#                         architecture at gpt3-1.3b's size (1.443 B), FSDP2 dp 2 mb 4, per-block
#                         torch.compile (benchmarks/torchtitan_gpt3_1.3b.toml)
#   dp2z2_llama_compiled  the executor's layout on that same Llama-shaped model (like for like)
#   titan_eager           torchtitan without compile, if >= 60 s are left
# torchtitan and the packages it needs that the device lacks come as wheels in $CARRY/wheels
# (the run call names that folder in `carry`; see docs/benchmarks/executor_gpu.md, "torchtitan"),
# installed with pip --no-index into /tmp/titan_site, which only the torchtitan runs see.
#   bash benchmarks/torchtitan_device.sh     # $OUT/summary.md, $OUT/summary.json, $OUT/titan.tar.gz
#   TINY=1 bash benchmarks/torchtitan_device.sh   # tiny models on CPU (gloo): the plumbing only
set -u
OUT=${OUT:-/tmp/titan_out}
DEADLINE=${DEADLINE:-285}
CARRY=${CARRY:-.titan_carry}
SITE=/tmp/titan_site
. benchmarks/mfu_lib.sh
mfu_setup /tmp/titan "" ""
sed -i 's/^plan /cluster preset /' "$W/env.txt"
titan_install "$CARRY" "$SITE"
python3 - "$W" "${TINY:-}" <<'PY'
import sys
sys.path.insert(0, "benchmarks")
from baseline_ddp import GPT_1_3B
from torchtitan_bench import llama_shape_spec
from meshplan.executor.planfiles import write_plan_for_layout
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.calibrated import apply_profile
from meshplan.spec import Job, Layout
model, llama, job = GPT_1_3B, llama_shape_spec(), Job(global_batch=8, seq_len=2048, runtime="torch")
if sys.argv[2]:   # TINY: the torchtitan flavor "tiny" of torchtitan_bench.py, on the CPU
    from baseline_ddp import TINY
    model, job = TINY, Job(global_batch=8, seq_len=64, precision="fp32", runtime="torch")
    llama = llama_shape_spec(num_layers=2, hidden_size=64, num_heads=4, vocab_size=256,
                             ffn_hidden_size=192, name="tiny-llama-shape")
cluster = apply_profile(Cluster.preset("dgx-h200", nodes=1, gpus_per_node=2),
                        "docs/benchmarks/data/profiles/profile_h200x4_compile_20261128.toml")
layout = Layout(dp=2, micro_batch=4, zero=2, compile=True)
write_plan_for_layout(f"{sys.argv[1]}/dp2z2.json", model, job, layout, cluster)
write_plan_for_layout(f"{sys.argv[1]}/dp2z2_llama.json", llama, job, layout, cluster)
PY
TR="python3 -m torch.distributed.run --standalone --nproc-per-node=2"
EX="-m meshplan.executor.run --steps 15 --warmup 5 --force"
titan_cmd "$SITE" "$TR"
DDP=(--global-batch 8)
if [ -n "${TINY:-}" ]; then
  EX="$EX --device cpu"; DDP=(--tiny)
  TT="$TT --cpu-check --model.flavor tiny --training.seq_len 64 --optimizer.implementation foreach"
fi
run dp2z2_compiled       100 $TR $EX --plan "$W/dp2z2.json" --out "$W/dp2z2_compiled.json"
run ddp_compiled          90 $TR benchmarks/baseline_ddp.py --compile "${DDP[@]}" \
  --out "$W/ddp_compiled.json"
run titan_compiled       130 $TT --compile.enable --out "$W/titan_compiled.json"
run dp2z2_llama_compiled 100 $TR $EX --plan "$W/dp2z2_llama.json" \
  --out "$W/dp2z2_llama_compiled.json"
run titan_eager           80 $TT --out "$W/titan_eager.json"
python3 benchmarks/torchtitan_summary.py "$W" --json "$OUT/summary.json" > "$W/summary.md" 2>&1
cp "$W/summary.md" "$OUT/summary.md"
tar czf "$OUT/titan.tar.gz" -C /tmp titan
cat "$OUT/summary.md"
