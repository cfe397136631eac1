"""Leave-shape-out transfer error: how well the cost model predicts a model whose layer shape
the calibration did not time (issue 36, item 5).

    python benchmarks/transfer_analysis.py                  # summary, by feature, by term
    python benchmarks/transfer_analysis.py --only t36       # and those layouts one by one
    python benchmarks/transfer_analysis.py --json /tmp/ta.json

Every measured layout — the 328 of ``docs/benchmarks/data/measured_sets.json`` (each on the
profile its run used, as ``repredict_sets.py``) and the transfer rounds' records
(``docs/benchmarks/data/transfer36_accuracy.json``, on the profile the run used) — is
re-predicted twice:

- **as-is**: on its profile, as ``repredict_sets.py`` does (the model's own layer rows where
  the profile has them);
- **leave-out**: on the same profile with every layer and end row of that model's layer
  shape removed (:meth:`~meshplan.hardware_profiles.measured.MeasuredTables.without_shape`):
  what a user whose model the calibration did not time gets. This is the transfer error.

For the transfer round's models the calibration did not time (t36m02, t36m04) both
predictions are the same. The report breaks the errors down by layout feature (ZeRO stage,
FSDP2, tp, SP, schedule, pp, recompute, micro-batch, model) and by term: where the
leave-out prediction's time breakdown and per-rank memory move from the as-is one (whose
measured layer rows are the reference for what a layer actually costs), in % of the
measured step / memory, and the leave-out layer pieces over the measured rows (forward,
backward, kept activations, backward working memory, ends, CPU dispatch).

A change fitted on these records is post hoc; the next transfer round measures it held out
(docs/benchmarks/transfer.md).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from layout_sets import GPT_05B, LLAMA_16B, gpu_cluster  # noqa: E402
from repredict_sets import MEASURED, load_measured, set_context  # noqa: E402
from meshplan.calibrate.validate import rescore  # noqa: E402
from meshplan.costmodel import estimate  # noqa: E402
from meshplan.costmodel.data_parallel import group_links  # noqa: E402
from meshplan.costmodel.measured import layer_shape_key  # noqa: E402
from meshplan.costmodel.parts import layer_parts  # noqa: E402
from meshplan.costmodel.result import StageMemory, TimeBreakdown  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

DATA = ROOT / "docs" / "benchmarks" / "data"
TRANSFER = {"transfer36": DATA / "transfer36_accuracy.json"}
MEMORY_GOAL_PCT = 5.0
VARIANTS = ("as-is", "leave-out")


@dataclass(frozen=True)
class Case:
    """One measured layout and what it is re-predicted with."""

    source: str           # the measured set or transfer round
    record: dict
    model: ModelSpec
    cluster: Cluster      # on the profile its run used
    job: Job
    timed: bool           # the profile has layer rows of this model's shape

    @property
    def layout(self) -> Layout:
        return Layout.from_dict(self.record["layout"])

    def cluster_for(self, variant: str) -> Cluster:
        if variant == "as-is" or not self.timed:
            return self.cluster
        return without_own_rows(self.cluster, self.model)


def without_own_rows(cluster: Cluster, model: ModelSpec) -> Cluster:
    """``cluster`` with every layer and end row of ``model``'s layer shape removed from its
    profile: what a user whose model the calibration did not time gets."""
    gpu = cluster.gpu
    return cluster.with_gpu(replace(gpu, measured=gpu.measured.without_shape(
        layer_shape_key(model))))


def _timed(cluster: Cluster, model: ModelSpec) -> bool:
    key = layer_shape_key(model)
    return any(r.shape == key for r in cluster.gpu.measured.layers)


def measured_set_cases(path: Path = MEASURED):
    """Every layout that ran in every measured set, on the profile its run used."""
    models = {m.name: m for m in (GPT_05B, LLAMA_16B)}
    measured = load_measured(path)
    for name in measured:
        doc, cluster, job = set_context(name, measured, path.parent)
        for rec in doc["records"]:
            if rec.get("status") == "ok":
                m = models[rec["model"]]
                yield Case(name, rec, m, cluster, job, _timed(cluster, m))


def transfer_cases(name: str, path: Path):
    """Every layout that ran in a transfer round, on the profile each model ran with."""
    doc = json.loads(path.read_text())
    set_dir = ROOT / "benchmarks" / "sets" / str(doc["set"])
    clusters: dict[str, Cluster] = {}
    for rec in doc["records"]:
        if rec.get("status") != "ok":
            continue
        model = ModelSpec.from_dict(json.loads(
            (set_dir / "models" / f"{rec['model']}.json").read_text()))
        profile = ROOT / doc["profiles"][rec["model"]]
        if str(profile) not in clusters:
            clusters[str(profile)] = apply_profile(
                gpu_cluster(doc["gpu_name"], int(doc["nproc"])), profile)
        cluster = clusters[str(profile)]
        yield Case(name, rec, model, cluster, Job.from_dict(doc["jobs"][rec["model"]]),
                   _timed(cluster, model))


def all_cases(*, without: tuple[str, ...] = (), pooled_hbm: bool = False) -> list[Case]:
    """Every case; ``without`` switches those named corrections off in every profile (the
    effect of one mechanism), ``pooled_hbm`` prices every memory-bound op at the pooled
    ``hbm_efficiency`` as before per-op efficiencies."""
    cases = list(measured_set_cases())
    for name, path in TRANSFER.items():
        cases += list(transfer_cases(name, path))
    if not without and not pooled_hbm:
        return cases
    memo: dict[int, Cluster] = {}

    def changed(c: Cluster) -> Cluster:
        if id(c) not in memo:
            gpu = c.gpu
            numbers = gpu.corrections
            for n in without:
                numbers = numbers.without(n)
            memo[id(c)] = c.replace(gpu=replace(
                gpu, corrections=numbers,
                membound_efficiency={} if pooled_hbm else gpu.membound_efficiency))
        return memo[id(c)]
    return [replace(x, cluster=changed(x.cluster)) for x in cases]


# ---- features -----------------------------------------------------------------------------
def features(case: Case) -> dict[str, str]:
    """The layout features the errors are broken down by."""
    lay = case.record["layout"]
    fsdp = lay["zero"] >= 2 and lay["dp"] > 1
    return {
        "data": "transfer36" if case.source.startswith("transfer") else "measured sets",
        "model": case.record["model"],
        "zero": f"z{lay['zero']}",
        "fsdp2": "FSDP2" if fsdp else "no FSDP2",
        "fsdp2 x pp": ("FSDP2 " if fsdp else "") + ("pp>1" if lay["pp"] > 1 else "pp1"),
        "tp": f"tp{lay['tp']}",
        "sp": "sp" if lay.get("sequence_parallel") and lay["tp"] > 1 else "no sp",
        "schedule": lay["schedule"] if lay["pp"] > 1 else "no pipeline",
        "recompute": lay["recompute"],
        "micro-batch": f"mb{lay['micro_batch']}",
    }


# ---- re-prediction ------------------------------------------------------------------------
def repredict_case(case: Case, variant: str) -> dict:
    """The record re-scored on ``variant``'s cluster, with the estimate's breakdown."""
    cluster = case.cluster_for(variant)
    out = rescore(case.record, case.model, cluster, case.job)
    est = estimate(case.model, cluster, case.job, case.layout)
    out["time"] = {f.name: getattr(est.time, f.name) for f in fields(TimeBreakdown)}
    out["memory_terms"] = [{f.name: getattr(m, f.name) for f in fields(StageMemory)}
                           for m in est.memory]
    out["parts"] = _parts(case, cluster)
    out["caveats"] = list(est.caveats)
    out["corrections"] = [c.name for c in est.corrections]
    return out


def _parts(case: Case, cluster: Cluster) -> dict:
    """One layer's and the ends' pieces, per micro-batch, as the estimate uses them."""
    lay = case.layout
    links = group_links(cluster, lay)
    p = layer_parts(case.model, cluster, case.job, lay.micro_batch, lay.tp,
                    lay.sequence_parallel, lay.recompute, links.tp, links.pp)
    return {"layer_forward_s": p.layer.forward.total_s,
            "layer_backward_s": p.layer.backward.total_s,
            "layer_activation_bytes": p.activation_bytes,
            "layer_backward_buf_bytes": p.backward_buf_bytes,
            "embedding_s": p.embedding[0].total_s + p.embedding[1].total_s,
            "output_s": p.logits[0].total_s + p.logits[1].total_s,
            "output_bytes": p.logits_bytes + p.output_peak_bytes,
            "layer_cpu_s": (p.cpu[0] + p.cpu[1]) if p.cpu else None,
            "measured": list(p.measured)}


def analyse(cases: list[Case]) -> list[dict]:
    """Per case: its features and both re-predictions."""
    rows = []
    for case in cases:
        row = {"source": case.source, "name": case.record["name"],
               "model": case.record["model"], "short": case.record["short"],
               "timed": case.timed, "features": features(case),
               "measured": {"step_time_s": case.record["measured"]["step_time_s"],
                            "memory_per_rank_bytes":
                                case.record["measured"].get("memory_per_rank_bytes")}}
        for v in VARIANTS:
            row[v] = repredict_case(case, v)
        rows.append(row)
    return rows


# ---- summaries ----------------------------------------------------------------------------
def stats(rows: list[dict], variant: str) -> dict:
    steps = [r[variant]["step_time_error_pct"] for r in rows]
    mem = [e for r in rows for e in r[variant].get("memory_error_pct_per_rank", [])]
    return {"n": len(steps),
            "step_mean_abs_pct": statistics.mean(map(abs, steps)) if steps else None,
            "step_signed_pct": statistics.mean(steps) if steps else None,
            "step_max_abs_pct": max(map(abs, steps)) if steps else None,
            "memory_ranks": len(mem),
            "memory_within_5pct": (sum(abs(e) <= MEMORY_GOAL_PCT for e in mem) / len(mem)
                                   if mem else None),
            "memory_mean_abs_pct": statistics.mean(map(abs, mem)) if mem else None,
            "memory_signed_pct": statistics.mean(mem) if mem else None}


def _line(label: str, rows: list[dict]) -> str:
    cells = []
    for v in VARIANTS:
        s = stats(rows, v)
        if not s["n"]:
            return f"{label:<34} n=  0"
        mem = ("  mem n/a" if s["memory_within_5pct"] is None else
               f"  mem ≤5% {100 * s['memory_within_5pct']:3.0f}% "
               f"({s['memory_signed_pct']:+5.1f})")
        cells.append(f"{s['step_mean_abs_pct']:5.1f} {s['step_signed_pct']:+6.1f} "
                     f"{s['step_max_abs_pct']:5.1f}{mem}")
    return f"{label:<34} n={len(rows):3d} | " + " | ".join(cells)


HEADER = (f"{'':<34} {'':>5} | {'as-is: mean signed max step %, memory':<38} | "
          f"leave-out: the same")


def summary(rows: list[dict]) -> list[str]:
    timed = [r for r in rows if r["timed"]]
    gpu = [r for r in timed if r["as-is"]["predicted"].get("host_load", 0.0) < 1.0]
    out = [HEADER,
           _line("every layout (328 + 14)", rows),
           _line("  timed by their own profile", timed),
           _line("  ... of those, CPU below GPU (as-is)", gpu),
           _line("measured sets", [r for r in rows if r["features"]["data"] != "transfer36"]),
           _line("transfer36, timed (t36m01, t36m03)",
                 [r for r in timed if r["features"]["data"] == "transfer36"]),
           _line("transfer36, untimed (t36m02, t36m04)",
                 [r for r in rows if not r["timed"]]),
           _line("transfer36, all", [r for r in rows if r["features"]["data"] == "transfer36"])]
    return out


def by_feature(rows: list[dict]) -> list[str]:
    out = [HEADER]
    for feat in next(iter(rows))["features"]:
        if feat == "data":
            continue
        groups: dict[str, list[dict]] = {}
        for r in rows:
            groups.setdefault(r["features"][feat], []).append(r)
        out.append(f"-- {feat}")
        for key in sorted(groups):
            out.append(_line(f"   {key}", groups[key]))
    return out


TIME_TERMS = ("gemm_s", "attention_s", "memory_bound_s", "overhead_s", "tp_comm_s",
              "pp_comm_s", "bubble_s", "dp_comm_exposed_s", "zero3_gather_s", "optimizer_s",
              "host_wait_s", "pp_interference_s", "fsdp_step_s")
MEMORY_TERMS = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
                "embedding_logits_bytes", "buffers_bytes")
PART_TERMS = ("layer_forward_s", "layer_backward_s", "layer_activation_bytes",
              "layer_backward_buf_bytes", "embedding_s", "output_s", "output_bytes",
              "layer_cpu_s")
PART_LABELS = {"layer_forward_s": "fwd", "layer_backward_s": "bwd",
               "layer_activation_bytes": "kept", "layer_backward_buf_bytes": "bwd work",
               "embedding_s": "emb s", "output_s": "out s", "output_bytes": "out bytes",
               "layer_cpu_s": "cpu"}


def term_deltas(row: dict) -> dict[str, float]:
    """Leave-out less as-is, per time term in % of the measured step and per memory term of
    the as-is peak rank in % of its measured memory."""
    step = row["measured"]["step_time_s"]
    a, b = row["as-is"], row["leave-out"]
    d = {f"time {k}": 100 * (b["time"][k] - a["time"][k]) / step for k in TIME_TERMS}
    mm = row["measured"]["memory_per_rank_bytes"] or []
    if mm:
        pa = a["memory_terms"]
        rank = max(range(len(pa)), key=lambda i: sum(pa[i][k] for k in MEMORY_TERMS))
        ref = mm[min(rank, len(mm) - 1)] if len(mm) == len(pa) else max(mm)
        for k in MEMORY_TERMS:
            d[f"memory {k}"] = 100 * (b["memory_terms"][rank][k]
                                      - a["memory_terms"][rank][k]) / ref
    return d


def part_ratios(row: dict) -> dict[str, float]:
    """Leave-out layer pieces over the measured (as-is) ones, − 1, in %."""
    a, b = row["as-is"]["parts"], row["leave-out"]["parts"]
    out = {}
    for k in PART_TERMS:
        if a.get(k) and b.get(k) is not None and a[k] > 0:
            out[k] = 100 * (b[k] / a[k] - 1)
    return out


def _term_name(key: str) -> str:
    kind, name = key.split(" ", 1)
    return f"{kind[0]}:{name.removesuffix('_s').removesuffix('_bytes')}"


def by_term(rows: list[dict]) -> list[str]:
    timed = [r for r in rows if r["timed"] and "layer" in r["as-is"]["parts"]["measured"]]
    out = ["leave-out − as-is, mean over the timed layouts (time: % of measured step; "
           "memory: % of the peak rank's measured memory)"]
    for feat in ("all", "model", "fsdp2 x pp", "recompute", "tp"):
        groups: dict[str, list[dict]] = {}
        for r in timed:
            groups.setdefault("all" if feat == "all" else r["features"][feat], []).append(r)
        for key in sorted(groups):
            deltas = [term_deltas(r) for r in groups[key]]
            names = sorted({k for d in deltas for k in d})
            means = {k: statistics.mean(d.get(k, 0.0) for d in deltas) for k in names}
            shown = ", ".join(f"{_term_name(k)} {v:+.1f}"
                              for k, v in sorted(means.items(), key=lambda kv: -abs(kv[1]))
                              if abs(v) >= 0.3)
            out.append(f"{feat}={key} (n={len(groups[key])}): {shown}")
    out.append("")
    out.append("leave-out layer pieces / measured rows − 1 (%), mean [min, max]; "
               "CPU lost: layouts whose leave-out prediction has no CPU dispatch")
    for feat in ("all", "model", "recompute", "tp", "fsdp2"):
        groups = {}
        for r in timed:
            groups.setdefault("all" if feat == "all" else r["features"][feat], []).append(r)
        for key in sorted(groups):
            rat = [part_ratios(r) for r in groups[key]]
            cells = []
            for k in PART_TERMS:
                vals = [x[k] for x in rat if k in x]
                if vals:
                    cells.append(f"{PART_LABELS[k]} {statistics.mean(vals):+.0f} "
                                 f"[{min(vals):+.0f},{max(vals):+.0f}]")
            lost = sum(1 for r in groups[key] if r["leave-out"]["parts"]["layer_cpu_s"] is None
                       and r["as-is"]["parts"]["layer_cpu_s"] is not None)
            out.append(f"{feat}={key} (n={len(groups[key])}, CPU lost on {lost}): "
                       + "; ".join(cells))
    return out


def one_by_one(rows: list[dict], pattern: re.Pattern) -> list[str]:
    out = []
    for r in rows:
        if pattern.search(f"{r['source']} {r['name']} {r['model']} {r['short']}"):
            cells = []
            for v in VARIANTS:
                x = r[v]
                mem = " ".join(f"{e:+.0f}" for e in x.get("memory_error_pct_per_rank", []))
                cells.append(f"{x['step_time_error_pct']:+6.1f} % [{mem}]")
            out.append(f"{r['source']:<10} {r['name']:<4} {r['model']:<22} {r['short']:<46} "
                       + " | ".join(cells))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None,
                    help="regular expression on 'source name model layout': print the "
                         "matching layouts one by one (as-is | leave-out step %% [memory %%])")
    ap.add_argument("--json", type=Path, default=None, help="write every row here")
    ap.add_argument("--no-terms", action="store_true", help="skip the breakdown by term")
    ap.add_argument("--without", action="append", default=[], metavar="CORRECTION",
                    help="switch this named correction off in every profile (e.g. "
                         "nearest_shape_rows: the analytical layer for untimed shapes)")
    ap.add_argument("--pooled-hbm", action="store_true",
                    help="every memory-bound op at the pooled hbm_efficiency")
    ap.add_argument("--summary", action="store_true", help="the summary lines only")
    args = ap.parse_args(argv)
    try:
        pattern = re.compile(args.only) if args.only else None
    except re.error as exc:
        ap.error(f"--only {args.only!r} is not a regular expression: {exc}")
    rows = analyse(all_cases(without=tuple(args.without), pooled_hbm=args.pooled_hbm))
    print("\n".join(summary(rows)))
    if args.summary:
        return 0
    print()
    print("\n".join(by_feature(rows)))
    if not args.no_terms:
        print()
        print("\n".join(by_term(rows)))
    if pattern:
        print()
        print("\n".join(one_by_one(rows, pattern)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
