"""MoE executor on GPUs: the grouped GEMM against the per-expert loop, and expert-parallel
layouts of a 1.9B-parameter MoE (16 experts, top-2) run one after another with torchrun.

Checks, and the cost model's prediction beside each measurement (issue 38 item 5):
* grouped_mm (bf16, CUDA) vs the loop on the same rows: largest relative difference of the
  outputs and gradients, and the time of each (CUDA events, median of 20);
* each layout's losses (bf16: ep 2/4 should follow ep 1 closely, not bit for bit), step time,
  tokens/s and peak memory per rank, against the cost model's prediction for the layout as
  run (runtime "torch", the run's cluster; the plan file carries it, the executor's results
  its errors); a layout that fails is recorded and the rest go on.

    python benchmarks/moe_gpu_check.py --estimate                 # the predictions, no GPU
    python benchmarks/moe_gpu_check.py --out $OUT                 # 4 GPUs, about 7 minutes
    python benchmarks/moe_gpu_check.py --out $OUT --only dp4-ep1-zero1,dp4-ep4-zero1
    python benchmarks/moe_gpu_check.py --out /tmp/x --device cpu --tiny --nproc 2
    python benchmarks/moe_gpu_check.py --out $OUT --profile fresh.toml   # a third prediction
    python benchmarks/moe_gpu_check.py --out $OUT/trace --trace --only dp4-ep1-zero1 \
        --steps 3 --warmup 2 --no-grouped-check     # torch.profiler traces (OUT/profiles)

Writes $OUT/moe_gpu.md, $OUT/moe_gpu.json, $OUT/grouped_mm.json and the plan, results and
log files in $OUT/moe_gpu_raw.tar.gz.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

MODEL = ModelSpec(name="moe-1.9b", num_layers=12, hidden_size=2048, num_heads=16,
                  num_kv_heads=8, ffn_hidden_size=5632, vocab_size=32000, max_seq_len=2048,
                  activation="swiglu", norm="rmsnorm", position_embedding="rope",
                  tied_embeddings=False, bias=False, num_experts=16, experts_per_token=2,
                  moe_ffn_hidden_size=1408)
JOB = Job(global_batch=32, seq_len=2048, precision="bf16", runtime="torch")
TINY = ModelSpec(name="tiny-moe", num_layers=4, hidden_size=64, num_heads=4, vocab_size=256,
                 max_seq_len=64, activation="swiglu", norm="rmsnorm", position_embedding="rope",
                 tied_embeddings=False, bias=False, num_experts=4, experts_per_token=2)
TINY_JOB = Job(global_batch=16, seq_len=64, precision="fp32", runtime="torch")


def layouts(nproc: int) -> list[tuple[str, Layout]]:
    L = Layout
    if nproc == 2:
        return [("dp2-ep1", L(dp=2, micro_batch=2, zero=1)),
                ("dp2-ep2", L(dp=2, ep=2, micro_batch=2, zero=1)),
                ("tp2-sp-ep2", L(tp=2, ep=2, micro_batch=2, sequence_parallel=True)),
                # added 2026-11-28 before the first 2-GPU run (held out from the 4-GPU set)
                ("dp2-ep2-zero2", L(dp=2, ep=2, micro_batch=2, zero=2)),
                ("dp2-ep2-zero3", L(dp=2, ep=2, micro_batch=2, zero=3)),
                ("pp2-ep1-1f1b", L(pp=2, micro_batch=2, schedule="1f1b"))]
    return [("dp4-ep1-zero1", L(dp=4, micro_batch=2, zero=1)),
            ("dp4-ep2-zero1", L(dp=4, ep=2, micro_batch=2, zero=1)),
            ("dp4-ep4-zero1", L(dp=4, ep=4, micro_batch=2, zero=1)),
            ("dp4-ep4-zero2", L(dp=4, ep=4, micro_batch=2, zero=2)),
            ("dp2-tp2-sp-ep4-zero1", L(dp=2, tp=2, ep=4, micro_batch=2, zero=1,
                                      sequence_parallel=True)),
            ("dp2-pp2-ep2-1f1b", L(dp=2, pp=2, ep=2, micro_batch=2, zero=1, schedule="1f1b")),
            ("dp4-ep2-zero3", L(dp=4, ep=2, micro_batch=2, zero=3)),
            ("pp2-tp2-ep2-gpipe-full", L(pp=2, tp=2, ep=2, micro_batch=2, schedule="gpipe",
                                         recompute="full"))]


def grouped_vs_loop(out: Path) -> dict:
    """One layer's local experts (8 of width 1408, h 2048) on 16,384 rows of uneven groups."""
    import torch

    from meshplan.executor.moe import GroupedExperts, grouped_mm_usable
    dev = torch.device("cuda")
    spec = ModelSpec(**{**MODEL.to_dict(), "num_experts": 8})
    ex = GroupedExperts(spec).to(dev)
    torch.manual_seed(0)
    for p in ex.parameters():
        torch.nn.init.normal_(p, std=0.02)
    counts = torch.tensor([4096, 0, 1, 2999, 3000, 2048, 2047, 2193], device=dev)
    x = torch.randn(int(counts.sum()), 2048, device=dev)
    g = torch.randn_like(x)
    res = {"usable": grouped_mm_usable(dev, torch.bfloat16), "rows": int(counts.sum()),
           "device": torch.cuda.get_device_name(dev), "torch": torch.__version__}
    runs = {}
    for backend in ("loop", "grouped"):
        ex.backend = backend
        ex.zero_grad()
        xi = x.clone().requires_grad_()
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = ex(xi, counts)
            y.float().backward(g)
        except Exception as exc:   # noqa: BLE001 - recorded, the layouts still run
            res[f"{backend}_error"] = f"{type(exc).__name__}: {exc}"[:400]
            continue
        runs[backend] = (y.float(), xi.grad.float(), ex.w_in.grad.float().clone())
        times = []
        for _ in range(25):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = ex(xi, counts)
            y.float().backward(g)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        res[f"{backend}_fwd_bwd_s"] = statistics.median(times[5:])
    if len(runs) == 2:
        for i, what in enumerate(("output", "input_grad", "w_in_grad")):
            ref, got = runs["loop"][i], runs["grouped"][i]
            res[f"{what}_max_rel_diff"] = float((got - ref).abs().max() / ref.abs().max())
    (out / "grouped_mm.json").write_text(json.dumps(res, indent=1))
    return res


def predict_all(eg, model, cluster, job, layout, profiles) -> dict:
    """``executor_gpu.predict`` (datasheet and saved profile) and, under ``profiles``, the
    prediction on each further profile file (applied to the run's cluster)."""
    from meshplan.hardware_profiles.calibrated import apply_profile
    pred = eg.predict(model, cluster, job, layout)
    if profiles:
        pred["profiles"] = {}
        for path in profiles:
            try:
                cl = apply_profile(cluster, path, override=True)
            except Exception as exc:    # noqa: BLE001 - recorded; the other predictions stand
                pred["profiles"][Path(path).name] = {"error": str(exc)}
                continue
            pred["profiles"][Path(path).name] = eg.predict(model, cl, job, layout,
                                                           with_saved_profile=False)
    return pred


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--estimate", action="store_true", help="print the predictions and exit")
    ap.add_argument("--nproc", type=int, default=4, choices=(2, 4))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=150, help="seconds per layout")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for all layouts: a layout runs only if the longest so far "
                    "still fits, and never past the budget (the rest are recorded as skipped)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="a tiny fp32 model (CPU smoke test)")
    ap.add_argument("--only", default="", help="comma-separated layout names to run")
    ap.add_argument("--no-grouped-check", action="store_true")
    ap.add_argument("--profile", action="append", default=[], dest="fresh_profiles",
                    metavar="PATH", help="also predict with this profile (repeatable; e.g. "
                    "a calibration made just before the run)")
    ap.add_argument("--trace", action="store_true",
                    help="torch.profiler trace of the first timed steps of each layout run "
                    "(the executor's --profile: traces in OUT/profiles/NAME; time the "
                    "layouts in a run without it)")
    args = ap.parse_args()
    args.compile, args.allow_gpu_mismatch = False, True
    args.profile = bool(args.trace)
    import executor_gpu as eg
    model, job = (TINY, TINY_JOB) if args.tiny else (MODEL, JOB)
    if args.estimate:     # no GPU here: the H100 node (the GPU run prices its own card)
        cluster = eg.cluster_for("cpu", args.nproc)
        for name, layout in layouts(args.nproc):
            p = predict_all(eg, model, cluster, job, layout, args.fresh_profiles)
            extra = " ".join(f"{k}: {v.get('step_time_s', float('nan')):.3f} s"
                             for k, v in p.get("profiles", {}).items())
            mem = p.get("memory_peak_bytes")
            print(f"{name:24s} {layout.short():44s} {p.get('step_time_s', float('nan')):7.3f} s "
                  f"{'-' if mem is None else f'{mem / 2**30:.2f} GiB'} {p.get('error', '')} {extra}")
        return 0
    if not args.out:
        ap.error("--out is required unless --estimate")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"model": model.to_dict(), "job": job.to_dict(),
               "params": model.num_params(), "active_params": model.num_active_params()}
    if args.device == "cuda" and not args.no_grouped_check:
        summary["grouped_mm"] = grouped_vs_loop(out)
    cluster = eg.cluster_for(args.device, args.nproc)
    rows = []
    summary["layouts"] = rows
    only = {n for n in args.only.split(",") if n}
    t_start, longest, per_layout = time.monotonic(), 0.0, args.timeout
    for name, layout in layouts(args.nproc):
        if only and name not in only:
            continue
        left = None if args.budget is None else args.budget - (time.monotonic() - t_start)
        if left is not None and (left < longest or left < 10):
            rows.append({"layout": name, "short": layout.short(), "loss_per_step": None,
                         "status": f"skipped: {left:.0f} s of --budget left, the longest "
                         f"layout so far took {longest:.0f} s", "step_time_s": None,
                         "tokens_per_s": None, "memory_peak_bytes": None,
                         "predicted": predict_all(eg, model, cluster, job, layout,
                                                  args.fresh_profiles)})
            continue
        args.timeout = per_layout if left is None else int(min(per_layout, left))
        t0 = time.monotonic()
        r = eg.run_case(eg.Case(name, layout), args, model, job, cluster, out)
        longest = max(longest, time.monotonic() - t0)
        m = (r["doc"] or {}).get("measured") or {}
        rows.append({"layout": name, "short": layout.short(), "status": r["status"],
                     "step_time_s": m.get("step_time_s"), "tokens_per_s": m.get("tokens_per_s"),
                     "memory_peak_bytes": m.get("memory_peak_bytes"),
                     "loss_per_step": m.get("loss_per_step"),
                     "predicted": predict_all(eg, model, cluster, job, layout,
                                              args.fresh_profiles),
                     "errors_pct": (r["doc"] or {}).get("errors_pct")})
        # after every layout: a run killed later keeps the layouts it measured
        (out / "moe_gpu.json").write_text(json.dumps(summary, indent=1))
    (out / "moe_gpu.json").write_text(json.dumps(summary, indent=1))
    (out / "moe_gpu.md").write_text(markdown(summary))
    with tarfile.open(out / "moe_gpu_raw.tar.gz", "w:gz") as tar:
        for d in ("plans", "results", "logs"):
            if (out / d).exists():
                tar.add(out / d, arcname=d)
                shutil.rmtree(out / d)
    print((out / "moe_gpu.md").read_text())
    return 0


def markdown(s: dict) -> str:
    lines = [f"# MoE executor check: {s['model']['name']} ({s['params'] / 1e9:.2f}B, "
             f"{s['active_params'] / 1e9:.2f}B active), global batch {s['job']['global_batch']}"
             f" × {s['job']['seq_len']}", ""]
    gm = s.get("grouped_mm")
    if gm:
        lines += ["grouped_mm vs loop: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float)
                                                     else f"{k} {v}" for k, v in gm.items()), ""]
    base = next((r["loss_per_step"] for r in s["layouts"] if r["loss_per_step"]), None)
    names = sorted({n for r in s["layouts"] for n in
                    ((r.get("predicted") or {}).get("profiles") or {})})
    lines += ["Predictions: *datasheet* (the GPU's preset profile) and *saved profile* (the "
              "newest saved 4-GPU calibration of this GPU type, `executor_gpu.SAVED_PROFILES`;"
              " the model itself was never timed there)"
              + (", and on " + ", ".join(f"`{n}`" for n in names) + " (`--profile`)"
                 if names else "") + ".", "",
              "| layout | status | step s | predicted s datasheet | error | predicted s saved "
              "profile | error | " + "".join(f"{n} s | error | " for n in names)
              + "tokens/s | peak GiB | predicted GiB | error | "
              + "".join(f"{n} GiB | error | " for n in names) + "losses | "
              "max rel. loss diff |",
              "|---" * (13 + 4 * len(names)) + "|"]
    for r in s["layouts"]:
        losses = r["loss_per_step"] or []
        diff = (max(abs(a - b) / abs(b) for a, b in zip(losses, base)) if losses and base
                else None)
        fmt = (lambda v, f: f.format(v) if v is not None else "–")
        pred = r.get("predicted") or {}
        p_step, p_mem = pred.get("step_time_s"), pred.get("memory_peak_bytes")
        s_step = (pred.get("saved_profile") or {}).get("step_time_s")
        e_step = p_step / r["step_time_s"] - 1 if p_step and r["step_time_s"] else None
        e_saved = s_step / r["step_time_s"] - 1 if s_step and r["step_time_s"] else None
        e_mem = p_mem / r["memory_peak_bytes"] - 1 if p_mem and r["memory_peak_bytes"] else None
        fresh = [(pred.get("profiles") or {}).get(n) or {} for n in names]
        f_step = "".join(f"{fmt(p.get('step_time_s'), '{:.3f}')} | "
                         f"{fmt(rel(p.get('step_time_s'), r['step_time_s']), '{:+.1%}')} | "
                         for p in fresh)
        f_mem = "".join(f"{fmt(p.get('memory_peak_bytes') and p['memory_peak_bytes'] / 2**30, '{:.2f}')} | "
                        f"{fmt(rel(p.get('memory_peak_bytes'), r['memory_peak_bytes']), '{:+.1%}')} | "
                        for p in fresh)
        lines.append(f"| {r['short']} | {r['status'][:60]} | {fmt(r['step_time_s'], '{:.3f}')} | "
                     f"{fmt(p_step, '{:.3f}')} | {fmt(e_step, '{:+.1%}')} | "
                     f"{fmt(s_step, '{:.3f}')} | {fmt(e_saved, '{:+.1%}')} | {f_step}"
                     f"{fmt(r['tokens_per_s'], '{:.0f}')} | "
                     f"{fmt(r['memory_peak_bytes'] and r['memory_peak_bytes'] / 2**30, '{:.2f}')}"
                     f" | {fmt(p_mem and p_mem / 2**30, '{:.2f}')} | {fmt(e_mem, '{:+.1%}')}"
                     f" | {f_mem}{' '.join(f'{v:.4f}' for v in losses)} | {fmt(diff, '{:.2e}')} |")
    return "\n".join(lines) + "\n"


def rel(pred, meas):
    """predicted / measured − 1, or None where either is missing."""
    return pred / meas - 1 if pred and meas else None


if __name__ == "__main__":
    raise SystemExit(main())
