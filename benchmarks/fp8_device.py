"""FP8 against bf16 on the local GPUs (issue 41): layouts measured in both, and fp8 kernels.

1. Microbenchmark (GPU 0, in this process): the fp8 GEMMs and the whole fp8 linear against
   bf16 for every linear of Llama-1.64B at tp 1/2/4 (meshplan.calibrate.bench_fp8), the
   cast bandwidth per block kind, and each recipe's kernel-vs-emulation probe (does this
   torch's ``_scaled_mm`` take the recipe's scales?) -> micro.json.
2. Layouts: the same layouts of Llama-1.64B, each run twice with the executor, bf16 then fp8
   (``--precision fp8 --fp8-recipe R``), through meshplan.calibrate.validate.run_layouts;
   step time and per-rank peak memory -> layouts.json, layouts.md; logs -> runs.tgz.
   The prediction in each record is the bf16 datasheet estimate (the cost model does not
   price fp8 yet): for the fp8 runs it is a reference, not a prediction of them.

    # on a 4-GPU machine (no wheels needed: the executor's fp8 is its own, over torch._scaled_mm)
    python benchmarks/fp8_device.py --out $OUT --budget 540
    # CPU check of the script (tiny model, 2 gloo ranks, emulated fp8)
    python benchmarks/fp8_device.py --device cpu --out /tmp/fp8dev --budget 300
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                   "NVSHMEM_DISABLE_NVLS": "1"})

from meshplan.calibrate.validate import ValidateOptions, run_layouts  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402
from validate_device import LLAMA_16B  # noqa: E402  (the accuracy rounds' Llama-1.64B)

TINY = ModelSpec(name="tiny-llama-128", num_layers=2, hidden_size=256, num_heads=2,
                 num_kv_heads=2, ffn_hidden_size=256, vocab_size=128, max_seq_len=64,
                 activation="swiglu", norm="rmsnorm", position_embedding="rope",
                 tied_embeddings=False, bias=False)
JOB = Job(global_batch=32, seq_len=2048, runtime="torch")
TINY_JOB = Job(global_batch=8, seq_len=64, runtime="torch")


def L(**kw) -> Layout:
    return Layout(**kw)


# every parallelism the executor composes fp8 with: DDP, ZeRO-1/2/3 (FSDP2), tp with and
# without SP, pipelines; the first six always run, the rest while the budget lasts
LAYOUTS = [
    ("f01", L(dp=4, micro_batch=2, zero=1)),
    ("f02", L(dp=4, micro_batch=2, zero=3)),
    ("f03", L(dp=2, tp=2, micro_batch=2, zero=1, sequence_parallel=True)),
    ("f04", L(tp=4, micro_batch=4, sequence_parallel=True)),
    ("f05", L(dp=2, pp=2, micro_batch=2, schedule="1f1b", zero=1)),
    ("f06", L(pp=2, tp=2, micro_batch=1, schedule="interleaved-1f1b", vpp=2,
              sequence_parallel=True)),
    ("f07", L(dp=4, micro_batch=1, zero=2, recompute="selective")),
    ("f08", L(dp=2, tp=2, micro_batch=2, recompute="full")),
]
CPU_LAYOUTS = [("c01", L(dp=2, micro_batch=2)), ("c02", L(tp=2, micro_batch=2,
                                                         sequence_parallel=True))]


def micro(device_kind: str, out: Path, budget_s: float) -> None:
    import torch

    from meshplan.calibrate.bench_fp8 import RUNNABLE_RECIPES, fp8_rows
    from meshplan.calibrate.shapes import GemmShape, layer_gemms
    from meshplan.costmodel.fp8 import recipe
    from meshplan.executor.fp8 import probe_kernel
    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    model, seq = (LLAMA_16B, 2048) if device_kind == "cuda" else (TINY, 64)
    shapes = sorted({g for tp in (1, 2, 4) for mb in (1, 2)
                     for g in layer_gemms(model, mb * seq, tp) if not g.label.startswith("logits")})
    t0 = time.perf_counter()
    doc: dict = {"torch": torch.__version__, "device": str(device), "probe": {}}
    if device_kind == "cuda":
        doc["gpu"] = torch.cuda.get_device_name(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        for name in RUNNABLE_RECIPES:
            try:
                doc["probe"][name] = {"max_rel_diff": probe_kernel(recipe(name), device)}
            except Exception as exc:   # noqa: BLE001 (recorded, the benchmark goes on)
                doc["probe"][name] = {"error": str(exc)}
    rows = {"fp8_gemm": [], "fp8_cast": []}
    for name in RUNNABLE_RECIPES:
        if time.perf_counter() - t0 > budget_s:
            doc.setdefault("skipped", []).append(name)
            continue
        cut = shapes if name == "tensorwise" else [s for s in shapes if s.m == 2 * seq]
        part = fp8_rows(cut, device, recipes=(name,),
                        cast_shape=(4096, 2048) if device_kind == "cuda" else (256, 128))
        rows["fp8_gemm"] += part["fp8_gemm"]
        rows["fp8_cast"] = part["fp8_cast"]
    doc.update(rows, seconds=time.perf_counter() - t0)
    (out / "micro.json").write_text(json.dumps(doc, indent=1))
    ok = [r for r in rows["fp8_gemm"] if "speedup" in r]
    print(f"micro: {len(ok)} GEMM rows in {doc['seconds']:.0f} s; probes {doc['probe']}",
          file=sys.stderr, flush=True)


def layouts(args, out: Path, keep: Path, deadline: float) -> None:
    cpu = args.device == "cpu"
    model, job = (TINY, TINY_JOB) if cpu else (LLAMA_16B, JOB)
    cluster = Cluster.preset("dgx-h100", nodes=1)
    todo = CPU_LAYOUTS if cpu else LAYOUTS
    arms = [("bf16", ()), ("fp8", ("--precision", "fp8", "--fp8-recipe", args.recipe))]
    compile_args = ("--compile",) if args.compile else ()
    table = []
    for name, layout in todo:
        left = deadline - time.perf_counter()
        if left < 2 * args.min_run_s:
            print(f"{name}: skipped, {left:.0f} s left", file=sys.stderr, flush=True)
            table.append({"name": name, "short": layout.short(), "status": "skipped (budget)"})
            continue
        row = {"name": name, "short": layout.short(), "layout": layout.to_dict()}
        for arm, extra in arms:
            opts = ValidateOptions(
                out_dir=keep / arm, nproc=layout.num_gpus, device=args.device,
                steps=args.steps, warmup=args.warmup,
                timeout_s=min(args.timeout, max(30.0, deadline - time.perf_counter())),
                extra_args=("--allow-gpu-mismatch", *compile_args, *extra))
            rec = run_layouts(model, cluster, job, [layout], opts, names=[name])[0]
            row[arm] = {k: rec.get(k) for k in ("status", "error", "measured", "predicted")}
        table.append(row)
        (out / "layouts.json").write_text(json.dumps(
            {"model": model.to_dict(), "job": job.to_dict(), "recipe": args.recipe,
             "compile": args.compile, "steps": args.steps, "warmup": args.warmup,
             "layouts": table}, indent=1))
    (out / "layouts.md").write_text(summary_table(table, args.recipe))
    subprocess.run(["tar", "czf", str(out / "runs.tgz"), "-C", str(keep), "."], check=False)


def summary_table(table: list[dict], recipe: str) -> str:
    """Markdown: step time and the largest per-rank peak memory, bf16 vs fp8."""
    lines = [f"| layout | bf16 step s | fp8 ({recipe}) step s | speed-up | bf16 peak GiB "
             f"(max rank) | fp8 peak GiB | fp8/bf16 memory |", "|---|---|---|---|---|---|---|"]
    for r in table:
        b, f = r.get("bf16") or {}, r.get("fp8") or {}
        if b.get("status") != "ok" or f.get("status") != "ok":
            why = r.get("status") or f"bf16 {b.get('status')}, fp8 {f.get('status')}: " \
                                     f"{(f.get('error') or b.get('error') or '')[:120]}"
            lines.append(f"| {r['short']} | {why} | | | | | |")
            continue
        bm, fm = b["measured"], f["measured"]
        bp, fp = max(bm["memory_per_rank_bytes"]), max(fm["memory_per_rank_bytes"])
        lines.append(f"| {r['short']} | {bm['step_time_s']:.4f} | {fm['step_time_s']:.4f} | "
                     f"{bm['step_time_s'] / fm['step_time_s']:.3f} | {bp / 2**30:.2f} | "
                     f"{fp / 2**30:.2f} | {fp / bp:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--keep", default="/tmp/meshplan-fp8")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--budget", type=float, default=540.0, help="seconds for everything")
    p.add_argument("--micro-budget", type=float, default=75.0)
    p.add_argument("--recipe", default="tensorwise", choices=("tensorwise", "rowwise",
                                                              "blockwise"))
    p.add_argument("--compile", action="store_true", help="torch.compile both arms")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=float, default=90.0, help="per run")
    p.add_argument("--min-run-s", type=float, default=30.0)
    p.add_argument("--micro-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    deadline = time.perf_counter() + args.budget
    out, keep = Path(args.out), Path(args.keep)
    out.mkdir(parents=True, exist_ok=True)
    if args.micro_only:
        micro(args.device, out, args.micro_budget)
        return 0
    keep.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda":
        with (out / "env.txt").open("w") as f:
            subprocess.run(["nvidia-smi"], stdout=f, stderr=subprocess.STDOUT, check=False)
    # its own process, so that its CUDA context is gone before the layouts start
    try:
        subprocess.run([sys.executable, __file__, "--micro-only", "--out", str(out),
                        "--device", args.device, "--micro-budget", str(args.micro_budget)],
                       timeout=args.micro_budget + 60, check=False)
    except subprocess.TimeoutExpired:
        print("micro: timed out", file=sys.stderr, flush=True)
    layouts(args, out, keep, deadline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
