"""Measured vs predicted on one node of 4 GPUs: a ≥1B-parameter model under 10+ layouts.

Needs torch and GPUs, not ortools: each layout's plan file is built from the Layout
directly (meshplan.executor.planfiles) with the cost model's prediction, then run with
torchrun (one layout after another, each with a timeout); the results files are
collected under --out and summarized in --out/executor_gpu.md (the format of
docs/benchmarks/executor_gpu.md).

    python benchmarks/executor_gpu.py --out $OUT                    # 4 GPUs, ~8 minutes
    python benchmarks/executor_gpu.py --out /tmp/x --device cpu --tiny --only dp4,pp4-1f1b

A layout that fails or runs out of memory is recorded as such and the rest continue.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402
from meshplan.executor.child_env import child_env  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402

# Llama-style 1.26B: 24 layers, hidden 2048, 16 heads of 128, GQA with 8 kv heads (tp4
# divides both), SwiGLU 5632, vocab 32000, untied.
MODEL = ModelSpec(name="llama-1.3b", num_layers=24, hidden_size=2048, num_heads=16,
                  num_kv_heads=8, ffn_hidden_size=5632, vocab_size=32000, max_seq_len=2048,
                  activation="swiglu", norm="rmsnorm", position_embedding="rope",
                  tied_embeddings=False, bias=False)
JOB = Job(global_batch=64, seq_len=2048, precision="bf16")

TINY = ModelSpec(name="tiny-llama", num_layers=8, hidden_size=64, num_heads=4, num_kv_heads=4,
                 ffn_hidden_size=128, vocab_size=256, max_seq_len=64, activation="swiglu",
                 norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False)
TINY_JOB = Job(global_batch=32, seq_len=64, precision="fp32")



@dataclass(frozen=True)
class Case:
    name: str
    layout: Layout
    note: str = ""
    compile: bool = False


def cases() -> list[Case]:
    """Best guess first (it matters most if the time budget runs out)."""
    L = Layout
    return [
        Case("best-dp4-zero1-mb4", L(dp=4, micro_batch=4, zero=1), "best guess for MFU"),
        Case("dp4-zero2-mb4", L(dp=4, micro_batch=4, zero=2), "FSDP2, bf16 params"),
        Case("dp4", L(dp=4, micro_batch=2)),
        Case("tp4", L(tp=4, micro_batch=4)),
        Case("tp4-sp", L(tp=4, micro_batch=4, sequence_parallel=True), "sequence parallel"),
        Case("pp4-1f1b", L(pp=4, micro_batch=2, schedule="1f1b")),
        Case("pp4-interleaved", L(pp=4, micro_batch=2, schedule="interleaved-1f1b", vpp=2)),
        Case("pp4-zero-bubble", L(pp=4, micro_batch=2, schedule="zero-bubble")),
        Case("dp2-tp2", L(dp=2, tp=2, micro_batch=4)),
        Case("dp2-pp2", L(dp=2, pp=2, micro_batch=2, schedule="1f1b")),
        Case("pp2-tp2", L(pp=2, tp=2, micro_batch=2, schedule="1f1b")),
        Case("dp4-zero3", L(dp=4, micro_batch=2, zero=3)),
        Case("dp4-full-recompute", L(dp=4, micro_batch=2, zero=1, recompute="full")),
        Case("dp4-selective-recompute", L(dp=4, micro_batch=2, zero=1, recompute="selective")),
        # last: torch.compile per block fuses RoPE / RMSNorm / SwiGLU elementwise work; its
        # compile time counts against the per-layout timeout
        Case("best-dp4-zero1-mb4-compile", L(dp=4, micro_batch=4, zero=1), "torch.compile",
             compile=True),
    ]


def cluster_for(device: str, nproc: int) -> Cluster:
    name = "dgx-h100"
    if device == "cuda":
        import torch
        if "H200" in torch.cuda.get_device_name(0):
            name = "dgx-h200"
    return Cluster.preset(name, nodes=1, gpus_per_node=nproc)


# The newest saved 4-GPU calibration of each GPU type (docs/benchmarks/data/profiles): H100
# from the transfer36 round (torch 2.11, the device's torch), H200 from round 26.
PROFILES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "data" / "profiles"
SAVED_PROFILES = {"H100": PROFILES / "profile_h100x4_transfer36_part1.toml",
                  "H200": PROFILES / "profile_h200x4_round26.toml"}


def saved_profile_cluster(cluster: Cluster, profiles=SAVED_PROFILES
                          ) -> tuple[Cluster | None, str]:
    """The cluster with the saved calibration of its GPU type applied (a user's calibrated
    machine: measured kernels, host dispatch and links; models it did not time are priced
    from its nearest timed shapes), and the profile's path; (None, why) where none fits.
    ``profiles``: saved 4-GPU profiles by a fragment of the GPU name."""
    from meshplan.hardware_profiles.calibrated import apply_profile
    if cluster.gpus_per_node != 4:
        return None, f"no saved profile for {cluster.gpus_per_node} GPUs per node"
    path = next((p for frag, p in profiles.items() if frag in cluster.gpu.name), None)
    if path is None:
        return None, f"no saved profile for {cluster.gpu.name}"
    return apply_profile(cluster, path, override=True), str(path.relative_to(PROFILES.parents[3]))


def predict(model, cluster, job: Job, layout: Layout, *, with_saved_profile: bool = True) -> dict:
    """The cost model's prediction for a layout as it runs: step time, peak and per-rank
    memory, the exposed cp and ep communication; {"error": ...} where it refuses it (the
    layout still runs). With ``with_saved_profile``, ``saved_profile`` holds the same
    prediction on the saved calibration of this GPU type (``saved_profile_cluster``)."""
    from meshplan.costmodel import estimate
    try:
        est = estimate(model, cluster, job, layout)
    except Exception as exc:     # noqa: BLE001 — recorded beside the measurement
        return {"error": str(exc)}
    pred = {"step_time_s": est.step_time_s, "memory_peak_bytes": est.memory_peak_bytes,
            "memory_per_stage_bytes": [m.total_bytes for m in est.memory],
            "attention_s": est.time.attention_s, "cp_comm_s": est.time.cp_comm_s,
            "ep_comm_s": est.time.ep_comm_s}
    if with_saved_profile:
        profiled, source = saved_profile_cluster(cluster)
        pred["saved_profile"] = {"source": source} if profiled is None else {
            "source": source, **predict(model, profiled, job, layout, with_saved_profile=False)}
    return pred


def run_case(case: Case, args, model, job, cluster, out: Path) -> dict:
    from meshplan.executor.planfiles import write_plan_for_layout
    plan = out / "plans" / f"{case.name}.json"
    res = out / "results" / f"{case.name}.json"
    log = out / "logs" / f"{case.name}.log"
    for d in (plan.parent, res.parent, log.parent):
        d.mkdir(parents=True, exist_ok=True)
    write_plan_for_layout(plan, model, job, case.layout, cluster)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={case.layout.num_gpus}", "-m", "meshplan.executor.run",
           "--plan", str(plan), "--out", str(res), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--device", args.device, "--force"]
    if args.compile or case.compile:
        cmd.append("--compile")
    if args.profile:
        cmd += ["--profile", str(out / "profiles" / case.name)]
    if args.allow_gpu_mismatch:
        cmd.append("--allow-gpu-mismatch")
    env = child_env()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.time()
    status = "ok"
    with open(log, "w") as fh:
        fh.write("+ " + " ".join(cmd) + "\n")
        fh.flush()
        try:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc, status = None, f"timeout after {args.timeout} s"
    wall = time.time() - t0
    doc = None
    if res.exists():
        try:
            doc = json.loads(res.read_text())
        except json.JSONDecodeError:
            doc = None
    if rc not in (0, None):
        status = f"failed (exit {rc})"
        if doc and doc.get("error"):
            ranks = doc["error"].get("ranks") or []
            if ranks:
                status += f": rank {ranks[0].get('rank')} {ranks[0].get('kind')}: " \
                          f"{str(ranks[0].get('message'))[:160]}"
        else:
            tail = log.read_text().strip().splitlines()[-3:]
            status += ": " + " / ".join(tail)[:200]
    print(f"{case.name:28s} {status[:100]:100s} {wall:6.1f} s", flush=True)
    return {"case": case, "status": status, "doc": doc, "wall_s": wall, "command": " ".join(cmd)}


def _gib(v):
    return f"{v / 2**30:.1f}" if isinstance(v, (int, float)) else "-"


def _pct(v):
    return f"{100 * v:.1f} %" if isinstance(v, (int, float)) else "-"


def _err(v):
    return f"{v:+.0f} %" if isinstance(v, (int, float)) else "-"


def markdown(rows: list[dict], args, model, job, cluster, started: str) -> str:
    env = next((r["doc"].get("environment") for r in rows
                if r["doc"] and r["doc"].get("environment")), {}) or {}
    lines = [
        "# Executor on one node: measured vs predicted",
        "",
        f"- date: {started}; GPUs: {env.get('world_size', '?')} × {env.get('gpu_name', args.device)}"
        f" (cluster profile `{cluster.name}`, {cluster.gpu.name}); torch {env.get('torch', '?')}, "
        f"CUDA {env.get('cuda', '-')}, NCCL {env.get('nccl', '-')}, driver {env.get('driver', '-')}",
        f"- model: `{model.name}` ({model.num_params() / 1e9:.2f} B parameters: {model.num_layers} "
        f"layers, hidden {model.hidden_size}, {model.num_heads} heads / {model.num_kv_heads} kv, "
        f"ffn {model.ffn_hidden_size}, vocab {model.vocab_size}); job: {job.global_batch} "
        f"sequences × {job.seq_len} tokens per step, {job.precision}",
        f"- {args.warmup} warm-up + {args.steps} measured steps per layout; step time = median "
        f"(CUDA events on rank 0), spread = p10-p90 in % of the median; peak memory = max over "
        f"ranks of `torch.cuda.max_memory_allocated`; MFU against the profile's dense "
        f"{job.precision} peak; error = (predicted - measured) / measured",
        f"- command: `python benchmarks/executor_gpu.py {' '.join(sys.argv[1:])}` (each layout's "
        f"torchrun command is in `logs/<layout>.log`)",
        "",
        "| layout | predicted step | measured step (spread) | error | predicted peak GiB | "
        "measured peak GiB (reserved) | error | MFU predicted | MFU measured | tokens/s | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        case, doc = r["case"], r["doc"] or {}
        pred, meas, err = doc.get("prediction") or {}, doc.get("measured") or {}, doc.get("errors_pct") or {}
        st = meas.get("step_time") or {}
        step = (f"{meas['step_time_s']:.3f} s ({st.get('spread_pct', 0):.0f} %)"
                if isinstance(meas.get("step_time_s"), (int, float)) else "-")
        pstep = f"{pred['step_time_s']:.3f} s" if isinstance(pred.get("step_time_s"), (int, float)) else "-"
        tps = f"{meas['tokens_per_s']:,.0f}" if isinstance(meas.get("tokens_per_s"), (int, float)) else "-"
        lines.append(
            f"| {case.name} `{case.layout.short()}`{' compiled' if case.compile else ''} | {pstep} | {step} | {_err(err.get('step_time_s'))} | "
            f"{_gib(pred.get('memory_peak_bytes'))} | {_gib(meas.get('memory_peak_bytes'))} "
            f"({_gib(meas.get('memory_peak_reserved_bytes'))}) | {_err(err.get('memory_peak_bytes'))} | "
            f"{_pct(pred.get('mfu'))} | {_pct(meas.get('mfu'))} | {tps} | {r['status']} |")
    ok = [r for r in rows if r["doc"] and isinstance((r["doc"].get("measured") or {}).get("mfu"), float)]
    if ok:
        best = max(ok, key=lambda r: r["doc"]["measured"]["mfu"])
        lines += ["", f"Best measured MFU: **{_pct(best['doc']['measured']['mfu'])}** "
                      f"({best['case'].name}, `{best['case'].layout.short()}`)."]
    return "\n".join(lines) + "\n"


def select(parser: argparse.ArgumentParser, todo: list, only: str | None) -> list:
    """The cases named in ``only`` (comma-separated), or all; an unknown name is an error."""
    if not only:
        return todo
    names = only.split(",")
    unknown = set(names) - {c.name for c in todo}
    if unknown:
        parser.error(f"unknown layouts {sorted(unknown)}; known: {[c.name for c in todo]}")
    return [c for c in todo if c.name in names]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory (plans, results, logs, table)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=int, default=100, help="seconds per layout")
    p.add_argument("--budget", type=float, default=480, help="seconds for all layouts; the "
                   "layouts left when it runs out are recorded as skipped")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="a tiny fp32 model (CPU check)")
    p.add_argument("--only", default=None, help="comma-separated layout names")
    p.add_argument("--compile", action="store_true", help="pass --compile to the executor")
    p.add_argument("--profile", action="store_true",
                   help="record a torch.profiler trace per layout under --out/profiles/")
    p.add_argument("--allow-gpu-mismatch", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, job = (TINY, TINY_JOB) if args.tiny else (MODEL, JOB)
    cluster = cluster_for(args.device, 4)
    todo = select(p, cases(), args.only)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    t0 = time.time()
    rows = []
    for case in todo:
        left = args.budget - (time.time() - t0)
        if left < 20:
            rows.append({"case": case, "status": "skipped (time budget)", "doc": None,
                         "wall_s": 0.0, "command": ""})
            continue
        saved = args.timeout
        args.timeout = int(min(args.timeout, left))
        rows.append(run_case(case, args, model, job, cluster, out))
        args.timeout = saved
        (out / "executor_gpu.md").write_text(markdown(rows, args, model, job, cluster, started))
    (out / "executor_gpu.md").write_text(markdown(rows, args, model, job, cluster, started))
    print(f"total {time.time() - t0:.0f} s; table in {out / 'executor_gpu.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
