"""Re-predict a transfer round with GPU-alone compute curves (the `--queued-microbench`
keys): the round's profiles copied with the ``[gpu]`` curves of a
``queued_microbench_gpu.py`` run swapped in and ``microbench_timing = "queued"`` set, then
``transfer_round.py report`` on each — own profiles, leave-out and every generic profile of
the round — beside the same reports on the profiles as they are.

    python benchmarks/queued_repredict.py --round 45 --qmb OUT/qmb/queued_microbench.json
    python benchmarks/queued_repredict.py --round 43 \\
        --qmb docs/benchmarks/data/queued_microbench_h200_20261129_branch.json

Post hoc by construction (the runs are known); docs/calibrate.md "Compute microbenchmarks"
says what the queued keys change and why the default waits for this comparison.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEYS = ("gemm_efficiency", "attention_efficiency", "hbm_efficiency", "membound_efficiency")


def queued_profiles(round_dir: Path, qmb: dict, out: Path) -> dict[str, Path]:
    """Each profile of ``round_dir`` with the queued keys of ``qmb`` swapped in."""
    from meshplan.calibrate.tomlfile import dumps
    keys = qmb["modes"]["queued"]["gpu"]
    if not keys:
        raise SystemExit("queued_repredict: the microbenchmark file has no queued [gpu] keys "
                         "(a CPU run?)")
    made = {}
    for p in sorted(round_dir.glob("*.toml")):
        doc = tomllib.loads(p.read_text())
        doc["gpu"].update({k: keys[k] for k in KEYS if k in keys})
        doc["gpu"]["microbench_timing"] = "queued"
        (out / p.name).write_text(dumps(doc))
        made[p.name] = out / p.name
    return made


def report(accuracy: Path, *extra: str) -> str:
    """The re-predicted step-time line of ``transfer_round.py report``."""
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "transfer_round.py"),
                          "report", "--accuracy", str(accuracy), *extra],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    lines = res.stdout.splitlines()
    after = lines[next((i for i, x in enumerate(lines) if x.startswith("re-predicted")),
                       len(lines)):]
    return next((x for x in after if x.startswith("step time")), res.stderr.strip()[-200:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--round", type=int, required=True)
    ap.add_argument("--qmb", type=Path, required=True, help="queued_microbench.json")
    args = ap.parse_args(argv)
    data = ROOT / "docs" / "benchmarks" / "data"
    accuracy = data / f"transfer{args.round}_accuracy.json"
    round_dir = data / "profiles" / f"round{args.round}"
    for need in (accuracy, round_dir, args.qmb):
        if not need.exists():
            raise SystemExit(f"queued_repredict: {need} does not exist")
    doc = json.loads(accuracy.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        made = queued_profiles(round_dir, json.loads(args.qmb.read_text()), tmp)
        rel = str(round_dir.relative_to(ROOT))
        queued_doc = dict(doc, profiles={m: str(p).replace(rel, str(tmp))
                                         for m, p in (doc.get("profiles") or {}).items()})
        queued_acc = tmp / accuracy.name
        queued_acc.write_text(json.dumps(queued_doc))
        rows = [("own profiles", (), ()), ("leave-out", ("--leave-out",), ("--leave-out",))]
        rows += [(name, ("--profile", str(round_dir / name)), ("--profile", str(made[name])))
                 for name in made if name.startswith("generic")]
        # own: any re-prediction switch; a correction that never applies to these rounds
        own = ("--without", "cp_ring_interference")
        print(f"round {args.round}: as they are | with the queued keys")
        for label, plain, queued in rows:
            plain, queued = plain or own, queued or own
            print(f"  {label}: {report(accuracy, *plain)} | {report(queued_acc, *queued)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
