"""Re-predict a context-parallel GPU check (benchmarks/context_parallel_gpu.py's cp_gpu.json)
with today's cost model, on the GPU it ran on, and print as-run vs post-hoc errors.

POST HOC: the measured step times were known when the cost model changed; only a new run
is a test. Usage (no GPU):

    python benchmarks/cp_gpu_posthoc.py docs/benchmarks/data/cp_gpu_h200.json --gpu H200
    python benchmarks/cp_gpu_posthoc.py docs/benchmarks/data/cp_gpu_h200.json --gpu H200 \
        --rerun docs/benchmarks/data/cp_gpu_h200_ring_sdpa_20261128.json
        # the ten layouts as they stand: the second run's rows replace the first's
    python benchmarks/cp_gpu_posthoc.py RESULTS --attention-points \
        docs/benchmarks/data/attention_points_h200_20261128.json   # + the saved profile with
        # its attention curve re-fitted on 2k-64k points (what calibrate times since then)
    python benchmarks/cp_gpu_posthoc.py docs/benchmarks/data/cp_gpu_h200_cp40_20261128.json \
        --set benchmarks/sets/cp40/set.json     # a drawn set's run: the set's own model

The column "one curve" is today's datasheet prediction with the attention curve's head-dim
ratio removed (every head dim priced at the head-dim-128 curve, as before the ratio).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import context_parallel_gpu as cg  # noqa: E402
import executor_gpu as eg  # noqa: E402

from meshplan.costmodel import estimate  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.spec import Job, Layout  # noqa: E402


def _err(pred: float, meas: float) -> float:
    return 100.0 * (pred / meas - 1.0)


def with_long_attention(cluster: Cluster, points_file: str) -> Cluster:
    """``cluster`` with its GPU's attention curve re-fitted from the measured points of
    ``benchmarks/attention_points_gpu.py`` (calibrate's own benchmark and formula) joined to
    the curve's points below their smallest FLOP count."""
    from meshplan.hardware_profiles.curve_fit import extend_with_base, merge_points
    rows = json.loads(Path(points_file).read_text())["rows"]
    new = merge_points((r["flops_forward"], r["efficiency"]) for r in rows)
    lo = min(x for x, _ in new)
    old = [(x, y) for x, y in cluster.gpu.attention_efficiency.to_list() if x < lo]
    curve = extend_with_base(sorted(old + list(new)), None)
    return replace(cluster, gpu=replace(cluster.gpu, attention_efficiency=curve))


def without_head_dim_ratio(cluster: Cluster) -> Cluster:
    """``cluster`` with one attention curve for every head dim (no published ratio)."""
    return replace(cluster, gpu=replace(cluster.gpu, attention_head_dim_ratio=()))


def merged_rows(results: str, rerun: str | None) -> list[dict]:
    """The rows of ``results``, each replaced by the row of the same name in ``rerun``."""
    rows = json.loads(Path(results).read_text())
    if rerun is None:
        return rows
    later = {r["name"]: r for r in json.loads(Path(rerun).read_text())}
    unknown = sorted(set(later) - {r["name"] for r in rows})
    if unknown:
        raise SystemExit(f"cp_gpu_posthoc: {rerun} has layouts {unknown} that {results} "
                         f"does not")
    return [later.get(r["name"], r) for r in rows]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="cp_gpu.json of a run")
    p.add_argument("--gpu", default="H200", choices=("H100", "H200"),
                   help="the GPU the run used (the dgx preset of that GPU, 4 per node)")
    p.add_argument("--attention-points", default=None,
                   help="attention_points_gpu.py's JSON: also predict on the saved profile "
                        "with its attention curve re-fitted on those points")
    p.add_argument("--rerun", default=None,
                   help="cp_gpu.json of a later run of some of the same layouts: its rows "
                        "replace the first file's rows of the same name")
    p.add_argument("--set", default=None,
                   help="the set (benchmarks/cp_draw.py) the run drew its model from")
    p.add_argument("--host-comm-op-s", type=float, default=None,
                   help="the CPU seconds of one c10d call to price the cp cores' with "
                        "(costmodel.cp_host; default: the GPU preset's, else one operator's)")
    args = p.parse_args(argv)
    model = cg.MODEL if args.set is None else cg.load_set(args.set)[0]
    rows = merged_rows(args.results, args.rerun)
    cluster = Cluster.preset(f"dgx-{args.gpu.lower()}", nodes=1, gpus_per_node=4)
    if args.host_comm_op_s is not None:
        cluster = replace(cluster, gpu=replace(cluster.gpu, host_comm_op_s=args.host_comm_op_s))
    one_curve = without_head_dim_ratio(cluster)
    print(f"{'layout':30s} {'meas s':>7s} {'as-run':>7s} {'err':>7s} {'one curve':>9s} {'err':>7s}"
          f" {'now':>7s} {'err':>7s} {'saved now':>9s} {'err':>7s}")
    before, after, saved, longer, single = [], [], [], [], []
    long_cluster = (with_long_attention(eg.saved_profile_cluster(cluster)[0],
                                        args.attention_points)
                    if args.attention_points else None)
    for r in rows:
        if r.get("status") != "ok":
            continue
        job, layout = Job(**r["job"]), Layout(**r["layout"])
        pred = eg.predict(model, cluster, job, layout)
        one = estimate(model, one_curve, job, layout).step_time_s
        meas = r["step_time_s"]
        b, a = _err(r["predicted"]["step_time_s"], meas), _err(pred["step_time_s"], meas)
        sp = pred.get("saved_profile", {}).get("step_time_s", float("nan"))
        s = _err(sp, meas)
        before.append(abs(b)), after.append(abs(a)), saved.append(abs(s))
        single.append(abs(_err(one, meas)))
        extra = ""
        if long_cluster is not None:
            est = estimate(model, long_cluster, job, layout)
            e = _err(est.step_time_s, meas)
            longer.append(abs(e))
            extra = f" {est.step_time_s:9.3f} {e:+6.1f}%"
        print(f"{r['name']:30s} {meas:7.3f} {r['predicted']['step_time_s']:7.3f} {b:+6.1f}%"
              f" {one:9.3f} {_err(one, meas):+6.1f}%"
              f" {pred['step_time_s']:7.3f} {a:+6.1f}% {sp:9.3f} {s:+6.1f}%{extra}")
    n = len(before)
    print(f"mean |error|: as-run {sum(before) / n:.1f} %, one curve {sum(single) / n:.1f} %, "
          f"now {sum(after) / n:.1f} %, saved profile now {sum(saved) / n:.1f} %; max: "
          f"{max(before):.1f} %, {max(single):.1f} %, {max(after):.1f} %, {max(saved):.1f} %")
    if longer:
        print(f"saved profile with the 2k-64k attention points: mean {sum(longer) / n:.1f} %, "
              f"max {max(longer):.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
