"""Context parallelism on one node of 4 GPUs: step time and per-rank peak memory of a
Llama-style 1.26B model at 16k-64k tokens per sequence, cp 1/2/4 with tp, dp and pp,
measured against the cost model's prediction as run (issue 39 item 5).

Every layout trains 131072 tokens per step (a drawn set: its `tokens_per_step`, 65536 on two GPUs)
across sequence lengths. Each plan carries the cost model's prediction for its layout (cp
priced by meshplan.costmodel.context_tables on the cluster of the run); the results keep it
beside the measurement (``prediction_step_time_s``, ``prediction_memory_peak_bytes``,
per-rank ``predicted_bytes``, the executor's ``errors_pct``).

    python benchmarks/context_parallel_gpu.py --out $OUT              # 4 GPUs, ≈ 8 minutes
    python benchmarks/context_parallel_gpu.py --estimate              # the predictions, no GPU
    python benchmarks/context_parallel_gpu.py --set benchmarks/sets/cp40/set.json --out $OUT
                                      # a drawn held-out set (benchmarks/cp_draw.py): its model
    python benchmarks/context_parallel_gpu.py --out /tmp/x --device cpu --tiny --only cp2-dp2-zero1-ring-32k
    python benchmarks/context_parallel_gpu.py --out $OUT --profile \
        --only cp1-dp4-zero1-16k,cp1-tp4-sp-32k,cp4-zero1-a2a-64k    # + kernel times per op

Writes three files under --out: ``cp_gpu.json`` (per layout: layout, job, status, step
times, tokens/s, MFU, every rank's peak memory, losses, the prediction and its errors),
``cp_gpu.md`` (measured vs predicted) and ``cp_gpu_logs.tar.gz`` (each layout's torchrun
log, plan and results file). With ``--profile`` each layout also records a torch.profiler
trace of 3 steps (the executor's ``--profile``); its per-op tables by self device time
(``top_ops_rank*.txt``: attention kernels, GEMMs and the rest, what the step's kernels took
inside the run) go into a fourth file, ``cp_gpu_top_ops.tar.gz``; the traces themselves are
dropped (too large to bring back). Profiled steps run slower than plain ones: their
step times are not the measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import executor_gpu as eg  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

MODEL = dataclasses.replace(eg.MODEL, max_seq_len=65536)   # 16 heads / 8 kv: a2a up to tp·cp 8
# 8 heads (of 8): an all-to-all cp of 8 ranks scatters them (gpu8cp42's c42-08)
TINY = dataclasses.replace(eg.TINY, max_seq_len=256, num_heads=8, num_kv_heads=8)
TOKENS_PER_STEP = 131072


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    seq_len: int
    layout: Layout
    compile: bool = False
    tokens_per_step: int = TOKENS_PER_STEP


def cases() -> list[Case]:
    L = Layout
    return [   # the cp = 1 baselines early: they matter if the time budget runs out
        Case("cp4-zero1-ring-64k", 65536, L(cp=4, zero=1)),
        Case("cp2-tp2-sp-ring-64k", 65536, L(cp=2, tp=2, sequence_parallel=True, zero=1)),
        Case("cp1-tp4-sp-32k", 32768, L(tp=4, sequence_parallel=True)),
        Case("cp2-dp2-zero1-ring-32k", 32768, L(cp=2, dp=2, zero=1)),
        Case("cp2-pp2-1f1b-ring-32k", 32768, L(cp=2, pp=2, schedule="1f1b", zero=1)),
        Case("cp4-zero1-a2a-64k", 65536, L(cp=4, zero=1, cp_style="all-to-all")),
        Case("cp1-dp4-zero1-16k", 16384, L(dp=4, zero=1)),
        Case("cp2-dp2-zero3-a2a-32k", 32768, L(cp=2, dp=2, zero=3, cp_style="all-to-all")),
        Case("cp2-tp2-sp-a2a-32k", 32768,
             L(cp=2, tp=2, sequence_parallel=True, zero=1, cp_style="all-to-all")),
        Case("cp4-zero1-ring-selective-32k", 32768, L(cp=4, zero=1, recompute="selective")),
    ]


def load_set(path: str) -> tuple[ModelSpec, list[Case]]:
    """A set drawn by benchmarks/cp_draw.py: its model and cases."""
    try:
        doc = json.loads(Path(path).read_text())
        tokens = int(doc.get("tokens_per_step", TOKENS_PER_STEP))
        return ModelSpec.from_dict(doc["model"]), [
            Case(c["name"], c["seq_len"], Layout.from_dict(c["layout"]),
                 tokens_per_step=tokens) for c in doc["cases"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--set {path}: not a set written by benchmarks/cp_draw.py "
                         f"(a JSON file with 'model' and 'cases'): {exc}") from None


def job_for(case: Case, tiny: bool) -> Job:
    if tiny:
        return Job(global_batch=8, seq_len=case.seq_len // 512, precision="fp32",
                   runtime="torch")
    return Job(global_batch=case.tokens_per_step // case.seq_len, seq_len=case.seq_len,
               precision="bf16", runtime="torch")


def summary(row: dict, case: Case, job: Job, pred: dict) -> dict:
    doc = row["doc"] or {}
    meas = doc.get("measured") or {}
    ranks = [{k: r.get(k) for k in ("rank", "dp", "pp", "tp", "allocated_bytes",
                                    "reserved_bytes", "step_median_s")}
             for r in meas.get("memory_per_rank") or []]
    return {"name": case.name, "layout": case.layout.to_dict(), "short": case.layout.short(),
            "job": job.to_dict(), "status": row["status"], "wall_s": row["wall_s"],
            "command": row["command"], "predicted": pred,
            "prediction_memory_peak_bytes": pred.get("memory_peak_bytes"),
            "errors_pct": doc.get("errors_pct"),
            "step_time_s": meas.get("step_time_s"), "step_time": meas.get("step_time"),
            "step_times_s": meas.get("step_times_s"), "tokens_per_s": meas.get("tokens_per_s"),
            "mfu": meas.get("mfu"), "memory_peak_bytes": meas.get("memory_peak_bytes"),
            "memory_per_rank": ranks, "loss_per_step": meas.get("loss_per_step"),
            "prediction_step_time_s": (doc.get("prediction") or {}).get("step_time_s"),
            "environment": doc.get("environment")}


def markdown(rows: list[dict], host_note: str = "") -> str:
    env = next((r["environment"] for r in rows if r.get("environment")), {}) or {}
    lines = [f"# Context parallelism on {env.get('world_size', '?')} × "
             f"{env.get('gpu_name', '?')} (torch {env.get('torch', '?')})", "",
             f"{rows[0]['job']['global_batch'] * rows[0]['job']['seq_len'] if rows else '?'} "
             "tokens per step; step = median of the measured steps; "
             "peak = max over ranks of max_memory_allocated; predicted = the cost model's "
             "estimate of the layout as run (error = predicted / measured − 1)", "",
             "Two predictions, both fixed before the run: *datasheet* (the GPU's preset "
             "profile) and *saved profile* (the newest saved 4-GPU calibration of this GPU "
             "type, `executor_gpu.SAVED_PROFILES`; the model itself was never timed there)."
             + host_note, "",
             "| layout | seq_len | step s | predicted s datasheet | error | predicted s "
             "saved profile | error | tokens/s | MFU | peak GiB (min-max over ranks) | "
             "predicted GiB | error | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        alloc = [x["allocated_bytes"] for x in r["memory_per_rank"]
                 if isinstance(x.get("allocated_bytes"), (int, float))]
        peak = (f"{max(alloc) / 2**30:.1f} ({min(alloc) / 2**30:.1f}-{max(alloc) / 2**30:.1f})"
                if alloc else "-")
        num = lambda v, f: f.format(v) if isinstance(v, (int, float)) else "-"  # noqa: E731
        pred = r.get("predicted") or {}
        p_step, p_mem = pred.get("step_time_s"), pred.get("memory_peak_bytes")
        s_step = (pred.get("saved_profile") or {}).get("step_time_s")
        rel = lambda p, m: p / m - 1 if isinstance(p, (int, float)) and m else None  # noqa: E731
        step_err, s_err = rel(p_step, r["step_time_s"]), rel(s_step, r["step_time_s"])
        mem_err = rel(p_mem, max(alloc) if alloc else None)
        lines.append(f"| {r['name']} `{r['short']}` | {r['job']['seq_len']} | "
                     f"{num(r['step_time_s'], '{:.3f}')} | {num(p_step, '{:.3f}')} | "
                     f"{num(step_err, '{:+.1%}')} | {num(s_step, '{:.3f}')} | "
                     f"{num(s_err, '{:+.1%}')} | {num(r['tokens_per_s'], '{:,.0f}')} | "
                     f"{num(r['mfu'], '{:.1%}')} | {peak} | "
                     f"{num(p_mem and p_mem / 2**30, '{:.1f}')} | {num(mem_err, '{:+.1%}')}"
                     f" | {r['status'][:80]} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="directory for cp_gpu.json, cp_gpu.md, cp_gpu_logs.tar.gz")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=int, default=120, help="seconds per layout")
    p.add_argument("--budget", type=float, default=520, help="seconds for all layouts")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="a tiny fp32 model (CPU check)")
    p.add_argument("--only", default=None, help="comma-separated layout names")
    p.add_argument("--set", default=None,
                   help="a set drawn by benchmarks/cp_draw.py (its model and layouts)")
    p.add_argument("--estimate", action="store_true", help="print the predictions and exit")
    p.add_argument("--allow-gpu-mismatch", action="store_true")
    p.add_argument("--profile", action="store_true",
                   help="also record each layout's kernel times per op (cp_gpu_top_ops.tar.gz)")
    p.add_argument("--host-json", default=None,
                   help="benchmarks/cp_host_gpu.py's output: its measured host_comm_op_s "
                        "goes on the cluster of the predictions")
    args = p.parse_args(argv)
    args.compile = False                           # what executor_gpu.run_case reads
    model, todo = (MODEL, cases()) if args.set is None else load_set(args.set)
    if args.tiny:
        model = TINY
    todo = eg.select(p, todo, args.only)
    # the node of the set's layouts (a set drawn for two GPUs: cp_draw.py --gpus 2)
    cluster = eg.cluster_for(args.device if not args.estimate else "cpu",
                             max(c.layout.num_gpus for c in todo))
    host_note = ""
    if args.host_json:
        host = json.loads(Path(args.host_json).read_text())
        if not isinstance(host.get("host_comm_op_s"), (int, float)):
            p.error(f"--host-json {args.host_json}: no host_comm_op_s number (expected "
                    f"benchmarks/cp_host_gpu.py's output)")
        comm_s, a2a_s = host["host_comm_op_s"], host.get("host_all_to_all_s") or 0.0
        cluster = cluster.replace(gpu=dataclasses.replace(
            cluster.gpu, host_comm_op_s=comm_s, host_all_to_all_s=a2a_s))
        print(f"host_comm_op_s {comm_s * 1e6:.1f} us from {args.host_json}", flush=True)
        host_note = (f" The datasheet prediction carries host_comm_op_s = {comm_s * 1e6:.1f} us "
                     f"and host_all_to_all_s = {a2a_s * 1e6:.1f} us measured before the "
                     f"layouts ran ({args.host_json}).")
    if args.estimate:
        for c in todo:
            pred = eg.predict(model, cluster, job_for(c, args.tiny), c.layout)
            mem = pred.get("memory_peak_bytes")
            print(f"{c.name:32s} {c.layout.short():48s} "
                  f"{pred.get('step_time_s', float('nan')):8.3f} s "
                  f"{'-' if mem is None else f'{mem / 2**30:.1f} GiB'} {pred.get('error', '')}")
        return 0
    if not args.out:
        p.error("--out is required unless --estimate")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cp_gpu_"))
    t0, rows = time.time(), []
    for c in todo:
        job = job_for(c, args.tiny)
        pred = eg.predict(model, cluster, job, c.layout)
        left = args.budget - (time.time() - t0)
        if left < 30:
            row = {"status": "skipped (time budget)", "doc": None, "wall_s": 0.0, "command": ""}
        else:
            args.timeout = int(min(args.timeout, left))
            row = eg.run_case(c, args, model, job, cluster, work)
        rows.append(summary(row, c, job, pred))
        (out / "cp_gpu.json").write_text(json.dumps(rows, indent=1))
        (out / "cp_gpu.md").write_text(markdown(rows, host_note))
    if args.profile:
        tables = sorted((work / "profiles").glob("*/top_ops_rank*.txt"))
        with tarfile.open(out / "cp_gpu_top_ops.tar.gz", "w:gz") as tar:
            for t in tables:
                tar.add(t, arcname=f"cp_gpu_top_ops/{t.parent.name}/{t.name}")
        for trace in (work / "profiles").glob("*/trace_rank*.json"):
            trace.unlink()
    with tarfile.open(out / "cp_gpu_logs.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="cp_gpu")
    shutil.rmtree(work, ignore_errors=True)
    print(f"total {time.time() - t0:.0f} s; {out / 'cp_gpu.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
