"""Re-predict a transfer round with GPU-alone compute curves (the `--queued-microbench`
keys): the round's profiles copied with the ``[gpu]`` curves of a
``queued_microbench_gpu.py`` run swapped in and ``microbench_timing = "queued"`` set, then
every record re-predicted on them (``transfer_round.repredict``: own profiles, leave-out and
every generic profile of the round) beside the same re-predictions on the profiles as they
are.

    python benchmarks/queued_repredict.py --round 45 --qmb OUT/qmb/queued_microbench.json
    python benchmarks/queued_repredict.py --round 43 \\
        --qmb docs/benchmarks/data/queued_microbench_h200_20261129_branch.json

Post hoc by construction (the runs are known); docs/calibrate.md "Compute microbenchmarks"
says what the queued keys change and why the default waits for this comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

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


def step_line(records: list[dict]) -> str:
    """The step-time line ``transfer_round.py report`` prints for ``records``."""
    from transfer_round import _fmt, figures
    return next(x for x in _fmt(figures(records)).splitlines() if x.startswith("step time"))


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
    from transfer_round import repredict
    doc = json.loads(accuracy.read_text())
    gpu = str(doc.get("gpu_name"))
    with tempfile.TemporaryDirectory() as tmp:
        made = queued_profiles(round_dir, json.loads(args.qmb.read_text()), Path(tmp))
        queued_doc = dict(doc, profiles={m: str(made[Path(p).name])
                                         for m, p in (doc.get("profiles") or {}).items()})
        rows = [("own profiles", (doc, None, False), (queued_doc, None, False)),
                ("leave-out", (doc, None, True), (queued_doc, None, True))]
        rows += [(name, (doc, str(round_dir / name), False), (doc, str(made[name]), False))
                 for name in made if name.startswith("generic")]
        print(f"round {args.round}: as they are | with the queued keys")
        for label, (d0, p0, lo0), (d1, p1, lo1) in rows:
            print(f"  {label}: {step_line(repredict(d0, p0, gpu, leave_out=lo0))} | "
                  f"{step_line(repredict(d1, p1, gpu, leave_out=lo1))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
