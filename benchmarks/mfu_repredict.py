"""Re-predict an MFU call's runs (benchmarks/mfu_device.sh) and break the FSDP2 estimate down.

    python benchmarks/mfu_repredict.py                       # the 2026-11-28 4 x H200 call
    python benchmarks/mfu_repredict.py --plan                # and the planner's top 5 (ortools)

Reads the runs' key numbers (``docs/benchmarks/data/mfu_h200_20261128.json``, written by
``mfu_summary.py --json``) and the calibrated profile the plans were made with, and prints:

1. each run measured, as predicted when it ran, and re-predicted now: on the cluster the
   runs' files carried (the profile's curves, none of its rows: what the plan files held),
   on that cluster with the profile's measured layer rows put back (the model's shape reads
   them through :mod:`meshplan.costmodel.nearest_rows`), and on the profile as ``meshplan
   plan --profile`` applies it today (also the built-in GPU table's newer keys, e.g.
   ``membound_efficiency``); the plain DDP script is priced as the
   executor's nearest layout (dp = world, ZeRO-0, its micro-batch), which is not the same
   program (the executor runs DDP over fp32 weights under autocast);
2. the per-layer terms of the FSDP2 layout (``--layout``, default dp 4 mb 4 ZeRO-2) in both
   estimates: the layer's passes, FSDP2's all-gather / reduce-scatter (raw, of which hop
   latency, and as charged after overlap), the same collectives at the profile's own
   measured 4-rank sizes (interpolated in log size), and the per-step terms.

Everything here is post hoc: the runs were measured before these re-predictions.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.costmodel import comm, estimate  # noqa: E402
from meshplan.costmodel.data_parallel import group_links  # noqa: E402
from meshplan.costmodel.memory import (compute_weight_bytes_per_param, stage_params,  # noqa: E402
                                       state_bytes_per_param)
from meshplan.costmodel.tables import layer_tables  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.hardware_profiles.loader import read_toml  # noqa: E402
from meshplan.hardware_profiles.cluster import Cluster  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

DATA = ROOT / "docs" / "benchmarks" / "data"
RUNS = DATA / "mfu_h200_20261128.json"
PROFILE = DATA / "profiles" / "profile_h200x4_round26.toml"


def run_layout(run: dict, world: int) -> Layout:
    """The executor layout a run ran (the DDP script's: its nearest executor layout)."""
    if "layout" in run:
        return Layout.from_dict(run["layout"])
    return Layout(dp=world, micro_batch=run["micro_batch"], zero=3 if run.get("fsdp") else 0,
                  compile=bool(run.get("compile")))


def measured_collective_s(profile: dict, op: str, size: int, nbytes: float) -> float | None:
    """The profile's own timing of ``op`` over ``size`` ranks at ``nbytes``, interpolated in
    log size between the two measured sizes around it (None outside them)."""
    pts = sorted((c["nbytes"], c["seconds"]) for c in profile["measurements"]["collectives"]
                 if c["op"] == op and c["group_size"] == size)
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if b0 <= nbytes <= b1:
            w = math.log(nbytes / b0) / math.log(b1 / b0)
            return s0 + w * (s1 - s0)
    return None


def layer_terms(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
                profile: dict) -> dict:
    """One layer of ``layout`` as the estimate prices it (ms), and FSDP2's collectives."""
    t = layer_tables(model, cluster, job, layout, checked=True)
    link = group_links(cluster, layout).dp
    params = stage_params(model, 1, layout.tp, first=False, last=False, pp=layout.pp)
    gather_b = params * (compute_weight_bytes_per_param(job) or state_bytes_per_param(job).weights)
    reduce_b = params * state_bytes_per_param(job).grads
    ag, rs = comm.all_gather_s(link, gather_b), comm.reduce_scatter_s(link, reduce_b)
    latency = 2 * (link.size - 1) * link.hop_latency_s
    m_ag = measured_collective_s(profile, "all_gather", link.size, gather_b)
    m_rs = measured_collective_s(profile, "reduce_scatter", link.size, reduce_b)
    ms = 1e3
    return {"layer_forward": t.parts.layer.forward.total_s * ms,
            "layer_backward": t.parts.layer.backward.total_s * ms,
            "fsdp_charged_forward": t.zero3.forward_s * ms,
            "fsdp_charged_backward": t.zero3.backward_s * ms,
            "all_gather_raw": ag * ms, "reduce_scatter_raw": rs * ms,
            "of_which_hop_latency": latency * ms,
            "all_gather_measured": m_ag * ms if m_ag else None,
            "reduce_scatter_measured": m_rs * ms if m_rs else None,
            "gather_bytes": gather_b, "reduce_bytes": reduce_b,
            "hop_latency_us": link.hop_latency_s * 1e6,
            "overlap_interference": cluster.gpu.overlap_interference,
            "ends": sum(p.total_s for p in (*t.parts.embedding, *t.parts.logits[:2])) * ms,
            "fsdp_step": t.fsdp_step_s * ms, "layers": model.num_layers,
            "rows_from": t.parts.transferred_from or ("own rows" if t.parts.measured
                                                      else "analytical layer")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=RUNS)
    ap.add_argument("--profile", type=Path, default=PROFILE)
    ap.add_argument("--layout", default="dp=4,micro_batch=4,zero=2",
                    help="the layout to break down, as FIELD=VALUE pairs")
    ap.add_argument("--plan", action="store_true", help="also run the planner (ortools)")
    args = ap.parse_args(argv)
    doc = json.loads(args.runs.read_text())
    model, job = ModelSpec.from_dict(doc["model"]), Job.from_dict(doc["job"])
    first = next(r for r in doc["runs"] if "layout" in r)
    world = Layout.from_dict(first["layout"]).num_gpus
    as_run = Cluster.from_dict(doc["cluster"])      # what the plan and results files held
    whole = apply_profile(as_run, args.profile)
    rows = as_run.with_gpu(replace(as_run.gpu, measured=whole.gpu.measured))
    profile = read_toml(args.profile)

    print(f"profile {args.profile.relative_to(ROOT)}; model {model.name}, global batch "
          f"{job.global_batch}, seq {job.seq_len}; POST HOC\n")
    print("| run | layout priced | measured ms | as run ms (err) | as-run cluster now ms | "
          "with the profile's rows ms (err) | `plan --profile` today ms (err) |")
    print("|---|---|---|---|---|---|---|")
    for r in doc["runs"]:
        if r["status"] != "ok":
            continue
        lay = run_layout(r, world)
        meas = 1e3 * r["step_s"]
        pred = (r.get("predicted") or {}).get("step_time_s")
        ran = f"{1e3 * pred:.1f} ({100 * (pred * 1e3 / meas - 1):+.1f} %)" if pred else "-"
        now = [1e3 * estimate(model, c, job, lay).step_time_s for c in (as_run, rows, whole)]
        print(f"| {r['name']} | `{lay.short()}` | {meas:.1f} | {ran} | {now[0]:.1f} | "
              + " | ".join(f"{v:.1f} ({100 * (v / meas - 1):+.1f} %)" for v in now[1:]) + " |")

    lay = Layout(**{k: int(v) for k, v in (p.split("=") for p in args.layout.split(","))})
    print(f"\nper layer of `{lay.short()}` (ms; the step: x{model.num_layers} layers)\n")
    a = layer_terms(model, as_run, job, lay, profile)
    b = layer_terms(model, rows, job, lay, profile)
    print("| term | as-run cluster | with the profile's rows |")
    print("|---|---|---|")
    for k in a:
        fa, fb = (f"{v:.4g}" if isinstance(v, float) else str(v) for v in (a[k], b[k]))
        print(f"| {k} | {fa} | {fb} |")
    for tag, c in (("as-run cluster", as_run), ("with the profile's rows", rows),
                   ("plan --profile today", whole)):
        e = estimate(model, c, job, lay)
        print(f"\n{tag}: step {1e3 * e.step_time_s:.1f} ms = forward "
              f"{1e3 * e.stage_forward_s[0]:.1f} + backward {1e3 * e.stage_backward_s[0]:.1f} "
              f"+ optimizer {1e3 * e.time.optimizer_s:.1f} + rest; corrections "
              + ", ".join(f"{x.name} {1e3 * x.step_time_delta_s:+.1f} ms" for x in e.corrections))

    if args.plan:
        from meshplan.planner import plan
        p = plan(model, whole, job, gpus=world, top_k=5)
        print("\nplanner, `meshplan plan --profile` today (POST HOC):")
        for cand in p.candidates:
            print(f"  {cand.layout.short()}: {1e3 * cand.estimate.step_time_s:.1f} ms")


if __name__ == "__main__":
    main()
