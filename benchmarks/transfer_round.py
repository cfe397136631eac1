"""Run and score a transfer round (issue 36, item 5) with the user's commands.

The set is a directory written by ``benchmarks/draw_models.py --round`` (``set.json``,
``models/*.json``, ``layouts/*.json``). On the lent 4-GPU machine, one device call each:

    python benchmarks/transfer_round.py calibrate --set benchmarks/sets/transfer36 --out $OUT
    python benchmarks/transfer_round.py validate  --set benchmarks/sets/transfer36 --out $OUT
    python benchmarks/transfer_round.py generic   --out $OUT   # calibration timing no model

(validate uses the profile the first call left in ``--keep`` on the still-warm machine, or
``--profile FILE``.) A CPU dry run of the whole path with shrunk models:
``... validate --device cpu --tiny --nproc 4 --out /tmp/t36cpu``.

``calibrate`` runs ``meshplan calibrate --nproc 4 --model A --model B ...`` with the set's
models; ``validate`` runs ``meshplan validate --runtime torch --layout-list ...`` once per
model (each model has its own job), sharing one time budget, then merges the records into
one accuracy.json; ``generic`` runs ``meshplan calibrate --nproc 4`` without ``--model``.
Back on any machine (CPU):

    python benchmarks/transfer_round.py report --accuracy accuracy.json \\
        [--profile generic.toml --gpu "NVIDIA H100 80GB HBM3"]

prints the round's figures as the issue states its goals (step mean / max, ranks within 5 %
memory, Spearman and best-layout gap per model) and, with ``--profile``, the same layouts
re-predicted on that profile (the second prediction: a calibration that did not time
these models).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.calibrate.validate import by_model, rescore, summarize, write_accuracy  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.spec import Job, ModelSpec  # noqa: E402

# NVLink multicast off on the lent machines (KINDS.md), as benchmarks/device_accuracy.sh
DEVICE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
              "NVSHMEM_DISABLE_NVLS": "1"}
MEMORY_GOAL_PCT = 5.0


def load_set(path: Path) -> dict:
    doc = json.loads((path / "set.json").read_text())
    for m in doc["models"]:
        m["model_file"] = str(path / "models" / f"{m['name']}.json")
        m["layout_file"] = str(path / "layouts" / f"{m['name']}.json")
    return doc


def tiny_set(doc: dict, where: Path) -> dict:
    """The set with each model shrunk for a CPU dry run (gloo): the same layers, heads, kv
    heads, family and layouts, head dim 8, ffn 2·hidden, vocab 512, seq 64."""
    (where / "models").mkdir(parents=True, exist_ok=True)
    for m in doc["models"]:
        spec = dict(m["spec"], head_dim=None, vocab_size=512, max_seq_len=64)
        spec["hidden_size"] = 8 * spec["num_heads"]
        spec["ffn_hidden_size"] = 2 * spec["hidden_size"]
        model = ModelSpec.from_dict(spec)
        m["model_file"] = str(where / "models" / f"{m['name']}.json")
        Path(m["model_file"]).write_text(json.dumps(model.to_dict()))
        m["job"] = dict(m["job"], seq_len=64)
    return doc


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout
        return out.splitlines()[0].strip()
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "cpu"


def cluster_preset(gpu: str) -> str:
    return "dgx-h200" if "H200" in gpu else "dgx-h100"


def calibrate_cmd(doc: dict | None, out: Path, *, nproc: int, budget_s: float,
                  micro_batches: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "meshplan.cli", "calibrate", "--nproc", str(nproc),
           "--time-budget", f"{budget_s:g}", "--out", str(out), "--no-progress"]
    for m in (doc or {"models": []})["models"]:
        cmd += ["--model", m["model_file"]]
    if doc and micro_batches:
        cmd += ["--micro-batches", micro_batches]
    return cmd


def validate_cmd(m: dict, out: Path, *, profile: str | None, gpu: str, nproc: int,
                 budget_s: float, device: str) -> list[str]:
    job = m["job"]
    cmd = [sys.executable, "-m", "meshplan.cli", "validate", "--runtime", "torch",
           "--model", m["model_file"], "--cluster", cluster_preset(gpu),
           "--global-batch", str(job["global_batch"]), "--seq-len", str(job["seq_len"]),
           "--layout-list", m["layout_file"], "--nproc", str(nproc), "--device", device,
           "--steps", "6", "--warmup", "2", "--timeout", "60", "--budget", f"{budget_s:.0f}",
           "--out", str(out)]
    return cmd + (["--profile", profile] if profile else [])


def _run(cmd: list[str], log: Path, timeout_s: float) -> int:
    env = {**os.environ, **DEVICE_ENV, "PYTHONPATH": str(ROOT)}
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        try:
            return subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                  timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            fh.write(f"timed out after {timeout_s:.0f} s\n")
            return 124


def validate_set(doc: dict, args) -> Path:
    """One ``meshplan validate`` per model, sharing ``args.budget`` seconds; one merged
    accuracy.json in ``args.out``."""
    gpu = gpu_name() if args.device != "cpu" else "cpu"
    if args.profile is None and args.device != "cpu":
        kept = args.keep / "profile.toml"
        if not kept.exists():
            raise SystemExit(f"no --profile and none kept at {kept}: run the calibrate call on "
                             f"this (still warm) machine first, or pass the profile it wrote")
        args.profile = str(kept)
    t0 = time.perf_counter()
    records = []
    models = doc["models"]
    for i, m in enumerate(models):
        left = args.budget - (time.perf_counter() - t0)
        share = max(0.0, left / (len(models) - i))
        d = args.keep / "val" / m["name"]
        _run(validate_cmd(m, d, profile=args.profile, gpu=gpu, nproc=args.nproc,
                          budget_s=share, device=args.device),
             args.out / "validate.log", timeout_s=share + 60)
        acc = d / "accuracy.json"
        if acc.exists():
            records += json.loads(acc.read_text())["records"]
    meta = {"set": doc["set"], "seed": doc["seed"], "gpu_name": gpu, "nproc": args.nproc,
            "profile": args.profile or "", "device": args.device,
            "command": " ".join(["python", *sys.argv]),
            "jobs": {m["name"]: m["job"] for m in models}}
    paths = write_accuracy(args.out, records, meta)
    subprocess.run(["tar", "czf", str(args.out / "runs.tgz"), "-C", str(args.keep), "val"],
                   check=False)
    return paths["json"]


def figures(records: list[dict]) -> dict:
    """The issue's goal figures: step mean/max, memory ranks within 5 %, per-model
    Spearman and best-layout gap."""
    s = summarize(records)
    mem = [abs(e) for r in records if r.get("status") == "ok"
           for e in r.get("memory_error_pct_per_rank", [])]
    per = by_model(records)
    return {
        "layouts_ok": s.get("ok", 0), "layouts": s["layouts"],
        "step_mean_abs_pct": s.get("step_time_mean_abs_error_pct"),
        "step_max_abs_pct": s.get("step_time_max_abs_error_pct"),
        "memory_ranks_within_5pct": (sum(e <= MEMORY_GOAL_PCT for e in mem) / len(mem)
                                     if mem else None),
        "memory_max_abs_pct": max(mem) if mem else None,
        "per_model": {n: {"spearman": p.get("spearman"),
                          "best_gap_pct": p.get("predicted_best_gap_pct"),
                          "step_mean_abs_pct": p.get("step_time_mean_abs_error_pct")}
                      for n, p in per.items()},
    }


def repredict(doc: dict, profile: str, gpu: str) -> list[dict]:
    """Every record re-predicted on ``profile`` (models and jobs from the accuracy file)."""
    nproc = int(doc.get("nproc") or 4)
    cluster = apply_profile(Cluster.preset(cluster_preset(gpu), nodes=1, gpus_per_node=nproc),
                            profile)
    set_dir = ROOT / "benchmarks" / "sets" / str(doc["set"])
    out = []
    for r in doc["records"]:
        model = ModelSpec.from_dict(json.loads((set_dir / "models" / f"{r['model']}.json")
                                               .read_text()))
        out.append(rescore(r, model, cluster, Job.from_dict(doc["jobs"][r["model"]])))
    return out


def _fmt(f: dict) -> str:
    def pct(v):
        return "n/a" if v is None else f"{v:.2f} %"
    lines = [f"layouts run: {f['layouts_ok']}/{f['layouts']}",
             f"step time: mean {pct(f['step_mean_abs_pct'])}, max {pct(f['step_max_abs_pct'])}",
             "memory: " + ("n/a" if f["memory_ranks_within_5pct"] is None else
                           f"{100 * f['memory_ranks_within_5pct']:.0f} % of ranks within 5 %, "
                           f"max {pct(f['memory_max_abs_pct'])}")]
    for n, p in f["per_model"].items():
        sp = "n/a" if p["spearman"] is None else f"{p['spearman']:.3f}"
        lines.append(f"  {n}: Spearman {sp}, predicted best {pct(p['best_gap_pct'])} off "
                     f"the measured best, step mean {pct(p['step_mean_abs_pct'])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["calibrate", "validate", "generic", "report"])
    ap.add_argument("--set", type=Path, default=ROOT / "benchmarks" / "sets" / "transfer36")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/transfer-out")))
    ap.add_argument("--keep", type=Path, default=Path("/tmp/meshplan-keep"),
                    help="where runs and the profile stay on the machine between calls")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the call's work (default: calibrate 540, validate 470, "
                         "generic 240; a validate layout may overrun its share by its 60 s "
                         "timeout)")
    ap.add_argument("--tiny", action="store_true",
                    help="validate: shrunk models (a CPU dry run with --device cpu)")
    ap.add_argument("--micro-batches", default="1,4",
                    help="calibrate's layer-table micro-batches (the set uses 1, 2, 4, 16)")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--accuracy", type=Path, default=None, help="report: merged accuracy.json")
    ap.add_argument("--gpu", default=None, help="report: the GPU the records ran on")
    args = ap.parse_args(argv)
    if args.budget is None:
        args.budget = {"calibrate": 540.0, "validate": 470.0, "generic": 240.0}.get(args.what, 0)
    args.out.mkdir(parents=True, exist_ok=True)
    args.keep.mkdir(parents=True, exist_ok=True)
    if args.what in ("calibrate", "generic"):
        doc = load_set(args.set) if args.what == "calibrate" else None
        name = "profile.toml" if doc else "generic.toml"
        # 40 s of the budget for torchrun's start-up and the imports, which calibrate's own
        # --time-budget does not see (as benchmarks/device_accuracy.sh)
        rc = _run(calibrate_cmd(doc, args.keep / name, nproc=args.nproc,
                                budget_s=args.budget - 40, micro_batches=args.micro_batches),
                  args.out / f"{args.what}.log", timeout_s=args.budget)
        if (args.keep / name).exists():
            (args.out / name).write_text((args.keep / name).read_text())
        return rc
    if args.what == "validate":
        doc = load_set(args.set)
        if args.tiny:
            doc = tiny_set(doc, args.keep / "tiny")
        print(f"wrote {validate_set(doc, args)}")
        return 0
    if args.accuracy is None:
        ap.error("report needs --accuracy")
    doc = json.loads(args.accuracy.read_text())
    print(f"as run ({doc.get('profile') or 'datasheet'}):")
    print(_fmt(figures(doc["records"])))
    if args.profile:
        again = repredict(doc, args.profile, args.gpu or str(doc.get("gpu_name")))
        print(f"\nre-predicted on {args.profile}:")
        print(_fmt(figures(again)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
