"""Large grouped GEMMs in isolation and inside the executor's MoE layer, on one GPU.

The grouped-GEMM sweep (``grouped_gemm_sweep_gpu.py``) read 3-7 TFLOP calls at about 0.60 of
the bf16 peak, where moeh23's measured steps imply about 0.65 or more
(docs/benchmarks/moe_checks.md, "Grouped GEMMs keyed by the call"). This times one model's
fc1 / fc2 grouped calls (all experts local) at several rows a group four ways:

1. ``calibrate``: ``bench_moe.bench_grouped_gemm`` (forward + backward, synchronized);
2. ``queued``: the same step queued behind a spin (the GPU's time alone);
3. ``sustained``: the step back to back for about a second, median of the second half;
4. ``in_layer``: the executor's routed MoE layer (``executor/moe.py``, eager, bf16
   autocast) forward + backward at the same tokens, its grouped-GEMM kernels' GPU time read
   from ``torch.profiler`` (kernels named ``cutlass`` / ``Gemm``), as a step runs them;

with the SM clock and power (``nvidia-smi``) read after each.

    PYTHONPATH=. python benchmarks/grouped_gemm_in_step_gpu.py --check moeh23 --out $OUT/x.json

``--layer-rows moeh18,moeh19,...`` instead times only (4), for each named check's model at
128 to 16,384 rows a group, and writes each call's kernels as a calibrate grouped-GEMM row
(groups, rows, k, n, seconds: forward + both backward GEMMs), fc1 and fc2 told apart by their
order (forward fc1, fc2; backward fc2's two, then fc1's); with ``--fp8 rowwise`` the
experts' fp8 grouped GEMMs (a call whose kernels do not count six a step is left out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def clock() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


LAYER_ROWS = tuple(2 ** i for i in range(7, 15))


def layer_rows_main(checks: list[str], out_path: str, fp8: str | None = None) -> int:
    import torch

    from meshplan.calibrate.bench_grouped_layer import grouped_rows_in_layer, profiled_layer

    from meshplan.spec.resolve import load_model
    dev = torch.device("cuda:0")
    out = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "grouped_gemm": {}}
    t0 = time.perf_counter()
    for check in checks:
        model = load_model(str(ROOT / "benchmarks/sets" / check / "m01.json"))
        e, h, f = model.num_experts, model.hidden_size, model.moe_ffn_hidden_size
        rows_out = []
        for rows in LAYER_ROWS:
            act = rows * e * (h * 4 + model.ffn_matrices * f * 6 + f * 4) * 3
            if act > 60e9:
                break
            rows_out += grouped_rows_in_layer(model, e, rows, dev, fp8=fp8)
        out["grouped_gemm"][check] = rows_out
        if not rows_out:      # what the layer ran instead, to tell its grouped kernels apart
            prof = profiled_layer(model, e, 1024, dev, iters=1, fp8=fp8)
            out.setdefault("kernels", {})[check] = sorted(
                ((ev.device_time_total, ev.key[:160]) for ev in prof.key_averages()
                 if ev.device_time_total > 0), reverse=True)[:16]
        print(f"{check}: {len(rows_out)} rows, {time.perf_counter() - t0:.0f} s", flush=True)
    Path(out_path).write_text(json.dumps(out, indent=1))
    return 0


def main(argv=None) -> int:
    import torch

    from meshplan.calibrate.bench_grouped_layer import profiled_layer
    from meshplan.calibrate.bench_moe import GroupedGemmShape, bench_grouped_gemm
    from meshplan.calibrate.timing import time_fn
    from meshplan.executor.moe import _grouped_mm_fn
    from meshplan.spec.resolve import load_model
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", default="moeh23")
    ap.add_argument("--rows", default="1024,4096,8192,16384")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layer-rows", default=None, help="comma-separated checks (docstring)")
    ap.add_argument("--fp8", default=None, help="with --layer-rows: the experts in fp8 (rowwise)")
    a = ap.parse_args(argv)
    if a.layer_rows:
        return layer_rows_main(a.layer_rows.split(","), a.out, a.fp8)
    dev = torch.device("cuda:0")
    model = load_model(str(ROOT / "benchmarks/sets" / a.check / "m01.json"))
    e, h, f = model.num_experts, model.hidden_size, model.moe_ffn_hidden_size
    from meshplan.hardware_profiles.loader import builtin_gpu
    peak = builtin_gpu("H200-SXM-141GB").peak_flops("bf16")
    out = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "check": a.check, "rows": []}
    mm = _grouped_mm_fn()
    for rows in (int(r) for r in a.rows.split(",")):
        for kk, nn in ((h, model.ffn_matrices * f), (f, h)):
            s = GroupedGemmShape(e, rows, kk, nn)
            flops = 3 * 2.0 * e * rows * kk * nn
            rec = {"rows": rows, "k": kk, "n": nn,
                   "calibrate_s": bench_grouped_gemm(s, dev)["seconds"], "clock_a": clock()}
            x = torch.randn(e * rows, kk, device=dev, dtype=torch.bfloat16, requires_grad=True)
            w = torch.randn(e, nn, kk, device=dev, dtype=torch.bfloat16, requires_grad=True)
            g = torch.randn(e * rows, nn, device=dev, dtype=torch.bfloat16)
            offs = torch.arange(1, e + 1, device=dev, dtype=torch.int32) * rows

            def step():
                mm(x, w.transpose(-2, -1), offs=offs).backward(g)
                x.grad = w.grad = None
            rec["queued_s"] = time_fn(step, device=dev, queued=True).median_s
            times, t_end = [], time.perf_counter() + 1.0
            while time.perf_counter() < t_end:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                step()
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) / 1e3)
            rec["sustained_s"] = statistics.median(times[len(times) // 2:])
            rec["clock_b"] = clock()
            for key in ("calibrate_s", "queued_s", "sustained_s"):
                rec[key.replace("_s", "_eff")] = flops / (peak * rec[key])
            out["rows"].append(rec)
            print(json.dumps(rec), flush=True)
            x = w = g = None
            torch.cuda.empty_cache()
        # the executor's routed layer at the tokens giving these rows a group (balanced)
        prof = profiled_layer(model, model.num_experts, rows, dev)
        gemm_us = sum(ev.device_time_total for ev in prof.key_averages()
                      if ("cutlass" in ev.key.lower() or "gemm" in ev.key.lower())
                      and ev.device_time_total > 0)
        all_us = sum(ev.device_time_total for ev in prof.key_averages()
                     if ev.device_time_total > 0 and not ev.key.startswith("Memcpy"))
        top = sorted(((ev.device_time_total / 3, ev.key[:90]) for ev in prof.key_averages()
                      if ev.device_time_total > 0), reverse=True)[:8]
        ideal = 3 * 2.0 * e * rows * h * (model.ffn_matrices + 1) * f
        rec = {"rows": rows, "in_layer_gemm_s": gemm_us / 3 / 1e6,
               "in_layer_all_s": all_us / 3 / 1e6,
               "in_layer_expert_eff_upper": ideal / (peak * gemm_us / 3 / 1e6),
               "top_kernels_us": top, "clock": clock()}
        out["rows"].append(rec)
        print(json.dumps(rec), flush=True)
        torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
