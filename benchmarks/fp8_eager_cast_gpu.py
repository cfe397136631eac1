"""Where the executor's eager fp8 casts spend their time: on the GPU or in the host's dispatch
(issue 41; docs/benchmarks/fp8_checks.md, "Eager casts: GPU or host").

``meshplan calibrate`` fits the eager casts from *synchronized* timings of the executor's
fp8 linear (``meshplan.calibrate.fp8_profile.eager_cast_fit``: ``t = passes · pass_s +
bytes / gbps`` over the linear's time less its three GEMMs). A synchronized timing reads
max(GPU, CPU dispatch); on the H200 hosts the fp8 linear read about 2 ms whatever its size
(moeh20's calibration: 1.95-2.18 ms for m from 1,024 to 4,096 and n from 2,048 to 11,008),
which is the CPU's time, not the GPU's. The cost model puts the fitted per-pass time on the
GPU's timeline, and every eager fp8 arm run since has run faster than priced (fp8h3 eager
+11..+22 %, moeh18 +8 %, moeh19 +8 %, moeh20 +29 %).

This times each linear three ways, for the executor's fp8 linear, its three GEMMs on
pre-cast operands and the bf16 ``F.linear``: synchronized (calibrate's way), queued behind
a spin kernel (the GPU's busy time alone, :func:`meshplan.calibrate.timing.time_fn`'s
``queued``) and the CPU's dispatch of the queued call; and counts the CUDA kernels one fp8
linear launches (``torch.profiler``). The fit it reports splits the casts' per-pass time
into its GPU and host parts.

    # 1 x H200, ~1 minute; the shapes of moeh20 (MLA + shared expert, m 1,024 and 8,192) and
    # fp8h3 (Llama 2.26 B, m 8,192)
    python benchmarks/fp8_eager_cast_gpu.py --out $OUT/fp8_eager_cast.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: (label, m, k, n): moeh20's seven linears at micro-batch 1 and 8 (seq 1024), fp8h3's four at
#: micro-batch 2 (seq 4096)
SHAPES = ([(f"moeh20 {lab} m{m}", m, k, n) for m in (1024, 8192) for lab, k, n in (
    ("q-down", 2048, 1536), ("q-up", 1536, 3072), ("kv-down", 2048, 576),
    ("kv-up", 512, 4096), ("out", 2048, 2048), ("shared-up", 2048, 11008),
    ("shared-down", 5504, 2048))]
    + [(f"fp8h3 {lab} m8192", 8192, k, n) for lab, k, n in (
        ("qkv", 2048, 6144), ("out", 2048, 2048), ("up", 2048, 10752),
        ("down", 5376, 2048))])
RECIPES = ("rowwise", "tensorwise")


def kernels_per_call(fn) -> int:
    """CUDA kernels one call of ``fn`` launches (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def chained_calls(m: int, k: int, n: int, recipe: str, dev, depth: int):
    """(fp8, bf16): ``depth`` uses of one linear in one autograd graph and one backward call,
    as a training step runs them — the per-``backward()`` work a linear timed alone pays is
    shared by ``depth`` (fp8h16's host-bound eager arm dispatched its casts at two thirds of
    the cost timed on one linear alone)."""
    import torch
    import torch.nn.functional as F
    from meshplan.executor.fp8 import Fp8Plan, check_recipe_runnable, fp8_linear
    plan = Fp8Plan(recipe=check_recipe_runnable(recipe, dev), emulate=dev.type != "cuda")
    xs = [torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
          for _ in range(depth)]
    w = torch.randn(n, k, device=dev, dtype=torch.float32, requires_grad=True)
    w16 = w.detach().to(torch.bfloat16).requires_grad_()
    dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)

    def run(linear, weight):
        torch.autograd.backward([linear(x, weight) for x in xs], [dy] * depth)
        for t in (*xs, weight):
            t.grad = None
    return (lambda: run(lambda x, wt: fp8_linear(x, wt, None, plan), w),
            lambda: run(F.linear, w16))


def one_row(label: str, m: int, k: int, n: int, recipe: str, chain: int = 0) -> dict:
    import torch
    from meshplan.calibrate.bench_fp8 import linear_calls
    from meshplan.calibrate.timing import time_fn, time_queued_split
    from meshplan.costmodel.fp8 import linear_cast_traffic
    dev = torch.device("cuda")
    gemms, fp8, bf16 = linear_calls(m, k, n, recipe, dev)
    row = {"label": label, "m": m, "k": k, "n": n, "recipe": recipe}
    for name, fn in (("gemms", gemms), ("fp8", fp8), ("bf16", bf16)):
        row[f"{name}_sync_s"] = time_fn(fn, device=dev, iters=9).median_s
        row[f"{name}_gpu_s"], row[f"{name}_cpu_s"] = time_queued_split(fn, device=dev)
    if chain > 1:
        fp8_chain, bf16_chain = chained_calls(m, k, n, recipe, dev, chain)
        for name, fn in (("fp8_chain", fp8_chain), ("bf16_chain", bf16_chain)):
            gpu_s, cpu_s = time_queued_split(fn, device=dev)
            row[f"{name}_gpu_s"], row[f"{name}_cpu_s"] = gpu_s / chain, cpu_s / chain
    row["fp8_kernels"] = kernels_per_call(fp8)
    row["bf16_kernels"] = kernels_per_call(bf16)
    c = linear_cast_traffic(m, k, n, recipe, act_bytes=2, weight_bytes=4)
    row["cast_passes"], row["cast_bytes"] = c.kernels, c.per_microbatch_bytes
    return row


def fit(rows: list[dict]) -> dict:
    """The profile's fits (meshplan.calibrate.fp8_profile) on these rows, per recipe and
    over both: the synchronized pair calibrate made until 2026-12-01 and the split."""
    from meshplan.calibrate.fp8_profile import eager_cast_fit, eager_cast_split_fit
    out = {}
    for recipe in (*sorted({r["recipe"] for r in rows}), "all"):
        rs = [dict(r, linear_seconds=r["fp8_sync_s"], gemm_seconds=r["gemms_sync_s"],
                   linear_gpu_seconds=r["fp8_gpu_s"], gemm_gpu_seconds=r["gemms_gpu_s"],
                   linear_cpu_seconds=r["fp8_cpu_s"], bf16_cpu_seconds=r["bf16_cpu_s"])
              for r in rows if recipe in ("all", r["recipe"])]
        out[recipe] = {"sync_pass_s_gbps": eager_cast_fit(rs),
                       "split_gpu_pass_s_gpu_gbps_host_pass_s": eager_cast_split_fit(rs),
                       "kernels_per_linear": sorted({r["fp8_kernels"] for r in rs})}
        chained = [r for r in rs if "fp8_chain_cpu_s" in r]
        if chained:
            out[recipe]["host_pass_s_chained"] = statistics.median(
                (r["fp8_chain_cpu_s"] - r["bf16_chain_cpu_s"]) / r["cast_passes"]
                for r in chained)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--chain", type=int, default=8, metavar="N",
                   help="also time N uses of each linear in one backward call, per use "
                        "(0: not; default 8)")
    args = p.parse_args(argv)
    if args.chain < 0:
        p.error(f"--chain {args.chain}: the uses of a linear per backward call, 0 (not timed) "
                f"or more")
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("fp8_eager_cast_gpu.py times CUDA kernels: no GPU here")
    rows = []
    for recipe in args.recipes.split(","):
        for label, m, k, n in SHAPES:
            rows.append(one_row(label, m, k, n, recipe, args.chain))
            r = rows[-1]
            print(f"{recipe:10s} {label:24s} fp8 sync {r['fp8_sync_s'] * 1e3:.3f} gpu "
                  f"{r['fp8_gpu_s'] * 1e3:.3f} cpu {r['fp8_cpu_s'] * 1e3:.3f} | gemms gpu "
                  f"{r['gemms_gpu_s'] * 1e3:.3f} | bf16 gpu {r['bf16_gpu_s'] * 1e3:.3f} cpu "
                  f"{r['bf16_cpu_s'] * 1e3:.3f} ms | kernels {r['fp8_kernels']}", flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "rows": rows, "fit": fit(rows)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["fit"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
