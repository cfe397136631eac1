"""Run and score a transfer round (issue 36, item 5) with the user's commands.

The set is a directory written by ``benchmarks/draw_models.py --round`` (``set.json``,
``models/*.json``, ``layouts/*.json``). On the lent 4-GPU machine, one device call each
(docs/benchmarks/transfer.md has the exact commands of a round):

    python benchmarks/transfer_round.py calibrate --set DIR --part 1/2 --out $OUT
    python benchmarks/transfer_round.py calibrate --set DIR --part 2/2 --generic-first --out $OUT
    python benchmarks/transfer_round.py validate  --set DIR --part 1/2 --out $OUT
    python benchmarks/transfer_round.py validate  --set DIR --part 2/2 --out $OUT

``calibrate`` runs ``meshplan calibrate --nproc 4 --model A --model B ...`` with the set's
models (``--part K/N``: the models i with i % N == K - 1; its ``--time-budget`` bounds
every layer round, so the call writes its profile within the budget); ``generic`` (or
``--generic-first``) runs ``meshplan calibrate --nproc 4`` without ``--model``.
``validate`` runs ``meshplan validate --runtime torch --layout-list ...`` once per model
(each model has its own job), sharing one time budget, and writes one accuracy.json;
``--part K/N`` runs every model's layouts j with j % N == K - 1 (each layout costs
25-30 s of start-up beside its steps, so a round's 24 layouts take two calls of 12), with
each model's profile from the calibrate call that timed it (``--keep`` on the still-warm
machine, or ``--profiles DIR`` / ``--profile FILE``). A CPU dry run of the whole path with
shrunk models: ``... validate --device cpu --tiny --nproc 4 --out /tmp/t36cpu``.

Back on any machine (CPU):

    python benchmarks/transfer_round.py merge --parts A/accuracy.json B/accuracy.json --out DIR
    python benchmarks/transfer_round.py report --accuracy accuracy.json \\
        [--profile generic.toml --gpu "NVIDIA H100 80GB HBM3"]

``merge`` joins the parts' records into one accuracy.json (with .md and .png); ``report``
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
from shrink_model import SEQ_LEN as TINY_SEQ_LEN, tiny_spec  # noqa: E402

# NVLink multicast off on the lent machines (KINDS.md), as benchmarks/device_accuracy.sh
DEVICE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
              "NVSHMEM_DISABLE_NVLS": "1"}
MEMORY_GOAL_PCT = 5.0
GENERIC_TIMEOUT_S = 150.0   # the no-model calibration: ~25 s of benchmarks + start-up


def load_set(path: Path) -> dict:
    doc = json.loads((path / "set.json").read_text())
    for m in doc["models"]:
        m["model_file"] = str(path / "models" / f"{m['name']}.json")
        m["layout_file"] = str(path / "layouts" / f"{m['name']}.json")
    return doc


def parse_part(text: str | None) -> tuple[int, int] | None:
    """``--part K/N`` → (K, N): the models i with i % N == K - 1 (1-based K)."""
    if text is None:
        return None
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SystemExit(f"--part {text!r}: give K/N, e.g. 1/2") from None
    if not 1 <= k <= n:
        raise SystemExit(f"--part {text!r}: K must be between 1 and N")
    return k, n


def part_models(doc: dict, part: tuple[int, int] | None) -> list[dict]:
    if part is None:
        return doc["models"]
    k, n = part
    return [m for i, m in enumerate(doc["models"]) if i % n == k - 1]


def part_layouts(doc: dict, part: tuple[int, int] | None, where: Path) -> list[dict]:
    """Every model with, for ``part`` (K, N), only its layouts j with j % N == K - 1, each
    model's layout list rewritten to ``where`` (validate's ``--layout-list``)."""
    if part is None:
        return doc["models"]
    k, n = part
    where.mkdir(parents=True, exist_ok=True)
    out = []
    for m in doc["models"]:
        listed = json.loads(Path(m["layout_file"]).read_text())
        mine = [x for j, x in enumerate(listed) if j % n == k - 1]
        if not mine:
            continue
        path = where / f"{m['name']}.json"
        path.write_text(json.dumps(mine, indent=1) + "\n")
        out.append(dict(m, layout_file=str(path)))
    return out


def merge_parts(paths: list[Path]) -> tuple[list[dict], dict]:
    """The records of every part's accuracy.json, in the set's order, and their metadata
    (the first part's, with every part's profiles, commands and jobs). A layout in two parts
    is an error: the parts of one round are disjoint."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    sets = {d.get("set") for d in docs}
    if len(sets) != 1:
        raise SystemExit(f"merge: the parts come from different sets {sorted(map(str, sets))}")
    records, seen = [], {}
    for path, d in zip(paths, docs):
        for r in d["records"]:
            key = (r["model"], r["name"])
            if key in seen:
                raise SystemExit(f"merge: layout {r['name']} of {r['model']} is in both "
                                 f"{seen[key]} and {path}")
            seen[key] = path
            records.append(r)
    records.sort(key=lambda r: r["name"])
    meta = {k: v for k, v in docs[0].items()
            if k not in ("records", "summary", "summary_by_model", "schema", "version")}
    meta["profiles"] = {k: v for d in docs for k, v in (d.get("profiles") or {}).items()}
    meta["profile"] = ", ".join(sorted({p for p in meta["profiles"].values() if p}))
    meta["jobs"] = {k: v for d in docs for k, v in (d.get("jobs") or {}).items()}
    # each part's command once, in order (one outer command makes every part of a round)
    meta["command"] = " ; ".join(dict.fromkeys(str(d.get("command", "")) for d in docs))
    meta["parts"] = [str(p) for p in paths]
    return records, meta


def profile_name(part: tuple[int, int] | None) -> str:
    return "profile.toml" if part is None else f"profile_part{part[0]}of{part[1]}.toml"


def kept_profile(keep: Path, doc: dict, name: str) -> Path | None:
    """The profile a model was calibrated in on this machine: profile.toml, else the part's."""
    if (keep / "profile.toml").exists():
        return keep / "profile.toml"
    index = [m["name"] for m in doc["models"]].index(name)
    for f in sorted(keep.glob("profile_part*of*.toml")):
        k, n = (int(x) for x in f.stem[len("profile_part"):].split("of"))
        if index % n == k - 1:
            return f
    return None


def tiny_set(doc: dict, where: Path) -> dict:
    """The set with each model shrunk for a CPU dry run (gloo): the same layers, heads, kv
    heads, family and layouts (``shrink_model.tiny_spec``: head dim 8, ffn 2·hidden, vocab
    512, seq 64)."""
    (where / "models").mkdir(parents=True, exist_ok=True)
    for m in doc["models"]:
        model = ModelSpec.from_dict(tiny_spec(m["spec"]))
        m["model_file"] = str(where / "models" / f"{m['name']}.json")
        Path(m["model_file"]).write_text(json.dumps(model.to_dict()))
        m["job"] = dict(m["job"], seq_len=TINY_SEQ_LEN)
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


def drop_stale_profile(name: str, *dirs: Path) -> None:
    """Remove an earlier call's profile ``name`` from ``dirs`` (the kept one and its copy in
    --out) before a calibrate call writes it again: ``meshplan calibrate --out`` refuses an
    existing file, and whatever is there after the call is copied and read as this call's
    profile, so a re-run (or a call that wrote nothing) would pass the old one on."""
    for d in dirs:
        (d / name).unlink(missing_ok=True)


def calibrate_cmd(models: list[dict], out: Path, *, nproc: int, budget_s: float,
                  micro_batches: str | None, layer_grid: bool = False) -> list[str]:
    """``meshplan calibrate`` with the models (none: the generic grid, no layer tables
    unless ``layer_grid``: the stand-in shapes' layer tables, ``--layer-grid``)."""
    cmd = [sys.executable, "-m", "meshplan.cli", "calibrate", "--nproc", str(nproc),
           "--time-budget", f"{budget_s:g}", "--out", str(out)]   # progress lines: the log
    for m in models:
        cmd += ["--model", m["model_file"]]
    if layer_grid:
        cmd.append("--layer-grid")
    if (models or layer_grid) and micro_batches:
        cmd += ["--micro-batches", micro_batches]
    return cmd


def validate_cmd(m: dict, out: Path, *, profile: str | None, gpu: str, nproc: int,
                 budget_s: float, device: str, steps: int = 6, warmup: int = 2,
                 layout_timeout_s: float = 60) -> list[str]:
    job = m["job"]
    cmd = [sys.executable, "-m", "meshplan.cli", "validate", "--runtime", "torch",
           "--model", m["model_file"], "--cluster", cluster_preset(gpu),
           "--global-batch", str(job["global_batch"]), "--seq-len", str(job["seq_len"]),
           "--layout-list", m["layout_file"], "--nproc", str(nproc), "--device", device,
           "--steps", str(steps), "--warmup", str(warmup), "--timeout", f"{layout_timeout_s:g}",
           "--budget", f"{budget_s:.0f}",
           "--out", str(out), "--force"]   # its own scratch directory
    # a CPU dry run prices the GPU cluster's shape with the CPU calibration's profile
    override = ["--profile-override"] if device == "cpu" else []
    return cmd + (["--profile", profile, *override] if profile else [])


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
    part = parse_part(args.part)
    tag = "" if part is None else f"_part{part[0]}of{part[1]}"
    models = part_layouts(doc, part, args.keep / f"layouts{tag}")
    profiles = {}
    for m in models:
        kept = None if args.profile else kept_profile(args.profiles or args.keep, doc, m["name"])
        if args.profile is None and kept is None and args.device != "cpu":
            raise SystemExit(f"no --profile and no profile kept in {args.keep} for {m['name']}: "
                             f"run the calibrate call(s) on this (still warm) machine first, "
                             f"or pass the profile they wrote")
        profiles[m["name"]] = args.profile or (str(kept) if kept else None)
    t0 = time.perf_counter()
    records, failed = [], []
    for i, m in enumerate(models):
        left = args.budget - (time.perf_counter() - t0)
        share = max(0.0, left / (len(models) - i))
        d = args.keep / f"val{tag}" / m["name"]
        rc = _run(validate_cmd(m, d, profile=profiles[m["name"]], gpu=gpu, nproc=args.nproc,
                               budget_s=share, device=args.device, steps=args.steps,
                               warmup=args.warmup, layout_timeout_s=args.layout_timeout),
                  args.out / "validate.log", timeout_s=share + args.layout_timeout + 30)
        acc = d / "accuracy.json"
        if acc.exists():
            records += json.loads(acc.read_text())["records"]
        else:
            failed.append(f"{m['name']} (rc {rc})")
    meta = {"set": doc["set"], "seed": doc["seed"], "gpu_name": gpu, "nproc": args.nproc,
            "profile": ", ".join(sorted({p for p in profiles.values() if p})),
            "profiles": profiles, "device": args.device,
            "command": " ".join(["python", *sys.argv]),
            "jobs": {m["name"]: m["job"] for m in models},
            **({"part": args.part} if part else {}),
            # the caller fails the call on these once all is written (fail_if_nothing_ran)
            **({"failed": failed} if failed else {})}
    paths = write_accuracy(args.out, records, meta)
    subprocess.run(["tar", "czf", str(args.out / f"runs{tag}.tgz"), "-C", str(args.keep),
                    f"val{tag}"], check=False)
    return paths["json"]


def fail_if_nothing_ran(paths: list[Path], log: Path) -> None:
    """Exit non-zero, naming them, where a model's ``meshplan validate`` wrote nothing (it ran
    none of its layouts: a refused profile, a crash) — after every file is written."""
    failed = [f for p in paths for f in json.loads(Path(p).read_text()).get("failed", [])]
    if failed:
        raise SystemExit(f"meshplan validate ran nothing for {', '.join(failed)}: see {log}")


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


def without_corrections(names: tuple[str, ...]):
    """A cluster transform for :func:`repredict`: these named corrections switched off
    (``Estimate.corrections`` names)."""
    from dataclasses import replace

    def adjust(cluster):
        numbers = cluster.gpu.corrections
        for name in names:
            numbers = numbers.without(name)
        return replace(cluster, gpu=replace(cluster.gpu, corrections=numbers))
    return adjust


def repredict(doc: dict, profile: str | None, gpu: str, *, leave_out: bool = False,
              adjust=None) -> list[dict]:
    """Every record re-predicted on ``profile`` (models and jobs from the accuracy file);
    ``profile=None``: each model on the profile it was validated with (the file's
    ``profiles``, e.g. each part's calibration in a merged round).
    ``leave_out``: each model on the profile less its own layer shape's rows — a calibration
    that timed the round's other models but not this one (the nearest-shape transfer).
    ``adjust``: a function of the profiled cluster returning the one to price on (e.g.
    :func:`without_corrections`)."""
    from transfer_analysis import without_own_rows
    nproc = int(doc.get("nproc") or 4)
    clusters: dict[str, Cluster] = {}

    def cluster_for(model_name: str) -> Cluster:
        path = profile or (doc.get("profiles") or {}).get(model_name)
        if not path:
            raise SystemExit(f"re-predict: no profile recorded for {model_name!r} in the "
                             f"accuracy file; give --profile PROFILE.toml")
        if not Path(path).exists() and (ROOT / path).exists():
            path = str(ROOT / path)
        if path not in clusters:
            cluster = apply_profile(Cluster.preset(cluster_preset(gpu), nodes=1,
                                                   gpus_per_node=nproc), path)
            clusters[path] = adjust(cluster) if adjust is not None else cluster
        return clusters[path]

    set_dir = ROOT / "benchmarks" / "sets" / str(doc["set"])
    out = []
    for r in doc["records"]:
        model = ModelSpec.from_dict(json.loads((set_dir / "models" / f"{r['model']}.json")
                                               .read_text()))
        cluster = cluster_for(r["model"])
        here = without_own_rows(cluster, model) if leave_out else cluster
        out.append(rescore(r, model, here, Job.from_dict(doc["jobs"][r["model"]])))
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


def _per_layout(records: list[dict], again: list[dict] | None) -> str:
    """One line a layout: name, layout, model, step-time error as run (→ re-predicted)."""
    def err(r):
        e = r.get("step_time_error_pct")
        return "n/a" if e is None else f"{e:+.1f} %"
    lines = []
    for i, r in enumerate(records):
        tail = f" → {err(again[i])}" if again is not None else ""
        lines.append(f"{r['name']:>5}  {r.get('short', ''):<52} {r['model']:<28} {err(r)}{tail}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["calibrate", "validate", "generic", "merge", "report"])
    ap.add_argument("--set", type=Path, default=ROOT / "benchmarks" / "sets" / "transfer36")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/transfer-out")))
    ap.add_argument("--keep", type=Path, default=Path("/tmp/meshplan-keep"),
                    help="where runs and the profile stay on the machine between calls")
    ap.add_argument("--nproc", type=int, default=None,
                    help="ranks (default: the set's own, 4 for sets drawn before it was kept)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the call's work (default: calibrate 540, validate 470, "
                         "generic 240; a validate layout may overrun its share by its 60 s "
                         "timeout)")
    ap.add_argument("--steps", type=int, default=6, help="validate: timed steps per layout")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layout-timeout", type=float, default=60.0,
                    help="validate: seconds per layout")
    ap.add_argument("--part", default=None, metavar="K/N",
                    help="calibrate: only the models i with i %% N == K-1 (one profile per "
                         "part, profile_partKofN.toml); validate: every model's layouts j "
                         "with j %% N == K-1, each model with the profile of the calibrate "
                         "part that timed it")
    ap.add_argument("--parts", type=Path, nargs="+", default=None,
                    help="merge: the parts' accuracy.json files")
    ap.add_argument("--profiles", type=Path, default=None,
                    help="validate: a directory holding profile.toml or the parts' profiles "
                         "(default: --keep, where the calibrate calls left them)")
    ap.add_argument("--generic-first", action="store_true",
                    help="calibrate: run the no-model calibration first in the same call")
    ap.add_argument("--layer-grid", action="store_true",
                    help="generic: also time calibrate's stand-in layer shapes "
                         "(meshplan calibrate --layer-grid), untimed by the time cap below")
    ap.add_argument("--tiny", action="store_true",
                    help="validate: shrunk models (a CPU dry run with --device cpu)")
    ap.add_argument("--micro-batches", default="1,4,16",
                    help="calibrate's layer-table micro-batches (transfer36 runs 1, 2, 4 and "
                         "16; FSDP rows take the two smallest) [%(default)s]")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--accuracy", type=Path, default=None, help="report: merged accuracy.json")
    ap.add_argument("--gpu", default=None, help="report: the GPU the records ran on")
    ap.add_argument("--without", action="append", default=[], metavar="CORRECTION",
                    help="report: re-predict on --profile with this named correction switched "
                         "off (e.g. sustained_clock; repeatable)")
    ap.add_argument("--leave-out", action="store_true",
                    help="report: re-predict each model on --profile less its own layer rows "
                         "(a calibration that timed the other models only)")
    ap.add_argument("--per-layout", action="store_true",
                    help="report: also each layout's step-time error (as run, and re-predicted "
                         "where the report re-predicts)")
    args = ap.parse_args(argv)
    if args.budget is None:
        args.budget = {"calibrate": 540.0, "validate": 470.0, "generic": 150.0}.get(args.what, 0)
    if args.what == "merge":
        if not args.parts:
            ap.error("merge needs --parts A/accuracy.json B/accuracy.json ...")
        records, meta = merge_parts(args.parts)
        args.out.mkdir(parents=True, exist_ok=True)
        print(f"wrote {write_accuracy(args.out, records, meta)['json']} "
              f"({len(records)} layouts from {len(args.parts)} parts)")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    args.keep.mkdir(parents=True, exist_ok=True)
    if args.nproc is None and args.what != "report":
        args.nproc = int(load_set(args.set).get("nproc") or 4)
    if args.what in ("calibrate", "generic"):
        t0 = time.perf_counter()
        jobs = []
        if args.what == "generic" or args.generic_first:
            jobs.append(([], "generic.toml", "generic.log",
                         None if args.layer_grid else GENERIC_TIMEOUT_S))
        if args.what == "calibrate":
            part = parse_part(args.part)
            jobs.append((part_models(load_set(args.set), part), profile_name(part),
                         "calibrate.log", None))
        rc = 0
        for models, name, log, cap in jobs:
            left = args.budget - (time.perf_counter() - t0)
            limit = min(left, cap) if cap else left
            drop_stale_profile(name, args.keep, args.out)
            # calibrate's --time-budget counts torchrun's start-up (launch time); 25 s
            # for writing, tearing down and the last row's overrun
            rc = _run(calibrate_cmd(models, args.keep / name, nproc=args.nproc,
                                    budget_s=max(limit - 25, 30),
                                    micro_batches=args.micro_batches,
                                    layer_grid=args.layer_grid and not models),
                      args.out / log, timeout_s=limit) or rc
            if (args.keep / name).exists():
                (args.out / name).write_text((args.keep / name).read_text())
        return rc
    if args.what == "validate":
        doc = load_set(args.set)
        if args.tiny:
            doc = tiny_set(doc, args.keep / "tiny")
        path = validate_set(doc, args)
        print(f"wrote {path}")
        fail_if_nothing_ran([path], args.out / "validate.log")
        return 0
    if args.accuracy is None:
        ap.error("report needs --accuracy")
    from meshplan.costmodel.registry import all_corrections
    known = sorted(c.name for c in all_corrections())
    bad = [n for n in args.without if n not in known]
    if bad:
        ap.error(f"--without {bad}: not a named correction; known: {', '.join(known)}")
    doc = json.loads(args.accuracy.read_text())
    print(f"as run ({doc.get('profile') or 'datasheet'}):")
    print(_fmt(figures(doc["records"])))
    if args.profile or args.leave_out or args.without:
        again = repredict(doc, args.profile, args.gpu or str(doc.get("gpu_name")),
                          leave_out=args.leave_out,
                          adjust=without_corrections(tuple(args.without)) if args.without
                          else None)
        print(f"\nre-predicted on {args.profile or 'the profiles it was validated with'}"
              f"{', each model without its own rows' if args.leave_out else ''}"
              f"{', without ' + ', '.join(args.without) if args.without else ''}:")
        print(_fmt(figures(again)))
    else:
        again = None
    if args.per_layout:
        print()
        print(_per_layout(doc["records"], again))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
