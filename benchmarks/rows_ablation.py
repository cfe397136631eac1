"""What each part of a profile's measured tables is worth: a transfer round's layouts
re-predicted with its layer rows, end rows or both removed (CPU, seconds).

    python benchmarks/rows_ablation.py --accuracy docs/benchmarks/data/transfer41_accuracy.json

Each record is re-predicted on the profile it ran with (the accuracy file's ``profiles``)
as is, without its end rows (embedding, output layer), without its layer rows, and without
any rows (the analytical layer on the profile's curves); prints per layout the signed
errors and per variant the mean / max absolute and the mean signed error
(docs/benchmarks/transfer.md, "Round 41: after the run").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.costmodel import estimate  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.hardware_profiles.measured import MeasuredTables  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

VARIANTS = ("as run", "no end rows", "no layer rows", "no rows")


def variants(cluster: Cluster) -> dict[str, Cluster]:
    """The cluster with its profile's measured tables as is and with parts removed."""
    mt = cluster.gpu.measured

    def with_tables(t):
        return replace(cluster, gpu=replace(cluster.gpu, measured=t))
    return dict(zip(VARIANTS, (cluster, with_tables(MeasuredTables(layers=mt.layers)),
                               with_tables(MeasuredTables(ends=mt.ends)), with_tables(None))))


def ablate(doc: dict, preset: str) -> dict[str, list[float]]:
    """Signed step-time errors (%) of every record under each variant, in record order."""
    set_dir = ROOT / "benchmarks" / "sets" / str(doc["set"])
    nproc = int(doc.get("nproc") or 4)
    clusters = {}
    out: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in doc["records"]:
        path = str(ROOT / doc["profiles"][r["model"]])
        if path not in clusters:
            clusters[path] = variants(apply_profile(
                Cluster.preset(preset, nodes=1, gpus_per_node=nproc), path))
        model = ModelSpec.from_dict(json.loads((set_dir / "models" / f"{r['model']}.json")
                                               .read_text()))
        job, lay = Job.from_dict(doc["jobs"][r["model"]]), Layout.from_dict(r["layout"])
        meas = r["measured"]["step_time_s"]
        for v, c in clusters[path].items():
            out[v].append(100 * (estimate(model, c, job, lay).step_time_s - meas) / meas)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accuracy", type=Path, required=True, help="a merged accuracy.json")
    ap.add_argument("--cluster", default="dgx-h200", help="the preset the records ran as")
    args = ap.parse_args(argv)
    doc = json.loads(args.accuracy.read_text())
    errs = ablate(doc, args.cluster)
    for i, r in enumerate(doc["records"]):
        print(f"{r['name']:5} {r['short'][:44]:44} "
              + "  ".join(f"{v} {errs[v][i]:+5.1f}" for v in VARIANTS))
    for v in VARIANTS:
        e = errs[v]
        print(f"{v:14} mean {statistics.mean(map(abs, e)):5.2f} %  max {max(map(abs, e)):5.2f} %"
              f"  signed {statistics.mean(e):+5.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
