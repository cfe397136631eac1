"""POST HOC: re-predict the as-run fp8 arms of the 2026-11-28 4 × H200 fp8 check with
measured fp8 layer rows (``meshplan calibrate --fp8-rows``) beside a 4-GPU profile's rows.

"before": the 4-GPU profile alone (fp8 composed on its bf16 rows: GEMM shares × the fp8/bf16
ratio plus the casts at its cast rate, meshplan/costmodel/fp8_cost.py). "after": the same
profile with the fp8 rows of ``--fp8-profile`` added beside its rows (only the fp8 rows, only
tp 1: the 1-GPU calibration's bf16 rows and its GPU keys are not used), so an fp8 layout's
layer comes from the measured fp8 row where one matches (meshplan/costmodel/fp8_rows.py).
The bf16 arms are the same in both. Errors = predicted / measured − 1.

    python benchmarks/fp8_rows_repredict.py --fp8-profile profile_fp8.toml
    # defaults: --data docs/benchmarks/data/fp8_layouts_h200_20261128.json
    #           --profile docs/benchmarks/data/profiles/profile_h200x4_compile_20261128.toml
    #           --only f01,f02,f05,f07 (the tp 1 layouts)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fp8_repredict import error_cell, summary  # noqa: E402
from layout_sets import gpu_cluster  # noqa: E402
from meshplan.costmodel import estimate  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile, load_profile  # noqa: E402
from meshplan.hardware_profiles.measured import MeasuredTables  # noqa: E402
from meshplan.hardware_profiles.measured_rows import layer_shape_key  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

DATA = ROOT / "docs/benchmarks/data/fp8_layouts_h200_20261128.json"
PROFILE = ROOT / "docs/benchmarks/data/profiles/profile_h200x4_compile_20261128.toml"


def fp8_rows(path: str, model: ModelSpec, seq_len: int) -> tuple:
    """The tp 1 fp8 layer rows of ``path`` at ``model``'s shape and ``seq_len``."""
    cl = apply_profile(gpu_cluster("H200-SXM-141GB", 1), path, override=True)
    key = layer_shape_key(model)
    return tuple(r for r in cl.gpu.measured.layers if r.precision == "fp8" and r.tp == 1
                 and r.shape == key and r.seq_len == seq_len)


def session_check(path: str, profile: str, model: ModelSpec, seq_len: int) -> list[str]:
    """The bf16 rows both profiles timed (tp 1, ZeRO-0): the 1-GPU session's over the
    4-GPU one's GPU and CPU seconds, per row — how far the two sessions' machines differ,
    which the merged fp8 rows carry into "after"."""
    one = apply_profile(gpu_cluster("H200-SXM-141GB", 1), path, override=True).gpu.measured
    four = apply_profile(gpu_cluster("H200-SXM-141GB", 4), profile, override=True).gpu.measured
    out = []
    for r in one.layers:
        if r.precision != "bf16" or r.tp != 1 or r.zero or r.seq_len != seq_len \
                or r.shape != layer_shape_key(model):
            continue
        o = four.layer(model, seq_len=seq_len, tp=1, sequence_parallel=False,
                       recompute=r.recompute, micro_batch=r.micro_batch, compile=r.compile)
        if o is None or o.forward_s <= 0 or o.backward_s <= 0:
            continue
        cpu = ((r.forward_cpu_s + r.backward_cpu_s) / (o.forward_cpu_s + o.backward_cpu_s)
               if o.forward_cpu_s + o.backward_cpu_s > 0 else float("nan"))
        out.append(f"bf16 {'compiled' if r.compile else 'eager'} rc={r.recompute} "
                   f"mb{r.micro_batch}: 1-GPU / 4-GPU fwd x{r.forward_s / o.forward_s:.3f}, "
                   f"bwd x{r.backward_s / o.backward_s:.3f}, cpu x{cpu:.3f}")
    return out


def with_rows(cluster, rows: tuple):
    t = cluster.gpu.measured
    return dataclasses.replace(cluster, gpu=dataclasses.replace(
        cluster.gpu, measured=MeasuredTables(t.layers + rows, t.ends)))


def repredict(data: dict, profile: str, rows: tuple, only: set[str]) -> list[dict]:
    model = ModelSpec(**data["model"])
    job16 = Job(**data["job"])
    job8 = dataclasses.replace(job16, precision="fp8", fp8_recipe=data["recipe"])
    out = []
    for row in data["layouts"]:
        if row["name"] not in only:
            continue
        layout = Layout(**row["layout"])
        base = apply_profile(gpu_cluster(data["machine"], layout.num_gpus), profile,
                             override=True)
        meas = {arm: (row[arm].get("measured") or {}).get("step_time_s")
                if row[arm].get("status") == "ok" else None for arm in ("bf16", "fp8")}
        b16 = estimate(model, base, job16, layout).step_time_s
        before = estimate(model, base, job8, layout)
        after = estimate(model, with_rows(base, rows), job8, layout)
        out.append(dict(name=row["name"], short=row["short"], bf16_measured_s=meas["bf16"],
                        fp8_measured_s=meas["fp8"], bf16_s=b16, fp8_before_s=before.step_time_s,
                        fp8_after_s=after.step_time_s,
                        row=[c for c in after.caveats if "measured fp8 row" in c]))
    return out


def table(rows: list[dict]) -> str:
    lines = ["| layout | bf16 s meas. (pred.) | fp8 s meas. | before | after | speed-up meas. "
             "| before | after | fp8 row used |", "|---" * 9 + "|"]
    stats: dict[str, list[float]] = {}

    def cell(p, m, key):
        return error_cell(stats, p, m, key)
    for r in rows:
        mb, mf = r["bf16_measured_s"], r["fp8_measured_s"]
        ms = mb / mf if mb and mf else None
        sp = [r["bf16_s"] / r[f"fp8_{w}_s"] for w in ("before", "after")]
        lines.append(
            f"| {r['name']} `{r['short']}` | {mb or 0:.3f} ({r['bf16_s']:.3f}) | {mf or 0:.3f} "
            f"| {cell(r['fp8_before_s'], mf, 'fp8 step before')} "
            f"| {cell(r['fp8_after_s'], mf, 'fp8 step after')} | "
            f"{ms or 0:.3f} | {cell(sp[0], ms, 'speed-up before')} "
            f"| {cell(sp[1], ms, 'speed-up after')} | {'yes' if r['row'] else 'no'} |")
    return "\n".join(lines + [""] + summary(stats)) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fp8-profile", required=True,
                   help="a profile from `meshplan calibrate --fp8-rows` (its tp 1 fp8 rows)")
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--profile", default=str(PROFILE))
    p.add_argument("--only", default="f01,f02,f05,f07")
    p.add_argument("--json", default=None, help="also write the rows here")
    a = p.parse_args()
    data = json.loads(Path(a.data).read_text())
    model = ModelSpec(**data["model"])
    rows = fp8_rows(a.fp8_profile, model, data["job"]["seq_len"])
    prov = load_profile(a.fp8_profile).provenance
    print(f"fp8 rows of {a.fp8_profile} ({prov.get('gpu_name')}, {prov.get('date')}): "
          + ", ".join(f"{'compiled' if r.compile else 'eager'} {r.fp8_recipe} rc={r.recompute} "
                      f"mb{r.micro_batch}" for r in rows) or "none at this shape")
    if not rows:
        print(f"no tp 1 fp8 row of {model.name}'s layer at seq {data['job']['seq_len']}: "
              "nothing to re-predict")
        return 1
    print("\n".join(session_check(a.fp8_profile, a.profile, model, data["job"]["seq_len"]))
          or "no bf16 row timed by both profiles (no session check)")
    out = repredict(data, a.profile, rows, set(a.only.split(",")))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    print(table(out))
    for r in out:
        for c in r["row"]:
            print(f"{r['name']}: {c}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
