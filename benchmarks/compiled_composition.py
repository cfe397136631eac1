"""The analytical compiled layer against a profile's own compiled rows, with and without the
GPU-alone curves.

    python benchmarks/compiled_composition.py PROFILE.toml [PROFILE.toml ...] [--curves FILE]

For each compiled bf16 layer row at tp 1 of a dense model: the row's measured forward +
backward seconds (GPU-paced, as calibrate timed it) against ``costmodel.compute.layer_cost``
on the profile's GPU with its rows set aside (what a model or family the profile did not time
gets), once at the synchronized curves (``gemm_efficiency``, ``attention_efficiency``) and
once at the GPU-alone ones and the weights' gradient work (``GPUSpec.gpu_alone``; only where
the profile has them). ``--curves FILE`` lends every profile the GPU-alone GEMM and attention
curves of a ``queued_microbench_gpu.py`` result (its ``modes.queued.gpu``), for profiles
calibrated before calibrate timed them (another lease's curves: a post hoc reading).
Used by benchmarks/sets/fp8h48/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tomllib
import warnings
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan import Cluster, Job  # noqa: E402
from meshplan.costmodel.compute import layer_cost  # noqa: E402
from meshplan.hardware_profiles.calibrated import load_profile  # noqa: E402
from meshplan.hardware_profiles.curve import Curve  # noqa: E402
from meshplan.hardware_profiles.measured_rows import model_from_shape_key  # noqa: E402


def rows_errors(path: str, lent: dict | None = None) -> list[dict]:
    """One record per compiled bf16 tp-1 dense row of the profile at ``path``."""
    gpu = replace(load_profile(path).gpu, measured=None)
    if lent:
        gpu = replace(gpu, **lent)
    sync = replace(gpu, gemm_efficiency_alone=None, attention_efficiency_alone=None)
    cluster = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1)
    out = []
    for r in tomllib.loads(Path(path).read_text()).get("layers", []):
        if (not r.get("compile") or r["tp"] != 1
                or r.get("precision", "bf16") != "bf16"):
            continue
        model = model_from_shape_key(r["shape"])
        if model is None or model.num_experts:
            continue
        job = Job(global_batch=r["micro_batch"], seq_len=r["seq_len"], runtime="torch")
        meas = r["forward_s"] + r["backward_s"]

        def priced(g):
            c = layer_cost(model, replace(cluster, gpu=g), job, micro_batch=r["micro_batch"],
                           tp=1, sequence_parallel=False, recompute=r["recompute"],
                           tp_link=None, compiled=True)
            return c.forward.total_s + c.backward.total_s
        rec = dict(profile=Path(path).name, model=r.get("model", r["shape"]),
                   family=model.activation, recompute=r["recompute"],
                   micro_batch=r["micro_batch"], measured_s=meas,
                   sync=priced(sync) / meas - 1)
        if gpu.gpu_alone() is not None:
            rec["alone"] = priced(gpu) / meas - 1
        out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+")
    ap.add_argument("--curves", help="lend these GPU-alone curves (queued_microbench_gpu.py "
                                     "result) to every profile")
    ap.add_argument("--rows", action="store_true", help="print every row")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    lent = None
    if args.curves:
        q = json.loads(Path(args.curves).read_text())["modes"]["queued"]["gpu"]
        lent = {f"{k}_alone": Curve(tuple(map(tuple, q[k])))
                for k in ("gemm_efficiency", "attention_efficiency")}
    recs = [r for p in args.profiles for r in rows_errors(p, lent)]
    if not recs:
        raise SystemExit("no compiled bf16 tp-1 dense rows in these profiles")
    if args.rows:
        print("| profile | model | recompute | mb | measured ms | synchronized | GPU-alone |")
        print("|---|---|---|---|---|---|---|")
        for r in recs:
            alone = f"{r['alone'] * 100:+.1f} %" if "alone" in r else "—"
            print(f"| {r['profile']} | {r['model']} | {r['recompute']} | {r['micro_batch']} | "
                  f"{r['measured_s'] * 1e3:.3f} | {r['sync'] * 100:+.1f} % | {alone} |")
        print()
    groups: dict[str, list[dict]] = {}
    for r in recs:
        groups.setdefault(f"{r['family']} {r['recompute']}", []).append(r)
        groups.setdefault("every row", []).append(r)
    print("| rows | n | synchronized: mean / mean abs | GPU-alone + gradient work: mean / "
          "mean abs |")
    print("|---|---|---|---|")
    for name, v in sorted(groups.items(), key=lambda kv: (kv[0] == "every row", kv[0])):
        s = [r["sync"] for r in v]
        a = [r["alone"] for r in v if "alone" in r]
        alone = (f"{statistics.mean(a) * 100:+.1f} / {statistics.mean(map(abs, a)) * 100:.1f} %"
                 if a else "—")
        print(f"| {name} | {len(v)} | {statistics.mean(s) * 100:+.1f} / "
              f"{statistics.mean(map(abs, s)) * 100:.1f} % | {alone} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
