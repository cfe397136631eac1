"""The analytical compiled layer against a profile's own compiled rows, at the synchronized
curves and composed from GPU-alone ones (a study: the cost model prices the first).

    python benchmarks/compiled_composition.py PROFILE.toml [PROFILE.toml ...] [--curves FILE]

For each compiled bf16 layer row at tp 1 of a dense model: the row's measured forward +
backward seconds (GPU-paced, as calibrate timed it) against ``costmodel.compute.layer_cost``
on the profile's GPU with its rows set aside (what a model or family the profile did not time
gets), once at the synchronized curves (``gemm_efficiency``, ``attention_efficiency``: what
the cost model prices) and once composed from GPU-alone ones — the GEMMs and attention
calibrate also times queued behind a spin kernel (``[measurements]`` ``gemm_alone`` and
``attention_alone``, since 2026-12-04) — plus the weights' gradient work
(``torch_membound.weight_grad_bytes`` at the residual add's rate). ``--curves FILE`` lends
every profile the GPU-alone curves of a ``queued_microbench_gpu.py`` result (its
``modes.queued.gpu``), for profiles calibrated before calibrate timed them (another lease's
curves: a post hoc reading). Used by docs/benchmarks/fp8_checks.md, "fp8h48 / fp8h49": the
composition meets the burst rows within 3.3 % where the synchronized curves read 16 % slow,
yet priced into steps it made held-out predictions worse (rule 2 there), so the cost model
does not use it.
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
from meshplan.costmodel.compute import hbm_s, layer_cost  # noqa: E402
from meshplan.costmodel.torch_membound import weight_grad_bytes  # noqa: E402
from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.hardware_profiles.calibrated import load_profile  # noqa: E402
from meshplan.hardware_profiles.curve import Curve  # noqa: E402
from meshplan.hardware_profiles.curve_fit import extend_with_base, merge_points  # noqa: E402
from meshplan.hardware_profiles.loader import builtin_gpu, builtin_gpu_names  # noqa: E402
from meshplan.hardware_profiles.measured_rows import model_from_shape_key  # noqa: E402


def alone_curves(doc: dict, base_name: str | None) -> dict | None:
    """The profile's GPU-alone GEMM and attention curves from its ``[measurements]`` rows,
    extended past them by its base GPU's datasheet curves as calibrate extends its own
    (``calibrate.profile.build_profile``), or None where it has none."""
    meas = doc.get("measurements", {})
    g, a = meas.get("gemm_alone"), meas.get("attention_alone")
    if not g or not a:
        return None
    base = builtin_gpu(base_name) if base_name in builtin_gpu_names() else None
    return {"gemm_efficiency": extend_with_base(
                merge_points((r["flops"], r["efficiency"]) for r in g),
                base and base.gemm_efficiency),
            "attention_efficiency": extend_with_base(
                merge_points((r["executed_flops"], r["efficiency"]) for r in a),
                base and base.attention_efficiency)}


def rows_errors(path: str, lent: dict | None = None) -> list[dict]:
    """One record per compiled bf16 tp-1 dense row of the profile at ``path``."""
    prof = load_profile(path)       # a missing or malformed file: its ProfileError first
    doc = tomllib.loads(Path(path).read_text())
    gpu = replace(prof.gpu, measured=None)
    curves = lent or alone_curves(doc, prof.base_gpu)
    alone = replace(gpu, **curves) if curves else None
    cluster = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1)
    out = []
    for r in doc.get("layers", []):
        if (not r.get("compile") or r["tp"] != 1
                or r.get("precision", "bf16") != "bf16"):
            continue
        model = model_from_shape_key(r["shape"])
        if model is None or model.num_experts:
            continue
        job = Job(global_batch=r["micro_batch"], seq_len=r["seq_len"], runtime="torch")
        meas = r["forward_s"] + r["backward_s"]
        tokens = r["micro_batch"] * r["seq_len"]

        def priced(g):
            c = layer_cost(model, replace(cluster, gpu=g), job, micro_batch=r["micro_batch"],
                           tp=1, sequence_parallel=False, recompute=r["recompute"],
                           tp_link=None, compiled=True)
            return c.forward.total_s + c.backward.total_s
        rec = dict(profile=Path(path).name, model=r.get("model", r["shape"]),
                   family=model.activation, recompute=r["recompute"],
                   micro_batch=r["micro_batch"], measured_s=meas,
                   sync=priced(gpu) / meas - 1)
        if alone is not None:
            grads = hbm_s(gpu, weight_grad_bytes(model, tokens=tokens, tp=1,
                                                 mlp_width=model.ffn_hidden_size, e=2),
                          "residual-add")
            rec["alone"] = (priced(alone) + grads) / meas - 1
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
        lent = {k: Curve(tuple(map(tuple, q[k])))
                for k in ("gemm_efficiency", "attention_efficiency")}
    try:
        recs = [r for p in args.profiles for r in rows_errors(p, lent)]
    except MeshplanError as e:
        raise SystemExit(f"compiled_composition.py: {e}")
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
