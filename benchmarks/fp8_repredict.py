"""POST HOC: re-predict the as-run arms of an fp8 layouts check (fp8_device.py's data) with
another profile and today's cost model; before/after errors of step time, fp8/bf16
speed-up and peak memory (docs/benchmarks/fp8_checks.md, "POST HOC").

    python benchmarks/fp8_repredict.py \\
        --data docs/benchmarks/data/fp8_layouts_h200_20261128.json \\
        --profile docs/benchmarks/data/profiles/profile_h200x4_compile_20261128.toml
    # how much the tp 2 + SP layouts lean on the profile's compiled SP rows: the same
    # without them (those layers then come from the eager SP rows)
    python benchmarks/fp8_repredict.py ... --drop-compiled-sp
    # a module's sustained-clock ratio, where its rows carry none (1), from a later
    # calibration of the same model that measured it; the rows' times as they were
    # (docs/benchmarks/fp8_checks.md "fp8h9")
    python benchmarks/fp8_repredict.py ... --sustained-from OTHER.toml
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from layout_sets import gpu_cluster  # noqa: E402
from meshplan.costmodel import estimate  # noqa: E402
from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile, load_profile  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

GIB = 2 ** 30


def _module(r) -> tuple:
    """A row's built module: the rows one sustained ratio is measured for."""
    return (r.shape, r.seq_len, r.tp, r.sequence_parallel, r.zero, r.dp, r.compile,
            r.precision, r.fp8_recipe, r.ep)


def with_layers(cluster, layers: tuple):
    """``cluster`` with its profile's layer rows replaced by ``layers``."""
    tables = cluster.gpu.measured
    if layers == tables.layers:
        return cluster
    return dataclasses.replace(cluster, gpu=dataclasses.replace(
        cluster.gpu, measured=dataclasses.replace(tables, layers=layers)))


def with_sustained_from(cluster, sustained_from: str):
    """``cluster`` whose layer rows carrying no sustained ratio (1) take the ratio
    ``sustained_from``'s rows of the same module carry, where they have one."""
    later = load_profile(sustained_from).gpu.measured.layers
    ratio = {_module(r): r.sustained_ratio for r in later}
    return with_layers(cluster, tuple(
        dataclasses.replace(r, sustained_ratio=ratio.get(_module(r), 1.0))
        if r.sustained_ratio == 1.0 else r for r in cluster.gpu.measured.layers))


def cluster_for(profile: str, gpu: str, nproc: int, drop_compiled_sp: bool,
                sustained_from: str | None = None):
    cluster = apply_profile(gpu_cluster(gpu, nproc), profile, override=True)
    if drop_compiled_sp:
        cluster = with_layers(cluster, tuple(r for r in cluster.gpu.measured.layers
                                             if not (r.compile and r.sequence_parallel)))
    return with_sustained_from(cluster, sustained_from) if sustained_from else cluster


def repredict(data: dict, profile: str, drop_compiled_sp: bool = False,
              sustained_from: str | None = None) -> list[dict]:
    model = ModelSpec(**data["model"])
    job16 = Job(**data["job"])
    job8 = dataclasses.replace(job16, precision="fp8", fp8_recipe=data["recipe"])
    out = []
    for row in data["layouts"]:
        layout = Layout(**row["layout"])
        # fp8_device.py's data name no machine: the GPU the profile was measured on
        gpu = data.get("machine") or load_profile(profile).device_name
        cluster = cluster_for(profile, gpu, layout.num_gpus, drop_compiled_sp, sustained_from)
        rec = {"name": row["name"], "short": row["short"]}
        for arm, job in (("bf16", job16), ("fp8", job8)):
            est = estimate(model, cluster, job, layout)
            meas = (row[arm].get("measured") or {}) if row[arm].get("status") == "ok" else {}
            before = row[arm].get("predicted") or {}
            rec[arm] = {"measured_s": meas.get("step_time_s"),
                        "measured_gib": (meas.get("memory_peak_bytes") or 0) / GIB or None,
                        "before_s": before.get("step_time_s"),
                        "before_gib": (before.get("memory_peak_bytes") or 0) / GIB or None,
                        "after_s": est.step_time_s, "after_gib": est.memory_peak_bytes / GIB}
        b, f = rec["bf16"], rec["fp8"]
        for when in ("before", "after"):     # an arm not predicted before (or not run): —
            rec[f"{when}_speedup"] = (b[f"{when}_s"] / f[f"{when}_s"]
                                      if b[f"{when}_s"] and f[f"{when}_s"] else None)
        if b["measured_s"] and f["measured_s"]:
            rec["measured_speedup"] = b["measured_s"] / f["measured_s"]
        out.append(rec)
    return out


def err(pred, meas):
    return None if not pred or not meas else (pred / meas - 1) * 100


def error_cell(stats: dict[str, list[float]], pred, meas, key: str) -> str:
    """``pred`` with its error against ``meas`` (recorded under ``key`` in ``stats``), or —."""
    e = err(pred, meas)
    if e is None:
        return "—"
    stats.setdefault(key, []).append(abs(e))
    return f"{pred:.3f} ({e:+.1f} %)"


def table(rows: list[dict]) -> str:
    lines = ["| layout | bf16 s meas. | before | after | fp8 s meas. | before | after | "
             "speed-up meas. | before | after | peak GiB bf16 meas. / before / after | "
             "fp8 meas. / before / after |", "|---" * 11 + "|"]
    stats: dict = {}

    def cell(p, m, key):
        return error_cell(stats, p, m, key)
    for r in rows:
        b, f = r["bf16"], r["fp8"]
        ms = r.get("measured_speedup")
        c = [cell(b[f"{w}_s"], b["measured_s"], f"step {w}") for w in ("before", "after")]
        c += [cell(f[f"{w}_s"], f["measured_s"], f"step {w}") for w in ("before", "after")]
        c += [cell(r[f"{w}_speedup"], ms, f"speed-up {w}") for w in ("before", "after")]
        mem = []
        for a in (b, f):
            e = [err(a[f"{w}_gib"], a["measured_gib"]) for w in ("before", "after")]
            for w, x in zip(("before", "after"), e):
                if x is not None:
                    stats.setdefault(f"memory {w}", []).append(abs(x))
            before = ("—" if e[0] is None else
                      f"{a['before_gib']:.1f} ({e[0]:+.0f} %)")
            mem.append("—" if a["measured_gib"] is None else
                       f"{a['measured_gib']:.1f} / {before} / "
                       f"{a['after_gib']:.1f} ({e[1]:+.0f} %)")
        fmt = lambda v: f"{v:.3f}" if v else "—"  # noqa: E731
        lines.append(f"| {r['name']} `{r['short']}` | {fmt(b['measured_s'])} | {c[0]} | {c[1]} "
                     f"| {fmt(f['measured_s'])} | {c[2]} | {c[3]} | {fmt(ms)} | {c[4]} | {c[5]} "
                     f"| {mem[0]} | {mem[1]} |")
    return "\n".join(lines + [""] + summary(stats)) + "\n"


def summary(stats: dict[str, list[float]]) -> list[str]:
    """One line per statistic: mean and max absolute error in %."""
    return [f"- {k}: mean {sum(v) / len(v):.1f} %, max {max(v):.1f} % ({len(v)})"
            for k, v in sorted(stats.items())]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--drop-compiled-sp", action="store_true")
    p.add_argument("--sustained-from", default=None, metavar="PROFILE",
                   help="rows carrying no sustained ratio (1) take this profile's ratio "
                        "for the same module, where it has one")
    p.add_argument("--json", default=None, help="also write the rows here")
    a = p.parse_args()
    try:
        rows = repredict(json.loads(Path(a.data).read_text()), a.profile, a.drop_compiled_sp,
                         a.sustained_from)
    except MeshplanError as exc:     # a missing or malformed profile: its message, no trace
        p.error(str(exc))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
