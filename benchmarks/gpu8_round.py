"""Run issue 42's 8-GPU accuracy round with the user's commands (the device calls of
docs/benchmarks/gpu8.md), and check what a calibration at 8 ranks measured.

The set is ``benchmarks/sets/gpu8_42`` (``gpu8_draw.py``): two models, each calibrated in
its own call at the micro-batch sizes the set stores for it, then its 8 layouts in another::

    python benchmarks/gpu8_round.py calibrate --part 1/2 --out $OUT   # GPT 4.78 B
    python benchmarks/gpu8_round.py validate --part 1/2 --out $OUT
    python benchmarks/gpu8_round.py calibrate --part 2/2 --out $OUT   # Llama 5.44 B
    python benchmarks/gpu8_round.py validate --part 2/2 --out $OUT
    python benchmarks/gpu8_round.py merge A/accuracy.json B/accuracy.json --out DIR  # CPU

``calibrate`` runs ``meshplan calibrate --nproc 8 --model M --micro-batches A,B --rounds 1
--time-budget ...`` (its progress kept: the first per-row timings at 8 ranks; the budget
stops the layer tables row by row, plain rows and ends first, so the call writes its
profile) and prints :func:`summary` of the profile it wrote; ``validate`` runs ``meshplan validate --runtime
torch --layout-list ...`` once per model (``transfer_round.validate_set``: each model its own
job and the profile of its own calibration part, kept in ``--keep`` on the warm machine or
passed with ``--profiles DIR``), ``--only NAMES`` for some layouts; ``merge A.json B.json``
joins a call's records with those of a later ``--only`` call. Scoring, on any machine:
``python benchmarks/transfer_round.py report --accuracy accuracy.json``.

CPU dry runs at 8 gloo ranks (shrunk models: ``transfer_round.tiny_set``)::

    python benchmarks/gpu8_round.py calibrate --device cpu --tiny --part 2/2 \\
        --micro-batches 1 --budget 1200 --out /tmp/g8c
    python benchmarks/gpu8_round.py validate --device cpu --tiny --only g04,g09,g16 \\
        --steps 1 --warmup 1 --layout-timeout 600 --budget 3000 --out /tmp/g8v
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import transfer_round as tr  # noqa: E402

NPROC = 8
SET = ROOT / "benchmarks" / "sets" / "gpu8_42"
START_S = 25     # writing and tear-down: calibrate's --time-budget counts from its launch


def part_micro_batches(models: list[dict]) -> str:
    """The sizes the part's models store (``calibrate_micro_batches``), as one list."""
    return ",".join(str(m) for m in sorted({mb for m in models
                                             for mb in m["calibrate_micro_batches"]}))


def calibrate_cmd(models: list[dict], out: Path, *, budget_s: float, rounds: int,
                  device: str, quick: bool, micro_batches: str | None = None) -> list[str]:
    """``meshplan calibrate --nproc 8`` for ``models``, with its progress output."""
    cmd = tr.calibrate_cmd(models, out, nproc=NPROC, budget_s=budget_s,
                           micro_batches=micro_batches or part_micro_batches(models))
    cmd += ["--rounds", str(rounds), "--device", device] + (["--quick"] if quick else [])
    return cmd


def summary(profile: Path) -> dict:
    """What a calibration measured, by what 8 ranks add: layer rows per (tp, sp), FSDP
    rows per (zero, dp, tp), end rows, collectives per group size, the pipeline action's
    pp and the world size."""
    doc = tomllib.loads(profile.read_text())
    layers = doc.get("layers", [])
    meas = doc.get("measurements", {})
    return {
        "world_size": doc.get("provenance", {}).get("world_size"),
        "layer_rounds": doc.get("provenance", {}).get("layer_rounds"),
        "plain_rows_by_tp": dict(sorted(Counter(
            f"tp{r['tp']}{' sp' if r['sequence_parallel'] else ''}" for r in layers
            if not r["zero"]).items())),
        "fsdp_rows_by_zero_dp_tp": dict(sorted(Counter(
            f"z{r['zero']} dp{r['dp']} tp{r['tp']}" for r in layers if r["zero"]).items())),
        "end_rows": len(doc.get("ends", [])),
        "collective_group_sizes": sorted({r["group_size"] for r in meas.get("collectives", [])}),
        "pipeline_pp": [r.get("pp") for r in meas.get("pipeline", [])],
    }


def _log_clean(raw: Path, log: Path) -> None:
    """The progress bar's carriage returns as lines, the last 2000 kept (as
    device_accuracy.sh)."""
    if raw.exists():
        lines = [x for x in raw.read_text(errors="replace").replace("\r", "\n").splitlines()
                 if x.strip()]
        with open(log, "a") as fh:
            fh.write("\n".join(lines[-2000:]) + "\n")
        raw.unlink()


def host_info(path: Path) -> None:
    """The GPUs, their links and the host's CPU (host-bound layouts depend on it), as
    device_accuracy.sh records them."""
    with open(path, "w") as fh:
        for cmd in (["nvidia-smi", "-L"], ["nvidia-smi", "topo", "-m"], ["lscpu"],
                    [sys.executable, "-c", "import torch; print('torch', torch.__version__, "
                     "'cuda', torch.version.cuda)"]):
            try:
                fh.write(subprocess.run(cmd, capture_output=True, text=True,
                                        timeout=30).stdout + "\n")
            except (OSError, subprocess.TimeoutExpired) as exc:
                fh.write(f"{cmd[0]}: {exc}\n")


def calibrate(args) -> int:
    host_info(args.out / "host.txt")
    doc = tr.load_set(args.set)
    if args.tiny:
        doc = tr.tiny_set(doc, args.keep / "tiny")
    part = tr.parse_part(args.part)
    models = tr.part_models(doc, part)
    name = tr.profile_name(part)
    raw = args.out / "calibrate.raw"
    tr.drop_stale_profile(name, args.keep, args.out)     # a re-run's profile is its own
    t0 = time.perf_counter()
    rc = tr._run(calibrate_cmd(models, args.keep / name, budget_s=max(args.budget - START_S, 30),
                               rounds=args.rounds, device=args.device, quick=args.tiny,
                               micro_batches=args.micro_batches),
                 raw, timeout_s=args.budget)
    _log_clean(raw, args.out / "calibrate.log")
    wall = time.perf_counter() - t0
    if not (args.keep / name).exists():
        print(f"calibrate: no profile after {wall:.0f} s (rc {rc}); see calibrate.log")
        return rc or 1
    (args.out / name).write_text((args.keep / name).read_text())
    s = summary(args.keep / name)
    (args.out / "calibrate_summary.json").write_text(json.dumps(dict(s, wall_s=wall), indent=1))
    print(f"calibrate {', '.join(m['name'] for m in models)}: {wall:.0f} s, rc {rc}\n"
          + json.dumps(s, indent=1))
    return rc


def only_layouts(doc: dict, names: set[str], where: Path) -> dict:
    """The set with each model's layout list cut to ``names`` (models left without one are
    dropped); unknown names are an error that lists the set's."""
    known = {x["name"] for m in doc["models"] for x in m["layouts"]}
    if names - known:
        raise SystemExit(f"--only {','.join(sorted(names - known))}: not in the set "
                         f"({', '.join(sorted(known))})")
    where.mkdir(parents=True, exist_ok=True)
    kept = []
    for m in doc["models"]:
        listed = [x for x in json.loads(Path(m["layout_file"]).read_text())
                  if x["name"] in names]
        if listed:
            m["layout_file"] = str(where / f"{m['name']}.json")
            Path(m["layout_file"]).write_text(json.dumps(listed, indent=1))
            kept.append(m)
    return dict(doc, models=kept)


def validate(args) -> int:
    """``transfer_round.validate_set`` once per model of ``--part`` (and ``--only``), each on
    the profile of that model's calibration part — looked up in the whole set, so that a
    cut of the set cannot hand a model another part's profile — sharing ``--budget``; one
    accuracy.json, validate.log and runs.tgz in ``--out``."""
    full = tr.load_set(args.set)
    if args.tiny:
        full = tr.tiny_set(full, args.keep / "tiny")
    models = tr.part_models(full, tr.parse_part(args.part))
    if args.only:
        models = only_layouts(dict(full, models=models), set(args.only.split(",")),
                              args.keep / "only")["models"]
    t0, done = time.perf_counter(), []
    for i, m in enumerate(models):
        profile = args.profile or tr.kept_profile(args.profiles or args.keep, full, m["name"])
        if profile is None and args.device != "cpu":
            raise SystemExit(f"no --profile and no profile of {m['name']}'s part in "
                             f"{args.profiles or args.keep}: run its calibrate call on this "
                             f"(still warm) machine first, or pass --profiles DIR")
        left = args.budget - (time.perf_counter() - t0)
        one = argparse.Namespace(**dict(vars(args), nproc=NPROC, part=None,
                                  profile=str(profile) if profile else None,
                                  out=args.keep / "parts" / m["name"],
                                  budget=max(0.0, left / (len(models) - i))))
        one.out.mkdir(parents=True, exist_ok=True)
        done.append(tr.validate_set(dict(full, models=[m]), one))
        with open(args.out / "validate.log", "a") as fh:
            fh.write((one.out / "validate.log").read_text(errors="replace"))
    print(f"wrote {merge(done, args.out)}")
    if (args.keep / "val").is_dir():
        subprocess.run(["tar", "czf", str(args.out / "runs.tgz"), "-C", str(args.keep), "val"],
                       check=False)
    tr.fail_if_nothing_ran(done, args.out / "validate.log")
    return 0


def merge(paths: list[Path], out: Path) -> Path:
    """One accuracy.json of several validate calls (``transfer_round.merge_parts``), where a
    later call (``--only``) may run what an earlier one skipped for its budget: a skipped
    record gives way to the later file's record of that layout."""
    from meshplan.calibrate.validate import write_accuracy
    docs = [json.loads(p.read_text()) for p in paths]
    if len({(d.get("set"), d.get("gpu_name"), d.get("nproc")) for d in docs}) > 1:
        raise SystemExit("merge: the files differ in set, GPU or rank count")
    ran_later = [{(r["model"], r["name"]) for d in docs[i + 1:] for r in d["records"]}
                 for i in range(len(docs))]
    out.mkdir(parents=True, exist_ok=True)
    kept = []
    for i, (p, d) in enumerate(zip(paths, docs)):
        d["records"] = [r for r in d["records"] if r.get("status") != "skipped"
                        or (r["model"], r["name"]) not in ran_later[i]]
        kept.append(out / f"merge_input{i}.json")
        kept[-1].write_text(json.dumps(d))
    records, meta = tr.merge_parts(kept)
    for f in kept:
        f.unlink()
    meta["parts"] = [str(p) for p in paths]
    return write_accuracy(out, records, meta)["json"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["calibrate", "validate", "summary", "merge"])
    ap.add_argument("--set", type=Path, default=SET)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu8-out")))
    ap.add_argument("--keep", type=Path, default=Path("/tmp/meshplan-keep"),
                    help="where runs and profiles stay on the machine between calls")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true",
                    help="shrunk models (a CPU dry run; calibrate also --quick)")
    ap.add_argument("--part", default=None, metavar="K/N",
                    help="the models i with i %% N == K-1 (calibrate: profile_partKofN.toml)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the call's work (calibrate 540: the layer rows stop "
                         "there, less 40 s of start-up; validate 420: later layouts are "
                         "skipped once spent, one may overrun by its --layout-timeout)")
    ap.add_argument("--rounds", type=int, default=1, help="calibrate: layer-table rounds")
    ap.add_argument("--micro-batches", default=None, metavar="N,N",
                    help="calibrate: instead of the sizes the set stores for the part's models")
    ap.add_argument("--only", default=None, metavar="NAMES", help="validate: these layouts")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layout-timeout", type=float, default=75.0)
    ap.add_argument("--profile", default=None, help="validate: one profile for every model")
    ap.add_argument("--profiles", type=Path, default=None,
                    help="validate: a directory holding the parts' profiles (default --keep)")
    ap.add_argument("files", nargs="*", type=Path,
                    help="summary: a profile TOML; merge: accuracy.json files, first call first")
    args = ap.parse_args(argv)
    if args.what == "merge":
        if len(args.files) < 2:
            ap.error("merge needs two accuracy.json files or more")
        args.out.mkdir(parents=True, exist_ok=True)
        print(f"wrote {merge(args.files, args.out)}")
        return 0
    if args.what == "summary":
        if len(args.files) != 1:
            ap.error("summary needs one profile file")
        print(json.dumps(summary(args.files[0]), indent=1))
        return 0
    if args.budget is None:
        args.budget = {"calibrate": 540.0, "validate": 420.0}[args.what]
    args.out.mkdir(parents=True, exist_ok=True)
    args.keep.mkdir(parents=True, exist_ok=True)
    return calibrate(args) if args.what == "calibrate" else validate(args)


if __name__ == "__main__":
    raise SystemExit(main())
