"""The executor's eager layer on one GPU at the context-parallel check's shapes: what its
memory-bound kernels move (counted on the device) and how long they take, against
:mod:`meshplan.costmodel.torch_membound` and the datasheet layer prediction.

    python benchmarks/eager_membound_gpu.py --out $OUT/eager_membound.json   # 1 GPU, ~1 min
    python benchmarks/eager_membound_gpu.py --out /tmp/x.json --device cpu --seqs 64,128 --tiny

For each length: one :class:`meshplan.executor.model.Block` of the GPU check's 1.26B model
(hidden 2048, 16 heads / 8 kv of 128, SwiGLU 5632), fp32 weights under bf16 autocast (the
executor's ZeRO-0/1 set-up), batch 1:

* ``counted``: forward and backward bytes of every op but GEMMs and attention kernels under
  :class:`meshplan.executor.op_count.OpCounter` on the device (the CPU count the unit tests
  check may differ where a CUDA kernel returns another layout), beside the module's count;
* ``kernels_ms``: device time per forward + backward from a torch.profiler trace of 5
  iterations (``events_step_ms``: the same by CUDA events, untraced), by kind (GEMM,
  attention, the rest = memory-bound), and the rest's bytes over its time as a share of
  the datasheet HBM bandwidth (the efficiency the cost model assumes is the profile's
  ``hbm_efficiency``, 0.80 on the H200 preset);
* ``predicted_ms``: :func:`meshplan.costmodel.compute.layer_cost` on the datasheet preset,
  by kind.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import context_parallel_gpu as cg  # noqa: E402

GEMM_MARKS = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul")
ATTENTION_MARKS = ("flash", "cudnn", "fmha", "sdpa", "attention")
NOT_MEMORY_BOUND = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_unsafe_view")


def kind(name: str) -> str:
    n = name.lower()
    if any(m in n for m in ATTENTION_MARKS):
        return "attention"
    if any(m in n for m in GEMM_MARKS):
        return "gemm"
    return "memory_bound"


def measure(seq: int, dev, tiny: bool) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from meshplan.costmodel import torch_membound as tm
    from meshplan.executor.model import Block, rope_tables
    from meshplan.executor.op_count import OpCounter
    spec = cg.TINY if tiny else cg.MODEL
    block = Block(spec).to(dev)
    cos, sin = rope_tables(seq, spec.head_dim, device=dev)
    x = torch.randn(1, seq, spec.hidden_size, device=dev).to(torch.bfloat16).requires_grad_()
    g = torch.randn_like(x)

    def step(counter=None):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            if counter is None:
                block(x, (cos, sin)).backward(g)
                return
            with counter[0]:
                y = block(x, (cos, sin))
            with counter[1]:
                y.backward(g)
        x.grad = None
        block.zero_grad(set_to_none=True)

    counters = (OpCounter(), OpCounter())
    step(counters)
    counted = [sum(v for k, v in c.memory_ops.items() if k not in NOT_MEMORY_BOUND)
               for c in counters]
    eb = tm.eager_layer_bytes(spec, tokens=seq, tp=1, sequence_parallel=False,
                              mlp_width=spec.ffn_hidden_size, e=2)
    for _ in range(3):
        step()
    iters = 5
    step_ms = None
    if dev.type == "cuda":          # the whole pass pair by CUDA events, beside the trace
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            step()
        end.record()
        torch.cuda.synchronize()
        step_ms = start.elapsed_time(end) / iters
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(iters):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    per_kind = {"gemm": 0.0, "attention": 0.0, "memory_bound": 0.0}
    for evt in prof.events():
        if dev.type == "cuda" and str(evt.device_type).endswith("CUDA"):
            us = getattr(evt, "device_time_total", None)
            us = getattr(evt, "cuda_time_total", 0.0) if us is None else us
            per_kind[kind(evt.name)] += us / 1e3 / iters
    return {"seq": seq, "counted_bytes": {"forward": counted[0], "backward": counted[1]},
            "module_bytes": {"forward": eb.forward, "backward": eb.backward},
            "kernels_ms": per_kind, "events_step_ms": step_ms,
            "memory_ops_forward": dict(counters[0].memory_ops),
            "memory_ops_backward": dict(counters[1].memory_ops)}


def predicted(seq: int, tiny: bool) -> dict:
    from meshplan.costmodel.compute import layer_cost
    from meshplan.hardware_profiles import Cluster
    from meshplan.spec import Job
    cl = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=1)
    spec = cg.TINY if tiny else cg.MODEL
    job = Job(global_batch=1, seq_len=seq, precision="bf16", runtime="torch")
    lc = layer_cost(spec, cl, job, micro_batch=1, tp=1, sequence_parallel=False,
                    recompute="none", tp_link=cl.group_link(1, 1))
    both = lc.forward + lc.backward
    return {k: 1e3 * getattr(both, f"{k}_s") for k in ("gemm", "attention", "memory_bound")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--seqs", default="4096,16384", help="comma-separated tokens per call")
    p.add_argument("--tiny", action="store_true", help="the tiny model (CPU check)")
    args = p.parse_args(argv)
    import torch
    dev = torch.device(args.device)
    rows = []
    for seq in (int(s) for s in args.seqs.split(",")):
        row = measure(seq, dev, args.tiny)
        row["predicted_ms"] = predicted(seq, args.tiny)
        mb_s = row["kernels_ms"]["memory_bound"] / 1e3
        moved = row["counted_bytes"]["forward"] + row["counted_bytes"]["backward"]
        row["memory_bound_hbm_share"] = (moved / mb_s / 4.8e12) if mb_s > 0 else None
        rows.append(row)
        print(f"seq {seq}: counted {moved / 1e9:.3f} GB (module "
              f"{(row['module_bytes']['forward'] + row['module_bytes']['backward']) / 1e9:.3f}); "
              f"kernels ms {row['kernels_ms']}; predicted ms {row['predicted_ms']}; "
              f"memory-bound share of 4.8 TB/s {row['memory_bound_hbm_share']}", flush=True)
    env = {"torch": torch.__version__,
           "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
           "cudnn": torch.backends.cudnn.version() if args.device == "cuda" else None}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
