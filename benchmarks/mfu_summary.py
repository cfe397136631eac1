"""Table of benchmarks/mfu_device.sh's runs: step, tokens/s, MFU (two FLOP counts), memory.

    python benchmarks/mfu_summary.py /tmp/mfu > summary.md
    python benchmarks/mfu_summary.py /tmp/mfu8 best_eager fsdp2_compiled --base fsdp2_compiled
    python benchmarks/mfu_summary.py /tmp/mfu --json docs/benchmarks/data/mfu_h200_DATE.json

``--json`` also writes the runs' key numbers (measured step statistics, prediction and its
time breakdown, memory, MFU, FLOP counts, environment) for the docs: the results files
themselves and the logs stay out of the tree.

MFU = model FLOPs per step / step time / GPUs / dense bf16 peak (989 TFLOP/s, H100 and
H200 SXM datasheet). "MFU" counts the attention core in full (Narayanan et al. 2021 eq. 3,
the executor's ``meshplan.costmodel.flops``); "MFU causal" halves it for the causal mask
(what a FlashAttention kernel computes). Speed-up = the baseline's step (``--base``, default
the plain DDP script compiled) over the row's step; the runs are RUN names (default: those
of mfu_device.sh).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEAK = 989e12
RUNS = ["best_eager", "best_compiled", "dp4z2_eager", "dp4z2_compiled", "ddp_eager",
        "ddp_compiled"]


def row(name: str, d: Path) -> dict | None:
    from meshplan.spec import Job, Layout, ModelSpec

    from baseline_ddp import causal_flops_per_step
    f = d / f"{name}.json"
    if not f.exists():
        return None
    doc = json.loads(f.read_text())
    if "measured" in doc:            # the executor's results file
        if doc.get("status") != "ok":
            return {"name": name, "status": doc.get("error", {}).get("summary", "failed")}
        m, model, job = doc["measured"], ModelSpec.from_dict(doc["model"]), \
            Job.from_dict(doc["job"])
        what = Layout.from_dict(doc["layout"]).short()
        step, world = m["step_time_s"], Layout.from_dict(doc["layout"]).num_gpus
        mem = m.get("memory_peak_bytes")
        pred = (doc.get("prediction") or {}).get("step_time_s")
    else:                            # baseline_ddp.py's
        model, job = ModelSpec.from_dict(doc["model"]), Job.from_dict(doc["job"])
        what = (f"plain {'FSDP2' if doc.get('fsdp') else 'DDP'} mb{doc['micro_batch']}"
                + (f" rc={doc['recompute']}" if doc.get("recompute", "none") != "none" else "")
                + (" compiled" if doc["compile"] else ""))
        step, world, mem, pred = doc["step_time_s"], doc["world"], doc["memory_peak_bytes"], None
    from meshplan.costmodel.flops import model_flops_per_step
    full = model_flops_per_step(model, job.global_batch, job.seq_len)
    causal = causal_flops_per_step(model, job.global_batch, job.seq_len)
    return {"name": name, "status": "ok", "what": what, "step_s": step, "pred_s": pred,
            "tokens_per_s": job.tokens_per_step / step, "mfu": full / step / world / PEAK,
            "mfu_causal": causal / step / world / PEAK, "mem": mem,
            "flops_per_step": full, "causal_flops_per_step": causal, "doc": doc}


def key_numbers(r: dict, base: dict | None) -> dict:
    """One run's numbers for docs/benchmarks/data (no per-rank lists, no losses)."""
    if r["status"] != "ok":
        return {"name": r["name"], "status": r["status"]}
    doc = r["doc"]
    out = {k: r[k] for k in ("name", "status", "what", "step_s", "tokens_per_s", "mfu",
                             "mfu_causal")}
    out["memory_peak_bytes"] = r["mem"]
    out["vs_base"] = base["step_s"] / r["step_s"] if base else None
    if "measured" in doc:
        m, p = doc["measured"], doc.get("prediction") or {}
        out.update(command=doc.get("command"), layout=doc["layout"],
                   step_time=m.get("step_time"), step_times_s=m.get("step_times_s"),
                   memory_peak_reserved_bytes=m.get("memory_peak_reserved_bytes"),
                   predicted={k: p.get(k) for k in (
                       "step_time_s", "memory_peak_bytes", "stage_forward_s",
                       "stage_backward_s", "stage_wgrad_s", "pipeline_s", "time",
                       "corrections", "caveats")},
                   errors_pct=doc.get("errors_pct"), environment=doc.get("environment"))
    else:
        out.update(command=doc["environment"].get("command"), micro_batch=doc["micro_batch"],
                   compile=doc["compile"], fsdp=doc.get("fsdp", False),
                   step_times_s=doc.get("step_times_s"), environment=doc.get("environment"))
    return out


def phase_table(rows: list[dict]) -> str:
    """Per executor run and rank: median device / host ms of the step and of its forward,
    backward and optimizer phases (``phase_median_ms``). Where a rank's host time of a
    phase is about its device time, the GPU waited for the CPU there (or the CPU for the
    GPU); the forward is where a CPU without a lead leaves the GPU idle."""
    lines = ["", "| run | rank | step dev/host ms | forward 0 | backward 0 | optimizer |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok" or "measured" not in r["doc"]:
            continue
        for rk in r["doc"]["measured"].get("memory_per_rank") or []:
            ph = rk.get("phase_median_ms") or {}
            cells = [f"{ph[k]['device_ms']:.1f} / {ph[k]['host_ms']:.1f}" if k in ph else "-"
                     for k in ("forward 0", "backward 0", "optimizer")]
            step = rk.get("step_median_s"), rk.get("host_step_median_s")
            st = (f"{1e3 * step[0]:.1f} / {1e3 * step[1]:.1f}" if None not in step else "-")
            lines.append(f"| {r['name']} | {rk.get('rank')} | {st} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 3 else ""


def main(argv=None) -> None:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("runs", nargs="*", default=RUNS)
    ap.add_argument("--base", default="ddp_compiled")
    ap.add_argument("--json", type=Path, default=None,
                    help="also write the runs' key numbers to this JSON file")
    args = ap.parse_args(argv)
    d = args.dir
    rows = [r for r in (row(n, d) for n in args.runs) if r is not None]
    base = next((r for r in rows if r["name"] == args.base and r["status"] == "ok"), None)
    print((d / "env.txt").read_text() if (d / "env.txt").exists() else "")
    print("| run | layout | step ms (pred) | tokens/s | MFU | MFU causal | peak GiB | "
          f"vs {args.base} |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["status"] != "ok":
            print(f"| {r['name']} | {r['status']} | | | | | | |")
            continue
        pred = f" ({1e3 * r['pred_s']:.1f})" if r.get("pred_s") else ""
        mem = f"{r['mem'] / 2**30:.1f}" if r.get("mem") else "-"
        vs = f"{base['step_s'] / r['step_s']:.3f}×" if base else "-"
        print(f"| {r['name']} | `{r['what']}` | {1e3 * r['step_s']:.1f}{pred} | "
              f"{r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f} % | "
              f"{100 * r['mfu_causal']:.1f} % | {mem} | {vs} |")
    print(phase_table(rows))
    if (d / "runs.txt").exists():
        print("\n" + (d / "runs.txt").read_text())
    if args.json:
        ok = next((r for r in rows if r["status"] == "ok"), None)
        doc = {"schema": "meshplan.mfu_runs", "version": 1,
               "env": (d / "env.txt").read_text() if (d / "env.txt").exists() else "",
               "runs_txt": (d / "runs.txt").read_text() if (d / "runs.txt").exists() else "",
               "peak_flops_per_gpu": PEAK, "base": args.base,
               "flops_per_step": ok and ok["flops_per_step"],
               "causal_flops_per_step": ok and ok["causal_flops_per_step"],
               "model": ok and ok["doc"]["model"], "job": ok and ok["doc"]["job"],
               "cluster": next((r["doc"]["cluster"] for r in rows
                                if r["status"] == "ok" and "cluster" in r["doc"]), None),
               "runs": [key_numbers(r, base) for r in rows]}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
