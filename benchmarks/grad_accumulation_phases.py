"""The executor's gradient accumulation read off as-run phases: each later backward's GPU
time over the first's, against :mod:`meshplan.costmodel.grad_accumulation`'s one in-place add.

A step's first backward steals its gradients into ``.grad``, each later one adds in place
(the module's docstring), so at an equal micro-batch the backward of micro-batch k ≥ 1 runs
the first's kernels plus the adds. The checks' runs record every micro-batch's forward and
backward GPU time (``phases``: CUDA events, one H200), so the difference is a measurement of
the adds. Forward rows are printed as the control (fp8 arms cast their weights in the first
forward only: theirs differ the other way). Priced: 12 bytes a parameter at the H200
datasheet's element-wise rate, all the model's parameters (one GPU, ZeRO-0).

    python benchmarks/grad_accumulation_phases.py docs/benchmarks/data/moe_fp8_h200x1_moeh*_2026*.json \\
        docs/benchmarks/data/fp8_h200x1_fp8h*_2026*.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from moe_profile_transfer import check_name, runs  # noqa: E402
from optimizer_rate_posthoc import checks  # noqa: E402

from meshplan.costmodel.compute import hbm_s  # noqa: E402
from meshplan.costmodel.grad_accumulation import ACCUMULATE_BYTES_PER_PARAM  # noqa: E402
from meshplan.hardware_profiles.loader import builtin_gpu  # noqa: E402


def passes(run: dict, kind: str, timeline: str = "device_ms") -> list[float]:
    """Milliseconds of each micro-batch's ``kind`` pass, in order, on the GPU's timeline
    (``timeline`` "host_ms": the host's)."""
    ph = run.get("phases") or {}
    out, k = [], 0
    while f"{kind} {k}" in ph:
        out.append(ph[f"{kind} {k}"][timeline])
        k += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="+", help="check data files (docs/benchmarks/data/*.json)")
    ap.add_argument("--plans", default=str(ROOT / "benchmarks/plans/*h200x1/*.json"))
    args = ap.parse_args(argv)
    gpu = builtin_gpu("H200-SXM-141GB")
    models = {}
    for name, _prec, key, _meas, rec, _peak in runs(args.data, args.plans):
        models[(name, rec.job.precision, key)] = rec.model
    print("| check | run | precision | micro-batches | backward: later − first ms | priced add ms "
          "| forward: later − first ms |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for path in args.data:
        name = check_name(path)
        for chk in checks(json.loads(Path(path).read_text())):
            prec = chk["predictions"]["job"]["precision"]
            for key, run in chk["runs"].items():
                b, f = passes(run, "backward"), passes(run, "forward")
                model = models.get((name, prec, key))
                if len(b) < 2 or model is None:
                    continue
                add_ms = hbm_s(gpu, model.num_params() * ACCUMULATE_BYTES_PER_PARAM,
                               "residual-add") * 1e3
                db = statistics.mean(b[1:]) - b[0]
                df = statistics.mean(f[1:]) - f[0]
                ratios.append(db / add_ms)
                print(f"| {name} | `{key}` | {prec} | {len(b)} | {db:+.1f} | {add_ms:.1f} | "
                      f"{df:+.1f} |")
    if len(ratios) > 1:
        q1, median, q3 = statistics.quantiles(ratios, n=4)
        print(f"\nmeasured / priced: median {median:.2f}, quartiles {q1:.2f}-{q3:.2f} "
              f"({len(ratios)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
