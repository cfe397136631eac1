"""Re-predict 2026-11-28's compiled runs on a profile with compiled layer rows (POST HOC).

    python benchmarks/compile_repredict.py                          # the 2026-11-28 profile
    python benchmarks/compile_repredict.py --profile P.toml --json out.json

Two sets of runs on 4 x H200, both measured before the profile was calibrated:

- ``docs/benchmarks/data/mfu_h200_20261128.json``: gpt3-1.3b (global batch 16, seq 2048),
  the executor's layouts eager and compiled (the plain DDP script's runs are left out: it is
  not the executor's program, see ``mfu_repredict.py``);
- ``docs/benchmarks/data/fp8_layouts_h200_20261128.json``: Llama-1.64B (global batch 32), the
  bf16 arms of eight compiled layouts (the fp8 arms are another model's business).

For each run: measured step and peak memory (worst rank), the prediction as run (in the file),
and the prediction now on ``--profile`` applied to the 4 x H200 preset, with the estimate's
compile caveat (``own``: the layer came from a compiled row; ``derived``: from an eager row
and the plain compiled/eager pair, :mod:`meshplan.costmodel.compiled_rows`; ``eager``:
priced as eager). Everything here is post hoc.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.costmodel import estimate  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

DATA = ROOT / "docs" / "benchmarks" / "data"
PROFILE = DATA / "profiles" / "profile_h200x4_compile_20261128.toml"
MFU = DATA / "mfu_h200_20261128.json"
FP8 = DATA / "fp8_layouts_h200_20261128.json"


def runs() -> list[tuple[str, ModelSpec, Job, Layout, float, float, float | None,
                         float | None]]:
    """(name, model, job, layout, measured step s, measured peak bytes, predicted as run s,
    predicted as run bytes) of every executor run in the two files."""
    out = []
    doc = json.loads(MFU.read_text())
    model, job = ModelSpec.from_dict(doc["model"]), Job.from_dict(doc["job"])
    for r in doc["runs"]:
        if r["status"] == "ok" and "layout" in r:
            p = r.get("predicted") or {}
            out.append((f"mfu:{r['name']}", model, job, Layout.from_dict(r["layout"]),
                        r["step_s"], r["memory_peak_bytes"], p.get("step_time_s"),
                        p.get("memory_peak_bytes")))
    doc = json.loads(FP8.read_text())
    model, job = ModelSpec.from_dict(doc["model"]), Job.from_dict(doc["job"])
    for lay in doc["layouts"]:
        arm = lay["bf16"]
        if arm.get("status") != "ok":
            continue
        m, p = arm["measured"], arm["predicted"]
        out.append((f"fp8file:{lay['name']}-bf16", model, job, Layout.from_dict(lay["layout"]),
                    m["step_time_s"], m["memory_peak_bytes"], p["step_time_s"],
                    p["memory_peak_bytes"]))
    return out


def compile_source(est, layout: Layout) -> str:
    text = " ".join(est.caveats)
    if "priced as eager" in text:
        return "eager"
    if "compile = True priced from" in text:
        return "derived"
    return "own" if layout.compile else "-"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=PROFILE)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    cluster = apply_profile(Cluster.preset("dgx-h200", nodes=1, gpus_per_node=4), args.profile,
                            override=True)
    print(f"POST HOC: profile {args.profile}\n")
    print("| run | layout | step ms measured | as run (err) | now (err) | peak GiB measured "
          "| as run (err) | now (err) | compiled layer |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows, errs = [], {"step": [], "mem": []}
    gib = 2 ** 30
    for name, model, job, layout, step, peak, p_step, p_peak in runs():
        e = estimate(model, cluster, job, layout)
        src = compile_source(e, layout)
        es, em = 100 * (e.step_time_s / step - 1), 100 * (e.memory_peak_bytes / peak - 1)
        if layout.compile:
            errs["step"].append(abs(es))
            errs["mem"].append(abs(em))

        def was(p, m, k):
            return f"{p * k:.1f} ({100 * (p / m - 1):+.1f} %)" if p else "-"
        print(f"| {name} | `{layout.short()}` | {step * 1e3:.1f} | {was(p_step, step, 1e3)} | "
              f"{e.step_time_s * 1e3:.1f} ({es:+.1f} %) | {peak / gib:.2f} | "
              f"{was(p_peak, peak, 1 / gib)} | {e.memory_peak_bytes / gib:.2f} ({em:+.1f} %) "
              f"| {src} |")
        rows.append(dict(name=name, layout=layout.short(), measured_step_s=step,
                         measured_peak_bytes=peak, predicted_step_s=e.step_time_s,
                         predicted_peak_bytes=e.memory_peak_bytes, step_error_pct=es,
                         memory_error_pct=em, compiled_layer=src))
    n = len(errs["step"])
    print(f"\ncompiled runs: {n}; step |error| mean {sum(errs['step']) / n:.1f} % max "
          f"{max(errs['step']):.1f} %; peak memory |error| mean {sum(errs['mem']) / n:.1f} % "
          f"max {max(errs['mem']):.1f} %")
    if args.json:
        args.json.write_text(json.dumps({"profile": str(args.profile), "post_hoc": True,
                                         "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
