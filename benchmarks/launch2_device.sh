#!/usr/bin/env bash
# Issue 40 #2-#3 on a 2-GPU machine: the generated torchrun script run as written on two
# "nodes" of one GPU each (two torchrun agents, --nnodes 2, c10d rendezvous on 127.0.0.1,
# NCCL), training gpt3-1.3b dp 2 with a DCP checkpoint every 5 steps (size and time measured
# beside the cost model's prediction); then the checkpoint resumed into another layout
# (tp 2 on one node of 2 GPUs: DCP resharding on GPUs). About 3 minutes.
#   bash benchmarks/launch2_device.sh      # $DEVOUT/summary.md, $DEVOUT/launch2.tar.gz
#   TINY=1 bash benchmarks/launch2_device.sh   # a tiny GPT on CPU (gloo): the plumbing only
set -u
DEV=(); [ -n "${TINY:-}" ] && DEV=(--device cpu)
DEVOUT=${OUT:-/tmp/launch2_out}
W=/tmp/launch2; rm -rf "$W"; mkdir -p "$W" "$DEVOUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; df -h /tmp | tail -1; } \
  > "$W/env.txt" 2>&1
python3 - "$W" "${TINY:-}" <<'PY'
import sys
sys.path.insert(0, "benchmarks")
from baseline_ddp import GPT_1_3B
import meshplan as mp
if sys.argv[2]:
    GPT_1_3B = mp.ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_heads=4,
                            vocab_size=256, max_seq_len=2048)
from meshplan.executor.planfiles import write_plan_for_layout
from meshplan.planner.launch import write_launch_script
w = sys.argv[1]
job = mp.Job(global_batch=8, seq_len=2048, runtime="torch")
two_nodes = mp.Cluster.preset("dgx-h200", nodes=2).replace(gpus_per_node=1)
write_launch_script(write_plan_for_layout(f"{w}/nodes/plan.json", GPT_1_3B, job,
                                          mp.Layout(dp=2, micro_batch=4), two_nodes),
                    f"{w}/nodes", "torchrun")
one_node = mp.Cluster.preset("dgx-h200", nodes=1).replace(gpus_per_node=2)
write_launch_script(write_plan_for_layout(f"{w}/tp2/plan.json", GPT_1_3B, job,
                                          mp.Layout(tp=2, micro_batch=4), one_node),
                    f"{w}/tp2", "torchrun")
PY
TR=$(command -v torchrun || true)
if [ -z "$TR" ]; then   # the launch script execs one word: wrap the module
  TR="$W/torchrun"; printf '#!/usr/bin/env bash\nexec python3 -m torch.distributed.run "$@"\n' > "$TR"
  chmod +x "$TR"
fi
CK=/tmp/launch2_ckpt; rm -rf "$CK"
ARGS=("${DEV[@]}" --steps 8 --warmup 2 --timeout-s 240 --checkpoint-dir "$CK" --checkpoint-every 5
      --checkpoint-keep 1)
for node in 0 1; do
  CUDA_VISIBLE_DEVICES=$node NNODES=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 RDZV_ID=l2 \
    TORCHRUN="$TR" OUT="$W/nodes/results.json" timeout 300 "$W/nodes/run_torchrun.sh" "${ARGS[@]}" \
    > "$W/node$node.log" 2>&1 &
done
rc=0; for j in $(jobs -p); do wait "$j" || rc=$?; done; echo "two-node dp2 rc=$rc" >> "$W/runs.txt"
NNODES=1 TORCHRUN="$TR" OUT="$W/tp2/results.json" NPROC_PER_NODE=2 timeout 300 \
  "$W/tp2/run_torchrun.sh" "${DEV[@]}" --steps 12 --warmup 2 --timeout-s 240 --checkpoint-dir "$CK" --resume \
  > "$W/tp2.log" 2>&1; echo "resume into tp2 rc=$?" >> "$W/runs.txt"
du -sb "$CK" >> "$W/runs.txt" 2>&1
python3 benchmarks/launch2_summary.py "$W" > "$W/summary.md" 2>&1
cp "$W/summary.md" "$DEVOUT/summary.md"
tar czf "$DEVOUT/launch2.tar.gz" -C /tmp launch2
cat "$W/runs.txt" "$W/summary.md"
