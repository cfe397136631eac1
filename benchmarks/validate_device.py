"""Predicted vs measured step time and memory of a layout set on the local GPUs.

Runs one set of ``benchmarks/sets/layout_sets.toml`` (``--set``; models in
``sets/models.toml``) — 16 layouts of a GPT-style ≈ 0.54 B and a Llama-style ≈ 1.64 B model
on 4 GPUs (2 for the 2-GPU sets) over dp/pp/tp, all four schedules, ZeRO 0-3, the three
recompute modes and sequence parallelism — each with the executor (``torchrun -m
meshplan.executor.run``, one after another under ``--budget``), and writes
``accuracy.json`` (every record: layout, prediction, measurement, errors),
``accuracy.md`` and ``accuracy.png`` (predicted vs measured) into ``--out``. No ortools
needed: plans come from Layouts and ``meshplan.costmodel.estimate``. The GPU protocol
(calibrate, then validate, on one machine) is ``benchmarks/device_accuracy.sh``;
docs/benchmarks/accuracy.md has the results.

    # on the GPU machine, after `meshplan calibrate --nproc 4 --out profile.toml`:
    python benchmarks/validate_device.py --profile profile.toml --set holdout25 --out $OUT
    # the script itself on CPU (tiny models, 2 gloo ranks):
    python benchmarks/validate_device.py --device cpu --out /tmp/val
    # no runs: join two runs of one set (each layout by the median of its runs)
    python benchmarks/validate_device.py --merge a/accuracy.json,b/accuracy.json --median --out m
    # no runs: re-predict a run's records with the current model and a profile
    python benchmarks/validate_device.py --repredict accuracy.json --profile p.toml --out r
    # the two GPU models as ModelSpec JSON, for `meshplan calibrate --model`
    python benchmarks/validate_device.py --write-models models/
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from meshplan.calibrate.validate import (ValidateOptions, bound_split_text, by_model,  # noqa: E402
                                         merge_runs, rescore, run_layouts, summarize,
                                         write_accuracy)
from meshplan.spec import Job  # noqa: E402
from meshplan.executor.affinity import AFFINITY_MODES  # noqa: E402
from meshplan.executor.gc_control import GC_MODES  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402

from layout_sets import (CPU_JOB, GPT_05B, JOB, JOB4, LLAMA_16B, SET_JOBS,  # noqa: E402,F401
                         SET_NPROC, SETS, TINY_GPT, TINY_LLAMA)
from layout_sets import gpu_cluster as _gpu_cluster  # noqa: E402


def cpu_scaled_profile(profile: Path, factor: float, out_dir: Path) -> Path:
    """A copy of ``profile`` in ``out_dir`` whose measured CPU dispatch times — every
    ``*_cpu*_s`` field of its ``[[layers]]`` and ``[[ends]]`` rows — are ``factor`` times
    the calibrated ones (the GPU times, synchronized timings and fixed overheads stay)."""
    import tomllib

    from meshplan.calibrate.tomlfile import dumps, write_text_atomic
    if not factor > 0:
        raise SystemExit(f"CPU scale {factor!r}: must be > 0")
    doc = tomllib.loads(Path(profile).read_text())
    for table in ("layers", "ends"):
        for row in doc.get(table, []):
            for k, v in row.items():
                if "_cpu" in k and k.endswith("_s") and isinstance(v, (int, float)):
                    row[k] = v * factor
    doc.setdefault("provenance", {})["cpu_scaled_by"] = factor
    return write_text_atomic(out_dir / f"{Path(profile).stem}_cpu_x{factor:.3f}.toml",
                             dumps(doc))


def probe_ratio(record: dict, profile_probe_us: list[float]) -> float:
    """The host's dispatch speed during a measured run relative to its calibration: the
    mean of the run's per-rank host probes over the mean of the profile's (its provenance
    ``host_probe_us``). Both must be recorded (executor and calibrate since round 13)."""
    run = [v for v in record.get("measured", {}).get("host_probe_us_per_rank") or []
           if isinstance(v, (int, float)) and v > 0]
    if not run:
        raise SystemExit(f"--cpu-scale-by-probe: record {record.get('name')!r} has no host "
                         f"probe (measured.host_probe_us_per_rank; runs before round 13 "
                         f"did not record one)")
    if not profile_probe_us:
        raise SystemExit("--cpu-scale-by-probe: the profile's provenance has no host_probe_us "
                         "(profiles calibrated before round 13 did not record one)")
    return (sum(run) / len(run)) / (sum(profile_probe_us) / len(profile_probe_us))


def repredict(args) -> int:
    """Re-predict measured records (``--repredict accuracy.json``) and write a new report;
    with ``--cpu-scale-by-probe`` each record's CPU dispatch times are scaled by its run's
    host probe over the calibration's (:func:`probe_ratio`), a post-hoc test of whether the
    host's speed at run time explains the host-bound misses."""
    doc = json.loads(args.repredict.read_text())
    cluster = _gpu_cluster(str(doc.get("gpu_name")), int(doc.get("nproc") or 4))
    base = cluster
    if args.profile:
        cluster = apply_profile(cluster, args.profile)
    models = {m.name: m for m in (GPT_05B, LLAMA_16B, TINY_GPT, TINY_LLAMA)}
    job = (Job.from_dict(doc["job"]) if doc.get("job")
           else JOB if doc.get("device") == "cuda" else CPU_JOB)
    if args.cpu_scale_by_probe:
        if not args.profile:
            raise SystemExit("--cpu-scale-by-probe needs --profile (the calibrated CPU times)")
        import tomllib
        prov = tomllib.loads(Path(args.profile).read_text()).get("provenance", {})
        args.out.mkdir(parents=True, exist_ok=True)
        records = []
        for r in doc["records"]:
            if r.get("status") != "ok":
                records.append(rescore(r, models[r["model"]], cluster, job))
                continue
            ratio = probe_ratio(r, list(prov.get("host_probe_us") or []))
            scaled = apply_profile(base, cpu_scaled_profile(Path(args.profile), ratio, args.out))
            records.append({**rescore(r, models[r["model"]], scaled, job), "cpu_scale": ratio})
    else:
        records = [rescore(r, models[r["model"]], cluster, job) for r in doc["records"]]
    meta = {k: doc.get(k) for k in ("date", "machine", "device", "gpu_name", "torch", "cluster",
                                    "nproc")}
    meta.update(profile=args.profile or "datasheet", gpu_profile=cluster.gpu.provenance,
                job=job.to_dict(), command=" ".join(["python", *sys.argv]),
                measured_by=doc.get("command"), repredicted_from=str(args.repredict))
    paths = write_accuracy(args.out, records, meta)
    _print_summary(records, paths)
    return 0


MERGE_KEYS = ("gpu_name", "nproc", "job", "profile", "device")


def merge(args) -> int:
    """Join the records of several runs of one set (``--merge a.json,b.json``) into one
    report, each record with the prediction it was run with. The runs must agree on the GPU,
    rank count, job, profile and device; a layout measured twice keeps the later file's, or
    with ``--median`` is measured by the median of all its runs (``merge_runs``, as
    ``--repeats`` does within one call: for repeats that do not fit one 10-minute call)."""
    paths = [Path(f) for f in args.merge.split(",")]
    docs = [json.loads(f.read_text()) for f in paths]
    for f, d in zip(paths[1:], docs[1:]):
        differ = [k for k in MERGE_KEYS if d.get(k) != docs[0].get(k)]
        if differ:
            raise SystemExit(f"--merge: {f} differs from {paths[0]} in "
                             + ", ".join(f"{k} ({d.get(k)!r} vs {docs[0].get(k)!r})"
                                         for k in differ))
    records = {}
    if args.median:
        by_name: dict[str, list[dict]] = {}
        for d in docs:
            for r in d["records"]:
                by_name.setdefault(r["name"], []).append(r)
        records = {n: merge_runs(rs) for n, rs in by_name.items()}
    else:
        for d in docs:
            records.update({r["name"]: r for r in d["records"]})
    meta = {k: docs[-1].get(k) for k in ("date", "machine", *MERGE_KEYS, "cluster", "torch",
                                         "gpu_profile")}
    meta.update(merged_from=[str(f) for f in paths],
                commands=[d.get("command") for d in docs],
                command=" ".join(["python", *sys.argv]))
    out = write_accuracy(args.out, [records[k] for k in sorted(records)], meta)
    _print_summary([records[k] for k in sorted(records)], out)
    return 0


def _print_summary(records, paths) -> None:
    for model_name, s in by_model(records).items():
        print(f"{model_name}: {s.get('ok', 0)}/{s['layouts']} ok; step-time mean abs err "
              f"{s.get('step_time_mean_abs_error_pct', float('nan')):.2f}%, max "
              f"{s.get('step_time_max_abs_error_pct', float('nan')):.2f}%, memory mean "
              f"{s.get('memory_mean_abs_error_pct', float('nan')):.1f}% max "
              f"{s.get('memory_max_abs_error_pct', float('nan')):.1f}%, Spearman "
              f"{s.get('spearman')}, best={s.get('predicted_best_is_measured_best')} "
              f"gap {s.get('predicted_best_gap_pct', float('nan')):.1f}%")
    for r in records:
        if r.get("status") == "ok":
            mem = r.get("memory_error_pct_per_rank") or []
            print(f"  {r['name']} {r['short']}: pred {r['predicted']['step_time_s']:.4f} meas "
                  f"{r['measured']['step_time_s']:.4f} ({r['step_time_error_pct']:+.1f}%) mem "
                  + " ".join(f"{e:+.0f}" for e in mem)
                  + (f" CPU {r['predicted']['host_load']:.2f}"
                     if r["predicted"].get("host_load") else ""))
    s = summarize(records)
    split = bound_split_text(s)
    print(f"all: {s.get('ok', 0)}/{s['layouts']} ok; step mean "
          f"{s.get('step_time_mean_abs_error_pct', float('nan')):.2f}% max "
          f"{s.get('step_time_max_abs_error_pct', float('nan')):.2f}%"
          f"{f' ({split})' if split else ''}; wrote "
          f"{', '.join(str(v) for v in paths.values())}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="directory for accuracy.{json,md,png} (required "
                                          "unless --write-models)")
    p.add_argument("--profile", default=None, help="calibrated profile from `meshplan calibrate`")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=float, default=90.0, help="seconds per layout")
    p.add_argument("--budget", type=float, default=400.0,
                   help="seconds for all layouts (7-minute device limit with margin)")
    p.add_argument("--only", default=None, help="comma-separated layout names to run")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per layout, in rounds over the set; each measured by the median "
                        "of its runs (meshplan.calibrate.validate.merge_runs) [1]")
    p.add_argument("--cpu-affinity", default="none", choices=AFFINITY_MODES,
                   help="the executor's --cpu-affinity: split pins each rank to its own "
                        "physical cores [none]")
    p.add_argument("--gc", default="manual", choices=GC_MODES,
                   help="the executor's --gc: manual collects Python garbage only every "
                        "50 steps, auto leaves CPython's collector on [manual]")
    p.add_argument("--block-marks", action="store_true",
                   help="the executor's --block-marks: also time each transformer block's "
                        "forward and backward (pp = 1 layouts; diagnostics: "
                        "benchmarks/step_phases.py --blocks; the marks cost a little, so the "
                        "step times are not for accuracy)")
    p.add_argument("--trace", action="store_true",
                   help="record a torch.profiler trace of 3 measured steps per layout into "
                        "OUT/NAME/trace (diagnostics: benchmarks/trace_overlap.py; the traced "
                        "steps are slower, so the step times are not for accuracy)")
    p.add_argument("--set", default="test", choices=sorted(k for k in SETS if k != "cpu"),
                   help="the GPU layout set (benchmarks/sets/layout_sets.toml, where each "
                        "set's design is written above it; 'all' = rounds 1-3's sets) [test]")
    p.add_argument("--write-models", default=None, type=Path, metavar="DIR",
                   help="write the two GPU models as ModelSpec JSON files into DIR (for "
                        "`meshplan calibrate --model DIR/NAME.json`) and exit")
    p.add_argument("--cpu-scale-by-probe", action="store_true",
                   help="with --repredict and --profile: scale each record's calibrated CPU "
                        "dispatch times by its run's host probe over the calibration's "
                        "(post hoc: does the host's speed explain host-bound misses?)")
    p.add_argument("--repredict", default=None, type=Path, metavar="ACCURACY_JSON",
                   help="no runs: recompute the predictions of the measured records in this "
                        "accuracy.json with the current cost model and --profile")
    p.add_argument("--median", action="store_true",
                   help="with --merge: a layout in several files is measured by the median of "
                        "its runs, not the later file's run")
    p.add_argument("--merge", default=None, metavar="A.json,B.json",
                   help="no runs: join the records of several runs of one set (same GPU, "
                        "rank count, job and profile) into one report, as run")
    args = p.parse_args(argv)
    if args.write_models:
        args.write_models.mkdir(parents=True, exist_ok=True)
        for m in (GPT_05B, LLAMA_16B):
            (args.write_models / f"{m.name}.json").write_text(json.dumps(m.to_dict(), indent=2))
            print(args.write_models / f"{m.name}.json")
        return 0
    if args.out is None:
        p.error("--out is required")
    if args.median and not args.merge:
        p.error("--median combines the runs of --merge: give --merge A.json,B.json")
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.trace and args.repeats > 1:
        p.error("--trace records one run per layout: leave --repeats at 1")
    if args.trace and args.steps < 3:
        p.error(f"--trace records 3 measured steps: --steps must be >= 3, got {args.steps}")
    if args.repredict:
        return repredict(args)
    if args.merge:
        return merge(args)

    if args.device == "cuda":
        import torch
        name = torch.cuda.get_device_name(0)
        nproc = SET_NPROC.get(args.set, 4)
        cluster = _gpu_cluster(name, nproc)
        entries, job, torch_version = SETS[args.set], SET_JOBS.get(args.set, JOB), \
            torch.__version__
    else:
        import torch
        name, cluster = platform.machine(), Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
        nproc = 2
        entries, job, torch_version = SETS["cpu"], CPU_JOB, torch.__version__
    if args.profile:
        cluster = apply_profile(cluster, args.profile, override=args.device == "cpu")
    if args.only:
        keep = set(args.only.split(","))
        entries = [e for e in entries if e[0] in keep]
    opts = ValidateOptions(out_dir=args.out, nproc=nproc,
                           device=args.device, steps=args.steps, warmup=args.warmup,
                           timeout_s=args.timeout, budget_s=args.budget, repeats=args.repeats,
                           trace=args.trace,
                           extra_args=("--cpu-affinity", args.cpu_affinity, "--gc", args.gc)
                           + (("--block-marks",) if args.block_marks else ()))
    t0 = time.perf_counter()
    records = run_layouts([m for _, m, _ in entries], cluster, job,
                          [lay for _, _, lay in entries], opts, names=[n for n, _, _ in entries])
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": socket.gethostname(), "device": args.device, "gpu_name": name,
            "torch": torch_version, "cluster": f"{cluster.name} ({cluster.gpus_per_node} GPUs)",
            "profile": args.profile or "datasheet", "gpu_profile": cluster.gpu.provenance,
            "job": job.to_dict(), "nproc": nproc, "command": " ".join(["python", *sys.argv]),
            "wall_s": time.perf_counter() - t0}
    paths = write_accuracy(args.out, records, meta)
    _print_summary(records, paths)
    return 0 if summarize(records).get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
